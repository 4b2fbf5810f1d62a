"""Celery configuration from the service settings (imported by Celery on first use of the app).

Read from ``RunnerSettings``, the settings without secrets: a runner (the ``cpu``/``gpu`` queues)
starts without the App key, the database URL and the webhook secret in its environment.
"""

from __future__ import annotations

from app.settings import get_runner_settings

_settings = get_runner_settings()

broker_url = _settings.redis_url
broker_transport_options = {
    # A task whose worker died (acks_late: not yet acknowledged) goes back on the queue after this.
    "visibility_timeout": _settings.broker_visibility_timeout,
    "global_keyprefix": _settings.redis_key_prefix,
}
broker_connection_retry_on_startup = True
task_ignore_result = True
result_backend = None

task_default_queue = "adopter"
# Only the build of repository code goes to the runners; everything that needs the database or
# the App key (including the verify_bench stage, which prepares the build) stays on "adopter".
task_routes = {"adopter.run_builds": {"queue": _settings.bench_queue}}

# A task is acknowledged only after it finished, and a task whose worker process was killed goes
# back to the queue: a killed worker loses nothing (tasks are idempotent, see worker.tasks).
task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
task_soft_time_limit = _settings.task_soft_time_limit
task_time_limit = _settings.task_time_limit

task_serializer = "json"
accept_content = ["json"]
worker_hijack_root_logger = False
