"""The runner: fetch one commit with a read-only token and build the repository's code (verify, bench).

A runner consumes only the bench queue (``cpu`` or ``gpu``) and holds no secret: no App private
key, no database URL (it carries the password), no webhook secret (docs/deploy.md, the ``runner``
service of docker-compose.yml). It reads only ``RunnerSettings`` and never opens the database:
everything it needs arrives in the ``BuildJob``, including a token GitHub scoped to the one
repository with ``contents: read`` (it can fetch that repository's code and do nothing else), and
its figures leave as a ``BuildReport`` on the ``adopter`` queue, where the control worker stores them.

A build is done once: the broker hands an unacknowledged message out again after its visibility
timeout (the runner died, or the build outlasted the timeout), so a runner marks each build it
reported in Redis (the broker, the only shared state a runner has) and skips a build marked done.
A build whose process dies (repository code that kills it, the kernel's OOM killer) goes back on the
queue; its starts are counted there too, and past ``ADOPTER_TASK_MAX_RETRIES`` retries the build is
reported as failed with that reason instead of being started again without end.

Fail closed: a runner that finds a credential in its own environment refuses to build in
production (the scan fails with the names to remove) and warns loudly in development.
"""

from __future__ import annotations

import logging
import os
import shutil

from celery import Task
from celery.exceptions import Retry, SoftTimeLimitExceeded

from app.settings import get_runner_settings, secrets_in_environment
from worker import engine_adapter
from worker.build_messages import RECORD_RESULTS, RUN_BUILDS, BuildJob, BuildReport, BuildResult
from worker.celery_app import celery_app
from worker.clone import CloneError, shallow_clone

log = logging.getLogger(__name__)
DONE_TTL_S = 7 * 24 * 3600  # far longer than a message can wait in the queue


def _redis():
    import redis

    return redis.Redis.from_url(get_runner_settings().redis_url)


def _done_key(job: BuildJob) -> str:
    return f"{get_runner_settings().redis_key_prefix}adopter:build-done:{job.key}"


def too_many_starts(job: BuildJob) -> str | None:
    """Count this start of ``job``; why it must not start again, or None."""
    key = f"{get_runner_settings().redis_key_prefix}adopter:build-starts:{job.key}"
    client = _redis()
    starts = client.incr(key)
    client.expire(key, DONE_TTL_S)
    allowed = get_runner_settings().task_max_retries + 1
    if starts > allowed:
        return (f"verify_bench: the build was started {allowed} times and did not finish (its process died: "
                "killed by the repository's code, out of memory, or the runner stopped)")
    return None


def credentials_refusal() -> str | None:
    """Why this process must not build repository code, or None. Logs loudly in development."""
    leaked = secrets_in_environment(os.environ)
    if not leaked:
        return None
    message = (f"the runner's environment holds credentials ({', '.join(leaked)}): repository code must not run "
               "where it can read them; run builds on a runner without them (docs/deploy.md)")
    if get_runner_settings().env == "production":
        return message
    log.warning("DEVELOPMENT ONLY: %s", message)
    return None


def build(job: BuildJob) -> list[BuildResult]:
    """Clone the job's commit and verify, then benchmark, each change set on this machine."""
    settings = get_runner_settings()
    root = settings.work_dir / f"build-{job.scan_id}"
    try:
        checkout = shallow_clone(job.clone_url, root / "src", token=job.token, ref=job.ref, sha=job.sha,
                                 timeout=settings.clone_timeout_s)
        results = []
        for change in job.changes:
            check = engine_adapter.verify(checkout.path, change.files)
            result = BuildResult(change_set_id=change.id, verified=check.passed, max_abs_error=check.max_abs_error,
                                 verify=check.details)
            if check.passed:
                bench = engine_adapter.bench(checkout.path, change.files)
                result = result.model_copy(update={
                    "device": bench.device, "before_s": bench.before_s, "after_s": bench.after_s,
                    "speedup": bench.speedup, "peak_mem_before": bench.peak_mem_before,
                    "peak_mem_after": bench.peak_mem_after, "versions": bench.versions, "bench": bench.details})
                result = BuildResult.model_validate(result.model_dump())  # the engine's figures, checked
            results.append(result)
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(message: BuildReport, job: BuildJob | None = None) -> None:
    celery_app.send_task(RECORD_RESULTS, args=[message.model_dump(mode="json")], queue="adopter")
    if job is not None:
        _redis().set(_done_key(job), "1", ex=DONE_TTL_S)


@celery_app.task(name=RUN_BUILDS, bind=True)
def run_builds(self: Task, job: dict) -> None:
    parsed = BuildJob.model_validate(job)
    if _redis().exists(_done_key(parsed)):
        log.info("scan %s: build %s was reported already; not building it again", parsed.scan_id, parsed.key)
        return None
    refusal = credentials_refusal() or too_many_starts(parsed)
    if refusal:
        return report(BuildReport(scan_id=parsed.scan_id, key=parsed.key, ticket=parsed.ticket,
                                  error=refusal if refusal.startswith("verify_bench:") else f"verify_bench: {refusal}"),
                      parsed)
    settings = get_runner_settings()
    try:
        results = build(parsed)
    except Retry:
        raise
    except CloneError as exc:
        if exc.transient and self.request.retries < settings.task_max_retries:
            raise self.retry(countdown=min(2 ** self.request.retries * 5, 600), exc=exc) from exc
        return report(BuildReport(scan_id=parsed.scan_id, key=parsed.key, ticket=parsed.ticket, error=f"verify_bench: {exc}"[:2000]), parsed)
    except SoftTimeLimitExceeded:
        return report(BuildReport(scan_id=parsed.scan_id, key=parsed.key, ticket=parsed.ticket,
                                  error=f"verify_bench: time limit of {settings.task_soft_time_limit} s exceeded"), parsed)
    except Exception as exc:
        log.exception("scan %s: build failed", parsed.scan_id)
        return report(BuildReport(scan_id=parsed.scan_id, key=parsed.key, ticket=parsed.ticket, error=f"verify_bench: {type(exc).__name__}: {exc}"[:2000]), parsed)
    report(BuildReport(scan_id=parsed.scan_id, key=parsed.key, ticket=parsed.ticket, results=results), parsed)
