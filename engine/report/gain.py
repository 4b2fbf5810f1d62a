"""Whether a measured gain is worth a pull request."""

from __future__ import annotations

from dataclasses import dataclass

from engine.report.findings import Benchmark, Verification

DEFAULT_MIN_GAIN = 0.05  # 5% faster training steps, or 5% less peak memory


def normalize_min_gain(value: float | None) -> float:
    """``min_gain`` as a fraction: 0.05 and the ratio form 1.05 both mean 5%."""
    if value is None:
        return DEFAULT_MIN_GAIN
    value = float(value)
    if value < 0:
        raise ValueError("min_gain must not be negative")
    return value - 1.0 if value >= 1.0 else value


@dataclass(frozen=True)
class GainDecision:
    open_pr: bool
    min_gain: float  # as a fraction
    speed_gain: float | None  # speedup - 1
    memory_gain: float | None  # fraction of peak memory saved
    reason: str


def decide(verification: Verification | None, bench: Benchmark | None, min_gain: float | None = None) -> GainDecision:
    """Open a pull request only when verification passed and the step got at least ``min_gain``
    faster or its peak memory at least ``min_gain`` smaller."""
    threshold = normalize_min_gain(min_gain)
    speed = bench.speedup - 1.0 if bench is not None and bench.ok and bench.speedup is not None else None
    memory = bench.memory_reduction if bench is not None and bench.ok else None
    if verification is None or not verification.passed:
        return GainDecision(False, threshold, speed, memory, "verification did not pass")
    if bench is None or not bench.ok:
        why = bench.message if bench is not None and bench.message else "no benchmark result"
        return GainDecision(False, threshold, speed, memory, f"the benchmark did not complete ({why})")
    cleared = [name for name, gain in (("speed", speed), ("memory", memory)) if gain is not None and gain >= threshold]
    if cleared:
        return GainDecision(True, threshold, speed, memory, f"the {' and '.join(cleared)} gain clears the minimum of {threshold:.0%}")
    return GainDecision(False, threshold, speed, memory,
                        f"neither step time ({_pct(speed)}) nor peak memory ({_pct(memory)}) improved by the minimum of "
                        f"{threshold:.0%}")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"
