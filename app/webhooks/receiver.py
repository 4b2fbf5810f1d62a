"""``POST /webhooks/github``: verify, store, enqueue, answer.

The route stays thin: it reads the body under a size limit, and hands the rest to ``accept``, a
plain function over a session. A delivery is stored before it is enqueued, so a broker outage
loses nothing (the row stays ``received`` and is enqueued again by a redelivery or by the worker's
sweep, see ``worker.tasks.requeue_received``).

The body is read from the ASGI stream with a running count and refused (413) as soon as the count
passes the limit, whatever Content-Length said or whether it was sent: nothing over the limit is
ever buffered. A body that is signed (so it came from GitHub) but is not JSON, or JSON without the
fields its event needs (``shapes``), is answered 400 or 422, never 500, and stored as ``rejected``
with the reason and the body, so nothing GitHub sent is lost.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import Delivery, DeliveryStatus, utcnow
from app.db.session import get_sessionmaker
from app.webhooks.events import ignore_reason, will_handle
from app.webhooks.shapes import shape_error
from app.webhooks.signature import signature_valid
from worker.celery_app import enqueue_delivery

log = logging.getLogger(__name__)
router = APIRouter()


@dataclass(frozen=True)
class Answer:
    status_code: int
    body: dict

    def response(self) -> JSONResponse:
        return JSONResponse(self.body, status_code=self.status_code)


class BodyTooLarge(Exception):
    pass


async def read_limited(request: Request, limit: int) -> bytes:
    """The raw body, refusing anything over ``limit`` bytes without reading all of it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def parse_payload(body: bytes, content_type: str) -> dict:
    """GitHub sends JSON, or a form with the JSON in ``payload`` (an App setting). ValueError if bad."""
    if content_type.startswith("application/x-www-form-urlencoded"):
        fields = parse_qs(body.decode("utf-8", errors="strict"))
        if "payload" not in fields:
            raise ValueError("form body without a 'payload' field")
        body = fields["payload"][0].encode()
    payload = json.loads(body)
    if not isinstance(payload, dict):
        raise ValueError(f"payload is a JSON {type(payload).__name__}, not an object")
    return payload


def _ids(payload: dict) -> tuple[int | None, int | None]:
    installation = payload.get("installation") if isinstance(payload.get("installation"), dict) else {}
    repository = payload.get("repository") if isinstance(payload.get("repository"), dict) else {}

    def as_id(value: object) -> int | None:  # GitHub ids are positive 64-bit integers
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63
        return value if ok else None

    return as_id(installation.get("id")), as_id(repository.get("id"))


def accept(session: Session, delivery_id: str, event: str, payload: dict) -> Answer:
    """Store the delivery once; enqueue it unless it needs no work. Safe to call again for the same id."""
    reason = ignore_reason(event, payload)
    installation_id, repository_id = _ids(payload)
    delivery = Delivery(
        id=delivery_id,
        event=event,
        action=payload.get("action") if isinstance(payload.get("action"), str) else None,
        installation_id=installation_id,
        repository_id=repository_id,
        payload=payload,
        status=DeliveryStatus.ignored if reason else DeliveryStatus.received,
        detail=reason,
    )
    session.add(delivery)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        existing = session.get(Delivery, delivery_id)
        if existing is None:  # lost a race with a concurrent insert that then rolled back
            return Answer(409, {"status": "conflict", "delivery": delivery_id})
        if existing.status != DeliveryStatus.received:
            return Answer(200, {"status": "duplicate", "delivery": delivery_id, "was": existing.status})
        # Stored earlier, not yet handled (perhaps never queued: the broker was down): enqueue it
        # again; a worker handles a delivery once however often it is queued.
    if reason:
        return Answer(200, {"status": "pong" if event == "ping" else "ignored", "reason": reason,
                            "delivery": delivery_id})
    try:
        enqueue_delivery(delivery_id)
    except Exception as exc:  # the broker is down; the stored row is picked up later
        log.warning("delivery %s stored but not enqueued: %s", delivery_id, exc)
        return Answer(503, {"status": "stored", "delivery": delivery_id,
                            "detail": "stored; the queue is unavailable, it will be processed later"})
    # The row stays "received" until a worker handles it: one commit per delivery keeps the
    # endpoint fast, and enqueueing a received delivery again (redelivery, sweep) is harmless.
    return Answer(202, {"status": "queued", "delivery": delivery_id})


def reject(session: Session, delivery_id: str, event: str, payload: dict, status_code: int, reason: str) -> Answer:
    """Store a signed delivery that cannot be handled, with why; answer ``status_code`` (4xx)."""
    installation_id, repository_id = _ids(payload)
    action = payload.get("action")
    session.add(Delivery(id=delivery_id, event=event, action=action if isinstance(action, str) else None,
                         installation_id=installation_id, repository_id=repository_id, payload=payload,
                         status=DeliveryStatus.rejected, detail=reason, processed_at=utcnow()))
    try:
        session.commit()
    except IntegrityError:  # a redelivery of the same id: already stored
        session.rollback()
    return Answer(status_code, {"status": "rejected", "delivery": delivery_id, "detail": reason})


def _raw(body: bytes) -> dict:
    """A body that is not a JSON object, kept as it came (base64: it may be any bytes)."""
    return {"raw_base64": base64.b64encode(body).decode(), "bytes": len(body)}


def _in_new_session(function, *args) -> Answer:
    session = get_sessionmaker()()
    try:
        return function(session, *args)
    finally:
        session.close()


@router.post("/webhooks/github")
async def github_webhook(request: Request) -> JSONResponse:
    settings = request.app.state.settings
    try:
        body = await read_limited(request, settings.webhook_max_body_bytes)
    except BodyTooLarge:
        return Answer(413, {"status": "rejected",
                            "detail": f"body larger than {settings.webhook_max_body_bytes} bytes"}).response()
    if not signature_valid(settings.webhook_secret, body, request.headers.get("x-hub-signature-256")):
        return Answer(401, {"status": "rejected", "detail": "missing or invalid X-Hub-Signature-256"}).response()
    event = request.headers.get("x-github-event")
    delivery_id = request.headers.get("x-github-delivery")
    if not event or not delivery_id or len(delivery_id) > 64 or len(event) > 64:
        return Answer(400, {"status": "rejected",
                            "detail": "X-GitHub-Event and X-GitHub-Delivery (at most 64 characters) are required"}
                      ).response()
    try:
        payload = parse_payload(body, request.headers.get("content-type", "application/json"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # nesting too deep for the parser: RecursionError
        answer = await run_in_threadpool(_in_new_session, reject, delivery_id, event, _raw(body), 400,
                                         f"malformed payload: {exc}"[:2000])
        return answer.response()
    wrong = shape_error(event, payload) if will_handle(event, payload) else None
    if wrong:
        answer = await run_in_threadpool(_in_new_session, reject, delivery_id, event, payload, 422, wrong[:2000])
        return answer.response()
    answer = await run_in_threadpool(_in_new_session, accept, delivery_id, event, payload)
    return answer.response()
