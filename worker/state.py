"""Scan state transitions: compare-and-set in the database, each one recorded with a timestamp.

Every stage moves a scan only from the states it owns, in one UPDATE ... WHERE state IN (...);
when two copies of a task run (a redelivered message), only one transition succeeds and only its
task enqueues the next stage.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from sqlalchemy import text, update
from sqlalchemy.orm import Session

from app.db.models import TERMINAL_STATES, Scan, ScanEvent, ScanState, utcnow


def transition(session: Session, scan_id: int, from_states: Iterable[ScanState], to_state: ScanState,
               reason: str | None = None) -> bool:
    """Move the scan to ``to_state`` if it is in one of ``from_states``; commit. True if it moved."""
    now = utcnow()
    values = {"state": to_state, "updated_at": now}
    if to_state in TERMINAL_STATES:
        values["finished_at"] = now
        values["reason"] = reason
    elif reason is not None:
        values["reason"] = reason
    result = session.execute(
        update(Scan)
        .where(Scan.id == scan_id, Scan.state.in_([s.value for s in from_states]))
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    moved = result.rowcount == 1
    if moved:
        session.add(ScanEvent(scan_id=scan_id, state=to_state, reason=reason, at=now))
    session.commit()
    return moved


def finish(session: Session, scan_id: int, state: ScanState, reason: str) -> bool:
    """End a scan (done, failed, skipped) from whatever non-terminal state it is in."""
    live = [s for s in ScanState if s not in TERMINAL_STATES]
    return transition(session, scan_id, live, state, reason)


def new_scan(session: Session, *, repository_id: int, trigger: str, delivery_id: str | None,
             head_sha: str | None = None, force_recreate: bool = False) -> Scan:
    scan = Scan(repository_id=repository_id, trigger=trigger, delivery_id=delivery_id, head_sha=head_sha,
                state=ScanState.queued, force_recreate=force_recreate)
    session.add(scan)
    session.flush()
    session.add(ScanEvent(scan_id=scan.id, state=ScanState.queued, reason=f"triggered by {trigger}"))
    return scan


@contextmanager
def publish_lock(session: Session, repository_id: int) -> Iterator[None]:
    """Serialise publishing per repository across workers (two scans of one repository, or two
    copies of one task, must not both open the pull request of an identity).

    A Postgres advisory lock held by a connection of its own, so the work session may commit
    while it is held. SQLite, the single-machine development database, serialises writers itself.
    """
    bind = session.get_bind()
    if bind.dialect.name != "postgresql":
        yield
        return
    key = int.from_bytes(hashlib.sha256(f"adopter-publish:{repository_id}".encode()).digest()[:8], "big",
                         signed=True)
    with bind.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
        try:
            yield
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            connection.commit()
