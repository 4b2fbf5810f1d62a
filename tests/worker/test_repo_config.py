"""The App reads ``.adopter.yml`` through the engine's reader (tests/engine/test_config.py tests the
reader itself); a bad file fails that one scan with the reader's line and nothing else."""

from __future__ import annotations

import pytest

from tests.engine.test_config import ALIAS_BOMB
from tests.worker.test_publish_and_clone import REPO, github  # noqa: F401 - the fixture

pytest.importorskip("sqlalchemy")


def test_the_worker_and_the_command_line_share_one_reader():
    import engine.config
    import engine.verify.targets
    from worker import repo_config

    assert repo_config.load_config is engine.config.load_config
    assert repo_config.RepoConfig is engine.config.RepoConfig
    assert engine.verify.targets.CONFIG_FILES == repo_config.CONFIG_PATHS == engine.config.CONFIG_FILES


def _queued_scan(fake, full_name: str, files: dict[str, str]) -> int:
    from app.db.models import Repository, Scan
    from app.db.session import session_scope

    repo = fake.add_repo(3, full_name, files)
    with session_scope() as session:
        session.add(Repository(id=repo.id, installation_id=3, full_name=full_name, default_branch="main"))
        session.flush()
        scan = Scan(repository_id=repo.id, trigger="test", state="queued")
        session.add(scan)
        session.flush()
        return scan.id


def _clone(scan_id: int) -> tuple[bool, dict]:
    from app.db.models import Scan
    from app.db.session import session_scope
    from worker.pipeline import clone_stage

    with session_scope() as session:
        moved_on = clone_stage(session, scan_id)
    with session_scope() as session:
        scan = session.get(Scan, scan_id)
        return moved_on, {"state": str(scan.state.value if hasattr(scan.state, "value") else scan.state),
                          "reason": scan.reason, "config": scan.config}


@pytest.mark.parametrize("config, reason", [
    (ALIAS_BOMB.decode(), "invalid configuration: .adopter.yml: not valid YAML (line 3, column 4): "
                          "YAML anchors and aliases (&name, *name) are not allowed"),
    ("harnes: harness.py:build\n", "invalid configuration: .adopter.yml: harnes: unknown key (did you mean 'harness'?)"),
    ("disable: [gelu-tahn]\n", "invalid configuration: .adopter.yml: disable: unknown rule 'gelu-tahn' "
                               "(did you mean 'gelu-tanh'?)"),
])
def test_a_bad_file_fails_its_scan_with_one_line_and_the_next_scan_runs(github, tmp_path, monkeypatch,  # noqa: F811
                                                                         config, reason):
    fake, _ = github
    monkeypatch.setenv("ADOPTER_WORK_DIR", str(tmp_path / "work"))
    from app.settings import get_settings

    get_settings.cache_clear()
    bad = _queued_scan(fake, "acme/bad", {".adopter.yml": config, "model.py": "import torch\n"})
    moved_on, scan = _clone(bad)
    assert not moved_on and scan["state"] == "failed" and scan["reason"] == reason
    assert scan["config"] is None  # nothing of the file was stored
    [comment] = fake.repos["acme/bad"].commit_comments
    assert reason.removeprefix("invalid configuration: ") in comment["body"]

    good = _queued_scan(fake, "acme/good", {".adopter.yml": "disable: [gelu-tanh]\n", "model.py": "x = 1\n"})
    moved_on, scan = _clone(good)
    assert moved_on and scan["state"] == "scanning"
    assert scan["config"]["source"] == ".adopter.yml" and scan["config"]["disable"] == ["gelu-tanh"]
