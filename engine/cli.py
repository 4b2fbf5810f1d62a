"""The `adopter` command line."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path

import typer

app = typer.Typer(
    help="Adopter: rewrite PyTorch model code to use optimized kernels, prove it, measure it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class ExtractFormat(str, Enum):
    text = "text"
    json = "json"


class ScanFormat(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"


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
) -> None:
    """Find optimization opportunities, rewrite them, and report."""
    from engine.scan import RuleSelectionError, scan_path

    root = Path(path)
    if not root.exists():
        _fail(f"{path} does not exist")
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
    text = _render(result, fmt, root)
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


def _render(result, fmt: ScanFormat, root: Path) -> str:
    if fmt is ScanFormat.json:
        return json.dumps(result.to_json(), indent=2) + "\n"
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
    return "\n".join(lines) + "\n"


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
