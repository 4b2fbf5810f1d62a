"""Repository code is untrusted: limits stop it, and it sees no secrets and (where possible) no network."""

from __future__ import annotations

import json
import os
import socket

import pytest

pytest.importorskip("torch")

from engine.verify import VerifyConfig, verify  # noqa: E402
from engine.verify.sandbox import network_namespace_available, scrubbed_env  # noqa: E402
from tests.engine.verify.fixtures import sdpa_rewrite, write_repo  # noqa: E402

pytestmark = pytest.mark.torch

SIMPLE = {"harness": "harness.py:build"}


def _config(**kwargs) -> VerifyConfig:
    return VerifyConfig(**{"timeout_s": 60, "threads": 1, "shapes": ({"batch_size": 1, "seq_len": 4},), **kwargs})


def test_hanging_harness_is_stopped_by_the_time_limit(tmp_path):
    repo = write_repo(tmp_path / "repo", harness="""
        import time

        def build(batch_size=1, seq_len=4):
            while True:
                time.sleep(0.05)
    """)
    result = verify(repo, sdpa_rewrite(repo), config=_config(timeout_s=8))
    assert result.status == "timeout"
    assert "time limit" in result.message
    assert result.duration_s < 40


def test_unbounded_allocation_is_stopped_by_the_memory_limit(tmp_path):
    repo = write_repo(tmp_path / "repo", harness="""
        import torch

        def build(batch_size=1, seq_len=4):
            hoard = []
            while True:
                hoard.append(torch.ones(64 * 1024 * 1024))  # 256 MiB each, touched
    """)
    result = verify(repo, sdpa_rewrite(repo), config=_config(memory_bytes=3 * 1024**3))
    assert result.status == "oom", result.message
    assert "original" in result.message


def test_harness_sees_no_secrets_and_no_network(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secretsecretsecret")
    monkeypatch.setenv("ADOPTER_GITHUB_TOKEN", "ghs_anothersecret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("PYTHONPATH", "/nonexistent/injected")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    # The sandbox lets the child write only its working copy: it reports there, in a kept workdir.
    work = tmp_path / "work"
    repo = write_repo(tmp_path / "repo", harness=f"""
        import json, os, socket, sys
        import torch
        from model import Net

        def build(batch_size=1, seq_len=4):
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
                network = "reached"
            except OSError as exc:
                network = repr(exc)
            with open("seen.json", "w") as handle:
                json.dump({{"env": dict(os.environ), "network": network, "path": sys.path, "cwd": os.getcwd()}}, handle)
            return Net(), (torch.randn(batch_size, seq_len, 32),)
    """)
    try:
        result = verify(repo, sdpa_rewrite(repo), config=_config(workdir=work))
    finally:
        server.close()
    assert result.passed, result.message
    data = json.loads(next(work.glob("*-original/tree/repo/seen.json")).read_text())
    env = data["env"]
    for name in ("GITHUB_TOKEN", "ADOPTER_GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "PYTHONPATH"):
        assert name not in env
    assert not any(secret in value for value in env.values()
                   for secret in ("ghp_secretsecretsecret", "ghs_anothersecret", "aws-secret"))
    assert env["HOME"] != os.environ.get("HOME") and env["HOME"].startswith(str(work))
    assert "/nonexistent/injected" not in data["path"]
    assert data["cwd"] != str(repo)  # a temporary working copy, not the repository itself
    if network_namespace_available():
        assert result.network_isolated is True
        assert data["network"] != "reached"
    else:
        assert result.network_isolated is False
        assert any("network" in note for note in result.notes)


def test_scrubbed_env_keeps_only_what_python_needs(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "x")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    env = scrubbed_env(tmp_path / "home", threads=2)
    assert "GITHUB_TOKEN" not in env and "HTTPS_PROXY" not in env
    assert env["HOME"] == str(tmp_path / "home") and env["OMP_NUM_THREADS"] == "2"
    assert env["HF_HUB_OFFLINE"] == "1"


def test_harness_that_fails_to_build_gives_a_clear_error(tmp_path):
    repo = write_repo(tmp_path / "repo", harness="""
        def build(batch_size=1, seq_len=4):
            raise RuntimeError("no dataset here")
    """)
    result = verify(repo, sdpa_rewrite(repo), config=_config())
    assert result.status == "error"
    assert "no dataset here" in result.message
