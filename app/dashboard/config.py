"""Settings of the dashboard (pages, JSON API, GitHub sign-in).

A class of its own, not ``app.settings.Settings``: the local dashboard (``adopter dashboard``) runs
with no webhook secret and no App key, and must not need them. The service reads both classes from
the same ``ADOPTER_`` environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DashboardSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ADOPTER_", extra="ignore")

    env: Literal["development", "production"] = "development"
    database_url: str = "sqlite:///.adopter/adopter.db"  # the same default as app.settings.Settings
    # The web host of GitHub (OAuth pages live there) and its REST API (``/user/installations``).
    github_url: str = "https://github.com"
    github_api_url: str = "https://api.github.com"
    # The App's OAuth credentials (GitHub App settings page: "Client ID", "Client secrets").
    github_client_id: str | None = None
    github_client_secret: str | None = None
    # Signs the session cookie. Required outside development; in development a missing secret
    # means a random one per process (sessions end when the server restarts).
    session_secret: str | None = None
    session_max_age_s: int = Field(default=8 * 3600, gt=0)
    # How long what GitHub said a person can access is trusted before it is asked again: losing
    # access on GitHub (or signing out elsewhere) ends access here within this many seconds.
    session_recheck_s: int = Field(default=60, ge=0)


@dataclass(frozen=True)
class DashboardConfig:
    """What the routes need: where the data is, and whether anyone on this machine may read it."""

    database_url: str
    local: bool  # True only for ``adopter dashboard`` (localhost, no sign-in)
    github_url: str = "https://github.com"
    github_api_url: str = "https://api.github.com"
    client_id: str | None = None
    client_secret: str | None = None
    session_secret: str = ""
    session_max_age_s: int = 8 * 3600
    session_recheck_s: int = 60
    secure_cookies: bool = False


class DashboardSettingsError(RuntimeError):
    pass


@lru_cache(maxsize=1)
def service_config() -> DashboardConfig:
    """The service's dashboard configuration, read once from the environment."""
    import secrets

    s = DashboardSettings()
    missing = []
    if s.env != "development":
        for name, value in (("ADOPTER_GITHUB_CLIENT_ID", s.github_client_id),
                            ("ADOPTER_GITHUB_CLIENT_SECRET", s.github_client_secret),
                            ("ADOPTER_SESSION_SECRET", s.session_secret)):
            if not value:
                missing.append(name)
    if missing:
        raise DashboardSettingsError(f"Adopter dashboard ({s.env}) cannot start: set {', '.join(missing)}")
    return DashboardConfig(
        database_url=s.database_url, local=False, github_url=s.github_url.rstrip("/"),
        github_api_url=s.github_api_url.rstrip("/"), client_id=s.github_client_id,
        client_secret=s.github_client_secret, session_secret=s.session_secret or secrets.token_hex(32),
        session_max_age_s=s.session_max_age_s, session_recheck_s=s.session_recheck_s,
        secure_cookies=s.env != "development",
    )
