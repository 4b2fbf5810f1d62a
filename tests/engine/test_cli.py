"""`adopter scan` as a CI gate and a tool that honours .adopter.yml; the other commands' output forms."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "minigpt"
ANSI = "\x1b["


@pytest.fixture(autouse=True)
def _history(tmp_path, monkeypatch):
    monkeypatch.setenv("ADOPTER_HISTORY_URL", f"sqlite:///{tmp_path / 'history' / 'h.sqlite'}")


@pytest.fixture
def minigpt(tmp_path: Path) -> Path:
    root = tmp_path / "minigpt"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def run(*args: str, **kwargs):
    return CliRunner().invoke(app, list(args), **kwargs)


def findings(out) -> list[tuple[str, str, str]]:
    return [(f["file"], f["rule"], f["status"]) for f in json.loads(out.stdout)["findings"]]


# --- --check exit codes ---------------------------------------------------------------------------


def test_check_exits_1_with_a_rewrite_and_0_after_apply_with_no_finding_left(minigpt):
    first = run("scan", str(minigpt), "--check", "--no-history")
    assert first.exit_code == 1, first.output
    assert run("scan", str(minigpt), "--apply", "--no-history").exit_code == 0
    again = run("scan", str(minigpt), "--check", "--format", "json", "--no-history")
    assert again.exit_code == 0, again.output
    assert findings(again) == []  # not even a near-miss about the tool's own edit
    assert run("scan", str(minigpt), "--no-history").exit_code == 0  # without --check: 0 either way


def test_check_exit_codes_for_usage_errors_and_unscannable_files(tmp_path):
    empty = tmp_path / "docs-only"
    empty.mkdir()
    (empty / "README.md").write_text("# no Python here\n")
    out = run("scan", str(empty), "--check")
    assert out.exit_code == 2 and f"error: no Python files to scan in {empty}" in out.output
    assert run("scan", str(tmp_path / "missing"), "--check").exit_code == 2

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.py").write_text("import torch\n\ndef forward(x:\n    return x\n")
    out = run("scan", str(broken), "--check")
    assert out.exit_code == 3 and "does not parse" in out.output
    (broken / "ok.py").write_text("import torch\n\n\ndef f(m):\n    return torch.optim.AdamW(m.parameters())\n")
    assert run("scan", str(broken), "--check").exit_code == 1  # a rewrite outranks an unscannable file

    only_excluded = tmp_path / "excluded"
    only_excluded.mkdir()
    (only_excluded / "t.py").write_text("import torch\n")
    out = run("scan", str(only_excluded), "--exclude", "t.py")
    assert out.exit_code == 2 and "(after paths.include/exclude)" in out.output


# --- .adopter.yml honoured, options win ----------------------------------------------------------


def test_the_file_settings_apply_and_options_replace_them(minigpt):
    everything = {(f, r) for f, r, _ in findings(run("scan", str(minigpt), "--format", "json"))}
    assert ("model.py", "gelu-tanh") in everything and ("train.py", "fused-adamw") in everything

    config = (minigpt / ".adopter.yml").read_text()
    (minigpt / ".adopter.yml").write_text(config + "disable: [gelu-tanh]\npaths: {exclude: [train.py]}\n")
    out = run("scan", str(minigpt), "--format", "json")
    assert out.exit_code == 0, out.output
    seen = {(f, r) for f, r, _ in findings(out)}
    assert seen == everything - {("model.py", "gelu-tanh"), ("train.py", "fused-adamw")}

    out = run("scan", str(minigpt), "--format", "json", "--exclude", "model.py")  # replaces paths.exclude
    assert {f for f, _, _ in findings(out)} == {"train.py"}
    out = run("scan", str(minigpt), "--format", "json", "--rules", "gelu-tanh,layer-norm")
    assert {r for _, r, _ in findings(out)} == {"layer-norm"}  # disable still holds

    (minigpt / ".adopter.yml").write_text(config + "rules: fused-adamw\n")
    assert {r for _, r, _ in findings(run("scan", str(minigpt), "--format", "json"))} == {"fused-adamw"}


def test_an_invalid_file_is_one_error_line_and_exit_2(minigpt):
    (minigpt / ".adopter.yml").write_text("harnes: harness.py:build\n")
    out = run("scan", str(minigpt))
    assert out.exit_code == 2
    assert out.output == "error: .adopter.yml: harnes: unknown key (did you mean 'harness'?)\n"
    (minigpt / ".adopter.yml").write_text("a: &x [1]\nb: *x\n")
    out = run("scan", str(minigpt), "--check")
    assert out.exit_code == 2 and out.output.count("\n") == 1 and "anchors and aliases" in out.output


def test_an_unknown_rule_id_is_a_usage_error_with_a_suggestion(minigpt):
    out = run("scan", str(minigpt), "--rules", "sdpa-atention,layer-norm")
    assert out.exit_code == 2
    assert "unknown rule id(s): sdpa-atention (did you mean 'sdpa-attention'?)" in out.output
    out = run("scan", str(minigpt), "--rules", "zzz")
    assert out.exit_code == 2 and "unknown rule id(s): zzz;" in out.output


def test_the_scan_records_the_settings_it_ran_with(minigpt, tmp_path):
    from sqlalchemy import create_engine, text

    (minigpt / ".adopter.yml").write_text("disable: [gelu-tanh]\n")
    assert run("scan", str(minigpt), "--exclude", "train.py").exit_code == 0
    engine = create_engine(f"sqlite:///{tmp_path / 'history' / 'h.sqlite'}")
    with engine.connect() as connection:
        [stored] = connection.execute(text("SELECT config FROM scans")).scalars()
    engine.dispose()
    config = json.loads(stored)
    assert config["source"] == ".adopter.yml" and config["disable"] == ["gelu-tanh"]
    assert config["paths"]["exclude"] == ["train.py"]


# --- output forms --------------------------------------------------------------------------------


def test_diff_dash_writes_the_patch_to_stdout_and_no_file(minigpt, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run("scan", str(minigpt), "--diff", "-", "--no-history")
    assert out.exit_code == 0
    assert out.stdout.startswith("--- a/model.py\n+++ b/model.py\n")
    assert "file(s) scanned" not in out.stdout and "file(s) scanned" in out.stderr  # the report moved aside
    assert not (tmp_path / "-").exists()


def test_no_color_is_respected_on_error_lines(tmp_path):
    coloured = run("scan", str(tmp_path / "missing"), color=True)
    assert ANSI in coloured.output  # the test can tell
    plain = run("scan", str(tmp_path / "missing"), color=True, env={"NO_COLOR": "1"})
    assert plain.exit_code == 2 and ANSI not in plain.output and plain.output.startswith("error: ")


def _colours(text: str) -> set[str]:
    """The SGR parameters that set a colour (30-37, 38;..., 40-47, 90-97, ...); bold and dim are not."""
    import re

    return {p for sgr in re.findall(r"\x1b\[([0-9;]*)m", text) for p in sgr.split(";")
            if p and (p[0] in "349" and len(p) == 2 or p in ("38", "48"))}


def test_no_color_is_respected_by_rich_output_too():
    forced = {"FORCE_COLOR": "1"}  # rich would colour a non-terminal then
    assert _colours(run("scan", "--bogus", color=True, env=forced).output)
    assert not _colours(run("scan", "--bogus", color=True, env={**forced, "NO_COLOR": "1"}).output)


def test_rules_and_history_speak_json(minigpt):
    from engine.scan import select_rules

    rules = json.loads(run("rules", "--format", "json").stdout)
    assert [r["id"] for r in rules] == [r.id for r in select_rules("all")]
    assert {r["kind"] for r in rules} <= {"rewrite", "rewrite-guarded", "detect-only"}
    assert next(r for r in rules if r["id"] == "sdpa-attention")["kind"] == "rewrite-guarded"

    assert run("scan", str(minigpt)).exit_code == 0
    listed = run("history", "--format", "json")
    assert listed.exit_code == 0, listed.output
    data = json.loads(listed.stdout)
    assert data["total"] == 1 and data["scans"][0]["folder"] == str(minigpt.resolve())
    assert data["scans"][0]["findings"] == {"rewritten": 4} and data["scans"][0]["state"] == "done"
    assert json.loads(run("history", "--format", "json", "--state", "failed").stdout)["total"] == 0


def test_history_state_is_validated_with_the_valid_states_listed():
    out = run("history", "--state", "finished")
    assert out.exit_code == 2
    assert out.output.strip() == ("error: --state: 'finished' is not a scan state; valid states: queued, cloning, "
                                  "scanning, verifying, benchmarking, publishing, done, failed, skipped")


def test_shell_completion_is_offered(monkeypatch):
    # `--show-completion` is a flag: the shell is detected from the processes above this one
    # (shellingham), which a run started without a shell above it does not have ("Shell  not
    # supported."): the test says which shell it asks for
    import shellingham

    monkeypatch.setattr(shellingham, "detect_shell", lambda *a, **k: ("bash", "/bin/bash"))
    script = run("--show-completion", prog_name="adopter")
    assert script.exit_code == 0 and "_ADOPTER_COMPLETE=complete_bash" in script.output, (
        script.output, repr(script.exception))
    env = {"_ADOPTER_COMPLETE": "complete_bash", "COMP_WORDS": "adopter history --state f", "COMP_CWORD": "3"}
    assert run(prog_name="adopter", env=env).output.split() == ["failed"]


# --- progress ------------------------------------------------------------------------------------


def test_progress_lines_name_the_stage_the_step_and_the_time_left(minigpt, monkeypatch):
    import engine.pipeline as pipeline
    from engine.bench import BenchResult
    from engine.progress import LineProgress
    from engine.scan import scan_path

    def fake_bench(root, files, target=None, *, config=None, on_round=None):
        for done in range(1, config.repeats + 1):
            on_round(done, config.repeats)
        return BenchResult("ok", device="cpu", dtype="float32", baseline_step_s=0.2, optimized_step_s=0.1,
                           speedup=2.0)

    monkeypatch.setattr("engine.bench.bench", fake_bench)
    lines = io.StringIO()
    pipeline.verify_and_bench(scan_path(minigpt, rules="gelu-tanh"), minigpt, verify=False, bench=True, repeats=3,
                              progress=LineProgress(lines))
    shown = lines.getvalue().splitlines()
    assert [line.split(" (about")[0] for line in shown] == [
        "bench 1/3: round 1/3", "bench 2/3: round 2/3", "bench 3/3: round 3/3"]
    assert all("left)" in line for line in shown[:2]) and "left" not in shown[2]


def test_bench_rounds_past_the_fewest_have_no_total_and_the_budget_bounds_the_time_left(minigpt, monkeypatch):
    import engine.pipeline as pipeline
    from engine.bench import BenchResult
    from engine.progress import LineProgress
    from engine.scan import scan_path

    def fake_bench(root, files, target=None, *, config=None, on_round=None):  # as engine.bench.bench calls it
        for done in range(1, 6):
            stopped = done == 5  # converged after five rounds
            on_round(done, max(config.repeats, done + (not stopped)))
        return BenchResult("ok", device="cpu", dtype="float32", baseline_step_s=0.2, optimized_step_s=0.1,
                           speedup=2.0)

    monkeypatch.setattr("engine.bench.bench", fake_bench)
    lines = io.StringIO()
    pipeline.verify_and_bench(scan_path(minigpt, rules="gelu-tanh"), minigpt, verify=False, bench=True, repeats=3,
                              bench_budget_s=120, progress=LineProgress(lines))
    shown = lines.getvalue().splitlines()
    assert [line.split(" (about")[0] for line in shown] == [
        "bench 1/3: round 1/3", "bench 2/3: round 2/3",
        "bench 3: round 3, more until the speedup's 95% interval is within +/- 5%",
        "bench 4: round 4, more until the speedup's 95% interval is within +/- 5%",
        "bench 5/5: round 5/5"]
    assert all(line.endswith(("1 min 59 s left)", "2 min 00 s left)")) for line in shown[2:4]), shown
    assert "left" not in shown[4]
    # the first round's time left is the budget's, not an estimate from the build and the warm-up
    assert shown[0].endswith(("1 min 59 s left)", "2 min 00 s left)")), shown
