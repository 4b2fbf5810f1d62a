"""The GitHub webhook receiver: signature check, delivery storage, enqueueing."""
