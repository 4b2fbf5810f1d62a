"""``adopter.record_results``: the control worker's side of a build, on the ``adopter`` queue.

A runner (``worker.runner``) sends its ``BuildReport`` here; this task checks it, stores the figures
and enqueues publishing. It holds the database; the runner never does.
"""

from __future__ import annotations

import logging
from time import monotonic

from celery import Task
from pydantic import ValidationError

from app.db.models import ScanState, utcnow
from app.db.session import session_scope
from worker.build_messages import RECORD_RESULTS, BuildReport
from worker.celery_app import celery_app
from worker.pipeline import BadReport, record_results_stage
from worker.tasks import _end, _record_run, enqueue_stage, retry_if_transient

log = logging.getLogger(__name__)


def _scan_id_of(report: object) -> int | None:
    value = report.get("scan_id") if isinstance(report, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@celery_app.task(name=RECORD_RESULTS, bind=True)
def record_results(self: Task, report: dict) -> None:
    started, t0, outcome = utcnow(), monotonic(), "ok"
    scan_id = _scan_id_of(report)
    try:
        parsed = BuildReport.model_validate(report)
        with session_scope() as session:
            advanced = record_results_stage(session, parsed)
        if advanced:
            enqueue_stage("publish", parsed.scan_id)
    except (ValidationError, BadReport) as exc:
        outcome = "failed"
        log.warning("scan %s: the runner's report was refused: %s", scan_id, exc)
        if scan_id is not None:
            _end(scan_id, ScanState.failed, f"verify_bench: invalid report from the runner: {exc}"[:2000])
    except Exception as exc:
        outcome = "retry"
        retry_if_transient(self, exc, f"scan {scan_id} record_results")
        outcome = "failed"
        log.exception("scan %s: results could not be recorded", scan_id)
        if scan_id is not None:
            _end(scan_id, ScanState.failed, f"verify_bench: {type(exc).__name__}: {exc}"[:2000])
    finally:
        _record_run("record_results", scan_id, outcome, started, t0)
