"""Links to other sites are rendered only for ``https`` URLs: a stored URL (a pull request's, as
GitHub or a forged record gave it) can never become ``javascript:``, ``data:`` or plain ``http``."""

from __future__ import annotations

from urllib.parse import urlsplit


def https_url(value: object) -> str | None:
    """``value`` when it is an absolute https URL with a host, else None (rendered as text)."""
    if not isinstance(value, str) or any(c.isspace() or ord(c) < 32 for c in value):
        return None
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    return value if parts.scheme == "https" and parts.hostname else None
