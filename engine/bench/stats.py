"""How sure a benchmark is: a 95% confidence interval of the median per-round ratio, and when to stop.

The interval is the distribution-free one for a median (order statistics, the sign-test interval):
with ``n`` independent rounds, the true median lies between the ``k``-th smallest and the ``k``-th
largest ratio with probability ``1 - 2 P(Binomial(n, 1/2) < k)``; ``k`` is the largest rank that keeps
that at or above 95%. It assumes nothing about the shape of the noise (step times on a shared machine
have long right tails that a normal interval would misstate), needs no random resampling, and so gives
the same interval for the same rounds every time. Below six rounds no such ``k`` exists: the median is
then not bounded at 95% and the interval is ``None``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95
MIN_BOUNDED_ROUNDS = 6  # the fewest rounds for which [min, max] covers the median with >= 95%


@dataclass(frozen=True)
class Estimate:
    """A median with its 95% confidence interval (``None`` when too few samples bound it)."""

    median: float
    ci95: tuple[float, float] | None
    samples: int

    def relative_half_width(self) -> float | None:
        """The interval's widest side relative to the median: 0.05 = within +/- 5%."""
        if self.ci95 is None or self.median == 0:
            return None
        low, high = self.ci95
        return max(self.median - low, high - self.median) / abs(self.median)

    def to_dict(self) -> dict:
        return {"median": self.median, "ci95": list(self.ci95) if self.ci95 is not None else None,
                "samples": self.samples}

    @classmethod
    def from_dict(cls, data: dict | None) -> Estimate | None:
        if not isinstance(data, dict) or data.get("median") is None:
            return None
        ci = data.get("ci95")
        return cls(float(data["median"]), (float(ci[0]), float(ci[1])) if ci else None, int(data.get("samples") or 0))


def _binomial_cdf_below(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) < k)."""
    return sum(math.comb(n, i) for i in range(k)) / 2**n


def median_rank_for(n: int, confidence: float = CONFIDENCE) -> int | None:
    """The largest 1-based rank ``k`` such that [x_(k), x_(n-k+1)] covers the median with at least
    ``confidence``; ``None`` when even [min, max] does not."""
    alpha = (1.0 - confidence) / 2
    best = None
    for k in range(1, n // 2 + 1):
        if _binomial_cdf_below(k, n) <= alpha:
            best = k
        else:
            break
    return best


def median_interval(samples: list[float], confidence: float = CONFIDENCE) -> Estimate:
    """The median of ``samples`` and its distribution-free confidence interval."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    n = len(ordered)
    k = median_rank_for(n, confidence)
    ci = (ordered[k - 1], ordered[n - k]) if k is not None else None
    return Estimate(statistics.median(ordered), ci, n)


def verdict(speedup: Estimate | None) -> str:
    """``faster`` when the whole interval is above 1x, ``slower`` when it is below, else ``within-noise``
    (also when too few rounds bound the median)."""
    if speedup is None or speedup.ci95 is None:
        return "within-noise"
    low, high = speedup.ci95
    if low > 1.0:
        return "faster"
    if high < 1.0:
        return "slower"
    return "within-noise"


def stop_reason(ratios: list[float], elapsed_s: float, *, min_rounds: int, max_rounds: int, budget_s: float,
                tolerance: float) -> str | None:
    """Why the rounds should stop now, or ``None`` to run another one.

    ``converged``: at least ``min_rounds`` and the interval is within +/- ``tolerance`` of the median;
    ``budget``: the time budget for rounds is spent (after at least one round); ``max-rounds``: the cap."""
    n = len(ratios)
    if n >= min_rounds:
        width = median_interval(ratios).relative_half_width()
        if width is not None and width <= tolerance:
            return "converged"
    if n >= max_rounds:
        return "max-rounds"
    if n >= 1 and elapsed_s >= budget_s:
        return "budget"
    return None


def point(value) -> float | None:
    """The median of a speedup in any stored form (``Estimate``, its dict, a bare number)."""
    if value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, Estimate):
        return value.median
    if isinstance(value, dict):
        return value.get("median")
    return None
