"""The report's view of scan findings, verification and benchmark results.

The report accepts the engine's own objects (``engine.match`` findings, ``VerifyResult``,
``CandidatesResult``, ``BenchResult``), their ``to_dict``/``to_json`` forms, and the worker's
records; each is normalized here into a small dataclass so the renderer reads one shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.bench.stats import Estimate, median_interval, verdict


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if isinstance(obj, dict):
            if name in obj and obj[name] is not None:
                return obj[name]
        elif getattr(obj, name, None) is not None:
            return getattr(obj, name)
    return default


@dataclass(frozen=True)
class Finding:
    """One site a rule matched."""

    rule_id: str
    path: str
    line: int
    end_line: int | None = None
    status: str = "rewritten"  # "rewritten", "guarded", "near-miss", "detected", "already-fused"
    reason: str | None = None  # why a near-miss (or an already-fused site) was not rewritten
    message: str | None = None

    @classmethod
    def from_any(cls, obj: Any) -> Finding:
        """From an ``engine.match`` finding, its JSON form, or a worker record."""
        if isinstance(obj, Finding):
            return obj
        return cls(
            rule_id=str(_get(obj, "rule_id", "rule", default="?")),
            path=str(_get(obj, "path", "file", default="?")),
            line=int(_get(obj, "line", default=0)),
            end_line=_get(obj, "end_line"),
            status=str(_get(obj, "status", default="rewritten")),
            reason=_get(obj, "reason"),
            message=_get(obj, "message"),
        )

    @property
    def applied(self) -> bool:
        return self.status in ("rewritten", "guarded")


@dataclass(frozen=True)
class VerificationRow:
    """One line of the verification table: a rewrite on its own, or all accepted ones together."""

    name: str
    status: str
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    comparisons: int = 0
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @classmethod
    def from_any(cls, name: str, obj: Any) -> VerificationRow:
        status = _get(obj, "status")
        if status is None:  # worker form: {"verified": bool, "max_abs_error": float}
            status = "passed" if _get(obj, "verified", "passed", default=False) else "failed"
        cases = _get(obj, "cases", default=[]) or []
        return cls(
            name=name,
            status=str(status),
            max_abs_err=_get(obj, "max_abs_err", "max_abs_error"),
            max_rel_err=_get(obj, "max_rel_err", "max_rel_error"),
            comparisons=len(cases),
            message=str(_get(obj, "message", default="")),
        )


@dataclass(frozen=True)
class Verification:
    rows: list[VerificationRow]
    combined: VerificationRow | None
    dropped: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        if self.combined is not None:
            return self.combined.passed
        return bool(self.rows) and all(r.passed for r in self.rows)

    @classmethod
    def from_any(cls, obj: Any) -> Verification | None:
        """From a ``CandidatesResult`` (or its dict), a single ``VerifyResult`` (or dict), or the
        worker's ``{"verified", "max_abs_error"}``."""
        if obj is None:
            return None
        per = _get(obj, "per_rewrite")
        if per is not None:
            rows = [VerificationRow.from_any(name, result) for name, result in per.items()]
            combined = _get(obj, "combined")
            accepted = _get(obj, "accepted", default=[]) or []
            return cls(
                rows=rows,
                combined=VerificationRow.from_any("all accepted together", combined)
                if combined is not None and len(accepted) > 1 else None,
                dropped=dict(_get(obj, "dropped", default={}) or {}),
            )
        return cls(rows=[VerificationRow.from_any("rewrite", obj)], combined=None)


@dataclass(frozen=True)
class Benchmark:
    ok: bool
    message: str = ""
    baseline_step_s: float | None = None
    optimized_step_s: float | None = None
    speedup: float | None = None  # the median per-round ratio (> 1: faster)
    speedup_ci95: tuple[float, float] | None = None  # None: too few rounds to bound it
    verdict: str = "within-noise"
    stopped: str = ""
    pair_ratios: tuple[float, ...] = ()
    baseline_peak_bytes: int | None = None
    optimized_peak_bytes: int | None = None
    memory_reduction: float | None = None
    memory_ci95: tuple[float, float] | None = None
    memory_metric: str = ""
    device: str | None = None
    device_name: str | None = None
    dtype: str | None = None
    shape: dict = field(default_factory=dict)
    repeats: int | None = None
    warmup: int | None = None
    threads: int | None = None
    versions: dict = field(default_factory=dict)

    @property
    def memory_interval(self) -> tuple[float, float] | None:
        """The memory saving's 95% interval over the rounds of this run, when there is one. None
        where memory was not measured, or was measured once per side: that "interval" is the point
        itself and bounds nothing."""
        ci = self.memory_ci95
        return ci if ci is not None and ci[0] != ci[1] else None

    @classmethod
    def from_any(cls, obj: Any) -> Benchmark | None:
        """From a ``BenchResult`` (or its dict) or the worker's result record."""
        if obj is None:
            return None
        before = _get(obj, "baseline_step_s", "before_s")
        after = _get(obj, "optimized_step_s", "after_s")
        ratios = tuple(_get(obj, "pair_ratios", default=()) or ())
        speed = _estimate(_get(obj, "speedup"))
        if speed is None and ratios:
            speed = median_interval(list(ratios))
        if speed is None and before and after:  # a record with two medians only: a point, no interval
            speed = Estimate(before / after, None, 0)
        mem_before = _get(obj, "baseline_peak_bytes", "peak_mem_before")
        mem_after = _get(obj, "optimized_peak_bytes", "peak_mem_after")
        reduction = _get(obj, "memory_reduction")
        if reduction is None and mem_before and mem_after is not None:
            reduction = 1.0 - mem_after / mem_before
        memory = _estimate(_get(obj, "memory"))
        if memory is None and reduction is not None:  # one peak per side: the measurement is the interval
            memory = Estimate(reduction, (reduction, reduction), 1)
        status = _get(obj, "status")
        ok = status == "ok" if status is not None else _get(obj, "ok", default=before is not None and after is not None)
        return cls(
            ok=bool(ok),
            message=str(_get(obj, "message", default="")),
            baseline_step_s=before,
            optimized_step_s=after,
            speedup=speed.median if speed is not None else None,
            speedup_ci95=speed.ci95 if speed is not None else None,
            verdict=str(_get(obj, "verdict", default=verdict(speed))),
            stopped=str(_get(obj, "stopped", default="")),
            pair_ratios=ratios,
            baseline_peak_bytes=mem_before,
            optimized_peak_bytes=mem_after,
            memory_reduction=reduction,
            memory_ci95=memory.ci95 if memory is not None else None,
            memory_metric=str(_get(obj, "memory_metric", default="")),
            device=_get(obj, "device"),
            device_name=_get(obj, "device_name"),
            dtype=_get(obj, "dtype"),
            shape=dict(_get(obj, "shape", default={}) or {}),
            repeats=_get(obj, "repeats"),
            warmup=_get(obj, "warmup"),
            threads=_get(obj, "threads"),
            versions=dict(_get(obj, "versions", default={}) or {}),
        )


def _estimate(value: Any) -> Estimate | None:
    """A speedup or memory figure in any stored form: an ``Estimate``, its dict, or a bare number
    (older records: a point without an interval)."""
    if value is None or isinstance(value, Estimate):
        return value
    if isinstance(value, dict):
        return Estimate.from_dict(value)
    return Estimate(float(value), None, 0)
