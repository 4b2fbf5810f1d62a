"""Which webhook events and actions Adopter acts on.

Everything else is stored and acknowledged (status ``ignored``), never an error: GitHub sends the
events an App subscribed to, and a subscription can be wider than what this version handles.
"""

from __future__ import annotations

# event -> actions handled (None: the event has no action field, e.g. push)
HANDLED: dict[str, frozenset[str | None]] = {
    "installation": frozenset({"created", "deleted", "suspend", "unsuspend", "new_permissions_accepted"}),
    "installation_repositories": frozenset({"added", "removed"}),
    "push": frozenset({None}),
    "pull_request": frozenset({"closed", "reopened", "synchronize"}),
    "issue_comment": frozenset({"created"}),
}


def will_handle(event: str, payload: dict) -> bool:
    """Whether a worker acts on this event and action (its payload must then fit ``shapes``)."""
    actions = HANDLED.get(event)
    return actions is not None and payload.get("action") in actions


def ignore_reason(event: str, payload: dict) -> str | None:
    """Why a delivery needs no work (stored as ``ignored``), or None when a worker must handle it."""
    if event == "ping":
        return "ping"
    actions = HANDLED.get(event)
    if actions is None:
        return f"event {event!r} is not handled"
    action = payload.get("action")
    if action not in actions:
        return f"action {action!r} of {event!r} is not handled"
    if event == "push":
        if payload.get("deleted"):
            return "branch or tag deletion"
        repository = payload.get("repository") if isinstance(payload.get("repository"), dict) else {}
        default = repository.get("default_branch")
        if payload.get("ref") != f"refs/heads/{default}":
            return f"push to {payload.get('ref')!r}, not to the default branch {default!r}"
    return None
