"""What each webhook event does to the database (and, for comments, on GitHub).

``handle(session, delivery)`` returns the ids of scans that must be (re)started. It is safe to run
twice for the same delivery: scans are unique per (delivery, repository), rows are upserted, and a
processed delivery only returns its still-queued scans (a worker may have died before enqueueing).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import (
    Delivery,
    DeliveryStatus,
    IgnoredIdentity,
    Installation,
    PullRequest,
    PullRequestState,
    Repository,
    Scan,
    ScanState,
    utcnow,
)
from app.settings import get_settings
from worker import github_client
from worker.state import new_scan


def upsert_installation(session: Session, data: dict) -> Installation:
    installation = session.get(Installation, data["id"])
    if installation is None:
        installation = Installation(id=data["id"], account_login="", permissions={})
        session.add(installation)
    account = data.get("account") or {}
    installation.account_login = account.get("login") or installation.account_login or "unknown"
    installation.account_type = account.get("type") or installation.account_type
    if "permissions" in data:
        installation.permissions = data["permissions"]
    return installation


def upsert_repository(session: Session, installation_id: int, data: dict) -> Repository:
    repository = session.get(Repository, data["id"])
    if repository is None:
        repository = Repository(id=data["id"], installation_id=installation_id, full_name=data["full_name"])
        session.add(repository)
    repository.installation_id = installation_id
    repository.full_name = data["full_name"]
    repository.private = bool(data.get("private", repository.private or False))
    if data.get("default_branch"):
        repository.default_branch = data["default_branch"]
    repository.removed_at = None
    return repository


def _scan_once(session: Session, delivery: Delivery, repository: Repository, trigger: str, **kwargs) -> Scan:
    existing = session.scalar(
        select(Scan).where(Scan.delivery_id == delivery.id, Scan.repository_id == repository.id)
    )
    return existing or new_scan(session, repository_id=repository.id, trigger=trigger,
                                delivery_id=delivery.id, **kwargs)


def _on_installation(session: Session, delivery: Delivery, payload: dict) -> str:
    action = payload["action"]
    installation = upsert_installation(session, payload["installation"])
    now = utcnow()
    if action == "created":
        installation.deleted_at = installation.suspended_at = None
        session.flush()
        for data in payload.get("repositories") or []:
            repository = upsert_repository(session, installation.id, data)
            session.flush()
            _scan_once(session, delivery, repository, "installation")
        return f"installed on {len(payload.get('repositories') or [])} repositories"
    if action == "deleted":
        installation.deleted_at = now
        for repository in installation.repositories:
            repository.removed_at = now
        return "uninstalled"
    if action == "suspend":
        installation.suspended_at = now
        return "suspended"
    if action == "unsuspend":
        installation.suspended_at = None
        return "unsuspended"
    return "permissions updated"  # new_permissions_accepted: upsert stored them


def _on_installation_repositories(session: Session, delivery: Delivery, payload: dict) -> str:
    installation = upsert_installation(session, payload["installation"])
    session.flush()
    if payload["action"] == "added":
        for data in payload.get("repositories_added") or []:
            repository = upsert_repository(session, installation.id, data)
            session.flush()
            _scan_once(session, delivery, repository, "repository added")
        return f"{len(payload.get('repositories_added') or [])} repositories added"
    for data in payload.get("repositories_removed") or []:
        repository = session.get(Repository, data["id"])
        if repository is not None:
            repository.removed_at = utcnow()
    return f"{len(payload.get('repositories_removed') or [])} repositories removed"


def _on_push(session: Session, delivery: Delivery, payload: dict) -> str:
    # The receiver already ignored deletions and pushes to other branches.
    data = payload["repository"]
    installation_data = payload.get("installation") or {}
    if "id" not in installation_data:
        return "push without an installation: not for this App"
    if session.get(Installation, installation_data["id"]) is None:
        owner = data.get("owner") or {}
        upsert_installation(session, {"id": installation_data["id"], "account": owner})
        session.flush()
    repository = upsert_repository(session, installation_data["id"], data)
    session.flush()
    scan = _scan_once(session, delivery, repository, "push", head_sha=payload.get("after"))
    return f"scan {scan.id} of {payload.get('after')}"


def _our_pull_request(session: Session, payload: dict, number: int) -> PullRequest | None:
    repository_id = (payload.get("repository") or {}).get("id")
    return session.scalar(
        select(PullRequest).where(PullRequest.repository_id == repository_id, PullRequest.number == number)
    )


def ignore_identity(session: Session, record: PullRequest, reason: str) -> None:
    ignored = session.scalar(select(IgnoredIdentity).where(
        IgnoredIdentity.repository_id == record.repository_id, IgnoredIdentity.identity == record.identity))
    if ignored is None:
        ignored = IgnoredIdentity(repository_id=record.repository_id, identity=record.identity, reason=reason)
        session.add(ignored)
    ignored.code_digest, ignored.reason = record.code_digest, reason


def unignore_identity(session: Session, record: PullRequest) -> None:
    ignored = session.scalar(select(IgnoredIdentity).where(
        IgnoredIdentity.repository_id == record.repository_id, IgnoredIdentity.identity == record.identity))
    if ignored is not None:
        session.delete(ignored)


def _on_pull_request(session: Session, delivery: Delivery, payload: dict) -> str:
    pull = payload["pull_request"]
    record = _our_pull_request(session, payload, pull["number"])
    if record is None:
        return "not an Adopter pull request"
    action = payload["action"]
    if action == "closed":
        record.closed_at = utcnow()
        if pull.get("merged"):
            record.state = PullRequestState.merged
            return f"#{record.number} merged"
        record.state = PullRequestState.closed
        ignore_identity(session, record, f"#{record.number} closed unmerged")
        return f"#{record.number} closed unmerged: {record.identity} ignored until its code changes"
    if action == "reopened":
        record.state, record.closed_at = PullRequestState.open, None
        unignore_identity(session, record)
        return f"#{record.number} reopened"
    # synchronize: a head that is not the commit Adopter pushed means a person pushed.
    if (pull.get("head") or {}).get("sha") != record.head_sha:
        record.person_pushed = True
        return f"#{record.number}: a person pushed; the branch will not be force-pushed"
    return f"#{record.number}: Adopter's own push"


def parse_command(body: str, mention: str) -> str | None:
    match = re.search(rf"(?im)^\s*{re.escape(mention)}\s+([a-z-]+)\b", body or "")
    return match.group(1).lower() if match else None


def _react(payload: dict, content: str) -> None:
    gh = github_client.client_for(payload["installation"]["id"])
    repo = gh.get_repo(payload["repository"]["full_name"])
    repo.get_issue(payload["issue"]["number"]).get_comment(payload["comment"]["id"]).create_reaction(content)


def _on_issue_comment(session: Session, delivery: Delivery, payload: dict) -> str:
    comment, issue = payload["comment"], payload["issue"]
    if (comment.get("user") or {}).get("type") == "Bot" or comment.get("performed_via_github_app"):
        return "comment by a bot"
    if not issue.get("pull_request"):
        return "comment on an issue, not a pull request"
    command = parse_command(comment.get("body") or "", get_settings().bot_mention)
    if command is None:
        return "no command"
    record = _our_pull_request(session, payload, issue["number"])
    if record is None:
        return "comment on a pull request Adopter did not open"
    repository = session.get(Repository, record.repository_id)
    login = (comment.get("user") or {}).get("login")
    if not isinstance(login, str) or not login:
        return "command from a comment without an author: no action"
    # Only people who may push to the repository command Adopter (recreate force-pushes, ignore
    # closes): GitHub's collaborator permission API decides, not the payload's author_association.
    if not github_client.has_write_access(repository.installation_id, repository.full_name, login):
        return f"command {command!r} from {login}, who has no write access to {repository.full_name}: no action"
    if command in ("rescan", "recreate"):
        if command == "recreate":
            unignore_identity(session, record)
        _scan_once(session, delivery, repository, f"comment: {command}", force_recreate=command == "recreate")
        reaction = "+1"
    elif command == "ignore":
        ignore_identity(session, record, f"{comment['user']['login']} commented ignore on #{record.number}")
        gh = github_client.client_for(payload["installation"]["id"])
        gh.get_repo(repository.full_name).get_pull(record.number).edit(state="closed")
        record.state, record.closed_at = PullRequestState.closed, utcnow()
        reaction = "+1"
    else:
        reaction = "confused"
    session.flush()
    _react(payload, reaction)
    return f"command {command!r} on #{record.number}"


HANDLERS: dict[str, Callable[[Session, Delivery, dict], str]] = {
    "installation": _on_installation,
    "installation_repositories": _on_installation_repositories,
    "push": _on_push,
    "pull_request": _on_pull_request,
    "issue_comment": _on_issue_comment,
}


def handle(session: Session, delivery_id: str) -> list[int]:
    """Apply one stored delivery; return the ids of its scans still waiting to start."""
    delivery = session.get(Delivery, delivery_id, with_for_update=True)
    if delivery is None:
        return []
    if delivery.status not in (DeliveryStatus.processed, DeliveryStatus.ignored):
        handler = HANDLERS.get(delivery.event)
        detail = handler(session, delivery, delivery.payload) if handler else f"no handler for {delivery.event}"
        delivery.status, delivery.detail, delivery.processed_at = DeliveryStatus.processed, detail, utcnow()
    session.commit()
    return list(session.scalars(
        select(Scan.id).where(Scan.delivery_id == delivery_id, Scan.state == ScanState.queued).order_by(Scan.id)
    ))
