"""The `adopter` command line."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

import typer

app = typer.Typer(
    help="Adopter: rewrite PyTorch model code to use optimized kernels, prove it, measure it.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
)


class ExtractFormat(StrEnum):
    text = "text"
    json = "json"


class ScanFormat(StrEnum):
    text = "text"
    json = "json"
    sarif = "sarif"


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


class DType(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"


def _version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    import engine.extract

    try:
        release = version("adopter")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        release = "unknown"
    typer.echo(f"adopter {release} (python {sys.version.split()[0]}; extractor {engine.extract.IMPLEMENTATION})")
    raise typer.Exit()


@app.callback()
def _main(
    show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and whether the extractor is compiled."),
) -> None:
    """Adopter: rewrite PyTorch model code to use optimized kernels, prove it, measure it."""


# Exit codes of `adopter scan` (docs in the README's CLI section), like black --check.
EXIT_OK = 0  # nothing to rewrite (or not --check)
EXIT_REWRITE_AVAILABLE = 1  # --check: at least one file would change
EXIT_USAGE = 2  # bad arguments, an invalid .adopter.yml, a path without Python files
EXIT_UNSCANNABLE = 3  # --check: nothing to rewrite, but some files could not be scanned (parse errors)


def _color(fg: str) -> str | None:
    """No colour where NO_COLOR is set to anything (https://no-color.org); click already drops it
    when the stream is not a terminal."""
    return None if os.environ.get("NO_COLOR") else fg


def _say(message: str, fg: str | None = None) -> None:
    colour = _color(fg) if fg else None
    if colour:
        typer.secho(message, err=True, fg=colour)
    else:  # secho adds a reset sequence even without a colour
        typer.echo(message, err=True)


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    _say(f"error: {message}", typer.colors.RED)
    raise typer.Exit(code)


@app.command()
def extract(
    path: Path = typer.Argument(..., help="A Python file or a folder (searched recursively)."),
    class_name: str | None = typer.Option(None, "--class", help="Only this class."),
    method: str | None = typer.Option(None, "--method", help="Only this method."),
    fmt: ExtractFormat = typer.Option(ExtractFormat.text, "--format", help="DSL text or JSON."),
) -> None:
    """Print the model structure of every nn.Module class in the DSL (what rules are matched against)."""
    from dataclasses import asdict, replace

    from engine.dsl.printer import print_file
    from engine.extract import extract_path

    if not path.exists():
        _fail(f"{path} does not exist")
    models = extract_path(path)
    out = []
    for fm in models:
        classes = [c for c in fm.classes if class_name is None or c.name == class_name]
        if method is not None:
            classes = [replace(c, methods=tuple(m for m in c.methods if m.name == method)) for c in classes]
        if class_name is not None and not classes:
            continue
        out.append(replace(fm, classes=tuple(classes)))
        for diag in fm.diagnostics:
            _say(f"{diag.file}:{diag.line}: {diag.severity}: {diag.message}", typer.colors.YELLOW)
    if fmt is ExtractFormat.json:
        typer.echo(json.dumps([asdict(fm) for fm in out], default=repr, indent=1))
    else:
        for fm in out:
            if fm.classes:
                typer.echo(print_file(fm))
    if class_name is not None and not out:
        _fail(f"no class {class_name!r} found", 1)


class ListFormat(StrEnum):
    text = "text"
    json = "json"


@app.command()
def rules(
    spec: str = typer.Option("all", "--rules", help="all, default, paper, or comma-separated ids."),
    fmt: ListFormat = typer.Option(ListFormat.text, "--format", help="text or json."),
) -> None:
    """List the rules."""
    from engine.scan import RuleSelectionError, select_rules

    try:
        chosen = select_rules(spec)
    except RuleSelectionError as exc:
        _fail(str(exc))
    rows = [{"id": rule.id, "kind": "detect-only" if rule.detect_only else "rewrite-guarded" if rule.guard else "rewrite",
             "summary": rule.summary, "kernel": rule.kernel, "requires": list(rule.requires),
             "default": not rule.id.startswith("paper/")} for rule in chosen]
    if fmt is ListFormat.json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        kind = row["kind"].replace("rewrite-guarded", "rewrite (guarded)")
        typer.echo(f"{row['id']:22s} {kind:18s} {row['summary']}")


@app.command()
def scan(
    path: str = typer.Argument(..., help="A file or folder to scan (recursively)."),
    rules_spec: str | None = typer.Option(None, "--rules", help="all, default (current kernels), paper, or ids "
                                          "(default: .adopter.yml's rules, else default)."),
    fmt: ScanFormat = typer.Option(ScanFormat.text, "--format", help="text, json or sarif."),
    output: Path | None = typer.Option(None, "--output", help="Write the report here instead of stdout."),
    diff: str | None = typer.Option(None, "--diff", help="Write the patch (unified diff) to this file; - for "
                                    "stdout (the report then goes to stderr unless --output is given)."),
    apply: bool = typer.Option(False, "--apply", help="Rewrite the files in place."),
    check: bool = typer.Option(False, "--check", help="CI gate: exit 1 when a rewrite is available, 0 when none, "
                               "3 when none but some files could not be scanned, 2 on usage errors."),
    include: list[str] = typer.Option([], "--include", help="Only paths matching (glob or folder); repeatable; "
                                      "replaces paths.include."),
    exclude: list[str] = typer.Option([], "--exclude", help="Skip paths matching (glob or folder); repeatable; "
                                      "replaces paths.exclude."),
    verify: bool = typer.Option(False, "--verify", help="Prove each rewrite equivalent (sandboxed); drop failures."),
    bench: bool = typer.Option(False, "--bench", help="Time the training step and peak memory, before and after."),
    device: Device = typer.Option(Device.cpu, "--device", help="Benchmark device."),
    dtype: DType = typer.Option(DType.float32, "--dtype", help="Benchmark (and verification) dtype."),
    bench_shape: str | None = typer.Option(None, "--bench-shape", help="Benchmark build() arguments, e.g. "
                                           "batch_size=2,seq_len=512 (default: the harness's bench shape)."),
    repeats: int | None = typer.Option(None, "--repeats", min=1, help="The fewest interleaved benchmark rounds "
                                       "(default 10); more run until the speedup's 95% interval is within +/- 5%."),
    bench_budget: float | None = typer.Option(None, "--bench-budget", min=1.0, help="Seconds for the benchmark "
                                              "rounds before the interval is reported as it stands (default 180)."),
    min_gain: float | None = typer.Option(None, "--min-gain", min=0.0, help="Minimum speed or memory gain for a "
                                          "pull request: 0.05 or 1.05 (default: .adopter.yml's min_gain, else 5%)."),
    report: Path | None = typer.Option(None, "--report", help="Write the pull request body (Markdown) here."),
    no_history: bool = typer.Option(False, "--no-history", help="Do not record this scan in the local history."),
) -> None:
    """Find optimization opportunities, rewrite them, and report; --verify and --bench prove and measure.

    Settings come from the scanned folder's .adopter.yml (docs/config.md); options given here win."""
    from engine.config import ConfigError, load_config
    from engine.progress import for_terminal
    from engine.scan import scan_path

    root = Path(path)
    if not root.exists():
        _fail(f"{path} does not exist")
    base = root if root.is_dir() else root.parent
    started_at = datetime.now(UTC)
    # How this scan runs, as the history and the pull request body record it.
    options = {"rules": rules_spec, "include": include or None, "exclude": exclude or None, "verify": verify,
               "bench": bench, "device": device.value, "dtype": dtype.value, "bench_shape": bench_shape,
               "repeats": repeats, "bench_budget_s": bench_budget, "min_gain": min_gain, "apply": apply}
    options = {k: v for k, v in options.items() if v is not None}
    try:
        file_config, source = load_config(base)
        config = file_config.overridden(rules=rules_spec, include=include, exclude=exclude, min_gain=min_gain)
        chosen = config.selected_rules(source, rules_from="--rules" if rules_spec is not None else None)
    except ConfigError as exc:
        _fail(str(exc))
    shape = _parse_shape(bench_shape) if bench_shape else None
    progress = for_terminal()
    progress.stage("scan")
    try:
        result = scan_path(root, rules=chosen, include=list(config.paths.include or []) or None,
                           exclude=list(config.paths.exclude or []) or None, progress=progress.at)
    finally:
        progress.close()
    if result.files_scanned == 0:
        for d in result.diagnostics:
            _say(f"{d.file}:{d.line}: {d.severity}: {d.message}", typer.colors.YELLOW)
        filtered = " (after paths.include/exclude)" if config.paths.include or config.paths.exclude else ""
        _fail(f"no Python files to scan in {path}{filtered}")
    # Each finding's SARIF place (columns, fingerprint) for the history, read now from the files as
    # scanned: --apply rewrites them below. The dashboard pairs findings across scans by fingerprint.
    places = None
    if not no_history:
        from engine.sarif import places as sarif_places

        places = [{"locations": [r.to_dict() for r in p.locations], "related_locations": [r.to_dict() for r in p.related],
                   "fingerprint": p.fingerprint} for p in sarif_places(result.findings, root)]
    outcome = None
    if verify or bench or report is not None:
        from dataclasses import replace

        from engine.pipeline import report_markdown, verify_and_bench

        stages = for_terminal()
        try:
            outcome = verify_and_bench(result, root, verify=verify, bench=bench, device=device.value,
                                       dtype=dtype.value, min_gain=config.min_gain, bench_shape=shape,
                                       repeats=repeats, bench_budget_s=bench_budget, log=lambda line: _say(line),
                                       progress=stages)
        finally:
            stages.close()
        if verify:  # the patch holds only the rewrites that passed
            result = replace(result, files=outcome["files"],
                             originals={rel: result.originals[rel] for rel in outcome["files"]})
        if report is not None:
            flags = " --verify" * verify + " --bench" * bench + f" --device {device.value} --dtype {dtype.value}"
            report.write_text(report_markdown(result, outcome, reproduce=f"adopter scan {path}{flags}",
                                              min_gain=config.min_gain,
                                              config={"source": source, **config.to_dict()}))
    text = _render(result, fmt, root, outcome)
    if output is not None:
        output.write_text(text)
    elif diff == "-":  # stdout carries the patch alone (`adopter scan . --diff - | git apply`)
        typer.echo(text, nl=not text.endswith("\n"), err=True)
    else:
        typer.echo(text, nl=not text.endswith("\n"))
    if diff == "-":
        sys.stdout.write(result.diff)
        sys.stdout.flush()
    elif diff is not None:
        Path(diff).write_text(result.diff)
    if apply:
        from engine.repo_files import UnsafePath, check_writable, write_inside

        base = root.resolve() if root.is_dir() else root.resolve().parent
        try:  # all checked before any is written: a refusal leaves the tree as it was
            for rel in result.files:
                check_writable(base, rel)
            for rel, new_text in result.files.items():
                write_inside(base, rel, new_text)
        except UnsafePath as exc:
            _fail(f"--apply refused: {exc}")
        _say(f"rewrote {len(result.files)} file(s)")
    if not no_history:
        from app.cli_history import record_cli_scan

        record_cli_scan(result, root, config={"source": source, **config.to_dict()}, outcome=outcome,
                        started_at=started_at, options=options, places=places)
    if check:
        raise typer.Exit(_check_code(result))


def _check_code(result) -> int:
    if result.files:
        return EXIT_REWRITE_AVAILABLE
    if any(d.severity == "error" for d in result.diagnostics):
        return EXIT_UNSCANNABLE
    return EXIT_OK


class HistoryFormat(StrEnum):
    text = "text"
    json = "json"


def _complete_state(incomplete: str) -> list[str]:
    from app.db.models import ScanState

    return [s.value for s in ScanState if s.value.startswith(incomplete)]


@app.command()
def history(
    limit: int = typer.Option(20, "--limit", min=1, max=100, help="Scans per page."),
    page: int = typer.Option(1, "--page", min=1),
    state: str | None = typer.Option(None, "--state", help="Only scans in this state (queued, cloning, scanning, "
                                     "verifying, benchmarking, publishing, done, failed, skipped).",
                                     autocompletion=_complete_state),
    rule: str | None = typer.Option(None, "--rule", help="Only scans with a finding of this rule."),
    repository: str | None = typer.Option(None, "--repo", help="Only scans of this folder."),
    fmt: HistoryFormat = typer.Option(HistoryFormat.text, "--format", help="text or json."),
) -> None:
    """List the scans recorded in the local history (newest first)."""
    from app.cli_history import print_history, scan_states

    if state is not None and state not in scan_states():
        _fail(f"--state: {state!r} is not a scan state; valid states: {', '.join(scan_states())}")
    print_history(limit=limit, page=page, state=state, rule=rule, repository=repository, as_json=fmt is HistoryFormat.json)


@app.command()
def dashboard(
    host: str = typer.Option("127.0.0.1", "--host", help="A loopback address: 127.0.0.1 or ::1."),
    port: int = typer.Option(8765, "--port"),
) -> None:
    """Serve the dashboard of the local history on this machine (no sign-in; localhost only)."""
    from app.cli_history import serve_dashboard

    try:
        serve_dashboard(host=host, port=port)
    except ValueError as exc:
        _fail(str(exc))


def _parse_shape(spec: str) -> dict:
    shape = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"--bench-shape: expected key=value[,key=value...], got {spec!r}")
        try:
            shape[key.strip()] = int(value)
        except ValueError:
            _fail(f"--bench-shape: {key.strip()} must be an integer, got {value!r}")
    return shape


def _render(result, fmt: ScanFormat, root: Path, outcome: dict | None = None) -> str:
    if fmt is ScanFormat.json:
        data = result.to_json()
        if outcome is not None:
            data.update({key: outcome[key] for key in ("rewrites", "verification", "benchmark", "decision",
                                                      "environment", "notes")})
        return json.dumps(data, indent=2) + "\n"
    if fmt is ScanFormat.sarif:
        from engine.sarif import to_sarif
        from engine.scan import select_rules

        return json.dumps(to_sarif(result.findings, select_rules("all"), str(root)), indent=2) + "\n"
    lines = []
    for f in result.findings:
        extra = f" [{f.reason}]" if f.reason else f" [original kept when: {f.guard_text}]" if f.guard_text else ""
        lines.append(f"{f.file}:{f.line}: {f.rule_id}: {f.status}: {f.message}{extra}")
    for d in result.diagnostics:
        lines.append(f"{d.file}:{d.line}: {d.severity}: {d.message}")
    counts: dict[str, int] = {}
    for f in result.findings:
        counts[f.status] = counts.get(f.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no findings"
    lines.append(f"{result.files_scanned} file(s) scanned: {summary}; {len(result.files)} file(s) would change")
    if outcome is not None:
        from engine.pipeline import summary_lines

        lines += summary_lines(outcome)
    return "\n".join(lines) + "\n"


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
