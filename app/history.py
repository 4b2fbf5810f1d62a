"""The local scan history: what ``adopter scan`` did on this machine, in SQLite.

Same tables as the service (``app.db.models``), built by the same Alembic migrations, so the
dashboard's pages render it unchanged. Where it lives:

- ``ADOPTER_HISTORY_URL`` (any SQLAlchemy URL) if set, else
- ``ADOPTER_HISTORY_PATH`` (a file) if set, else
- ``~/.adopter/history.sqlite``: one history per user, across all the projects they scan (the
  service's own development database, ``.adopter/adopter.db`` in the working folder, stays apart).

Local scans belong to a pseudo-installation ``local`` (id 0); each scanned folder is a repository
whose id is derived from its absolute path (stable across runs) and whose name is that path.
Nothing here imports the engine: a scan result is read through ``to_json()``, ``diff``, ``files``
and ``originals``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.orm import Session

from app.db.models import (
    Base,
    ChangeSet,
    Finding,
    Installation,
    Repository,
    Result,
    Scan,
    ScanEvent,
)

DEFAULT_PATH = Path("~/.adopter/history.sqlite")
LOCAL_INSTALLATION_ID = 0
MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"


def history_url(url: str | None = None) -> str:
    if url:
        return url
    if os.environ.get("ADOPTER_HISTORY_URL"):
        return os.environ["ADOPTER_HISTORY_URL"]
    path = Path(os.environ.get("ADOPTER_HISTORY_PATH") or DEFAULT_PATH).expanduser()
    return f"sqlite:///{path}"


def _engine(url: str) -> Engine:
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 30} if url.startswith("sqlite") else {})
    if url.startswith("sqlite"):
        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):
            dbapi_connection.execute("PRAGMA foreign_keys=ON")

    return engine


def ensure_schema(url: str) -> None:
    """Bring the history's schema to the models' head: Alembic where the migrations ship (a source
    checkout), else ``create_all`` (the migrations test proves both build the same schema)."""
    if (MIGRATIONS / "env.py").is_file():
        from alembic import command
        from alembic.config import Config
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["database_url"] = url
        engine = _engine(url)
        try:
            with engine.connect() as connection:
                current = MigrationContext.configure(connection).get_current_heads()
        finally:
            engine.dispose()
        if set(current) != set(ScriptDirectory.from_config(config).get_heads()):
            command.upgrade(config, "head")
        return
    engine = _engine(url)
    try:
        if not inspect(engine).has_table("scans"):
            Base.metadata.create_all(engine)
    finally:
        engine.dispose()


def open_history(url: str | None = None) -> Engine:
    url = history_url(url)
    ensure_schema(url)
    return _engine(url)


def repository_id_for(path: Path) -> int:
    """Stable id of a scanned folder: 48 bits of the SHA-256 of its absolute path (fits JavaScript)."""
    return int.from_bytes(hashlib.sha256(str(path).encode()).digest()[:6], "big") or 1


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=3, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def record_scan(result, root: Path | str, *, url: str | None = None, config: dict | None = None,
                started_at: datetime | None = None, verification: dict | None = None,
                benchmark: dict | None = None, options: dict | None = None,
                timeline: dict[str, str | datetime] | None = None, places: list[dict] | None = None) -> int:
    """Store one finished scan (its findings, patch, and any verification/benchmark figures);
    return the scan's id in the history.

    ``timeline`` gives the instant each stage began (state -> datetime or ISO string, as
    ``engine.pipeline.verify_and_bench`` reports it); ``queued`` and ``scanning`` are ``started_at``,
    ``done`` is now. ``options`` are how the scan was run (the command line's choices). ``places``
    (one per finding, in the report's order) are the findings' SARIF places as plain data
    (``locations`` and ``related_locations``: lists of ``engine.sarif.Region`` dicts, ``fingerprint``),
    stored as the App's scan stage stores them; without them those columns stay empty."""
    root = Path(root).resolve()
    folder = root if root.is_dir() else root.parent
    now = datetime.now(UTC)
    started_at = started_at or now
    report = result.to_json()
    diff = result.diff
    engine = open_history(url)
    try:
        with Session(engine) as session:
            if session.get(Installation, LOCAL_INSTALLATION_ID) is None:
                session.add(Installation(id=LOCAL_INSTALLATION_ID, account_login="local", account_type="Local"))
                session.flush()
            repo_id = repository_id_for(root)
            name = str(root)
            if len(name) > 255:
                name = "…" + name[-254:]
            if session.get(Repository, repo_id) is None:
                session.add(Repository(id=repo_id, installation_id=LOCAL_INSTALLATION_ID, full_name=name,
                                       default_branch=_git(folder, "rev-parse", "--abbrev-ref", "HEAD")))
                session.flush()
            scan = Scan(repository_id=repo_id, trigger="cli", state="done", head_sha=_git(folder, "rev-parse", "HEAD"),
                        branch=_git(folder, "rev-parse", "--abbrev-ref", "HEAD"), config=config, options=options,
                        diff=diff or None,
                        created_at=started_at, updated_at=now, finished_at=now,
                        reason=f"{report.get('files_scanned', 0)} file(s) scanned, "
                               f"{len(report.get('changed_files', []))} would change")
            session.add(scan)
            session.flush()
            states = ["queued", "scanning"] + (["verifying"] if verification else []) + \
                (["benchmarking"] if benchmark else []) + ["done"]
            stamps = {"queued": started_at, "scanning": started_at, "done": now}
            stamps.update({state: _instant(at) for state, at in (timeline or {}).items() if at})
            for state in states:
                session.add(ScanEvent(scan_id=scan.id, state=state, at=stamps.get(state) or started_at))
            findings = report.get("findings", [])
            if places is not None and len(places) != len(findings):
                raise ValueError(f"{len(places)} places for {len(findings)} findings")
            for f, place in zip(findings, places or [{}] * len(findings), strict=True):
                reason = f.get("reason") or (f"original kept when: {f['guard']}" if f.get("guard") else None)
                session.add(Finding(scan_id=scan.id, rule_id=f["rule"], status=f["status"], path=f["file"],
                                    line=f["line"], end_line=f.get("end_line"), message=f.get("message"),
                                    reason=reason, class_name=f.get("class"), method_name=f.get("method"),
                                    guard=f.get("guard"), locations=place.get("locations"),
                                    related_locations=place.get("related_locations"),
                                    fingerprint=place.get("fingerprint")))
            if diff or verification or benchmark:  # also when verification kept no rewrite: say what it found
                rules = sorted({f["rule"] for f in report.get("findings", [])
                                if f["status"] in ("rewritten", "guarded")})
                originals = getattr(result, "originals", {}) or {}
                digest = hashlib.sha256("".join(originals[k] for k in sorted(originals)).encode()).hexdigest()
                change = ChangeSet(scan_id=scan.id, identity="adopter/" + "+".join(rules or ["patch"]),
                                   rule_ids=rules, files=dict(getattr(result, "files", {}) or {}), diff=diff or "",
                                   code_digest=digest,
                                   outcome="patch (local scan)" if diff else "no rewrite kept: none passed verification")
                session.add(change)
                session.flush()
                if verification or benchmark:
                    session.add(_result(change.id, verification or {}, benchmark or {}))
            session.commit()
            return scan.id
    finally:
        engine.dispose()


def _first(data: dict, *keys):
    for key in keys:
        if data.get(key) is not None:
            return data[key]
    return None


def _instant(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def _largest_error(v: dict) -> float | None:
    """The largest absolute error over what was kept: the accepted rewrites together when they were
    checked together, else each kept (or, with none kept, each) rewrite on its own."""
    top = _first(v, "max_abs_err", "max_abs_error")
    if top is not None:
        return top
    if (v.get("combined") or {}).get("max_abs_err") is not None:
        return v["combined"]["max_abs_err"]
    rows = v.get("per_rewrite") or {}
    kept = [rows[c] for c in v.get("accepted") or [] if c in rows] or list(rows.values())
    errors = [r["max_abs_err"] for r in kept if isinstance(r, dict) and r.get("max_abs_err") is not None]
    return max(errors) if errors else None


def _result(change_set_id: int, v: dict, b: dict) -> Result:
    """The engine's verification and benchmark dicts (``engine.pipeline.verify_and_bench``) as a row."""
    measured = b.get("status", "ok") == "ok"
    speed = b.get("speedup")
    speed = speed.get("median") if isinstance(speed, dict) else speed  # {median, ci95}; older: a number
    return Result(
        change_set_id=change_set_id, verified=bool(_first(v, "passed", "ok", "verified")),
        max_abs_error=_largest_error(v),
        device=_first(b, "device_name", "device") or v.get("device"),
        before_s=_first(b, "baseline_step_s", "before_s"), after_s=_first(b, "optimized_step_s", "after_s"),
        speedup=speed if measured else None,  # the median; its interval stays in details
        peak_mem_before=_first(b, "baseline_peak_bytes", "peak_mem_before"),
        peak_mem_after=_first(b, "optimized_peak_bytes", "peak_mem_after"),
        versions=b.get("versions") or {}, details={"verify": v, "bench": b})
