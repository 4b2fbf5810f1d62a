"""What ``adopter scan``, ``adopter history`` and ``adopter dashboard`` call (engine/cli.py imports this
inside its commands, so the engine never imports ``app`` at import time, and this never imports the
engine). Recording never fails a scan: a problem is one line on stderr.

Recording and listing need only SQLAlchemy and Alembic (core dependencies), not the service extra:
the README's first command (``pip install -e ".[torch]"``) records its scan. Only the dashboard
needs ``adopter[service]``.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path


def record_cli_scan(result, root: Path | str, *, config: dict | None = None, started_at: datetime | None = None,
                    outcome: dict | None = None, url: str | None = None, options: dict | None = None,
                    places: list[dict] | None = None) -> int | None:
    """Record a finished ``adopter scan`` (``config``: the settings it ran with; ``outcome``: what
    --verify/--bench produced, if run; ``started_at``: when the scan began; ``options``: the command
    line's choices; ``places``: each finding's SARIF place, as ``app.history.record_scan`` takes it)."""
    try:
        from app.history import record_scan

        outcome = outcome or {}
        bench = outcome.get("benchmark")
        return record_scan(result, root, url=url, config=config, started_at=started_at, options=options, places=places,
                           timeline=outcome.get("timeline"), verification=outcome.get("verification"),
                           benchmark=bench if (bench or {}).get("status") != "skipped" else None)
    except ImportError as exc:
        print(f"note: scan not recorded in the local history ({exc.name} missing: pip install adopter again)",
              file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - the scan itself succeeded; say why history did not
        print(f"note: scan not recorded in the local history: {exc}", file=sys.stderr)
    return None


def scan_states() -> list[str]:
    from app.db.models import ScanState

    return [s.value for s in ScanState]


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)  # SQLite hands back naive datetimes


def list_local_scans(*, limit: int = 20, page: int = 1, state: str | None = None, rule: str | None = None,
                     repository: str | None = None, url: str | None = None) -> dict:
    """One page of the history's scans, newest first, as plain data."""
    from sqlalchemy import exists, func, select
    from sqlalchemy.orm import Session

    from app.db.models import ChangeSet, Finding, Repository, Result, Scan
    from app.history import LOCAL_INSTALLATION_ID, history_url, open_history

    engine = open_history(url)
    try:
        with Session(engine) as session:
            stmt = (select(Scan, Repository.full_name).join(Repository, Scan.repository_id == Repository.id)
                    .where(Repository.installation_id == LOCAL_INSTALLATION_ID))
            if repository:
                wanted = str(Path(repository).resolve()) if Path(repository).exists() else repository
                stmt = stmt.where(Repository.full_name == wanted)
            if state:
                stmt = stmt.where(Scan.state == state)
            if rule:
                stmt = stmt.where(exists().where(Finding.scan_id == Scan.id, Finding.rule_id == rule))
            total = session.scalar(select(func.count()).select_from(stmt.with_only_columns(Scan.id).subquery()))
            pages = max(1, -(-total // limit))
            rows = session.execute(stmt.order_by(Scan.created_at.desc(), Scan.id.desc())
                                   .offset((page - 1) * limit).limit(limit)).all()
            ids = [scan.id for scan, _ in rows]
            counts: dict[int, dict[str, int]] = {i: {} for i in ids}
            for scan_id, status, n in session.execute(
                    select(Finding.scan_id, Finding.status, func.count()).where(Finding.scan_id.in_(ids))
                    .group_by(Finding.scan_id, Finding.status)):
                counts[scan_id][status] = n
            speedups = dict(session.execute(
                select(ChangeSet.scan_id, func.max(Result.speedup)).join(Result, Result.change_set_id == ChangeSet.id)
                .where(ChangeSet.scan_id.in_(ids)).group_by(ChangeSet.scan_id)).all())
            scans = [{"id": scan.id, "created_at": _utc(scan.created_at).isoformat(), "folder": name,
                      "state": str(scan.state), "reason": scan.reason, "branch": scan.branch, "head_sha": scan.head_sha,
                      "findings": dict(sorted(counts[scan.id].items())), "speedup": speedups.get(scan.id)}
                     for scan, name in rows]
    finally:
        engine.dispose()
    return {"history": history_url(url), "page": page, "pages": pages, "total": total, "scans": scans}


def print_history(*, limit: int = 20, page: int = 1, state: str | None = None, rule: str | None = None,
                  repository: str | None = None, url: str | None = None, out=None, as_json: bool = False) -> int:
    """Print the history's scans (newest first), a table or JSON; return how many match."""
    found = list_local_scans(limit=limit, page=page, state=state, rule=rule, repository=repository, url=url)
    if as_json:
        print(json.dumps(found, indent=2), file=out or sys.stdout)
        return found["total"]
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out) if out is not None else Console()  # rich honours NO_COLOR itself
    table = Table(title=f"Adopter scan history ({found['history']})",
                  caption=f"page {found['page']} of {found['pages']}, {found['total']} scan(s)")
    counted = ("rewritten", "guarded", "near-miss", "suppressed")
    for column in ("scan", "when (UTC)", "folder", "state", *counted, "speedup"):
        table.add_column(column, justify="right" if column == "scan" or column in counted else "left")
    for s in found["scans"]:
        when = datetime.fromisoformat(s["created_at"]).astimezone(UTC).strftime("%Y-%m-%d %H:%M")
        table.add_row(str(s["id"]), when, s["folder"], s["state"], *(str(s["findings"].get(c, 0)) for c in counted),
                      f"{s['speedup']:.2f}x" if s["speedup"] else "-")
    console.print(table)
    return found["total"]


def serve_dashboard(*, host: str = "127.0.0.1", port: int = 8765, url: str | None = None) -> None:
    from app.history import history_url, open_history

    try:
        from app.dashboard.local import is_loopback, serve
    except ImportError as exc:
        raise ValueError(f"the dashboard needs the service extra ({exc.name} missing): "
                         "pip install 'adopter[service]'") from None
    if not is_loopback(host):
        raise ValueError(f"the local dashboard binds to this machine only (127.0.0.1 or ::1), not {host!r}")
    open_history(url).dispose()  # create or migrate before the first request
    print(f"Adopter dashboard of {history_url(url)} at http://{host}:{port}/ (Ctrl+C stops it)", file=sys.stderr)
    serve(history_url(url), host=host, port=port)
