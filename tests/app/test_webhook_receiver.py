from __future__ import annotations

import json
import uuid
from urllib.parse import urlencode

import pytest
from sqlalchemy import create_engine, text

from app.webhooks.signature import sign
from tests.app.conftest import SECRET
from tests.app.test_events_routing import example

pytestmark = pytest.mark.service


def post(client, event: str, body: bytes, *, delivery: str | None = None, secret: str = SECRET,
         content_type: str = "application/json", signature: str | None = None):
    delivery = delivery or f"app-{uuid.uuid4()}"
    headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "Content-Type": content_type,
               "X-Hub-Signature-256": signature if signature is not None else sign(secret, body)}
    return delivery, client.post("/webhooks/github", content=body, headers=headers)


def stored(pg_url: str, delivery: str):
    engine = create_engine(pg_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(text("SELECT status, event, action, installation_id, repository_id "
                                          "FROM deliveries WHERE id = :d"), {"d": delivery}).mappings().first()
            return dict(row) if row else None
    finally:
        engine.dispose()


def test_a_delivery_is_stored_once_and_enqueued_once(api, migrated_pg):
    client, enqueued, _ = api
    body = json.dumps(example("pull_request.closed")).encode()
    delivery, first = post(client, "pull_request", body)
    assert first.status_code == 202 and first.json() == {"status": "queued", "delivery": delivery}
    assert stored(migrated_pg, delivery) == {"status": "received", "event": "pull_request", "action": "closed",
                                             "installation_id": 1, "repository_id": 186853002}
    # Handled by a worker: a redelivery does nothing at all.
    engine = create_engine(migrated_pg)
    with engine.begin() as connection:
        connection.execute(text("UPDATE deliveries SET status = 'processed' WHERE id = :d"), {"d": delivery})
    engine.dispose()
    _, again = post(client, "pull_request", body, delivery=delivery)
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    assert enqueued == [delivery]


def test_broker_outage_keeps_the_delivery_and_a_redelivery_enqueues_it(api, migrated_pg):
    client, enqueued, broker = api
    # The vendored example has no installation (an App's deliveries always do): add one.
    body = json.dumps({**example("issue_comment.created"), "installation": {"id": 1}}).encode()
    broker["up"] = False
    delivery, answer = post(client, "issue_comment", body)
    assert answer.status_code == 503 and answer.json()["status"] == "stored"
    assert stored(migrated_pg, delivery)["status"] == "received"
    broker["up"] = True
    _, retry = post(client, "issue_comment", body, delivery=delivery)
    assert retry.status_code == 202
    assert stored(migrated_pg, delivery)["status"] == "received" and enqueued == [delivery]


def test_bad_signatures_are_refused_before_anything_is_stored(api, migrated_pg):
    client, enqueued, _ = api
    body = json.dumps(example("push")).encode()
    for signature in ("", "sha256=" + "0" * 64, sign("wrong", body), sign(SECRET, body)[:-2]):
        delivery, answer = post(client, "push", body, signature=signature)
        assert answer.status_code == 401, signature
        assert stored(migrated_pg, delivery) is None
    assert enqueued == []


def test_bodies_over_the_limit_are_refused_with_413(api, migrated_pg):
    client, enqueued, _ = api
    body = json.dumps({"padding": "x" * (65 * 1024)}).encode()
    delivery, answer = post(client, "push", body)
    assert answer.status_code == 413 and "larger than" in answer.json()["detail"]
    assert stored(migrated_pg, delivery) is None and enqueued == []


def test_malformed_payloads_get_400_and_form_encoded_payloads_work(api, migrated_pg):
    client, enqueued, _ = api
    for body in (b"{not json", b"[]", b'"text"', b"\xff\xfe"):
        delivery, answer = post(client, "push", body)
        assert answer.status_code == 400, body
        # Signed, so GitHub sent it: kept (as rejected, with the reason), never handled.
        assert stored(migrated_pg, delivery)["status"] == "rejected"
    assert enqueued == []
    payload = example("pull_request.reopened")
    form = urlencode({"payload": json.dumps(payload)}).encode()
    delivery, answer = post(client, "pull_request", form, content_type="application/x-www-form-urlencoded")
    assert answer.status_code == 202
    assert enqueued == [delivery]
    _, no_field = post(client, "pull_request", b"other=1", content_type="application/x-www-form-urlencoded")
    assert no_field.status_code == 400


def test_unknown_events_and_actions_are_stored_and_acknowledged(api, migrated_pg):
    client, enqueued, _ = api
    delivery, answer = post(client, "star", json.dumps(example("star.created")).encode())
    assert answer.status_code == 200 and answer.json()["status"] == "ignored"
    assert stored(migrated_pg, delivery)["status"] == "ignored"
    opened = dict(example("pull_request.closed"), action="labeled")
    delivery, answer = post(client, "pull_request", json.dumps(opened).encode())
    assert answer.status_code == 200 and "labeled" in answer.json()["reason"]
    delivery, answer = post(client, "ping", json.dumps(example("ping")).encode())
    assert answer.status_code == 200 and answer.json()["status"] == "pong"
    _, missing = post(client, "", b"{}")
    assert missing.status_code == 400
    assert enqueued == []


def test_healthz_and_metrics(api):
    client, _, _ = api
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok", "database": "ok", "broker": "ok"}
    post(client, "star", json.dumps(example("star.created")).encode())
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    lines = metrics.text.splitlines()
    assert any(line.startswith('adopter_webhook_deliveries_total{event="star",status="ignored"} ') for line in lines)
    for state in ("queued", "cloning", "scanning", "verifying", "benchmarking", "publishing", "done", "failed",
                  "skipped"):
        assert any(line.startswith(f'adopter_scans{{state="{state}"}} ') for line in lines)
    for line in lines:  # the exposition format: comments, or name{labels} value
        assert line.startswith("# ") or float(line.rsplit(" ", 1)[1]) >= 0


def test_healthz_reports_an_unreachable_broker(api, monkeypatch):
    client, _, _ = api
    client.app.state.settings = client.app.state.settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    answer = client.get("/healthz")
    assert answer.status_code == 503 and answer.json()["broker"].startswith("error")
