"""A local stand-in for GitHub's REST API and git hosting, for the service's tests (see server.py)."""
