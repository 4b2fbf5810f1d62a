"""The Celery application. Configuration is read lazily (``worker.celeryconfig``) so importing
this module, e.g. from the web app to send a task, needs no settings until a task is sent.

Queues: ``adopter`` (webhook handling, clone, scan, preparing builds, recording their results,
publish: the control worker, which holds the database URL and the App key) and ``gpu`` or ``cpu``
(``adopter.run_builds``, routed by ADOPTER_BENCH_QUEUE: the runners, which build repository code and
hold no secret). The control worker runs ``-Q adopter``, a runner ``-Q cpu`` or ``-Q gpu``
(see ``worker.runner`` and docs/deploy.md).
"""

from __future__ import annotations

from celery import Celery

celery_app = Celery("adopter", include=["worker.tasks", "worker.runner", "worker.build_jobs"])
celery_app.config_from_object("worker.celeryconfig")

HANDLE_DELIVERY = "adopter.handle_delivery"


def enqueue_delivery(delivery_id: str) -> None:
    """Put a stored webhook delivery on the queue (called by the web app)."""
    celery_app.send_task(HANDLE_DELIVERY, args=[delivery_id])
