"""Every process repository code starts dies with the run: a setsid grandchild after a normal end,
after the time limit, and when the caller is interrupted (Celery's soft time limit); a child cannot
kill its parent; process count and memory are bounded."""

from __future__ import annotations

import os
import signal
import textwrap
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("torch")

from celery.exceptions import SoftTimeLimitExceeded  # noqa: E402

from engine.bench import bench  # noqa: E402
from engine.verify import verify  # noqa: E402
from tests.engine.verify.fixtures import sdpa_rewrite  # noqa: E402
from tests.security.hostile import bench_config, hostile_repo, probes, verify_config  # noqa: E402

pytestmark = pytest.mark.torch


def _grandchild(token: str) -> str:
    """Attack code: a daemon in a new session that beats a heartbeat file until killed."""
    return textwrap.dedent(f"""
        beat = os.path.abspath("heartbeat-{token}")
        loop = "import sys, time\\nwhile True:\\n    open(sys.argv[1], 'a').write('.')\\n    time.sleep(0.1)\\n"
        if os.fork() == 0:  # double fork + setsid: no longer our child, not in our session
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", loop, beat, "{token}"])
            os._exit(0)
        time.sleep(0.5)
    """)


def _alive_with(token: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if token.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _assert_dead(token: str, workdir: Path) -> None:
    time.sleep(1.0)
    assert _alive_with(token) == []
    beats = list(workdir.rglob(f"heartbeat-{token}"))
    sizes = [b.stat().st_size for b in beats]
    time.sleep(1.0)
    assert [b.stat().st_size for b in beats] == sizes  # nothing beats any more


def test_a_setsid_grandchild_does_not_outlive_the_verification(tmp_path):
    token = uuid.uuid4().hex
    repo = hostile_repo(tmp_path / "repo", _grandchild(token) + "\nreturn {'spawned': True}")
    result = verify(repo, sdpa_rewrite(repo), config=verify_config(tmp_path / "verify"))
    assert result.passed, result.message
    assert list((tmp_path / "verify").rglob(f"heartbeat-{token}"))  # the attack did run
    _assert_dead(token, tmp_path / "verify")


def test_a_grandchild_of_a_run_stopped_by_its_time_limit_dies_too(tmp_path):
    token = uuid.uuid4().hex
    repo = hostile_repo(tmp_path / "repo", _grandchild(token) + "\nwhile True:\n    time.sleep(1)")
    started = time.monotonic()
    result = verify(repo, sdpa_rewrite(repo), config=verify_config(tmp_path / "verify", timeout_s=15))
    assert result.status == "timeout" and "time limit" in result.message
    assert time.monotonic() - started < 60
    _assert_dead(token, tmp_path / "verify")


def test_the_callers_soft_time_limit_kills_the_whole_tree_and_leaves_no_scratch_folder(tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    token = uuid.uuid4().hex
    repo = hostile_repo(tmp_path / "repo", _grandchild(token) + "\nwhile True:\n    time.sleep(1)")

    def soft_limit(*_):  # Celery's soft limit, once the attack's grandchild is running (a loaded machine is slow)
        if not list(scratch.rglob(f"heartbeat-{token}")):
            signal.alarm(1)
            return
        raise SoftTimeLimitExceeded()

    for run in (lambda: verify(repo, sdpa_rewrite(repo), config=verify_config(None, timeout_s=120)),
                lambda: bench(repo, sdpa_rewrite(repo), config=bench_config(None, timeout_s=120))):
        previous = signal.signal(signal.SIGALRM, soft_limit)
        signal.alarm(5)
        try:
            with pytest.raises(SoftTimeLimitExceeded):
                run()
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        _assert_dead(token, scratch)
        assert list(scratch.iterdir()) == []  # the working copies went with it


def test_a_child_cannot_kill_its_parent(tmp_path):
    host_pid = os.getpid()
    repo = hostile_repo(tmp_path / "repo", f"""
        outcome = {{}}
        for name, pid in (("ppid", os.getppid()), ("host parent", {host_pid}), ("host init", 1)):
            try:
                os.kill(pid, 9)
                outcome[name] = "sent"
            except OSError as exc:
                outcome[name] = type(exc).__name__
        return outcome
    """)
    result = verify(repo, sdpa_rewrite(repo), config=verify_config(tmp_path / "verify"))
    assert result.passed, result.message  # the run went on: nothing it could reach was its parent
    assert os.getpid() == host_pid
    seen = probes(tmp_path / "verify")
    assert len(seen) == 2


def test_the_process_count_is_bounded(tmp_path):
    repo = hostile_repo(tmp_path / "repo", """
        children, error = [], None
        try:
            for _ in range(700):
                children.append(subprocess.Popen(["sleep", "60"]))
        except OSError as exc:
            error = type(exc).__name__
        for child in children:
            child.kill()
            child.wait()
        return {"spawned": len(children), "error": error}
    """)
    result = verify(repo, sdpa_rewrite(repo), config=verify_config(tmp_path / "verify"))
    assert result.passed, result.message
    for report in probes(tmp_path / "verify"):
        assert report["spawned"] < 512 and report["error"] is not None, report


def test_unbounded_memory_in_the_benchmark_child_fails_that_benchmark_only(tmp_path):
    # valid for verification (batch 1); the benchmark's batch of 3 allocates without end
    repo = hostile_repo(tmp_path / "repo", """
        hoard = []
        while batch_size == 3:
            hoard.append(torch.ones(64 * 1024 * 1024))
        return {}
    """)
    rewrite = sdpa_rewrite(repo)
    assert verify(repo, rewrite, config=verify_config(tmp_path / "verify")).passed
    result = bench(repo, rewrite, config=bench_config(tmp_path / "bench", memory_bytes=2 * 1024**3,
                                                      shape={"batch_size": 3, "seq_len": 4}))
    assert result.status == "oom", (result.status, result.message)
    assert "original" in result.message


def test_a_verifying_process_killed_outright_leaves_no_process_and_its_folder_is_swept(tmp_path):
    """What a Celery pool process SIGKILLed mid-verification leaves: nothing running (bwrap dies with
    its parent and takes the pid namespace with it), and a scratch folder the next sweep removes."""
    import subprocess
    import sys

    from engine.verify.workspace import sweep_orphans

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    token = uuid.uuid4().hex
    repo = hostile_repo(tmp_path / "repo", _grandchild(token) + "\nwhile True:\n    time.sleep(1)")
    code = ("import sys, tempfile; tempfile.tempdir = sys.argv[2]\n"
            "from pathlib import Path\n"
            "from engine.verify import verify\n"
            "from tests.engine.verify.fixtures import sdpa_rewrite\n"
            "from tests.security.hostile import verify_config\n"
            "repo = Path(sys.argv[1])\n"
            "verify(repo, sdpa_rewrite(repo), config=verify_config(None, timeout_s=300))\n")
    verifying = subprocess.Popen([sys.executable, "-c", code, str(repo), str(scratch)],
                                 env={**os.environ, "PYTHONPATH": os.getcwd(), "ADOPTER_SANDBOX": "require"})
    deadline = time.monotonic() + 120
    while not list(scratch.rglob(f"heartbeat-{token}")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(scratch.rglob(f"heartbeat-{token}")), "the harness never started"
    verifying.kill()
    verifying.wait()
    _assert_dead(token, scratch)
    assert len(sweep_orphans(scratch)) == 1
    assert list(scratch.iterdir()) == []
