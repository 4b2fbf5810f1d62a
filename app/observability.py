"""``GET /healthz`` and ``GET /metrics``.

Metrics are computed from the database at scrape time rather than kept in process memory: the
API and every worker write to the same tables, so one scrape sees the whole service.
"""

from __future__ import annotations

from functools import lru_cache

import redis
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import case, func, select, text
from sqlalchemy.orm import Session

from app.db.models import Delivery, Scan, ScanState, TaskRun
from app.db.session import get_session

router = APIRouter()

DURATION_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800)


@lru_cache(maxsize=4)
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


@router.get("/healthz")
def healthz(request: Request, session: Session = Depends(get_session)) -> JSONResponse:
    checks = {}
    try:
        session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        _redis(request.app.state.settings.redis_url).ping()
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}"
    healthy = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ok" if healthy else "unavailable", **checks},
                        status_code=200 if healthy else 503)


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(session: Session) -> str:
    """The Prometheus text exposition of deliveries, scans by state and task durations."""
    lines = [
        "# HELP adopter_webhook_deliveries_total Webhook deliveries stored, by event and status.",
        "# TYPE adopter_webhook_deliveries_total counter",
    ]
    rows = session.execute(
        select(Delivery.event, Delivery.status, func.count()).group_by(Delivery.event, Delivery.status)
    )
    for event, status, count in sorted(rows):
        lines.append(f'adopter_webhook_deliveries_total{{event="{_label(event)}",status="{_label(status)}"}} {count}')

    lines += ["# HELP adopter_scans Scans by current state.", "# TYPE adopter_scans gauge"]
    by_state = dict(session.execute(select(Scan.state, func.count()).group_by(Scan.state)).all())
    for state in ScanState:
        lines.append(f'adopter_scans{{state="{state}"}} {by_state.get(state.value, 0)}')

    lines += ["# HELP adopter_task_duration_seconds Duration of pipeline tasks, by task and outcome.",
              "# TYPE adopter_task_duration_seconds histogram"]
    bucket_columns = [func.sum(case((TaskRun.duration_s <= b, 1), else_=0)) for b in DURATION_BUCKETS]
    rows = session.execute(
        select(TaskRun.task, TaskRun.outcome, func.count(), func.sum(TaskRun.duration_s), *bucket_columns)
        .group_by(TaskRun.task, TaskRun.outcome)
    )
    for task, outcome, count, total, *buckets in sorted(rows, key=lambda r: (r[0], r[1])):
        labels = f'task="{_label(task)}",outcome="{_label(outcome)}"'
        for bound, in_bucket in zip(DURATION_BUCKETS, buckets, strict=True):
            lines.append(f'adopter_task_duration_seconds_bucket{{{labels},le="{bound}"}} {int(in_bucket or 0)}')
        lines.append(f'adopter_task_duration_seconds_bucket{{{labels},le="+Inf"}} {count}')
        lines.append(f"adopter_task_duration_seconds_sum{{{labels}}} {float(total or 0):.6f}")
        lines.append(f"adopter_task_duration_seconds_count{{{labels}}} {count}")
    return "\n".join(lines) + "\n"


@router.get("/metrics")
def metrics(session: Session = Depends(get_session)) -> PlainTextResponse:
    return PlainTextResponse(render_metrics(session), media_type="text/plain; version=0.0.4")
