"""The worker's only door into the engine: imports its stage functions and normalizes their results.

The engine (``engine/``) is a library with no knowledge of the service; its entry points are named
by settings (``ADOPTER_ENGINE_SCAN`` = ``engine.scan:scan_path`` and so on). The defaults are the
engine's own functions; tests point a setting at a wrapper (to pause a scan, or to stand in for a
stage the engine does not have yet). A stage the engine lacks raises ``EngineStageUnavailable``:
the scan fails with that reason, nothing is invented in its place.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.settings import get_settings


class EngineStageUnavailable(RuntimeError):
    pass


def _load(spec: str):
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attribute)
    except (ImportError, AttributeError) as exc:
        raise EngineStageUnavailable(f"engine entry point {spec} is not available: {exc}") from exc


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """Read a field from a dataclass-like object or a mapping."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


@dataclass(frozen=True)
class FindingRecord:
    rule_id: str
    path: str
    line: int
    end_line: int | None
    status: str  # rewritten, guarded, near-miss
    reason: str | None
    message: str | None


@dataclass(frozen=True)
class ScanOutput:
    findings: list[FindingRecord]
    files: dict[str, str]  # relative path -> rewritten text (changed files only)
    diff: str


@dataclass(frozen=True)
class Verification:
    passed: bool
    max_abs_error: float | None
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Benchmark:
    device: str | None
    before_s: float | None
    after_s: float | None
    speedup: float | None
    peak_mem_before: int | None
    peak_mem_after: int | None
    versions: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)


def scan(root: Path, *, rules: str = "default", include: list[str] | None = None,
         exclude: list[str] | None = None) -> ScanOutput:
    """``engine.scan.scan_path``: parses the checkout (never imports or runs its code)."""
    scan_path = _load(get_settings().engine_scan)
    result = scan_path(root, rules=rules, include=include, exclude=exclude)
    findings = [
        FindingRecord(
            rule_id=str(_get(f, "rule_id")),
            path=str(_get(f, "path")),
            line=int(_get(f, "line") or 0),
            end_line=_get(f, "end_line"),
            status=str(_get(f, "status")),
            reason=_get(f, "reason"),
            message=_get(f, "message"),
        )
        for f in _get(result, "findings", [])
    ]
    files = {str(k): v for k, v in dict(_get(result, "files", {}) or {}).items()}
    return ScanOutput(findings=findings, files=files, diff=_get(result, "diff", "") or "")


def verify(root: Path, files: dict[str, str], *, harness: str | None) -> Verification:
    """Differential check of original vs rewritten; runs the repository's code in the engine's
    scrubbed child process (no tokens, no secrets), never in this process."""
    verify_rewrite = _load(get_settings().engine_verify)
    outcome = verify_rewrite(root, files, harness=harness)
    details = _get(outcome, "details", {}) or {}
    return Verification(
        passed=bool(_get(outcome, "passed", False)),
        max_abs_error=_get(outcome, "max_abs_error"),
        details=dict(details),
    )


def bench(root: Path, files: dict[str, str], *, harness: str | None) -> Benchmark:
    """Training-step timing and peak memory of original vs rewritten, on this worker's device."""
    benchmark_rewrite = _load(get_settings().engine_bench)
    outcome = benchmark_rewrite(root, files, harness=harness)
    before, after = _get(outcome, "before_s"), _get(outcome, "after_s")
    speedup = _get(outcome, "speedup")
    if speedup is None and before and after:
        speedup = before / after
    return Benchmark(
        device=_get(outcome, "device"),
        before_s=before,
        after_s=after,
        speedup=speedup,
        peak_mem_before=_get(outcome, "peak_mem_before"),
        peak_mem_after=_get(outcome, "peak_mem_after"),
        versions=dict(_get(outcome, "versions", {}) or {}),
        details=dict(_get(outcome, "details", {}) or {}),
    )


def render_pr_body(context: dict) -> str | None:
    """The engine's Markdown report for a pull request, or None while the engine has no renderer
    (the worker then uses its own template over the same figures, see ``worker.pr_body``)."""
    try:
        render = _load(get_settings().engine_report)
    except EngineStageUnavailable:
        return None
    return render(context)
