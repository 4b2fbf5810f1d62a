"""GitHub App authentication (PyGithub ``Auth.AppAuth``) against the configured API URL.

Only the control worker and the API import this module: it reads the App's private key. Clones
use ``repository_token``, a token GitHub scopes to one repository with read-only contents, so the
token a runner receives can read that repository's code and nothing else (not another repository
of the installation, not a branch to create, not a pull request to open).

One client per installation per process; PyGithub's installation auth keeps the installation token
and fetches a new one shortly before it expires, so tokens are cached until then. Objects are lazy: a
repository is fetched only when one of its attributes is read. PyGithub's own retry loop is off: a task must not sleep through a rate limit, it is rescheduled instead (see
``retry_delay``).
"""

from __future__ import annotations

import threading
from email.utils import parsedate_to_datetime
from time import time

import requests
from github import Auth, Github, GithubException

from app.settings import get_settings


class AppNotConfigured(RuntimeError):
    pass


_lock = threading.Lock()
_clients: dict[tuple[str, int], tuple[Github, Auth.AppInstallationAuth]] = {}


def _installation(installation_id: int) -> tuple[Github, Auth.AppInstallationAuth]:
    settings = get_settings()
    key = (settings.github_api_url, installation_id)
    with _lock:
        if key not in _clients:
            private_key = settings.private_key()
            if not (settings.github_app_id and private_key):
                raise AppNotConfigured("ADOPTER_GITHUB_APP_ID and the App's private key are required "
                                       "to talk to GitHub")
            app_auth = Auth.AppAuth(int(settings.github_app_id), private_key)
            installation_auth = app_auth.get_installation_auth(installation_id)
            client = Github(base_url=settings.github_api_url, auth=installation_auth, retry=None,
                            timeout=30, per_page=100, lazy=True)
            _clients[key] = (client, installation_auth)
        return _clients[key]


def client_for(installation_id: int) -> Github:
    return _installation(installation_id)[0]


def installation_token(installation_id: int) -> str:
    """A valid installation access token (cached until shortly before it expires)."""
    return _installation(installation_id)[1].token


# Read the code of one repository: all a clone needs (metadata:read comes with every token).
READ_CONTENTS = {"contents": "read"}


def repository_token(installation_id: int, repository_id: int, permissions: dict[str, str] | None = None) -> str:
    """A fresh installation token for one repository with ``permissions`` (default: contents read).

    ``POST /app/installations/{id}/access_tokens`` with ``repository_ids`` and ``permissions``:
    GitHub refuses (422) a repository outside the installation or a permission it was not granted,
    and the token expires after an hour. A GithubException on failure (``retry_delay`` applies).
    """
    settings = get_settings()
    private_key = settings.private_key()
    if not (settings.github_app_id and private_key):
        raise AppNotConfigured("ADOPTER_GITHUB_APP_ID and the App's private key are required to mint tokens")
    app_jwt = Auth.AppAuth(int(settings.github_app_id), private_key).token
    response = requests.post(
        f"{settings.github_api_url}/app/installations/{installation_id}/access_tokens",
        json={"repository_ids": [repository_id], "permissions": permissions or READ_CONTENTS},
        headers={"Authorization": f"Bearer {app_jwt}", "Accept": "application/vnd.github+json",
                 "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "adopter"},
        timeout=30,
    )
    try:
        data = response.json()
    except ValueError:
        data = {"message": response.text[:500]}
    if response.status_code != 201 or not isinstance(data, dict) or not isinstance(data.get("token"), str):
        raise GithubException(response.status_code, data, dict(response.headers))
    return data["token"]


# GitHub's legacy base roles (``permission``): maintain is reported as write, triage as read.
WRITE_PERMISSIONS = frozenset({"admin", "write"})


def has_write_access(installation_id: int, full_name: str, login: str) -> bool:
    """Whether ``login`` may push to ``full_name``, as GitHub's collaborator permission API says.

    ``GET /repos/{owner}/{repo}/collaborators/{username}/permission``; 404 (not a user, or not one
    the App can see) means no. Other errors propagate (a command is never run on a guess).
    """
    try:
        permission = client_for(installation_id).get_repo(full_name).get_collaborator_permission(login)
    except GithubException as exc:
        if exc.status == 404:
            return False
        raise
    return permission in WRITE_PERMISSIONS


def forget_clients() -> None:
    with _lock:
        _clients.clear()


def retry_delay(exc: BaseException, attempt: int) -> float | None:
    """Seconds to wait before retrying after ``exc``, or None when retrying cannot help.

    Transient: network errors, GitHub 5xx, and rate limits (primary or secondary), which say when
    to come back through ``retry-after`` or ``x-ratelimit-reset``.
    """
    backoff = min(2 ** attempt * 5, 600)
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return backoff
    if isinstance(exc, GithubException):
        headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
        if exc.status in (403, 429) and ("retry-after" in headers or headers.get("x-ratelimit-remaining") == "0"):
            return _rate_limit_wait(headers, backoff)
        if exc.status >= 500:
            return backoff
    return None


def _rate_limit_wait(headers: dict[str, str], fallback: float) -> float:
    value = headers.get("retry-after")
    if value:
        if value.isdigit():
            return float(value)
        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time())
        except (TypeError, ValueError):
            pass
    reset = headers.get("x-ratelimit-reset")
    if reset and reset.isdigit():
        return max(1.0, float(reset) - time())
    return fallback
