"""Without a working sandbox, production refuses to run repository code and says why; development
runs it with a loud warning; and a scratch folder of a killed process does not stay behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from engine.bench import bench  # noqa: E402
from engine.verify import sandbox, verify  # noqa: E402
from engine.verify.workspace import sweep_orphans  # noqa: E402
from tests.engine.verify.fixtures import sdpa_rewrite  # noqa: E402
from tests.security.hostile import bench_config, hostile_repo, probes, verify_config  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture
def no_bwrap(monkeypatch):
    """This machine as one without bubblewrap: the probe finds no bwrap."""
    real_which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    sandbox._probe.cache_clear()
    yield
    sandbox._probe.cache_clear()


@pytest.mark.parametrize("env", [{"ADOPTER_ENV": "production", "ADOPTER_SANDBOX": ""},
                                 {"ADOPTER_ENV": "production", "ADOPTER_SANDBOX": "off"},
                                 {"ADOPTER_ENV": "development", "ADOPTER_SANDBOX": "require"}])
def test_without_a_sandbox_production_refuses_to_run_repository_code(tmp_path, monkeypatch, no_bwrap, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    repo = hostile_repo(tmp_path / "repo", "return {'ran': True}")
    result = verify(repo, sdpa_rewrite(repo), config=verify_config(tmp_path / "verify"))
    assert result.status == "error"
    assert "refusing to run repository code" in result.message and "bubblewrap" in result.message
    benchmarked = bench(repo, sdpa_rewrite(repo), config=bench_config(tmp_path / "bench"))
    assert benchmarked.status == "error" and "refusing to run repository code" in benchmarked.message
    assert probes(tmp_path) == []  # not one line of the repository's code ran


def test_without_a_sandbox_development_runs_and_says_so_loudly(tmp_path, monkeypatch, no_bwrap, capfd):
    monkeypatch.setenv("ADOPTER_ENV", "development")
    monkeypatch.setenv("ADOPTER_SANDBOX", "")
    sandbox._warn_unsandboxed.cache_clear()
    repo = hostile_repo(tmp_path / "repo", "return {'uid': os.getuid()}")
    result = verify(repo, sdpa_rewrite(repo), config=verify_config(tmp_path / "verify"))
    assert result.passed, result.message
    assert any(note.startswith("UNSANDBOXED") for note in result.notes)
    assert "WITHOUT a sandbox" in capfd.readouterr().err
    assert [p["uid"] for p in probes(tmp_path / "verify")] == [os.getuid()] * 2


def test_the_sandboxed_run_says_nothing_of_the_kind(tmp_path):
    repo = hostile_repo(tmp_path / "repo", "return {}")
    result = verify(repo, sdpa_rewrite(repo), config=verify_config(tmp_path / "verify"))
    assert result.passed and not any("UNSANDBOXED" in note for note in result.notes)


def test_a_scratch_folder_of_a_killed_process_is_swept(tmp_path):
    code = ("import sys, tempfile, time; tempfile.tempdir = sys.argv[1];"
            "from engine.verify.workspace import scratch_dir; print(scratch_dir('verify'), flush=True); time.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    folder = owner.stdout.readline().strip()
    assert os.path.isdir(folder)
    assert sweep_orphans(tmp_path) == []  # its owner still runs
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    time.sleep(0.2)
    assert [str(p) for p in sweep_orphans(tmp_path)] == [folder]
    assert not os.path.exists(folder)


def test_a_shared_folder_is_never_made_writable_nor_given_to_the_child(tmp_path, monkeypatch):
    """The child's writable folders are its own: a caller that names the temporary directory, a
    folder holding it, or the Python environment is refused before anything is bound or handed
    over to nobody (a chown of all of /tmp broke every other process's temporary files once)."""
    shared = tmp_path / "shared-tmp"
    (shared / "other-tenant").mkdir(parents=True)
    sentinel = shared / "other-tenant" / "file"
    sentinel.write_text("theirs")
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(shared))
    script = tmp_path / "child.py"
    script.write_text("open('made-here', 'w').write('ok')\n")
    owner = sentinel.stat().st_uid
    for cwd, writable in ((shared, []), (tmp_path, []), (shared / "mine", [shared]),
                          (shared / "mine", [sys.prefix])):
        (shared / "mine").mkdir(exist_ok=True)
        with pytest.raises(sandbox.SandboxUnavailable, match="a folder other processes share"):
            sandbox.popen(script, [], cwd=cwd, home=shared / "mine" / "home", limits=sandbox.Limits(),
                          writable=writable)
    assert sentinel.stat().st_uid == owner and shared.stat().st_uid == owner
    assert not (shared / "made-here").exists() and not (tmp_path / "made-here").exists()
    # a folder of its own inside the temporary directory is what a child gets
    process, _ = sandbox.popen(script, [], cwd=shared / "mine", home=shared / "mine" / "home",
                               limits=sandbox.Limits())
    assert process.wait(timeout=60) == 0
    assert (shared / "mine" / "made-here").read_text() == "ok"
    assert sentinel.stat().st_uid == owner
