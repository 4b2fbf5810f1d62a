"""The `adopter` command line."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

import typer

app = typer.Typer(
    help="Adopter: rewrite PyTorch model code to use optimized kernels, prove it, measure it.",
    no_args_is_help=True,
    add_completion=False,
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


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
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
            typer.secho(f"{diag.file}:{diag.line}: {diag.severity}: {diag.message}", err=True, fg=typer.colors.YELLOW)
    if fmt is ExtractFormat.json:
        typer.echo(json.dumps([asdict(fm) for fm in out], default=repr, indent=1))
    else:
        for fm in out:
            if fm.classes:
                typer.echo(print_file(fm))
    if class_name is not None and not out:
        _fail(f"no class {class_name!r} found", 1)


@app.command()
def rules(
    spec: str = typer.Option("all", "--rules", help="all, default, paper, or comma-separated ids."),
) -> None:
    """List the rules."""
    from engine.scan import RuleSelectionError, select_rules

    try:
        chosen = select_rules(spec)
    except RuleSelectionError as exc:
        _fail(str(exc))
    for rule in chosen:
        kind = "detect-only" if rule.detect_only else "rewrite" + (" (guarded)" if rule.guard else "")
        typer.echo(f"{rule.id:22s} {kind:18s} {rule.summary}")


@app.command()
def scan(
    path: str = typer.Argument(..., help="A file or folder to scan (recursively)."),
    rules_spec: str = typer.Option("default", "--rules", help="all, default (current kernels), paper, or ids."),
    fmt: ScanFormat = typer.Option(ScanFormat.text, "--format", help="text, json or sarif."),
    output: Path | None = typer.Option(None, "--output", help="Write the report here instead of stdout."),
    diff: Path | None = typer.Option(None, "--diff", help="Write the patch (unified diff) here."),
    apply: bool = typer.Option(False, "--apply", help="Rewrite the files in place."),
    include: list[str] = typer.Option([], "--include", help="Only paths matching (glob or folder); repeatable."),
    exclude: list[str] = typer.Option([], "--exclude", help="Skip paths matching (glob or folder); repeatable."),
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
    """Find optimization opportunities, rewrite them, and report; --verify and --bench prove and measure."""
    from engine.scan import RuleSelectionError, scan_path

    root = Path(path)
    if not root.exists():
        _fail(f"{path} does not exist")
    started_at = datetime.now(UTC)
    # How this scan runs, as the history and the pull request body record it.
    options = {"rules": rules_spec, "include": include or None, "exclude": exclude or None, "verify": verify,
               "bench": bench, "device": device.value, "dtype": dtype.value, "bench_shape": bench_shape,
               "repeats": repeats, "bench_budget_s": bench_budget, "min_gain": min_gain, "apply": apply}
    options = {k: v for k, v in options.items() if v is not None}
    progress = None
    if sys.stderr.isatty():
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("scanning", total=None)

        def progress(i: int, n: int, rel: str) -> None:  # noqa: F811 - the terminal's progress callback
            bar.update(task, completed=i, total=n, description=rel[-40:])
    try:
        result = scan_path(root, rules=rules_spec, include=include or None, exclude=exclude or None, progress=progress)
    except RuleSelectionError as exc:
        _fail(str(exc))
    finally:
        if progress is not None:
            bar.stop()
    outcome = None
    if verify or bench or report is not None:
        from dataclasses import replace

        from engine.pipeline import report_markdown, verify_and_bench

        shape = _parse_shape(bench_shape) if bench_shape else None
        outcome = verify_and_bench(result, root, verify=verify, bench=bench, device=device.value, dtype=dtype.value,
                                   min_gain=min_gain, bench_shape=shape, repeats=repeats, bench_budget_s=bench_budget,
                                   log=lambda line: typer.secho(line, err=True))
        if verify:  # the patch holds only the rewrites that passed
            result = replace(result, files=outcome["files"],
                             originals={rel: result.originals[rel] for rel in outcome["files"]})
        if report is not None:
            flags = " --verify" * verify + " --bench" * bench + f" --device {device.value} --dtype {dtype.value}"
            report.write_text(report_markdown(result, outcome, reproduce=f"adopter scan {path}{flags}",
                                              min_gain=min_gain, config=options))
    text = _render(result, fmt, root, outcome)
    if output is not None:
        output.write_text(text)
    else:
        typer.echo(text, nl=not text.endswith("\n"))
    if diff is not None:
        diff.write_text(result.diff)
    if apply:
        base = root if root.is_dir() else root.parent
        for rel, new_text in result.files.items():
            (base / rel).write_text(new_text)
        typer.secho(f"rewrote {len(result.files)} file(s)", err=True)
    if not no_history:
        from app.cli_history import record_cli_scan

        record_cli_scan(result, root, rules=rules_spec, include=include, exclude=exclude, outcome=outcome,
                        started_at=started_at, options=options)


@app.command()
def history(
    limit: int = typer.Option(20, "--limit", min=1, max=100, help="Scans per page."),
    page: int = typer.Option(1, "--page", min=1),
    state: str | None = typer.Option(None, "--state", help="Only scans in this state."),
    rule: str | None = typer.Option(None, "--rule", help="Only scans with a finding of this rule."),
    repository: str | None = typer.Option(None, "--repo", help="Only scans of this folder."),
) -> None:
    """List the scans recorded in the local history (newest first)."""
    from app.cli_history import print_history

    print_history(limit=limit, page=page, state=state, rule=rule, repository=repository)


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
