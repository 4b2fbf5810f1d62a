"""Figures are reused only for the same inputs in the same repository of the same installation."""

from __future__ import annotations

import pytest


@pytest.fixture
def db(tmp_path, monkeypatch):
    from alembic import command
    from alembic.config import Config

    from app.db.session import get_engine, get_sessionmaker
    from app.settings import get_settings

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    monkeypatch.setenv("ADOPTER_WEBHOOK_SECRET", "s")
    monkeypatch.setenv("ADOPTER_DATABASE_URL", url)
    for cache in (get_settings, get_engine, get_sessionmaker):
        cache.cache_clear()
    config = Config("alembic.ini")
    config.attributes["database_url"] = url
    command.upgrade(config, "head")
    yield
    for cache in (get_settings, get_engine, get_sessionmaker):
        cache.cache_clear()


def test_equal_content_elsewhere_is_not_reused(db):
    from app.db.models import ChangeSet, Installation, Repository, Result, Scan
    from app.db.session import session_scope
    from worker.pipeline import _reuse_result

    with session_scope() as session:
        session.add_all([Installation(id=3, account_login="acme", permissions={}),
                         Installation(id=4, account_login="globex", permissions={})])
        session.flush()
        session.add_all([Repository(id=10, installation_id=3, full_name="acme/a"),
                         Repository(id=11, installation_id=3, full_name="acme/b"),
                         Repository(id=20, installation_id=4, full_name="globex/a")])
        session.flush()

        def change_in(repository_id: int) -> tuple[Scan, ChangeSet]:
            scan = Scan(repository_id=repository_id, trigger="test", state="verifying")
            session.add(scan)
            session.flush()
            change = ChangeSet(scan_id=scan.id, identity="adopter/x", rule_ids=["x"], files={"m.py": "y"},
                               diff="", code_digest="c", inputs_digest="same-inputs")
            session.add(change)
            session.flush()
            return scan, change

        _, measured = change_in(10)
        session.add(Result(change_set_id=measured.id, verified=True, device="cpu", before_s=2.0, after_s=1.0,
                           speedup=2.0, versions={"torch": "2"}, details={}))
        session.commit()
        for repository_id, reused in ((11, False), (20, False), (10, True)):
            scan, change = change_in(repository_id)
            session.commit()
            _reuse_result(session, scan, change)
            session.refresh(change)
            assert (change.result is not None) is reused, repository_id
            if reused:
                assert change.result.speedup == 2.0
                assert change.result.details["reused_from_change_set"] == measured.id
