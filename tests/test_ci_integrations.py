"""action.yml (the composite GitHub Action) and .pre-commit-hooks.yaml: their scripts run as written,
against the real command line, in the same order the runner would run them."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from engine.cli import app

ROOT = Path(__file__).resolve().parents[1]
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
HOOKS = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())


@pytest.fixture
def minigpt(tmp_path: Path) -> Path:
    root = tmp_path / "minigpt"
    shutil.copytree(ROOT / "examples" / "minigpt", root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def step(name: str) -> dict:
    return next(s for s in ACTION["runs"]["steps"] if s.get("name") == name)


def expand(text: str, values: dict[str, str]) -> str:
    """GitHub's ${{ ... }} expressions, for the few this action uses."""
    return re.sub(r"\$\{\{\s*([^}]+?)\s*\}\}", lambda m: values[m.group(1)], text)


def run_step(name: str, env: dict[str, str], tmp_path: Path, values: dict[str, str] | None = None):
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "adopter").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m engine.cli \"$@\"\n")
    (shim / "adopter").chmod(0o755)
    spec = step(name)
    values = values or {}
    script = expand(spec["run"], values)
    step_env = {k: expand(str(v), values) for k, v in spec.get("env", {}).items() if k not in env}
    full = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), **step_env, **env}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=300)


def test_the_action_declares_what_its_steps_use():
    inputs = set(ACTION["inputs"])
    text = (ROOT / "action.yml").read_text()
    assert set(re.findall(r"inputs\.([\w-]+)", text)) <= inputs
    assert ACTION["runs"]["using"] == "composite"
    assert any(s.get("uses", "").startswith("github/codeql-action/upload-sarif@") for s in ACTION["runs"]["steps"])
    import typer.main

    scan_command = typer.main.get_command(app).commands["scan"]
    known = {opt for param in scan_command.params for opt in param.opts}
    used = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", step("Scan")["run"]))
    assert used and used <= known, used - known
    for script in (s["run"] for s in ACTION["runs"]["steps"] if "run" in s):
        assert subprocess.run(["bash", "-n", "-c", expand(script, {k: "x" for k in _expressions()})]).returncode == 0


def _expressions() -> set[str]:
    return set(re.findall(r"\$\{\{\s*([^}]+?)\s*\}\}", (ROOT / "action.yml").read_text()))


def test_the_scan_step_writes_sarif_a_summary_and_the_check_code(minigpt, tmp_path):
    out, summary = tmp_path / "output", tmp_path / "summary.md"
    done = run_step("Scan", {"ADOPTER_PATH": str(minigpt), "ADOPTER_RULES": "", "RUNNER_TEMP": str(tmp_path),
                             "GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary)}, tmp_path,
                    {"inputs.path": str(minigpt), "inputs.rules": ""})
    assert done.returncode == 0, done.stderr
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert outputs["exit-code"] == "1"
    sarif = json.loads(Path(outputs["sarif-file"]).read_text())
    assert {r["ruleId"] for r in sarif["runs"][0]["results"]} == {"sdpa-attention", "gelu-tanh", "layer-norm",
                                                                    "fused-adamw"}
    text = summary.read_text()
    assert "model.py:74: sdpa-attention: rewritten" in text and "Rewrites are available" in text

    (minigpt / ".adopter.yml").write_text("harnes: x.py\n")  # a usage error fails the step, said once
    out.write_text("")
    bad = run_step("Scan", {"ADOPTER_PATH": str(minigpt), "ADOPTER_RULES": "", "RUNNER_TEMP": str(tmp_path),
                            "GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary)}, tmp_path)
    assert bad.returncode == 2 and "harnes: unknown key" in bad.stderr


@pytest.mark.parametrize("fail_on, code, expected", [
    ("rewrite", "1", 1), ("rewrite", "0", 0), ("rewrite", "3", 0), ("unscannable", "3", 1),
    ("unscannable", "1", 1), ("never", "1", 0), ("sometimes", "1", 2)])
def test_fail_on_decides_the_job(tmp_path, fail_on, code, expected):
    assert run_step("Fail per fail-on", {"CODE": code, "FAIL_ON": fail_on}, tmp_path).returncode == expected


def _hook(hook_id: str) -> list[str]:
    hook = next(h for h in HOOKS if h["id"] == hook_id)
    assert hook["language"] == "python" and hook["pass_filenames"] is False and hook["types"] == ["python"]
    command = shlex.split(hook["entry"]) + hook["args"]
    assert command[0] == "adopter"
    return command[1:]


def test_pre_commit_hooks_gate_and_fix(minigpt, monkeypatch, tmp_path):
    monkeypatch.chdir(minigpt)  # pre-commit runs hooks at the repository root
    monkeypatch.setenv("ADOPTER_HISTORY_URL", f"sqlite:///{tmp_path / 'h.sqlite'}")
    runner = CliRunner()
    assert runner.invoke(app, _hook("adopter")).exit_code == 1
    before = (minigpt / "model.py").read_text()
    fixed = runner.invoke(app, _hook("adopter-fix"))
    assert fixed.exit_code == 1 and (minigpt / "model.py").read_text() != before
    assert runner.invoke(app, _hook("adopter")).exit_code == 0
    assert runner.invoke(app, _hook("adopter-fix")).exit_code == 0
