"""The dashboard's HTML pages, rendered on the server with Jinja2 (templates in ``app/templates``)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy.orm import Session

from app.dashboard import queries
from app.dashboard.access import Viewer
from app.dashboard.charts import line_chart, sparkline
from app.dashboard.deps import Pagination, db, page_filters, page_viewer, pagination
from app.dashboard.diffview import render_diff
from app.dashboard.links import https_url
from app.dashboard.queries import FINDING_STATUSES, STATES, ScanFilters

APP_DIR = Path(__file__).resolve().parents[1]
STATIC_DIR = APP_DIR / "static"
STATIC_FILES = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}

router = APIRouter(include_in_schema=False)
templates = Environment(loader=FileSystemLoader(APP_DIR / "templates"), autoescape=select_autoescape(["html"]),
                        trim_blocks=True, lstrip_blocks=True)


def fmt_speedup(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def fmt_pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:.1f}%"


def fmt_bytes(v: int | None) -> str:
    if v is None:
        return "–"
    size = float(v)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(v)


def fmt_seconds(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v * 1000:.2f} ms" if v < 1 else f"{v:.3f} s"


def fmt_dt(v: datetime | None) -> str:
    return "–" if v is None else v.strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_err(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"


def fmt_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def error_label(key: str) -> str:
    """``max_abs_err`` -> "max abs error": an error measure's column heading, whatever its name."""
    words = key.replace("_", " ").split()
    return " ".join("error" if w in ("err", "error") else w for w in words)


def slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in str(text).lower()).strip("-")


templates.filters.update(speedup=fmt_speedup, pct=fmt_pct, bytes=fmt_bytes, seconds=fmt_seconds, dt=fmt_dt,
                         err=fmt_err, duration=fmt_duration, error_label=error_label, slug=slug,
                         https_url=https_url)


def render(request: Request, name: str, viewer: Viewer, **context) -> HTMLResponse:
    def url_with(**changes) -> str:
        params = dict(request.query_params)
        params.update({k: str(v) for k, v in changes.items() if v is not None})
        for k, v in changes.items():
            if v is None:
                params.pop(k, None)
        return f"{request.url.path}?{urlencode(params)}" if params else request.url.path

    html = templates.get_template(name).render(request=request, viewer=viewer, url_with=url_with, sparkline=sparkline,
                                               states=STATES, finding_statuses=FINDING_STATUSES, **context)
    return HTMLResponse(html)


@router.get("/static/{name}")
def static(name: str) -> FileResponse:
    if name not in STATIC_FILES:
        raise HTTPException(404, "not found")
    return FileResponse(STATIC_DIR / name, media_type=STATIC_FILES[name],
                        headers={"Cache-Control": "public, max-age=300"})


@router.get("/", response_class=HTMLResponse)
def overview_page(request: Request, installation: str | None = Query(None), q: str | None = Query(None),
                  pages: Pagination = Depends(pagination), viewer: Viewer = Depends(page_viewer),
                  session: Session = Depends(db)) -> HTMLResponse:
    inst = int(installation) if installation and installation.isdigit() else None
    data = queries.overview(session, viewer, installation_id=inst, q=q or None, page=pages[0], per_page=pages[1])
    return render(request, "overview.html", viewer, data=data, installation=inst, q=q or "", title="Overview")


@router.get("/scans", response_class=HTMLResponse)
def scans_page(request: Request, filters: ScanFilters = Depends(page_filters),
               pages: Pagination = Depends(pagination), viewer: Viewer = Depends(page_viewer),
               session: Session = Depends(db)) -> HTMLResponse:
    data = queries.list_scans(session, viewer, filters, pages[0], pages[1])
    repos = queries.list_repositories(session, viewer, per_page=100).items
    return render(request, "scans.html", viewer, scans=data, filters=filters, repositories=repos,
                  rules=queries.rule_ids(session, viewer), title="Scans")


@router.get("/repos/{repository_id}", response_class=HTMLResponse)
def repository_page(request: Request, repository_id: int, filters: ScanFilters = Depends(page_filters),
                    pages: Pagination = Depends(pagination), viewer: Viewer = Depends(page_viewer),
                    session: Session = Depends(db)) -> HTMLResponse:
    detail = queries.repository_detail(session, viewer, repository_id, filters, pages[0], pages[1])
    if detail is None:
        raise HTTPException(404, "repository not found")
    speed = [(p.at, p.speedup) for p in detail.chart if p.speedup is not None]
    memory = [(p.at, p.memory_reduction) for p in detail.chart if p.memory_reduction is not None]
    charts = {
        "speedup": line_chart("chart-speedup", f"Measured speedup per scan of {detail.repository.full_name}",
                              speed, fmt_speedup, baseline=1.0),
        "memory": line_chart("chart-memory", f"Peak-memory reduction per scan of {detail.repository.full_name}",
                             memory, fmt_pct, baseline=0.0),
    }
    return render(request, "repository.html", viewer, detail=detail, repo=detail.repository, charts=charts,
                  filters=filters, rules=queries.rule_ids(session, viewer, repository_id),
                  title=detail.repository.full_name)


@router.get("/scans/{scan_id}", response_class=HTMLResponse)
def scan_page(request: Request, scan_id: int, viewer: Viewer = Depends(page_viewer),
              session: Session = Depends(db)) -> HTMLResponse:
    detail = queries.scan_detail(session, viewer, scan_id)
    if detail is None:
        raise HTTPException(404, "scan not found")
    by_rule: dict[str, dict[str, list]] = {}
    for f in detail.findings:
        by_rule.setdefault(f.rule_id, {s: [] for s in FINDING_STATUSES}).setdefault(f.status, []).append(f)
    failed_logs = [e for e in detail.events if e.state in ("failed", "skipped") and e.reason]
    return render(request, "scan.html", viewer, detail=detail, scan=detail.scan, by_rule=by_rule,
                  diff_html=render_diff(detail.diff or "".join(cs.diff for cs in detail.change_sets)),
                  failed_logs=failed_logs, title=f"Scan {scan_id}")
