"""The App key must be out of reach of repository code: not in the parent's environment through
/proc, not in a file by its absolute path, not smuggled out through a reported version."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

from engine.bench import bench  # noqa: E402
from engine.verify import sandbox, verify  # noqa: E402
from engine.verify.messages import parent_versions  # noqa: E402
from tests.engine.verify.fixtures import sdpa_rewrite  # noqa: E402
from tests.security.hostile import bench_config, hostile_repo, probes, verify_config  # noqa: E402

pytestmark = pytest.mark.torch

FAKE_KEY = "-----BEGIN RSA PRIVATE KEY-----FAKEKEYFORTHESANDBOXTEST-----END RSA PRIVATE KEY-----"


def test_parent_environment_and_other_processes_are_unreachable_and_versions_carry_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ADOPTER_GITHUB_PRIVATE_KEY", FAKE_KEY)
    monkeypatch.setenv("ADOPTER_DATABASE_URL", "postgresql://adopter:FAKEKEYFORTHESANDBOXTEST@db/adopter")
    host_pid = os.getpid()
    repo = hostile_repo(tmp_path / "repo", f"""
        found, readable = [], []
        for pid in sorted({{os.getppid(), 1, {host_pid}}} | {{int(p) for p in os.listdir("/proc") if p.isdigit()}}):
            for entry in ("environ", "cmdline"):
                try:
                    data = open(f"/proc/{{pid}}/{{entry}}", "rb").read()
                except OSError:
                    continue
                readable.append(f"{{pid}}/{{entry}}")
                if b"FAKEKEYFORTHESANDBOXTEST" in data:
                    found.append(f"{{pid}}/{{entry}}")
        found += [k for k, v in os.environ.items() if "FAKEKEYFORTHESANDBOXTEST" in v]
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        # the side channel of the original attack: whatever was found, written into torch's version
        torch.__version__ = "FAKEKEYFORTHESANDBOXTEST " + " ".join(found)
        return {{"found": found, "readable": readable, "pids": pids, "ppid": os.getppid(), "uid": os.getuid()}}
    """)
    rewrite = sdpa_rewrite(repo)
    verified = verify(repo, rewrite, config=verify_config(tmp_path / "verify"))
    assert verified.passed, verified.message  # the attack is a side channel: the rewrite still verifies
    benchmarked = bench(repo, rewrite, config=bench_config(tmp_path / "bench"))
    assert benchmarked.ok, benchmarked.message
    assert benchmarked.speedup is not None and benchmarked.speedup.median > 0

    seen = probes(tmp_path / "verify") + probes(tmp_path / "bench")
    assert len(seen) >= 4  # original and rewritten side, verification and benchmark
    for report in seen:
        assert report["found"] == []
        assert report["uid"] == 65534  # another user (nobody), whatever the parent runs as
        assert len(report["pids"]) <= 4, report["pids"]  # its own pid namespace: bwrap's init and itself
    # nothing the child set reaches the report: versions are the parent's own reading
    published = json.dumps(benchmarked.to_dict()) + json.dumps(verified.to_dict())
    assert "FAKEKEYFORTHESANDBOXTEST" not in published
    assert benchmarked.versions == parent_versions()
    assert benchmarked.versions["torch"].startswith("2.")


def test_a_key_file_outside_the_working_copy_cannot_be_read_and_nothing_outside_can_be_written(tmp_path):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    key = secrets / "app-key.pem"
    key.write_text(FAKE_KEY)
    key.chmod(0o644)  # readable by anyone on the host: only the sandbox's mounts keep it out
    outside = tmp_path / "outside-written.txt"
    repo = hostile_repo(tmp_path / "repo", f"""
        seen = {{}}
        for path in ({str(key)!r}, "/etc/shadow", "/root/.bash_history", "/etc/hostname",
                     os.path.expanduser("~root") + "/.ssh/id_rsa", {str(tmp_path / "repo" / "model.py")!r}):
            try:
                seen[path] = open(path).read()[:100]
            except OSError as exc:
                seen[path] = type(exc).__name__
        writes = {{}}
        for path in ({str(outside)!r}, "/usr/adopter-escape", "/etc/adopter-escape", "/adopter-escape",
                     {str(tmp_path / "repo" / "model.py")!r}):
            try:
                with open(path, "a") as handle:
                    handle.write("escaped")
                writes[path] = "written"
            except OSError as exc:
                writes[path] = type(exc).__name__
        with open("/tmp/private-tmp-file", "w") as handle:  # its private /tmp: allowed, and gone after
            handle.write("x")
        return {{"reads": seen, "writes": writes, "listing": sorted(os.listdir("/")),
                 "run": os.path.exists("/run"), "home": os.path.exists("/home")}}
    """)
    original_model = (repo / "model.py").read_text()
    result = verify(repo, sdpa_rewrite(repo), config=verify_config(tmp_path / "verify"))
    assert result.passed, result.message
    seen = probes(tmp_path / "verify")
    assert len(seen) == 2
    for report in seen:
        for path, outcome in report["reads"].items():
            assert "FAKEKEY" not in outcome and outcome in ("FileNotFoundError", "PermissionError"), (path, outcome)
        for path, outcome in report["writes"].items():
            assert outcome != "written", path
        assert not report["run"] and not report["home"]
        # The system folders, and the first folder of each path the Python environment is bound at
        # (a CI checkout's venv under /check puts "check" there); nothing else of the host.
        python_tops = {Path(path).parts[1] for path in sandbox._python_dirs()}
        assert set(report["listing"]) <= {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc",
                                          "dev", "tmp", "sys"} | python_tops, report["listing"]
    assert not outside.exists()
    assert (repo / "model.py").read_text() == original_model
    for path in ("/usr/adopter-escape", "/etc/adopter-escape", "/adopter-escape", "/tmp/private-tmp-file"):
        assert not os.path.exists(path)
