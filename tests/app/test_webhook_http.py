"""The webhook endpoint over real HTTP (uvicorn on a socket): limits while streaming, and signed but
malformed payloads answered 4xx, never 500, and kept as ``rejected``."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import httpx
import pytest

from app.webhooks.signature import sign
from tests.app.conftest import SECRET, clear_caches
from tests.app.test_events_routing import example
from tests.app.test_webhook_receiver import stored

pytestmark = pytest.mark.service
LIMIT = 64 * 1024


@pytest.fixture
def server(migrated_pg, redis_target, monkeypatch):
    import uvicorn

    import app.webhooks.receiver as receiver
    from app.main import create_app

    for key, value in {
        "ADOPTER_DATABASE_URL": migrated_pg, "ADOPTER_WEBHOOK_SECRET": SECRET, "ADOPTER_ENV": "development",
        "ADOPTER_REDIS_URL": redis_target[0], "ADOPTER_REDIS_KEY_PREFIX": redis_target[1] + "http:",
        "ADOPTER_WEBHOOK_MAX_BODY_BYTES": str(LIMIT),
    }.items():
        monkeypatch.setenv(key, value)
    clear_caches()
    enqueued: list[str] = []
    monkeypatch.setattr(receiver, "enqueue_delivery", enqueued.append)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    instance = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not instance.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield port, enqueued
    instance.should_exit = True
    thread.join(10)
    clear_caches()


def headers(event: str, body: bytes, delivery: str) -> dict:
    return {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "Content-Type": "application/json",
            "X-Hub-Signature-256": sign(SECRET, body)}


def raw_request(port: int, head: dict, chunks, *, then_wait: float = 10) -> bytes:
    """Send a request by hand (headers as given, body chunks as given) and read what comes back,
    without ever finishing a body the server did not ask for."""
    with socket.create_connection(("127.0.0.1", port), timeout=then_wait) as conn:
        lines = [b"POST /webhooks/github HTTP/1.1", b"Host: 127.0.0.1"]
        lines += [f"{k}: {v}".encode() for k, v in head.items()]
        conn.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        for chunk in chunks:
            try:
                conn.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                data = conn.recv(65536)
                if not data:
                    break
                answer += data
        except TimeoutError:
            pass
        return answer


def test_a_chunked_body_over_the_limit_is_refused_before_it_ends(server, migrated_pg):
    port, enqueued = server
    delivery = f"http-{uuid.uuid4()}"
    # No Content-Length; more than the limit is sent and the final chunk never comes: a server that
    # buffered the whole body before deciding would never answer.
    chunk = b" " * 8192
    body = [b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(LIMIT // len(chunk) + 2)]
    answer = raw_request(port, {**headers("push", b"", delivery), "Transfer-Encoding": "chunked"}, body)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert stored(migrated_pg, delivery) is None and enqueued == []


def test_a_declared_length_over_the_limit_is_refused_without_reading(server, migrated_pg):
    port, _ = server
    delivery = f"http-{uuid.uuid4()}"
    answer = raw_request(port, {**headers("push", b"", delivery), "Content-Length": str(10**9)}, [])
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert stored(migrated_pg, delivery) is None


def test_a_lying_content_length_gains_nothing(server, migrated_pg):
    port, enqueued = server
    payload = json.dumps(example("push")).encode()
    delivery = f"http-{uuid.uuid4()}"
    # Declares less than it sends: the body is what was declared, so the signature of the whole
    # payload does not match the part read, and nothing is stored.
    answer = raw_request(port, {**headers("push", payload, delivery), "Content-Length": "10"}, [payload])
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert stored(migrated_pg, delivery) is None and enqueued == []


@pytest.mark.parametrize(("event", "body", "status", "reason"), [
    ("push", b"{not json", 400, "malformed payload"),
    ("push", b"[" * 30_000 + b"]" * 30_000, 400, "malformed payload"),
    ("push", b"[1, 2]", 400, "not an object"),
    ("push", json.dumps({k: v for k, v in example("push").items() if k != "repository"}).encode(), 422,
     "push payload: repository: Field required"),
    ("push", json.dumps({**example("push"), "repository": "acme/x"}).encode(), 422, "push payload: repository"),
    ("push", json.dumps({**example("push"), "installation": {"id": "7"}}).encode(), 422,
     "push payload: installation.id"),
    ("installation", json.dumps({"action": "created"}).encode(), 422, "installation payload: installation"),
    ("pull_request", json.dumps({**example("pull_request.closed"), "pull_request": None}).encode(), 422,
     "pull_request payload: pull_request"),
    ("issue_comment", json.dumps({"action": "created", "comment": {"id": 1}}).encode(), 422,
     "issue_comment payload:"),
])
def test_signed_but_malformed_payloads_get_4xx_and_are_kept_as_rejected(server, migrated_pg, event, body, status,
                                                                         reason):
    port, enqueued = server
    delivery = f"http-{uuid.uuid4()}"
    answer = httpx.post(f"http://127.0.0.1:{port}/webhooks/github", content=body,
                        headers=headers(event, body, delivery), timeout=30)
    assert answer.status_code == status, answer.text
    assert answer.json()["status"] == "rejected" and reason in answer.json()["detail"]
    row = stored(migrated_pg, delivery)
    assert row is not None and row["status"] == "rejected" and row["event"] == event
    assert enqueued == []
    # A redelivery of the same id is not handled either.
    again = httpx.post(f"http://127.0.0.1:{port}/webhooks/github", content=body,
                       headers=headers(event, body, delivery), timeout=30)
    assert again.status_code < 500 and enqueued == []
