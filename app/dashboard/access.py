"""Who is looking, and what they may see.

The service signs people in with GitHub (``app/auth.py``). The session cookie is signed and holds
the person's login, a random session id, and their GitHub user token encrypted with a key derived
from the session secret (the browser cannot read it). Every query of the dashboard is narrowed to
the App installations GitHub says the person can access (``Viewer.installation_ids``); a scan of
another installation is answered 404, exactly like a scan that does not exist, so ids reveal
nothing. The local dashboard has one viewer who sees everything (the history of this machine's user).

Access is not frozen at sign-in: what GitHub answered is trusted for ``session_recheck_s``
(default 60 s), then ``GET /user/installations`` is asked again with the person's token. Losing
access on GitHub, or revoking the App's authorization there, ends access here within that time.
Signing out revokes the token at GitHub (``DELETE /applications/{client_id}/token``) and the session
id in this process at once, so a copied cookie dies too: here immediately, in other server
processes at their next re-check. If GitHub cannot be asked, the session is refused (fail closed).
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from dataclasses import dataclass

import httpx
from cryptography.fernet import Fernet, InvalidToken
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


MAX_INSTALLATION_PAGES = 20  # 2,000 installations: far beyond any one person's
GITHUB_HEADERS = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28",
                  "User-Agent": "adopter-dashboard"}


def _fernet(config: DashboardConfig) -> Fernet:
    key = hashlib.sha256(f"adopter-session-token:{config.session_secret}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def user_installations(config: DashboardConfig, http: httpx.Client, token: str) -> list[int]:
    """Ids of the App's installations the token's person can access (every page). PermissionError
    when GitHub no longer accepts the token; httpx errors when GitHub cannot be asked."""
    auth = {**GITHUB_HEADERS, "Authorization": f"Bearer {token}"}
    ids: list[int] = []
    for page in range(1, MAX_INSTALLATION_PAGES + 1):
        listing = http.get(f"{config.github_api_url}/user/installations", headers=auth,
                           params={"per_page": 100, "page": page})
        if listing.status_code == 401:
            raise PermissionError("GitHub no longer accepts the sign-in")
        listing.raise_for_status()
        batch = listing.json().get("installations", [])
        ids.extend(int(i["id"]) for i in batch)
        if len(batch) < 100:
            break
    return ids


def session_value(config: DashboardConfig, login: str, user_id: int, token: str, session_id: str) -> str:
    return serializer(config, "session").dumps({"login": login, "id": user_id, "sid": session_id,
                                                "tok": _fernet(config).encrypt(token.encode()).decode()})


def read_session(config: DashboardConfig, value: str | None) -> dict | None:
    if not value:
        return None
    try:
        data = serializer(config, "session").loads(value, max_age=config.session_max_age_s)
    except BadSignature:  # includes an expired signature
        return None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("login", "sid", "tok")):
        return None  # includes sessions of earlier versions (no token): sign in again
    try:
        data["token"] = _fernet(config).decrypt(data["tok"].encode()).decode()
    except InvalidToken:
        return None
    return data


class AccessCache:
    """Per process: session id -> (when GitHub was asked, installation ids), and revoked session ids."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checked: dict[str, tuple[float, frozenset[int]]] = {}
        self._revoked: set[str] = set()

    def get(self, session_id: str, max_age_s: float) -> frozenset[int] | None:
        with self._lock:
            entry = self._checked.get(session_id)
        return entry[1] if entry and time.monotonic() - entry[0] < max_age_s else None

    def put(self, session_id: str, ids: frozenset[int]) -> None:
        with self._lock:
            if len(self._checked) > 10_000:  # forget the oldest: they are asked again when used
                for old in sorted(self._checked, key=lambda k: self._checked[k][0])[:5_000]:
                    del self._checked[old]
            self._checked[session_id] = (time.monotonic(), ids)

    def revoke(self, session_id: str) -> None:
        with self._lock:
            self._checked.pop(session_id, None)
            self._revoked.add(session_id)

    def revoked(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._revoked


ACCESS = AccessCache()


def current_installations(config: DashboardConfig, data: dict) -> frozenset[int]:
    """What the session's person can access now (cached ``session_recheck_s``), or NotSignedIn."""
    session_id = data["sid"]
    if ACCESS.revoked(session_id):
        raise NotSignedIn()
    cached = ACCESS.get(session_id, config.session_recheck_s)
    if cached is not None:
        return cached
    try:
        with httpx.Client(timeout=10.0) as http:
            ids = frozenset(user_installations(config, http, data["token"]))
    except PermissionError:
        ACCESS.revoke(session_id)
        raise NotSignedIn() from None
    except (httpx.HTTPError, KeyError, ValueError, TypeError):
        raise NotSignedIn() from None  # fail closed: access that cannot be checked is not granted
    ACCESS.put(session_id, ids)
    return ids


def revoke_session(config: DashboardConfig, value: str | None) -> None:
    """Sign-out: the session id dies in this process, and the token at GitHub (best effort)."""
    data = read_session(config, value)
    if data is None:
        return
    ACCESS.revoke(data["sid"])
    if config.client_id and config.client_secret:
        try:
            httpx.request("DELETE", f"{config.github_api_url}/applications/{config.client_id}/token",
                          auth=(config.client_id, config.client_secret), json={"access_token": data["token"]},
                          headers=GITHUB_HEADERS, timeout=10.0)
        except httpx.HTTPError:
            pass  # the session id is revoked here; the token expires on its own


def viewer(request: Request) -> Viewer:
    """FastAPI dependency: the person reading, or NotSignedIn."""
    config = get_config(request)
    if config.local:
        return Viewer("local", None)
    data = read_session(config, request.cookies.get(SESSION_COOKIE))
    if data is None:
        raise NotSignedIn()
    return Viewer(str(data["login"]), current_installations(config, data))
