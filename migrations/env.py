"""Alembic environment: the target is the models' metadata, the URL is ADOPTER_DATABASE_URL.

A caller may pass the URL in the config (``config.attributes["database_url"]``, used by tests);
otherwise it comes from the environment, read directly so that migrating needs no secrets.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from app.db.models import Base

DEFAULT_URL = "sqlite:///.adopter/adopter.db"  # the same default as app.settings.Settings

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    return config.attributes.get("database_url") or os.environ.get("ADOPTER_DATABASE_URL") or DEFAULT_URL


def run_migrations_offline() -> None:
    context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = database_url()
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        os.makedirs(os.path.dirname(os.path.abspath(url.removeprefix("sqlite:///"))), exist_ok=True)
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        # Batch mode lets the same migration alter tables on SQLite, which lacks most ALTERs.
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
