"""Links in a repository never take a read or a write out of it: the scan does not follow them,
the working copies for verification hold none, ``--apply`` refuses to write through one, and every
walk has a bound."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine import scan as scan_module
from engine.cli import app
from engine.repo_files import UnsafePath, WalkLimit, copy_tree, write_inside
from engine.scan import scan_path
from tests.engine.verify.fixtures import TINY_MODEL, write_repo
from tests.security.hostile import CONFIG, hostile_repo


def _repo_with_links(tmp_path: Path) -> tuple[Path, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.py"
    victim.write_text(TINY_MODEL)  # rewritable code: a scan that followed the link would rewrite it
    repo = write_repo(tmp_path / "repo", config=CONFIG)
    (repo / "linked_model.py").symlink_to(victim)
    (repo / "escape").symlink_to(outside, target_is_directory=True)
    (repo / "alias.py").symlink_to("model.py")  # inside: its target is scanned on its own path
    return repo, victim


def test_scan_does_not_read_through_links_leaving_the_repository(tmp_path):
    repo, victim = _repo_with_links(tmp_path)
    result = scan_path(repo, rules="sdpa-attention")
    assert sorted(result.files) == ["model.py"]
    outside = {d.file for d in result.diagnostics if "outside the repository" in d.message}
    assert outside == {"linked_model.py", "escape"}


@pytest.mark.torch
def test_scan_verify_without_apply_leaves_a_linked_file_outside_untouched(tmp_path):
    pytest.importorskip("torch")
    repo, victim = _repo_with_links(tmp_path)
    before = (victim.read_bytes(), victim.stat().st_mtime_ns)
    out = CliRunner().invoke(app, ["scan", str(repo), "--rules", "sdpa-attention", "--verify", "--format", "json",
                                   "--no-history"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert {f["file"] for f in data["findings"]} == {"model.py"}
    assert data["verification"]["rules"]["sdpa-attention"]["passed"] is True  # the real rewrite still verified
    assert (victim.read_bytes(), victim.stat().st_mtime_ns) == before
    assert list(victim.parent.iterdir()) == [victim]


def test_working_copies_hold_no_links(tmp_path):
    repo, victim = _repo_with_links(tmp_path)
    copy = tmp_path / "copy"
    dropped = copy_tree(repo, copy)
    assert sorted(dropped) == ["escape", "linked_model.py"]
    assert not any(p.is_symlink() for p in copy.rglob("*"))
    assert (copy / "alias.py").read_text() == (repo / "model.py").read_text()  # materialized as a plain file
    assert not (copy / "linked_model.py").exists() and not (copy / "escape").exists()


def test_apply_refuses_to_write_through_a_link(tmp_path):
    repo, victim = _repo_with_links(tmp_path)
    for rel in ("escape/victim.py", "linked_model.py", "../outside/victim.py", "/etc/passwd"):
        with pytest.raises(UnsafePath):
            write_inside(repo, rel, "overwritten")
    assert victim.read_text() == TINY_MODEL
    write_inside(repo, "model.py", "# fine\n")
    assert (repo / "model.py").read_text() == "# fine\n"


def test_cli_apply_refuses_a_rewrite_of_a_path_through_a_link(tmp_path, monkeypatch):
    repo, victim = _repo_with_links(tmp_path)
    real = scan_path

    def scan_with_a_linked_path(*args, **kwargs):  # a result naming a path through the link
        result = real(*args, **kwargs)
        result.files["escape/victim.py"] = "overwritten"
        result.originals["escape/victim.py"] = TINY_MODEL
        return result

    monkeypatch.setattr(scan_module, "scan_path", scan_with_a_linked_path)
    original_model = (repo / "model.py").read_text()
    out = CliRunner().invoke(app, ["scan", str(repo), "--rules", "sdpa-attention", "--apply", "--no-history"])
    assert out.exit_code == 2 and "--apply refused" in out.output and "symbolic link" in out.output
    assert victim.read_text() == TINY_MODEL
    assert (repo / "model.py").read_text() == original_model  # nothing written when one path is refused


def test_walks_are_bounded_with_a_clear_message(tmp_path, monkeypatch):
    repo = hostile_repo(tmp_path / "repo", "return {}")
    deep = repo
    for index in range(70):
        deep = deep / f"d{index}"
    deep.mkdir(parents=True)
    (deep / "buried.py").write_text(TINY_MODEL)
    result = scan_path(repo, rules="sdpa-attention")
    assert any("folders deep" in d.message for d in result.diagnostics)
    assert all("buried" not in rel for rel in result.files)
    with pytest.raises(WalkLimit, match="folders deep"):
        copy_tree(repo, tmp_path / "copy")
    monkeypatch.setattr(scan_module, "MAX_FILES", 1)
    result = scan_path(repo, rules="sdpa-attention")
    assert result.files_scanned <= 1
    assert any("scan stopped after 1 files" in d.message for d in result.diagnostics)
    assert os.path.exists(repo / "model.py")
