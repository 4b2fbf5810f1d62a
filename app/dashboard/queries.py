"""The dashboard's reads: plain functions over a session, each narrowed to what the viewer may see.

Routes stay thin (``api.py`` answers JSON, ``pages.py`` renders HTML); both call these.
Every query goes through ``_visible`` (repositories of the viewer's installations), so a scan,
repository or pull request of another installation is simply not found.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import Select, exists, func, select
from sqlalchemy.orm import Session

from app.dashboard.access import Viewer
from app.dashboard.changes import finding_changes, rule_trends
from app.dashboard.schemas import (
    ChangeSetOut,
    ChartPoint,
    FindingOut,
    IgnoredIdentityOut,
    InstallationSummary,
    Overview,
    PullRequestOut,
    RepositoryDetail,
    RepositoryPage,
    RepositorySummary,
    ResultOut,
    ScanDetail,
    ScanEventOut,
    ScanPage,
    ScanStatus,
    ScanSummary,
    TaskRunOut,
    Totals,
)
from app.dashboard.verification import benchmark_view, verification_view
from app.db.models import (
    TERMINAL_STATES,
    ChangeSet,
    Finding,
    IgnoredIdentity,
    Installation,
    PullRequest,
    Repository,
    Result,
    Scan,
    ScanEvent,
    ScanState,
    TaskRun,
)

DEFAULT_PER_PAGE = 25
MAX_PER_PAGE = 100
STATES = [s.value for s in ScanState]
FINDING_STATUSES = ("rewritten", "guarded", "near-miss")


@dataclass(frozen=True)
class ScanFilters:
    repository_id: int | None = None
    installation_id: int | None = None
    state: str | None = None
    rule: str | None = None
    since: date | None = None
    until: date | None = None  # inclusive: scans created on this day count

    def query_items(self) -> dict[str, str]:
        """The filters as query-string parameters (for links that keep them)."""
        out = {"repository": self.repository_id, "installation": self.installation_id, "state": self.state,
               "rule": self.rule, "since": self.since, "until": self.until}
        return {k: str(v) for k, v in out.items() if v not in (None, "")}


def _visible(stmt: Select, viewer: Viewer) -> Select:
    if viewer.installation_ids is None:
        return stmt
    return stmt.where(Repository.installation_id.in_(sorted(viewer.installation_ids)))


def _pages(total: int, per_page: int) -> int:
    return max(1, -(-total // per_page))


def _page_args(page: int, per_page: int) -> tuple[int, int]:
    return max(1, page), min(max(1, per_page), MAX_PER_PAGE)


def memory_reduction(before: int | None, after: int | None) -> float | None:
    if not before or after is None or before <= 0:
        return None
    return 1.0 - after / before


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything stored is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


# --- scans -------------------------------------------------------------------------------------


def scan_select(viewer: Viewer, filters: ScanFilters) -> Select:
    stmt = _visible(select(Scan, Repository.full_name).join(Repository, Scan.repository_id == Repository.id), viewer)
    if filters.repository_id is not None:
        stmt = stmt.where(Scan.repository_id == filters.repository_id)
    if filters.installation_id is not None:
        stmt = stmt.where(Repository.installation_id == filters.installation_id)
    if filters.state:
        stmt = stmt.where(Scan.state == filters.state)
    if filters.rule:
        stmt = stmt.where(exists(select(Finding.id).where(Finding.scan_id == Scan.id,
                                                          Finding.rule_id == filters.rule)))
    if filters.since:
        stmt = stmt.where(Scan.created_at >= datetime.combine(filters.since, time.min, UTC))
    if filters.until:
        stmt = stmt.where(Scan.created_at < datetime.combine(filters.until + timedelta(days=1), time.min, UTC))
    return stmt


def summarize(session: Session, rows: list[tuple[Scan, str]]) -> list[ScanSummary]:
    """Scan rows (with their repository's name) -> summaries, with two grouped queries for all."""
    ids = [scan.id for scan, _ in rows]
    counts: dict[int, dict[str, int]] = {}
    figures: dict[int, list[tuple[bool, float | None, float | None]]] = {}
    if ids:
        for scan_id, status, n in session.execute(
                select(Finding.scan_id, Finding.status, func.count()).where(Finding.scan_id.in_(ids))
                .group_by(Finding.scan_id, Finding.status)):
            counts.setdefault(scan_id, {})[status] = n
        for scan_id, verified, speedup, before, after in session.execute(
                select(ChangeSet.scan_id, Result.verified, Result.speedup, Result.peak_mem_before,
                       Result.peak_mem_after).join(Result, Result.change_set_id == ChangeSet.id)
                .where(ChangeSet.scan_id.in_(ids))):
            figures.setdefault(scan_id, []).append((bool(verified), speedup, memory_reduction(before, after)))
    out = []
    for scan, repo_name in rows:
        c = counts.get(scan.id, {})
        f = figures.get(scan.id, [])
        speedups = [s for _, s, _ in f if s is not None]
        reductions = [m for _, _, m in f if m is not None]
        out.append(ScanSummary(
            id=scan.id, repository_id=scan.repository_id, repository=repo_name, state=scan.state,
            trigger=scan.trigger, head_sha=scan.head_sha, branch=scan.branch, reason=scan.reason,
            created_at=_utc(scan.created_at), updated_at=_utc(scan.updated_at), finished_at=_utc(scan.finished_at),
            rewritten=c.get("rewritten", 0), guarded=c.get("guarded", 0), near_miss=c.get("near-miss", 0),
            verified=any(v for v, _, _ in f) if f else None,
            speedup=max(speedups) if speedups else None, memory_reduction=max(reductions) if reductions else None,
            terminal=scan.state in TERMINAL_STATES,
        ))
    return out


def list_scans(session: Session, viewer: Viewer, filters: ScanFilters, page: int = 1,
               per_page: int = DEFAULT_PER_PAGE) -> ScanPage:
    page, per_page = _page_args(page, per_page)
    stmt = scan_select(viewer, filters)
    total = session.scalar(select(func.count()).select_from(stmt.with_only_columns(Scan.id).subquery()))
    rows = session.execute(stmt.order_by(Scan.created_at.desc(), Scan.id.desc())
                           .offset((page - 1) * per_page).limit(per_page)).all()
    return ScanPage(items=summarize(session, [tuple(r) for r in rows]), total=total, page=page,
                    per_page=per_page, pages=_pages(total, per_page))


def rule_ids(session: Session, viewer: Viewer, repository_id: int | None = None) -> list[str]:
    """Rule ids that appear in the viewer's findings (the choices of the rule filter)."""
    stmt = (select(Finding.rule_id).distinct().join(Scan, Finding.scan_id == Scan.id)
            .join(Repository, Scan.repository_id == Repository.id))
    if repository_id is not None:
        stmt = stmt.where(Scan.repository_id == repository_id)
    return sorted(session.scalars(_visible(stmt, viewer)))


def get_scan(session: Session, viewer: Viewer, scan_id: int) -> tuple[Scan, str] | None:
    row = session.execute(scan_select(viewer, ScanFilters()).where(Scan.id == scan_id)).first()
    return tuple(row) if row else None


def _pull_out(pr: PullRequest) -> PullRequestOut:
    return PullRequestOut(id=pr.id, repository_id=pr.repository_id, identity=pr.identity, number=pr.number,
                          title=pr.title, html_url=pr.html_url, state=pr.state, branch=pr.branch,
                          created_at=_utc(pr.created_at), closed_at=_utc(pr.closed_at), last_scan_id=pr.last_scan_id)


def _events(session: Session, scan_id: int) -> list[ScanEventOut]:
    return [ScanEventOut(state=e.state, reason=e.reason, at=_utc(e.at))
            for e in session.scalars(select(ScanEvent).where(ScanEvent.scan_id == scan_id).order_by(ScanEvent.id))]


def scan_detail(session: Session, viewer: Viewer, scan_id: int) -> ScanDetail | None:
    found = get_scan(session, viewer, scan_id)
    if found is None:
        return None
    scan, _ = found
    findings = [FindingOut(id=f.id, rule_id=f.rule_id, status=f.status, path=f.path, line=f.line,
                           end_line=f.end_line, message=f.message, reason=f.reason)
                for f in session.scalars(select(Finding).where(Finding.scan_id == scan_id)
                                         .order_by(Finding.rule_id, Finding.path, Finding.line))]
    pulls = {pr.identity: pr for pr in session.scalars(
        select(PullRequest).where(PullRequest.repository_id == scan.repository_id))}
    change_sets = []
    for cs in session.scalars(select(ChangeSet).where(ChangeSet.scan_id == scan_id).order_by(ChangeSet.id)):
        r = cs.result
        result = None if r is None else ResultOut(
            verified=r.verified, max_abs_error=r.max_abs_error, device=r.device, before_s=r.before_s,
            after_s=r.after_s, speedup=r.speedup, peak_mem_before=r.peak_mem_before,
            peak_mem_after=r.peak_mem_after, memory_reduction=memory_reduction(r.peak_mem_before, r.peak_mem_after),
            versions=r.versions or {}, details=r.details or {},
            verification=verification_view(r.details, r.verified, r.max_abs_error),
            benchmark=benchmark_view(r.details))
        pr = pulls.get(cs.identity)
        change_sets.append(ChangeSetOut(id=cs.id, identity=cs.identity, rule_ids=list(cs.rule_ids or []),
                                        outcome=cs.outcome, diff=cs.diff, result=result,
                                        pull_request=_pull_out(pr) if pr else None))
    runs = [TaskRunOut(task=t.task, outcome=t.outcome, started_at=_utc(t.started_at), duration_s=t.duration_s)
            for t in session.scalars(select(TaskRun).where(TaskRun.scan_id == scan_id).order_by(TaskRun.id))]
    return ScanDetail(scan=summarize(session, [found])[0], events=_events(session, scan_id), findings=findings,
                      change_sets=change_sets, diff=scan.diff, config=scan.config, options=scan.options,
                      task_runs=runs)


def scan_status(session: Session, viewer: Viewer, scan_id: int) -> ScanStatus | None:
    found = get_scan(session, viewer, scan_id)
    if found is None:
        return None
    scan, _ = found
    return ScanStatus(id=scan.id, state=scan.state, reason=scan.reason, terminal=scan.state in TERMINAL_STATES,
                      updated_at=_utc(scan.updated_at), events=_events(session, scan_id))


def scan_states(session: Session, viewer: Viewer, ids: list[int]) -> dict[int, str]:
    if not ids:
        return {}
    stmt = _visible(select(Scan.id, Scan.state).join(Repository, Scan.repository_id == Repository.id), viewer)
    return dict(session.execute(stmt.where(Scan.id.in_(ids[:MAX_PER_PAGE]))).all())


# --- repositories and installations ------------------------------------------------------------


def list_repositories(session: Session, viewer: Viewer, *, installation_id: int | None = None, q: str | None = None,
                      page: int = 1, per_page: int = DEFAULT_PER_PAGE) -> RepositoryPage:
    page, per_page = _page_args(page, per_page)
    base = _visible(select(Repository.id), viewer)
    if installation_id is not None:
        base = base.where(Repository.installation_id == installation_id)
    if q:
        base = base.where(Repository.full_name.ilike(f"%{q}%"))
    total = session.scalar(select(func.count()).select_from(base.subquery()))
    stmt = (select(Repository, Installation.account_login, func.count(Scan.id), func.max(Scan.id))
            .join(Installation, Repository.installation_id == Installation.id)
            .outerjoin(Scan, Scan.repository_id == Repository.id)
            .where(Repository.id.in_(base))
            .group_by(Repository.id, Installation.account_login)
            .order_by(Repository.full_name, Repository.id).offset((page - 1) * per_page).limit(per_page))
    rows = session.execute(stmt).all()
    last = {sid: (state, at) for sid, state, at in session.execute(
        select(Scan.id, Scan.state, Scan.created_at).where(Scan.id.in_([r[3] for r in rows if r[3]])))}
    items = []
    for repo, account, n, last_id in rows:
        state, at = last.get(last_id, (None, None))
        items.append(RepositorySummary(
            id=repo.id, full_name=repo.full_name, installation_id=repo.installation_id, account=account,
            private=repo.private, default_branch=repo.default_branch, removed=repo.removed_at is not None,
            scans=n, last_scan_id=last_id, last_scan_state=state, last_scan_at=_utc(at)))
    return RepositoryPage(items=items, total=total, page=page, per_page=per_page, pages=_pages(total, per_page))


def get_repository(session: Session, viewer: Viewer, repository_id: int) -> RepositorySummary | None:
    stmt = _visible(select(Repository.id), viewer).where(Repository.id == repository_id)
    if session.scalar(stmt) is None:
        return None
    row = session.execute(
        select(Repository, Installation.account_login, func.count(Scan.id), func.max(Scan.id))
        .join(Installation, Repository.installation_id == Installation.id)
        .outerjoin(Scan, Scan.repository_id == Repository.id).where(Repository.id == repository_id)
        .group_by(Repository.id, Installation.account_login)).one()
    repo, account, n, last_id = row
    last = session.get(Scan, last_id) if last_id else None
    return RepositorySummary(
        id=repo.id, full_name=repo.full_name, installation_id=repo.installation_id, account=account,
        private=repo.private, default_branch=repo.default_branch, removed=repo.removed_at is not None, scans=n,
        last_scan_id=last_id, last_scan_state=last.state if last else None,
        last_scan_at=_utc(last.created_at) if last else None)


def chart_points(session: Session, repository_id: int) -> list[ChartPoint]:
    """Per scan with figures, oldest first: the best speedup and memory reduction it measured."""
    best: dict[int, list] = {}
    for scan_id, at, speedup, before, after in session.execute(
            select(Scan.id, Scan.created_at, Result.speedup, Result.peak_mem_before, Result.peak_mem_after)
            .join(ChangeSet, ChangeSet.scan_id == Scan.id).join(Result, Result.change_set_id == ChangeSet.id)
            .where(Scan.repository_id == repository_id).order_by(Scan.created_at, Scan.id)):
        point = best.setdefault(scan_id, [at, None, None])
        reduction = memory_reduction(before, after)
        if speedup is not None and (point[1] is None or speedup > point[1]):
            point[1] = speedup
        if reduction is not None and (point[2] is None or reduction > point[2]):
            point[2] = reduction
    return [ChartPoint(scan_id=sid, at=_utc(p[0]), speedup=p[1], memory_reduction=p[2]) for sid, p in best.items()]


def repository_detail(session: Session, viewer: Viewer, repository_id: int, filters: ScanFilters, page: int = 1,
                      per_page: int = DEFAULT_PER_PAGE) -> RepositoryDetail | None:
    repo = get_repository(session, viewer, repository_id)
    if repo is None:
        return None
    filters = ScanFilters(**{**filters.__dict__, "repository_id": repository_id})
    pulls = [_pull_out(pr) for pr in session.scalars(
        select(PullRequest).where(PullRequest.repository_id == repository_id)
        .order_by(PullRequest.created_at.desc(), PullRequest.id.desc()))]
    ignored = [IgnoredIdentityOut(identity=i.identity, reason=i.reason, code_digest=i.code_digest,
                                  created_at=_utc(i.created_at))
               for i in session.scalars(select(IgnoredIdentity).where(IgnoredIdentity.repository_id == repository_id)
                                        .order_by(IgnoredIdentity.created_at.desc()))]
    # The JSON column stores a missing config as JSON null on some backends (not SQL NULL): look at
    # the latest few scans instead of filtering in SQL.
    config_row = next((row for row in session.execute(
        select(Scan.id, Scan.config).where(Scan.repository_id == repository_id)
        .order_by(Scan.id.desc()).limit(20)) if row[1]), None)
    trend_scans, trends = rule_trends(session, repository_id)
    return RepositoryDetail(
        repository=repo, scans=list_scans(session, viewer, filters, page, per_page),
        chart=chart_points(session, repository_id), pull_requests=pulls, ignored=ignored,
        config=config_row[1] if config_row else None, config_scan_id=config_row[0] if config_row else None,
        changes=finding_changes(session, repository_id), trend_scans=trend_scans, rule_trends=trends)


def installations(session: Session, viewer: Viewer) -> list[InstallationSummary]:
    stmt = (select(Installation, func.count(Repository.id))
            .outerjoin(Repository, Repository.installation_id == Installation.id)
            .group_by(Installation.id).order_by(Installation.account_login))
    if viewer.installation_ids is not None:
        stmt = stmt.where(Installation.id.in_(sorted(viewer.installation_ids)))
    return [InstallationSummary(id=i.id, account_login=i.account_login, account_type=i.account_type,
                                active=i.active, repositories=n) for i, n in session.execute(stmt)]


def totals(session: Session, viewer: Viewer) -> Totals:
    scans = _visible(select(func.count(Scan.id)).join(Repository, Scan.repository_id == Repository.id), viewer)
    running = scans.where(Scan.state.not_in([s.value for s in TERMINAL_STATES]))
    results = _visible(select(Result.verified, Result.speedup, Result.peak_mem_before, Result.peak_mem_after)
                       .join(ChangeSet, Result.change_set_id == ChangeSet.id)
                       .join(Scan, ChangeSet.scan_id == Scan.id)
                       .join(Repository, Scan.repository_id == Repository.id), viewer)
    verified, speedups, reductions = 0, [], []
    for ok, speedup, before, after in session.execute(results):
        verified += bool(ok)
        if ok and speedup is not None:
            speedups.append(speedup)
        reduction = memory_reduction(before, after)
        if ok and reduction is not None:
            reductions.append(reduction)
    prs = dict(session.execute(_visible(
        select(PullRequest.state, func.count(PullRequest.id))
        .join(Repository, PullRequest.repository_id == Repository.id), viewer).group_by(PullRequest.state)).all())
    opened = session.scalar(_visible(select(func.count(PullRequest.id))
                                     .join(Repository, PullRequest.repository_id == Repository.id), viewer)
                            .where(PullRequest.number.is_not(None)))
    return Totals(scans=session.scalar(scans), running=session.scalar(running), rewrites_verified=verified,
                  pull_requests_opened=opened or 0, pull_requests_open=prs.get("open", 0),
                  pull_requests_merged=prs.get("merged", 0), pull_requests_closed=prs.get("closed", 0),
                  median_speedup=median(speedups), median_memory_reduction=median(reductions))


def overview(session: Session, viewer: Viewer, *, installation_id: int | None = None, q: str | None = None,
             page: int = 1, per_page: int = DEFAULT_PER_PAGE) -> Overview:
    recent = list_scans(session, viewer, ScanFilters(installation_id=installation_id), 1, 10).items
    return Overview(installations=installations(session, viewer),
                    repositories=list_repositories(session, viewer, installation_id=installation_id, q=q,
                                                   page=page, per_page=per_page),
                    recent_scans=recent, totals=totals(session, viewer))
