"""The README's first command installs ``adopter[torch]`` only; its scan is recorded in the local
history all the same. Simulated without a second virtual environment: a child process in which
every module outside the standard library, this project, and the distributions that the core
dependencies and the ``torch`` extra bring (transitively) fails to import."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN_PACKAGES = {"engine", "app", "worker", "rules", "tests", "examples"}

BLOCKER = r"""
import importlib.abc, json, os, sys

ALLOWED = set(json.loads(os.environ["ADOPTER_TEST_ALLOWED_MODULES"]))


class OnlyTheInstalledExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in ALLOWED or top in sys.stdlib_module_names or top.startswith("_"):
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (not installed with adopter[torch])", name=name)


sys.meta_path.insert(0, OnlyTheInstalledExtras())
from engine.cli import app

app(prog_name="adopter")
"""


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _closure(names: list[str]) -> set[str]:
    """The distributions ``names`` need, transitively (markers for extras ignored: a superset)."""
    seen: set[str] = set()
    todo = [_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return seen


def _allowed_modules() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dists = _closure(project["dependencies"] + project["optional-dependencies"]["torch"])
    modules = set(OWN_PACKAGES)
    for module, owners in metadata.packages_distributions().items():
        if any(o.lower().replace("_", "-") in dists for o in owners):
            modules.add(module)
    return modules


def test_a_scan_with_only_the_torch_extra_is_recorded_and_listed(tmp_path):
    allowed = _allowed_modules()
    assert "sqlalchemy" in allowed and "alembic" in allowed  # core dependencies now
    assert not {"fastapi", "celery", "pydantic_settings", "psycopg", "uvicorn"} & allowed  # the service extra

    project = tmp_path / "minigpt"
    shutil.copytree(ROOT / "examples" / "minigpt", project, ignore=shutil.ignore_patterns("__pycache__"))
    history = tmp_path / "home" / "history.sqlite"
    env = {**os.environ, "ADOPTER_HISTORY_PATH": str(history), "PYTHONPATH": str(ROOT),
           "ADOPTER_TEST_ALLOWED_MODULES": json.dumps(sorted(allowed))}
    env.pop("ADOPTER_HISTORY_URL", None)

    def adopter(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", BLOCKER, *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)

    scanned = adopter("scan", str(project))
    assert scanned.returncode == 0, scanned.stderr
    assert "not recorded" not in scanned.stderr, scanned.stderr
    with sqlite3.connect(history) as db:
        [(count,)] = db.execute("SELECT count(*) FROM scans")
        statuses = sorted(s for (s,) in db.execute("SELECT status FROM findings"))
    assert count == 1 and statuses == ["rewritten"] * 4

    listed = adopter("history", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["scans"][0]["folder"] == str(project.resolve())

    # the blocker really blocks: the dashboard needs the service extra and says so
    dashboard = adopter("dashboard", "--port", "1")
    assert dashboard.returncode == 2 and "pip install 'adopter[service]'" in dashboard.stderr
