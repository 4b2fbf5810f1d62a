"""The API in-process (FastAPI's test client) over the session's Postgres database."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT_ALEMBIC = Path(__file__).resolve().parents[2] / "alembic.ini"
SECRET = "test-webhook-secret"


def clear_caches() -> None:
    from app.db.session import get_engine, get_sessionmaker
    from app.settings import get_settings

    get_settings.cache_clear()
    get_sessionmaker.cache_clear()
    get_engine.cache_clear()


@pytest.fixture(scope="session")
def migrated_pg(pg_url):
    from alembic import command
    from alembic.config import Config

    config = Config(str(ROOT_ALEMBIC))
    config.attributes["database_url"] = pg_url
    command.upgrade(config, "head")
    return pg_url


@pytest.fixture
def api(migrated_pg, redis_target, monkeypatch):
    """(test client, list of enqueued delivery ids, enqueue switch) with the broker call recorded."""
    from fastapi.testclient import TestClient

    import app.webhooks.receiver as receiver
    from app.main import create_app

    for key, value in {
        "ADOPTER_DATABASE_URL": migrated_pg, "ADOPTER_WEBHOOK_SECRET": SECRET, "ADOPTER_ENV": "development",
        "ADOPTER_REDIS_URL": redis_target[0], "ADOPTER_REDIS_KEY_PREFIX": redis_target[1] + "app:",
        "ADOPTER_WEBHOOK_MAX_BODY_BYTES": str(64 * 1024),
    }.items():
        monkeypatch.setenv(key, value)
    clear_caches()
    enqueued: list[str] = []
    broker = {"up": True}

    def fake_enqueue(delivery_id: str) -> None:
        if not broker["up"]:
            raise ConnectionError("broker unreachable")
        enqueued.append(delivery_id)

    monkeypatch.setattr(receiver, "enqueue_delivery", fake_enqueue)
    with TestClient(create_app()) as client:
        yield client, enqueued, broker
    clear_caches()
