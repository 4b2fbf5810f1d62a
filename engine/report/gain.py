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
    speed_gain: float | None  # lower bound of the speedup's 95% interval - 1
    memory_gain: float | None  # lower bound of the fraction of peak memory saved
    reason: str


def decide(verification: Verification | None, bench: Benchmark | None, min_gain: float | None = None) -> GainDecision:
    """Open a pull request only when verification passed and the step got at least ``min_gain``
    faster or its peak memory at least ``min_gain`` smaller, judged by the lower bound of the 95%
    interval: a median that clears the bar by luck of the noise does not. A speedup without an
    interval (too few rounds, or an old record) never clears it."""
    threshold = normalize_min_gain(min_gain)
    ok = bench is not None and bench.ok
    speed = bench.speedup_ci95[0] - 1.0 if ok and bench.speedup_ci95 is not None else None
    memory = bench.memory_ci95[0] if ok and bench.memory_ci95 is not None else None
    if verification is None or not verification.passed:
        return GainDecision(False, threshold, speed, memory, _verification_failure(verification))
    if bench is None or not bench.ok:
        why = bench.message if bench is not None and bench.message else "no benchmark result"
        return GainDecision(False, threshold, speed, memory, f"the benchmark did not complete ({why})")
    cleared = [name for name, gain in (("speed", speed), ("memory", memory)) if gain is not None and gain >= threshold]
    if cleared:
        both = len(cleared) > 1
        return GainDecision(True, threshold, speed, memory,
                            f"the {' and '.join(cleared)} gain{'s clear' if both else ' clears'} the minimum of "
                            f"{threshold:.0%} (the lower bound{'s' if both else ''} of the 95% interval{'s' if both else ''})")
    return GainDecision(False, threshold, speed, memory,
                        f"neither step time ({_pct(speed)}) nor peak memory ({_pct(memory)}) improved by the minimum of "
                        f"{threshold:.0%} (lower bounds of the 95% intervals)")


def _verification_failure(verification: Verification | None) -> str:
    """"verification did not pass", with what failed first, so a scan's outcome says why."""
    if verification is None:
        return "verification did not pass (no verification result)"
    failed = [row for row in ([verification.combined] if verification.combined else []) + verification.rows
              if not row.passed]
    if not failed:
        return "verification did not pass"
    row = failed[0]
    why = row.message.strip().splitlines()[0][:300] if row.message.strip() else row.status
    return f"verification did not pass ({row.name}: {why})"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"
