"""The Celery application. Configuration is read lazily (``worker.celeryconfig``) so importing
this module, e.g. from the web app to send a task, needs no settings until a task is sent.

Queues: ``adopter`` (webhook handling, clone, scan, publish), ``gpu`` and ``cpu`` (verify+bench,
routed by ADOPTER_BENCH_QUEUE). A CPU worker runs ``-Q adopter,cpu``, a GPU worker ``-Q gpu``.
"""

from __future__ import annotations

from celery import Celery

celery_app = Celery("adopter", include=["worker.tasks"])
celery_app.config_from_object("worker.celeryconfig")

HANDLE_DELIVERY = "adopter.handle_delivery"


def enqueue_delivery(delivery_id: str) -> None:
    """Put a stored webhook delivery on the queue (called by the web app)."""
    celery_app.send_task(HANDLE_DELIVERY, args=[delivery_id])
