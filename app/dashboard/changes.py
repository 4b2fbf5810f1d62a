"""What changed between two scans of a repository: findings new, fixed and still open, and per rule
how many findings each recent scan had.

A finding's line moves when code above it is edited, so lines alone do not say which finding is
which. Two findings can be the same only when they have the same rule, file and status; within such
a group they pair by fingerprint first (``Finding.fingerprint``: a hash of the rule, the file and the
matched source text, the SARIF ``partialFingerprints`` value, which lines inserted above do not
change), then by equal line (the code at that line was edited). Findings stored before fingerprints
were kept pair with the rest in line order; two findings that both have a fingerprint and differ in
it and in line are different findings. What is left over is new (in the later scan) or fixed (gone
from it).
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.dashboard.schemas import FindingChanges, FindingRef, RuleTrend
from app.db.models import Finding, Scan, ScanState

TREND_SCANS = 10


def _finished(session: Session, repository_id: int, limit: int) -> list[Scan]:
    """The repository's latest finished scans (state done: their findings are complete), oldest first."""
    rows = session.scalars(select(Scan).where(Scan.repository_id == repository_id, Scan.state == ScanState.done)
                           .order_by(Scan.created_at.desc(), Scan.id.desc()).limit(limit)).all()
    return list(reversed(rows))


def _ref(f: Finding) -> FindingRef:
    return FindingRef(rule_id=f.rule_id, path=f.path, line=f.line, status=f.status, message=f.message)


def _fingerprint(f) -> str | None:
    return getattr(f, "fingerprint", None)


def _take(pool: list, wanted) -> object | None:
    """Remove and return the first finding of `pool` that `wanted` accepts."""
    for i, f in enumerate(pool):
        if wanted(f):
            return pool.pop(i)
    return None


def pair_findings(before: list[Finding], after: list[Finding]) -> tuple[list, list, list]:
    """(new, fixed, still open) between two scans' findings; still open are the later scan's."""
    groups: dict[tuple, tuple[list, list]] = defaultdict(lambda: ([], []))
    for f in before:
        groups[(f.rule_id, f.path, f.status)][0].append(f)
    for f in after:
        groups[(f.rule_id, f.path, f.status)][1].append(f)
    new, fixed, still = [], [], []
    for old, cur in groups.values():
        old_left = sorted(old, key=lambda f: f.line)
        cur_left = sorted(cur, key=lambda f: f.line)
        for same in (lambda o, f: _fingerprint(f) is not None and _fingerprint(o) == _fingerprint(f),
                     lambda o, f: o.line == f.line):
            unpaired = []
            for f in cur_left:
                match = _take(old_left, lambda o, f=f, same=same: same(o, f))
                (still if match is not None else unpaired).append(f)
            cur_left = unpaired
        # The rest in line order, where one side has no fingerprint to tell them apart by.
        unpaired = []
        for f in cur_left:
            match = _take(old_left, lambda o, f=f: _fingerprint(o) is None or _fingerprint(f) is None)
            (still if match is not None else unpaired).append(f)
        new += unpaired
        fixed += old_left
    order = lambda f: (f.rule_id, f.path, f.line)  # noqa: E731
    return ([_ref(f) for f in sorted(new, key=order)], [_ref(f) for f in sorted(fixed, key=order)],
            [_ref(f) for f in sorted(still, key=order)])


def finding_changes(session: Session, repository_id: int) -> FindingChanges | None:
    """The latest finished scan against the one before it; None with fewer than two."""
    scans = _finished(session, repository_id, 2)
    if len(scans) < 2:
        return None
    previous, latest = scans

    def findings(scan: Scan) -> list[Finding]:
        return list(session.scalars(select(Finding).where(Finding.scan_id == scan.id)))

    new, fixed, still = pair_findings(findings(previous), findings(latest))
    return FindingChanges(scan_id=latest.id, previous_scan_id=previous.id, new=new, fixed=fixed, still_open=still)


def rule_trends(session: Session, repository_id: int, limit: int = TREND_SCANS) -> tuple[list[int], list[RuleTrend]]:
    """The ids of the latest finished scans (oldest first) and, per rule, its findings in each."""
    scans = _finished(session, repository_id, limit)
    ids = [s.id for s in scans]
    counts: dict[str, dict[int, int]] = defaultdict(dict)
    if ids:
        for scan_id, rule_id, n in session.execute(
                select(Finding.scan_id, Finding.rule_id, func.count()).where(Finding.scan_id.in_(ids))
                .group_by(Finding.scan_id, Finding.rule_id)):
            counts[rule_id][scan_id] = n
    trends = []
    for rule_id in sorted(counts):
        series = [counts[rule_id].get(i, 0) for i in ids]
        trends.append(RuleTrend(rule_id=rule_id, counts=series,
                                change=series[-1] - series[-2] if len(series) > 1 else 0))
    return ids, trends
