"""What ``adopter scan``, ``adopter history`` and ``adopter dashboard`` call (engine/cli.py imports this
inside its commands, so the engine never imports ``app`` at import time, and this never imports the
engine). Recording never fails a scan: a problem is one line on stderr."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path


def record_cli_scan(result, root: Path | str, *, rules: str, include: list[str] | None = None,
                    exclude: list[str] | None = None, started_at: datetime | None = None,
                    outcome: dict | None = None, url: str | None = None, options: dict | None = None) -> int | None:
    """Record a finished ``adopter scan`` (``outcome``: what --verify/--bench produced, if run;
    ``started_at``: when the scan began; ``options``: the command line's choices)."""
    try:
        from app.history import record_scan

        config = {"rules": rules, "paths": {"include": list(include or []) or None,
                                            "exclude": list(exclude or []) or None}}
        outcome = outcome or {}
        bench = outcome.get("benchmark")
        return record_scan(result, root, url=url, config=config, started_at=started_at, options=options,
                           timeline=outcome.get("timeline"), verification=outcome.get("verification"),
                           benchmark=bench if (bench or {}).get("status") != "skipped" else None)
    except ImportError as exc:
        print(f"note: scan not recorded in the local history ({exc.name} missing: "
              "pip install 'adopter[service]')", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - the scan itself succeeded; say why history did not
        print(f"note: scan not recorded in the local history: {exc}", file=sys.stderr)
    return None


def print_history(*, limit: int = 20, page: int = 1, state: str | None = None, rule: str | None = None,
                  repository: str | None = None, url: str | None = None, out=None) -> int:
    """Print a table of the history's scans (newest first); return how many match."""
    from rich.console import Console
    from rich.table import Table
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from app.dashboard.access import Viewer
    from app.dashboard.queries import ScanFilters, list_scans
    from app.db.models import Repository
    from app.history import history_url, open_history

    engine = open_history(url)
    try:
        with Session(engine) as session:
            repo_id = None
            if repository:
                wanted = str(Path(repository).resolve()) if Path(repository).exists() else repository
                repo_id = session.scalar(select(Repository.id).where(Repository.full_name == wanted)) or -1
            found = list_scans(session, Viewer("local", None), ScanFilters(repository_id=repo_id, state=state,
                               rule=rule), page=page, per_page=limit)
    finally:
        engine.dispose()
    console = Console(file=out) if out is not None else Console()
    table = Table(title=f"Adopter scan history ({history_url(url)})", caption=(
        f"page {found.page} of {found.pages}, {found.total} scan(s)"))
    for column in ("scan", "when (UTC)", "folder", "state", "rewritten", "guarded", "near-miss", "speedup"):
        table.add_column(column, justify="right" if column in ("scan", "rewritten", "guarded", "near-miss") else "left")
    for s in found.items:
        table.add_row(str(s.id), s.created_at.strftime("%Y-%m-%d %H:%M"), s.repository, s.state, str(s.rewritten),
                      str(s.guarded), str(s.near_miss), f"{s.speedup:.2f}x" if s.speedup else "-")
    console.print(table)
    return found.total


def serve_dashboard(*, host: str = "127.0.0.1", port: int = 8765, url: str | None = None) -> None:
    from app.dashboard.local import is_loopback, serve
    from app.history import history_url, open_history

    if not is_loopback(host):
        raise ValueError(f"the local dashboard binds to this machine only (127.0.0.1 or ::1), not {host!r}")
    open_history(url).dispose()  # create or migrate before the first request
    print(f"Adopter dashboard of {history_url(url)} at http://{host}:{port}/ (Ctrl+C stops it)", file=sys.stderr)
    serve(history_url(url), host=host, port=port)
