"""Who is looking, and what they may see.

The service signs people in with GitHub (``app/auth.py``) and keeps, in a signed cookie, the ids of
the App installations GitHub says the person can access. Every query of the dashboard is narrowed
to those installations (``Viewer.installation_ids``); a scan of another installation is answered
404, exactly like a scan that does not exist, so ids reveal nothing. The local dashboard has one
viewer who sees everything (the history of this machine's user).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from itsdangerous import BadSignature, URLSafeTimedSerializer

from app.dashboard.config import DashboardConfig, service_config

SESSION_COOKIE = "adopter_session"
OAUTH_COOKIE = "adopter_oauth"


@dataclass(frozen=True)
class Viewer:
    login: str
    installation_ids: frozenset[int] | None  # None: every installation (the local dashboard)

    @property
    def local(self) -> bool:
        return self.installation_ids is None


class NotSignedIn(Exception):
    """Raised by the ``viewer`` dependency; pages answer with a redirect to sign-in, the API 401."""


def get_config(request: Request) -> DashboardConfig:
    config = getattr(request.app.state, "dashboard", None)
    if config is None:
        config = request.app.state.dashboard = service_config()
    return config


def serializer(config: DashboardConfig, purpose: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(config.session_secret, salt=f"adopter-{purpose}")


def session_value(config: DashboardConfig, login: str, user_id: int, installation_ids: list[int]) -> str:
    return serializer(config, "session").dumps({"login": login, "id": user_id, "inst": sorted(installation_ids)})


def read_session(config: DashboardConfig, value: str | None) -> dict | None:
    if not value:
        return None
    try:
        data = serializer(config, "session").loads(value, max_age=config.session_max_age_s)
    except BadSignature:  # includes an expired signature
        return None
    if not isinstance(data, dict) or not isinstance(data.get("inst"), list):
        return None
    return data


def viewer(request: Request) -> Viewer:
    """FastAPI dependency: the person reading, or NotSignedIn."""
    config = get_config(request)
    if config.local:
        return Viewer("local", None)
    data = read_session(config, request.cookies.get(SESSION_COOKIE))
    if data is None:
        raise NotSignedIn()
    return Viewer(str(data["login"]), frozenset(int(i) for i in data["inst"]))
