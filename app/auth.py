"""Sign-in with GitHub for the service dashboard: the OAuth web flow of the GitHub App.

1. ``/auth/login`` sends the browser to ``GITHUB_URL/login/oauth/authorize`` with a random
   ``state`` (kept in a short-lived signed cookie, checked on return: no login CSRF).
2. ``/auth/callback`` exchanges the code at ``GITHUB_URL/login/oauth/access_token`` for a user
   token, asks the API who the user is (``GET /user``) and which installations of the App they can
   access (``GET /user/installations``, every page), and keeps the login, a random session id and
   the user token (encrypted) in a signed session cookie.
3. ``/auth/logout`` (POST, same origin only: a cross-site form cannot sign anyone out) revokes
   the session and the token (``app.dashboard.access.revoke_session``) and forgets the cookie.

``app.dashboard.access`` re-asks GitHub which installations the person can access at most every
``ADOPTER_SESSION_RECHECK_S`` seconds and narrows every query to them; the cookie expires after
``ADOPTER_SESSION_MAX_AGE_S``.
"""

from __future__ import annotations

import secrets
from urllib.parse import urlencode, urlsplit

import httpx
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from itsdangerous import BadSignature

from app.dashboard.access import (
    ACCESS,
    GITHUB_HEADERS,
    OAUTH_COOKIE,
    SESSION_COOKIE,
    get_config,
    revoke_session,
    serializer,
    session_value,
    user_installations,
)
from app.dashboard.config import DashboardConfig

router = APIRouter(prefix="/auth", include_in_schema=False)
STATE_MAX_AGE_S = 600


def safe_next(target: str | None) -> str:
    """Only a path on this site: never an open redirect to another host."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _problem(status: int, message: str) -> HTMLResponse:
    from html import escape

    return HTMLResponse(f"<!doctype html><title>Sign-in problem</title><main><h1>Sign-in problem</h1>"
                        f"<p>{escape(message)}</p><p><a href='/auth/login'>Try again</a></p></main>", status)


@router.get("/login")
def login(request: Request, next: str | None = Query(None)):  # noqa: A002 - the conventional name
    config = get_config(request)
    target = safe_next(next)
    if config.local:
        return RedirectResponse(target, 303)
    if not (config.client_id and config.client_secret):
        return _problem(503, "GitHub sign-in is not configured: set ADOPTER_GITHUB_CLIENT_ID and "
                             "ADOPTER_GITHUB_CLIENT_SECRET.")
    state = secrets.token_urlsafe(24)
    query = urlencode({"client_id": config.client_id, "redirect_uri": str(request.url_for("auth_callback")),
                       "state": state, "allow_signup": "false"})
    response = RedirectResponse(f"{config.github_url}/login/oauth/authorize?{query}", 303)
    response.set_cookie(OAUTH_COOKIE, serializer(config, "oauth").dumps({"state": state, "next": target}),
                        max_age=STATE_MAX_AGE_S, httponly=True, samesite="lax", secure=config.secure_cookies,
                        path="/auth")
    return response


def github_identity(config: DashboardConfig, code: str, redirect_uri: str) -> tuple[str, int, list[int], str]:
    """Code -> (login, user id, ids of the App's installations the user can access, user token)."""
    with httpx.Client(timeout=10.0, headers={"Accept": "application/json", "User-Agent": "adopter-dashboard"}) as http:
        answer = http.post(f"{config.github_url}/login/oauth/access_token", data={
            "client_id": config.client_id, "client_secret": config.client_secret, "code": code,
            "redirect_uri": redirect_uri})
        answer.raise_for_status()
        body = answer.json()
        token = body.get("access_token")
        if not token:
            raise PermissionError(body.get("error_description") or body.get("error") or "no access token")
        user = http.get(f"{config.github_api_url}/user", headers={**GITHUB_HEADERS, "Authorization": f"Bearer {token}"})
        user.raise_for_status()
        ids = user_installations(config, http, token)
        return str(user.json()["login"]), int(user.json()["id"]), ids, token


@router.get("/callback", name="auth_callback")
def callback(request: Request, code: str | None = Query(None), state: str | None = Query(None),
             error: str | None = Query(None)):
    config = get_config(request)
    if config.local:
        return RedirectResponse("/", 303)
    try:
        saved = serializer(config, "oauth").loads(request.cookies.get(OAUTH_COOKIE, ""), max_age=STATE_MAX_AGE_S)
    except BadSignature:
        saved = None
    if not saved or not state or not secrets.compare_digest(str(saved.get("state")), state):
        return _problem(400, "The sign-in could not be matched to this browser (state mismatch or expired).")
    if error or not code:
        return _problem(401, f"GitHub did not sign you in: {error or 'no code'}.")
    try:
        login_name, user_id, ids, token = github_identity(config, code, str(request.url_for("auth_callback")))
    except PermissionError as exc:
        return _problem(401, f"GitHub refused the sign-in: {exc}")
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        return _problem(502, f"GitHub could not be asked who you are: {exc}")
    response = RedirectResponse(safe_next(saved.get("next")), 303)
    session_id = secrets.token_urlsafe(24)
    ACCESS.put(session_id, frozenset(ids))
    response.set_cookie(SESSION_COOKIE, session_value(config, login_name, user_id, token, session_id),
                        max_age=config.session_max_age_s, httponly=True, samesite="lax",
                        secure=config.secure_cookies)
    response.delete_cookie(OAUTH_COOKIE, path="/auth")
    return response


def same_origin(request: Request) -> bool:
    """Whether the request comes from a page of this site: its Origin (or, lacking one, its
    Referer) is this site's scheme and host. A request with neither is refused."""
    claimed = request.headers.get("origin") or request.headers.get("referer")
    if not claimed or claimed == "null":
        return False
    parts = urlsplit(claimed)
    return f"{parts.scheme}://{parts.netloc}" == f"{request.url.scheme}://{request.url.netloc}"


@router.post("/logout")
def logout(request: Request):
    config = get_config(request)
    if not same_origin(request):
        return _problem(403, "Signing out must come from a page of this site.")
    revoke_session(config, request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/auth/login" if not config.local else "/", 303)
    response.delete_cookie(SESSION_COOKIE)
    return response
