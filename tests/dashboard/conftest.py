"""Fixtures of the dashboard tests: a Postgres database of their own with seeded history (migrated by
Alembic), GitHub played by ``tests.github_fake`` (OAuth web flow and ``/user/installations``), and
the service app signed in as one of three people:

- alice can access the acme installation (acme/vision, acme/nlp),
- bob can access the globex installation (globex/secret-model),
- root can access both; carol can access none.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.dashboard.seed import ACME, GLOBEX

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID, CLIENT_SECRET = "Iv1.dashboardtest", "dashboard-client-secret"
SESSION_SECRET = "dashboard-session-secret-for-tests"
PEOPLE = {"alice": [ACME], "bob": [GLOBEX], "root": [ACME, GLOBEX], "carol": []}


@pytest.fixture(scope="session")
def dash_pg():
    """A fresh Postgres database, migrated to head and seeded; dropped at the end."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from tests.conftest import PG_HOST, _admin_connect, _unavailable
    from tests.dashboard.seed import seed

    try:
        admin, user = _admin_connect()
    except Exception as exc:
        _unavailable("Postgres", exc)
    name = f"adopter_dash_{secrets.token_hex(6)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://{user}@{PG_HOST}:5432/{name}"
    try:
        config = Config(str(ROOT / "alembic.ini"))
        config.attributes["database_url"] = url
        command.upgrade(config, "head")
        engine = create_engine(url)
        with Session(engine) as session:
            ids = seed(session)
        engine.dispose()
        yield url, ids
    finally:
        from app.db.session import get_engine, get_sessionmaker

        get_sessionmaker.cache_clear()
        get_engine.cache_clear()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def github(tmp_path_factory):
    from tests.github_fake.keys import app_key_pair
    from tests.github_fake.server import FakeGitHub

    _, public = app_key_pair()
    fake = FakeGitHub(tmp_path_factory.mktemp("gh"), app_id=4343, public_key=public).start()
    fake.add_installation(ACME, "acme")
    fake.add_installation(GLOBEX, "globex")
    for login, ids in PEOPLE.items():
        fake.add_user(login, ids)
    fake.add_oauth_client(CLIENT_ID, CLIENT_SECRET)
    yield fake
    fake.stop()


def service_env(db_url: str, fake) -> dict[str, str]:
    return {
        "ADOPTER_DATABASE_URL": db_url, "ADOPTER_WEBHOOK_SECRET": "x", "ADOPTER_ENV": "development",
        "ADOPTER_GITHUB_URL": fake.url, "ADOPTER_GITHUB_API_URL": fake.api,
        "ADOPTER_GITHUB_CLIENT_ID": CLIENT_ID, "ADOPTER_GITHUB_CLIENT_SECRET": CLIENT_SECRET,
        "ADOPTER_SESSION_SECRET": SESSION_SECRET,
    }


def clear_caches() -> None:
    from app.dashboard.config import service_config
    from app.settings import get_settings

    service_config.cache_clear()
    get_settings.cache_clear()


@pytest.fixture
def service(dash_pg, github, monkeypatch):
    """A factory of test clients of the service app; ``service("alice")`` is signed in as alice."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    for key, value in service_env(dash_pg[0], github).items():
        monkeypatch.setenv(key, value)
    clear_caches()
    clients = []

    def make(login: str | None = None) -> TestClient:
        client = TestClient(create_app(), base_url="http://127.0.0.1")
        clients.append(client)
        if login is not None:
            sign_in(client, github, login)
        return client

    yield make
    for client in clients:
        client.close()
    clear_caches()


def sign_in(client, fake, login: str):
    """The OAuth web flow, hop by hop: app -> GitHub's authorize page -> app's callback."""
    fake.sign_in(login)
    start = client.get("/auth/login", params={"next": "/"}, follow_redirects=False)
    assert start.status_code == 303, start.text
    authorize = start.headers["location"]
    assert authorize.startswith(f"{fake.url}/login/oauth/authorize?")
    back = httpx.get(authorize, follow_redirects=False)
    assert back.status_code == 302, back.text
    parts = urlsplit(back.headers["location"])
    assert parts.path == "/auth/callback"
    done = client.get("/auth/callback", params={k: v[0] for k, v in parse_qs(parts.query).items()},
                      follow_redirects=False)
    assert done.status_code == 303, done.text
    return done
