"""``alembic upgrade head`` builds exactly the schema the models describe, on Postgres and SQLite."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from app.db.models import Base

ROOT = Path(__file__).resolve().parents[2]


def schema_differences(url: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


def upgrade_then_compare(url: str) -> None:
    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["database_url"] = url
    command.upgrade(config, "head")
    assert schema_differences(url) == []
    engine = create_engine(url)
    tables = set(inspect(engine).get_table_names())
    engine.dispose()
    assert set(Base.metadata.tables) <= tables
    command.downgrade(config, "base")  # every migration also goes back
    engine = create_engine(url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()


@pytest.mark.service
def test_migrations_match_the_models_on_postgres():
    from tests.conftest import PG_HOST, _admin_connect

    admin, user = _admin_connect()
    name = f"adopter_test_mig_{secrets.token_hex(4)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        upgrade_then_compare(f"postgresql+psycopg://{user}@{PG_HOST}:5432/{name}")
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def test_migrations_match_the_models_on_sqlite(tmp_path):
    upgrade_then_compare(f"sqlite:///{tmp_path / 'adopter.db'}")


def test_alembic_command_line_migrates_the_database_in_the_environment(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADOPTER_")}
    env["ADOPTER_DATABASE_URL"] = url
    done = subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert schema_differences(url) == []
