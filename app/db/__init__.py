"""Database models (``app.db.models``) and sessions (``app.db.session``)."""
