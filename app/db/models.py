"""The service's database: SQLAlchemy 2 models. Alembic (``migrations/``) is the only way they change.

What each table holds, in the order a scan meets them:

- ``installations``: one row per GitHub App installation (GitHub's id is the key).
- ``repositories``: repositories an installation gave us (GitHub's id is the key).
- ``deliveries``: every webhook delivery we accepted, keyed by ``X-GitHub-Delivery``; a redelivery
  of the same id finds its row and does nothing twice.
- ``scans``: one run of the pipeline over one commit of one repository, with its current ``state``
  and, in ``scan_events``, every state it went through with a timestamp.
- ``findings``: what the engine reported for a scan (rewritten, guarded, near-miss).
- ``change_sets``: a group of rewritten findings that becomes one pull request. Its ``identity``
  (deterministic, e.g. ``adopter/sdpa-attention``) names the branch and the pull request.
- ``results``: verification and benchmark figures of one change set.
- ``pull_requests``: the pull request of an identity in a repository, the commit we last pushed,
  whether a person pushed to its branch.
- ``ignored_identities``: identities a person rejected (closed unmerged, or ``@adopter ignore``),
  with the digest of the code they touched: ignored until that code changes.
- ``task_runs``: how long each pipeline task took and how it ended (for ``/metrics``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    # Deterministic constraint names, so migrations can name what they alter on every backend.
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class ScanState(StrEnum):
    queued = "queued"
    cloning = "cloning"
    scanning = "scanning"
    verifying = "verifying"
    benchmarking = "benchmarking"
    publishing = "publishing"
    done = "done"
    failed = "failed"
    skipped = "skipped"


TERMINAL_STATES = frozenset({ScanState.done, ScanState.failed, ScanState.skipped})


class DeliveryStatus(StrEnum):
    received = "received"  # stored and (unless the broker was down) queued; no worker has handled it yet
    processed = "processed"  # a worker handled it
    ignored = "ignored"  # an event or action Adopter does not act on (stored and acknowledged)
    failed = "failed"  # a worker could not handle it; ``detail`` says why
    rejected = "rejected"  # signed, but not a payload Adopter can handle (not JSON, wrong shape); ``detail`` says why


class PullRequestState(StrEnum):
    pending = "pending"  # commit made, pull request not yet opened (a task died in between)
    open = "open"
    closed = "closed"
    merged = "merged"


class Installation(Base):
    __tablename__ = "installations"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    account_login: Mapped[str] = mapped_column(String(255))
    account_type: Mapped[str | None] = mapped_column(String(32))
    permissions: Mapped[dict] = mapped_column(JSON, default=dict)
    suspended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    repositories: Mapped[list[Repository]] = relationship(back_populates="installation")

    @property
    def active(self) -> bool:
        return self.deleted_at is None and self.suspended_at is None


class Repository(Base):
    __tablename__ = "repositories"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    installation_id: Mapped[int] = mapped_column(ForeignKey("installations.id"), index=True)
    full_name: Mapped[str] = mapped_column(String(255), index=True)
    private: Mapped[bool] = mapped_column(Boolean, default=False)
    default_branch: Mapped[str | None] = mapped_column(String(255))
    # Set when the installation no longer includes the repository (or was deleted).
    removed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    installation: Mapped[Installation] = relationship(back_populates="repositories")
    scans: Mapped[list[Scan]] = relationship(back_populates="repository", order_by="Scan.id")


class Delivery(Base):
    __tablename__ = "deliveries"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # X-GitHub-Delivery
    event: Mapped[str] = mapped_column(String(64), index=True)  # X-GitHub-Event
    action: Mapped[str | None] = mapped_column(String(64))
    installation_id: Mapped[int | None] = mapped_column(BigInteger)
    repository_id: Mapped[int | None] = mapped_column(BigInteger)
    payload: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=DeliveryStatus.received, index=True)
    detail: Mapped[str | None] = mapped_column(Text)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    processed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Scan(Base):
    __tablename__ = "scans"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id"), index=True)
    # The delivery that asked for the scan; (delivery, repository) is unique so a redelivered or
    # re-processed webhook never starts a second scan.
    delivery_id: Mapped[str | None] = mapped_column(ForeignKey("deliveries.id"))
    trigger: Mapped[str] = mapped_column(String(32))  # installation, push, comment, ...
    head_sha: Mapped[str | None] = mapped_column(String(40))  # known from a push; else set by clone
    branch: Mapped[str | None] = mapped_column(String(255))  # the default branch scanned
    state: Mapped[str] = mapped_column(String(16), default=ScanState.queued, index=True)
    reason: Mapped[str | None] = mapped_column(Text)  # why failed/skipped, or what done means
    # ``@adopter recreate``: rebuild the branch even if a person pushed to it.
    force_recreate: Mapped[bool] = mapped_column(Boolean, default=False)
    config: Mapped[dict | None] = mapped_column(JSON)  # the repository's adopter.yml, validated
    # How the scan was run (rules, paths, verify/bench, device, dtype, rounds, min_gain, ...): what a
    # command line or the App chose, apart from the repository's own file above.
    options: Mapped[dict | None] = mapped_column(JSON)
    diff: Mapped[str | None] = mapped_column(Text)  # the engine's unified diff of the whole scan
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (UniqueConstraint("delivery_id", "repository_id", name="uq_scans_delivery_repository"),)

    repository: Mapped[Repository] = relationship(back_populates="scans")
    events: Mapped[list[ScanEvent]] = relationship(back_populates="scan", order_by="ScanEvent.id")
    findings: Mapped[list[Finding]] = relationship(back_populates="scan", order_by="Finding.id")
    change_sets: Mapped[list[ChangeSet]] = relationship(back_populates="scan", order_by="ChangeSet.id")


class ScanEvent(Base):
    """One state a scan entered, when, and why."""

    __tablename__ = "scan_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scan_id: Mapped[int] = mapped_column(ForeignKey("scans.id", ondelete="CASCADE"), index=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    scan: Mapped[Scan] = relationship(back_populates="events")


class Finding(Base):
    __tablename__ = "findings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scan_id: Mapped[int] = mapped_column(ForeignKey("scans.id", ondelete="CASCADE"), index=True)
    rule_id: Mapped[str] = mapped_column(String(128))
    path: Mapped[str] = mapped_column(String(1024))
    line: Mapped[int] = mapped_column(Integer)
    end_line: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))  # rewritten, guarded, near-miss
    reason: Mapped[str | None] = mapped_column(Text)
    message: Mapped[str | None] = mapped_column(Text)
    # Where the finding is in SARIF's terms (engine.sarif.Place), computed while the scan had the
    # checkout, so the code-scanning upload needs no files: the matched nodes' spans with code-point
    # columns, the call sites of inlined helpers (engine.sarif.Region dicts), and the fingerprint that
    # follows the finding across commits. NULL in scans stored before these were kept.
    locations: Mapped[list | None] = mapped_column(JSON)
    related_locations: Mapped[list | None] = mapped_column(JSON)
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    class_name: Mapped[str | None] = mapped_column(Text)  # where the match is: class and method
    method_name: Mapped[str | None] = mapped_column(Text)
    guard: Mapped[str | None] = mapped_column(Text)  # guarded: the condition under which the original runs

    scan: Mapped[Scan] = relationship(back_populates="findings")


class ChangeSet(Base):
    """Rewritten findings grouped under one identity: what one pull request proposes."""

    __tablename__ = "change_sets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scan_id: Mapped[int] = mapped_column(ForeignKey("scans.id", ondelete="CASCADE"), index=True)
    identity: Mapped[str] = mapped_column(String(255))
    rule_ids: Mapped[list] = mapped_column(JSON)
    files: Mapped[dict] = mapped_column(JSON)  # relative path -> rewritten text
    diff: Mapped[str] = mapped_column(Text)
    # sha256 of the original text of the touched files: an ignored identity wakes when it changes.
    code_digest: Mapped[str] = mapped_column(String(64))
    # sha256 of everything verification depends on (the repository's code and config, the proposed
    # files): equal digests give equal results, so a docs-only push reuses the earlier figures.
    inputs_digest: Mapped[str | None] = mapped_column(String(64), index=True)
    # What became of it: published, or why not (verification failed, gain below threshold, ...).
    outcome: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (UniqueConstraint("scan_id", "identity", name="uq_change_sets_scan_identity"),)

    scan: Mapped[Scan] = relationship(back_populates="change_sets")
    result: Mapped[Result | None] = relationship(back_populates="change_set", uselist=False)


class Result(Base):
    """Verification and benchmark figures of one change set."""

    __tablename__ = "results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    change_set_id: Mapped[int] = mapped_column(
        ForeignKey("change_sets.id", ondelete="CASCADE"), unique=True
    )
    verified: Mapped[bool] = mapped_column(Boolean)
    max_abs_error: Mapped[float | None] = mapped_column(Float)
    device: Mapped[str | None] = mapped_column(String(64))
    before_s: Mapped[float | None] = mapped_column(Float)  # median training-step time, original
    after_s: Mapped[float | None] = mapped_column(Float)  # median training-step time, rewritten
    speedup: Mapped[float | None] = mapped_column(Float)  # before_s / after_s
    peak_mem_before: Mapped[int | None] = mapped_column(BigInteger)  # bytes
    peak_mem_after: Mapped[int | None] = mapped_column(BigInteger)
    versions: Mapped[dict] = mapped_column(JSON, default=dict)  # torch, python, engine ...
    details: Mapped[dict] = mapped_column(JSON, default=dict)  # the engine's full report
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    change_set: Mapped[ChangeSet] = relationship(back_populates="result")


class PullRequest(Base):
    __tablename__ = "pull_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id"), index=True)
    identity: Mapped[str] = mapped_column(String(255))
    branch: Mapped[str] = mapped_column(String(255))
    base_branch: Mapped[str] = mapped_column(String(255))
    number: Mapped[int | None] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(String(255))
    html_url: Mapped[str | None] = mapped_column(String(1024))
    state: Mapped[str] = mapped_column(String(16), default=PullRequestState.pending)
    head_sha: Mapped[str | None] = mapped_column(String(40))  # the commit Adopter last pushed
    base_sha: Mapped[str | None] = mapped_column(String(40))  # the base that commit sits on
    code_digest: Mapped[str | None] = mapped_column(String(64))  # see ChangeSet.code_digest
    content_digest: Mapped[str | None] = mapped_column(String(64))  # sha256 of the proposed files
    person_pushed: Mapped[bool] = mapped_column(Boolean, default=False)
    last_scan_id: Mapped[int | None] = mapped_column(ForeignKey("scans.id"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        UniqueConstraint("repository_id", "identity", name="uq_pull_requests_repository_identity"),
        Index("ix_pull_requests_repository_number", "repository_id", "number"),
    )


class IgnoredIdentity(Base):
    __tablename__ = "ignored_identities"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id"), index=True)
    identity: Mapped[str] = mapped_column(String(255))
    code_digest: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        UniqueConstraint("repository_id", "identity", name="uq_ignored_identities_repository_identity"),
    )


class TaskRun(Base):
    __tablename__ = "task_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task: Mapped[str] = mapped_column(String(64), index=True)
    scan_id: Mapped[int | None] = mapped_column(ForeignKey("scans.id", ondelete="SET NULL"))
    outcome: Mapped[str] = mapped_column(String(16))  # ok, retry, failed
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    duration_s: Mapped[float] = mapped_column(Float)
