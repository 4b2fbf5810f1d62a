"""Celery tasks: one per pipeline stage, plus webhook handling.

Every task is idempotent (see ``worker.pipeline`` and ``worker.state``): a message redelivered after
its worker died, or a retry, changes nothing twice. Transient failures (network, GitHub 5xx, rate
limits, a database or broker hiccup) are retried with backoff; anything else ends the scan as
``failed`` with the reason.

A stage whose pool process died (repository code that got it killed, the OOM killer, a hard time
limit) comes back at once (``acks_late``); each start is counted in Redis and the count removed when
the stage ends in any way, so a count still there at the next start is a process that died. After
``MAX_LOST_ATTEMPTS`` such deaths the scan fails with that reason instead of looping for ever.

Each forked pool process disposes the database engine it inherited (its connections belong to the
parent) and removes scratch folders left by pool processes that were killed mid-verification.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import lru_cache
from time import monotonic

from celery import Task
from celery.exceptions import Retry, SoftTimeLimitExceeded
from celery.signals import worker_process_init, worker_ready
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from app.db.models import TERMINAL_STATES, Delivery, DeliveryStatus, Scan, ScanState, TaskRun, utcnow
from app.db.session import session_scope
from app.settings import get_settings
from worker import events, github_client
from worker.celery_app import HANDLE_DELIVERY, celery_app, enqueue_delivery
from worker.clone import CloneError
from worker.pipeline import STAGE_FUNCTIONS, STAGES, Skip, next_stage, remove_checkout
from worker.state import finish

log = logging.getLogger(__name__)

MAX_LOST_ATTEMPTS = 2  # pool processes that may die running one stage of one scan before it fails


@worker_process_init.connect
def _fresh_pool_process(**_kwargs) -> None:
    from app.db.session import get_engine
    from engine.verify.workspace import sweep_orphans

    # The parent's pooled connections must not be shared with a forked child: drop them unclosed
    # (closing would end the parent's sessions), the child opens its own. get_engine is cached by
    # its arguments: session_scope() asks for get_engine(None), the settings' URL may be passed too.
    for url in (None, get_settings().database_url):
        get_engine(url).dispose(close=False)
    try:
        for path in sweep_orphans():
            log.info("removed %s, left by a killed worker process", path)
    except OSError:
        log.exception("sweep of scratch folders failed")


@lru_cache(maxsize=1)
def _redis():
    import redis

    return redis.Redis.from_url(get_settings().redis_url, socket_timeout=10)


def _attempt_key(stage: str, scan_id: int) -> str:
    return f"{get_settings().redis_key_prefix}adopter:running:{stage}:{scan_id}"


def start_attempt(stage: str, scan_id: int) -> int:
    """Count a start of ``stage`` for ``scan_id``; returns how many earlier starts never ended."""
    key = _attempt_key(stage, scan_id)
    client = _redis()
    count = client.incr(key)
    client.expire(key, get_settings().broker_visibility_timeout * (MAX_LOST_ATTEMPTS + 2))
    return int(count) - 1


def end_attempt(stage: str, scan_id: int) -> None:
    try:
        _redis().delete(_attempt_key(stage, scan_id))
    except Exception:  # the broker's Redis is down: the next start counts one loss too many, at worst
        log.exception("could not clear the attempt count of %s for scan %s", stage, scan_id)


def retry_delay(exc: BaseException, attempt: int) -> float | None:
    """Seconds to wait before retrying after ``exc``, None when it is not transient."""
    if isinstance(exc, CloneError):
        return min(2 ** attempt * 5, 600) if exc.transient else None
    if isinstance(exc, OperationalError):
        return min(2 ** attempt * 2, 120)
    return github_client.retry_delay(exc, attempt)


def retry_if_transient(task: Task, exc: BaseException, what: str) -> None:
    """Raise Celery's retry of ``task`` when ``exc`` is transient and retries are left (``what``
    names the work in the log); return when the caller must fail it instead."""
    delay = retry_delay(exc, task.request.retries)
    if delay is not None and task.request.retries < get_settings().task_max_retries:
        log.warning("%s: transient %s, retrying in %.0f s", what, exc, delay)
        raise task.retry(countdown=delay, exc=exc) from exc


def _record_run(task: str, scan_id: int | None, outcome: str, started, t0: float) -> None:
    try:
        with session_scope() as session:
            session.add(TaskRun(task=task, scan_id=scan_id, outcome=outcome, started_at=started,
                                duration_s=monotonic() - t0))
    except Exception:  # metrics must never fail a task
        log.exception("could not record the run of %s", task)


def enqueue_stage(stage: str, scan_id: int) -> None:
    celery_app.send_task(f"adopter.{stage}", args=[scan_id])


def run_stage(task: Task, stage: str, scan_id: int) -> None:
    started, t0, outcome = utcnow(), monotonic(), "ok"
    advanced = False
    lost = start_attempt(stage, scan_id)
    try:
        if lost > MAX_LOST_ATTEMPTS:
            outcome = "failed"
            _end(scan_id, ScanState.failed, f"{stage}: the worker process running it died {lost} times (killed, "
                                            "out of memory or past the hard time limit); not retried again")
            return
        with session_scope() as session:
            scan = session.get(Scan, scan_id)
            if scan is None or scan.state in TERMINAL_STATES:
                return
            owned, _ = STAGES[stage]
            if scan.state not in owned:
                # Past this stage: the worker may have died between moving the scan on and
                # enqueueing the next stage, so enqueue it (its own state check makes that safe).
                following = next_stage(stage, scan.state)
                if following:
                    enqueue_stage(following, scan_id)
                return
            advanced = STAGE_FUNCTIONS[stage](session, scan_id)
            # which stage follows is the one that runs from the state this one left the scan in
            following = next_stage(stage, session.scalar(select(Scan.state).where(Scan.id == scan_id)))
        if advanced and following:
            enqueue_stage(following, scan_id)
    except Retry:
        outcome = "retry"
        raise
    except Skip as exc:
        _end(scan_id, ScanState.skipped, str(exc))
    except SoftTimeLimitExceeded:
        outcome = "failed"
        _end(scan_id, ScanState.failed, f"{stage}: time limit of {get_settings().task_soft_time_limit} s exceeded")
    except Exception as exc:
        outcome = "retry"
        retry_if_transient(task, exc, f"scan {scan_id} {stage}")
        outcome = "failed"
        log.exception("scan %s failed in %s", scan_id, stage)
        _end(scan_id, ScanState.failed, f"{stage}: {type(exc).__name__}: {exc}"[:2000])
    finally:
        end_attempt(stage, scan_id)
        _record_run(stage, scan_id, outcome, started, t0)
        if outcome != "retry" and (stage == "verify_bench" or _past_the_files(scan_id)):
            remove_checkout(scan_id)  # publish needs no files; a later stage elsewhere clones again


def _end(scan_id: int, state: ScanState, reason: str) -> None:
    with session_scope() as session:
        finish(session, scan_id, state, reason)


def _past_the_files(scan_id: int) -> bool:
    """Whether no stage of the scan will read its checkout again: it ended, or only publishing is left."""
    with session_scope() as session:
        scan = session.get(Scan, scan_id)
        return scan is None or scan.state in TERMINAL_STATES or scan.state == ScanState.publishing


@celery_app.task(name="adopter.clone", bind=True)
def clone(self: Task, scan_id: int) -> None:
    run_stage(self, "clone", scan_id)


@celery_app.task(name="adopter.scan", bind=True)
def scan(self: Task, scan_id: int) -> None:
    run_stage(self, "scan", scan_id)


@celery_app.task(name="adopter.verify_bench", bind=True)
def verify_bench(self: Task, scan_id: int) -> None:
    run_stage(self, "verify_bench", scan_id)


@celery_app.task(name="adopter.publish", bind=True)
def publish(self: Task, scan_id: int) -> None:
    run_stage(self, "publish", scan_id)


@celery_app.task(name=HANDLE_DELIVERY, bind=True)
def handle_delivery(self: Task, delivery_id: str) -> None:
    started, t0, outcome = utcnow(), monotonic(), "ok"
    try:
        with session_scope() as session:
            scan_ids = events.handle(session, delivery_id)
        for scan_id in scan_ids:
            enqueue_stage("clone", scan_id)
    except Exception as exc:
        outcome = "retry"
        retry_if_transient(self, exc, f"delivery {delivery_id}")
        outcome = "failed"
        log.exception("delivery %s could not be handled", delivery_id)
        with session_scope() as session:
            session.execute(update(Delivery).where(Delivery.id == delivery_id).values(
                status=DeliveryStatus.failed, detail=f"{type(exc).__name__}: {exc}"[:2000], processed_at=utcnow()))
    finally:
        _record_run("handle_delivery", None, outcome, started, t0)


def requeue_received(older_than_s: float = 600) -> int:
    """Enqueue deliveries stored but still unhandled after ``older_than_s`` (the broker was down when
    they came). One that is merely waiting in a long queue gets queued twice, which is harmless."""
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    with session_scope() as session:
        ids = list(session.scalars(select(Delivery.id).where(
            Delivery.status == DeliveryStatus.received, Delivery.received_at < cutoff)))
    for delivery_id in ids:
        enqueue_delivery(delivery_id)
    return len(ids)


@worker_ready.connect
def _sweep_on_start(**_kwargs) -> None:
    # Only a worker of the "adopter" queue holds the database; a runner (-Q cpu/gpu) has no URL for it.
    if "adopter" not in celery_app.amqp.queues.consume_from:
        return
    try:
        count = requeue_received()
        if count:
            log.info("re-enqueued %d stored deliveries", count)
    except Exception:
        log.exception("sweep of stored deliveries failed")
    finally:  # the main process forks pool processes later: it keeps no connection for them to inherit
        from app.db.session import get_engine

        get_engine(None).dispose()
