"""The worker's only door into the engine: imports its stage functions and normalizes their results.

The engine (``engine/``) is a library with no knowledge of the service; its entry points are named
by settings (``ADOPTER_ENGINE_SCAN`` = ``engine.scan:scan_path`` and so on). The defaults are the
engine's own functions; the end-to-end tests point ADOPTER_ENGINE_SCAN at a wrapper that can pause
a scan so that a worker can be killed in the middle of one. A stage the engine lacks raises ``EngineStageUnavailable``:
the scan fails with that reason, nothing is invented in its place.

The stages: ``engine.scan.scan_path`` (findings, rewritten files, diff), ``engine.verify.verify``,
``engine.bench.bench``, ``engine.report.render_pr_body`` and ``engine.report.decide``; beside the
scan, ``engine.sarif.places`` reads each finding's columns and fingerprint from the checkout.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.settings import RunnerSettings, get_runner_settings


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
    class_name: str | None = None
    method_name: str | None = None
    guard: str | None = None  # guarded: the condition under which the original code runs
    # where it is in SARIF's terms (engine.sarif.Place as data): read from the checkout, which the
    # code-scanning upload no longer has
    locations: list[dict] | None = None
    related_locations: list[dict] | None = None
    fingerprint: str | None = None


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
    ok: bool
    message: str
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
    """``engine.scan.scan_path``: parses the checkout (never imports or runs its code); the findings'
    SARIF places (``engine.sarif.places``) are read from the same checkout."""
    scan_path = _load(get_runner_settings().engine_scan)
    result = scan_path(root, rules=rules, include=include, exclude=exclude)
    raw = list(_get(result, "findings", []))
    places = _load("engine.sarif:places")(raw, root)
    findings = [
        FindingRecord(
            rule_id=str(_get(f, "rule_id")),
            path=str(_get(f, "path") or _get(f, "file")),  # engine.match.Finding names it ``file``
            line=int(_get(f, "line") or 0),
            end_line=_get(f, "end_line"),
            status=str(_get(f, "status")),
            reason=_get(f, "reason"),
            message=_get(f, "message"),
            class_name=_get(f, "cls"),
            method_name=_get(f, "method"),
            guard=_get(f, "guard_text"),
            locations=[region.to_dict() for region in place.locations],
            related_locations=[region.to_dict() for region in place.related],
            fingerprint=place.fingerprint,
        )
        for f, place in zip(raw, places, strict=True)
    ]
    files = {str(k): v for k, v in dict(_get(result, "files", {}) or {}).items()}
    return ScanOutput(findings=findings, files=files, diff=_get(result, "diff", "") or "")


def verify(root: Path, files: dict[str, str]) -> Verification:
    """``engine.verify.verify``: original against rewritten, same weights and inputs; the
    repository's code runs in the engine's sandboxed child processes (scrubbed environment, no
    token), never in this process. The harness comes from the repository's config file."""
    verify_rewrite = _load(get_runner_settings().engine_verify)
    outcome = verify_rewrite(root, files)
    details = outcome.to_dict() if hasattr(outcome, "to_dict") else dict(outcome)
    return Verification(passed=bool(_get(outcome, "passed", False)),
                        max_abs_error=_get(outcome, "max_abs_err"), details=details)


def bench(root: Path, files: dict[str, str]) -> Benchmark:
    """``engine.bench.bench``: training-step time and peak memory, original against rewritten,
    on this worker's device (ADOPTER_BENCH_DEVICE)."""
    from engine.bench.stats import point
    settings = get_runner_settings()
    benchmark = _load(settings.engine_bench)
    config = None
    if settings.engine_bench == RunnerSettings.model_fields["engine_bench"].default:
        from engine.bench import BenchConfig

        config = BenchConfig(device=settings.bench_device, budget_s=settings.bench_budget_s)
    outcome = benchmark(root, files, config=config)
    details = outcome.to_dict() if hasattr(outcome, "to_dict") else dict(outcome)
    ok = _get(outcome, "status") == "ok"
    device = _get(outcome, "device")
    if _get(outcome, "device_name"):
        device = f"{device} ({_get(outcome, 'device_name')})"
    return Benchmark(
        ok=ok,
        message=_get(outcome, "message", "") or "",
        device=device,
        before_s=_get(outcome, "baseline_step_s"),
        after_s=_get(outcome, "optimized_step_s"),
        speedup=point(_get(outcome, "speedup")) if ok else None,  # the median; the interval stays in details
        peak_mem_before=_get(outcome, "baseline_peak_bytes"),
        peak_mem_after=_get(outcome, "optimized_peak_bytes"),
        versions=dict(_get(outcome, "versions", {}) or {}),
        details=details,
    )


def render_pr_body(context: dict) -> str:
    """``engine.report.render_pr_body``: the pull request's Markdown body from the stored figures."""
    return _load(get_runner_settings().engine_report)(context)


def gain_decision(verification: dict, benchmark: dict, min_gain: float | None) -> tuple[bool, str]:
    """``engine.report.decide``: whether the change set earns a pull request, and why. The same
    decision the body states, so the body and the publishing never disagree."""
    decide = _load("engine.report:decide")
    as_verification = _load("engine.report:Verification").from_any
    as_benchmark = _load("engine.report:Benchmark").from_any
    decision = decide(as_verification(verification), as_benchmark(benchmark), min_gain)
    return bool(decision.open_pr), str(decision.reason)
