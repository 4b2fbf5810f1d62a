"""Fixtures for tests that need the service's backing stores (``@pytest.mark.service``).

Postgres: each test session gets a database of its own (``adopter_test_<random>``), dropped at the
end, so parallel runs never collide. Redis: database 5 with a random key prefix per session.
Imports of service libraries stay inside the fixtures: engine tests never load them.
"""

from __future__ import annotations

import os
import secrets
import tempfile

import pytest

# ``adopter scan`` records each scan in the local history (app/history.py); a test run keeps its
# scans out of the user's ~/.adopter/history.sqlite.
os.environ.setdefault("ADOPTER_HISTORY_URL", f"sqlite:///{tempfile.mkdtemp(prefix='adopter-history-')}/history.sqlite")

PG_HOST = os.environ.get("ADOPTER_TEST_PG_HOST", "127.0.0.1")
REDIS_URL = os.environ.get("ADOPTER_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")


def _unavailable(what: str, exc: Exception):
    message = f"{what} is not reachable: {exc}"
    if os.environ.get("CI"):
        pytest.fail(message)  # CI starts the services; their absence there is a failure
    pytest.skip(message)


def _admin_connect():
    import psycopg

    last = None
    for user in ("postgres", "root", os.environ.get("USER") or "postgres"):
        try:
            return psycopg.connect(host=PG_HOST, user=user, dbname="test", autocommit=True, connect_timeout=5), user
        except psycopg.OperationalError as exc:
            last = exc
    raise last


def _fresh_database():
    """URL of a new, empty Postgres database, dropped when the generator is closed."""
    try:
        admin, user = _admin_connect()
    except Exception as exc:
        _unavailable("Postgres", exc)
    name = f"adopter_test_{secrets.token_hex(6)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://{user}@{PG_HOST}:5432/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def pg_url():
    """URL of a fresh, empty Postgres database for this test session (shared by the tests of one
    xdist worker: a test that migrates it down or fills it with rows of its own takes `own_pg_url`)."""
    yield from _fresh_database()


@pytest.fixture
def own_pg_url():
    """URL of a fresh, empty Postgres database for this test alone."""
    yield from _fresh_database()


@pytest.fixture(scope="session")
def redis_target():
    """(url, key prefix) isolating this session's broker keys."""
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except Exception as exc:
        _unavailable("Redis", exc)
    prefix = f"adopter_test_{secrets.token_hex(6)}:"
    yield REDIS_URL, prefix
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)


@pytest.fixture
def no_adopter_env(monkeypatch):
    """The service's settings read from nothing but what the test sets: every ``ADOPTER_*``
    variable removed, and the cached settings (control worker's and runner's) cleared around it."""
    from app.settings import get_runner_settings, get_settings

    for key in list(os.environ):
        if key.startswith("ADOPTER_"):
            monkeypatch.delenv(key)
    get_settings.cache_clear()
    get_runner_settings.cache_clear()
    yield
    get_settings.cache_clear()
    get_runner_settings.cache_clear()
