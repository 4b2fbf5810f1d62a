"""The benchmark's statistics on synthetic rounds: the median's interval, the verdict, when to stop."""

from __future__ import annotations

import random

import pytest

from engine.bench.stats import Estimate, median_interval, median_rank_for, point, stop_reason, verdict


def test_rank_of_the_distribution_free_interval():
    assert median_rank_for(5) is None  # [min, max] covers the median with 1 - 2/32 = 93.75% only
    assert median_rank_for(6) == 1  # 1 - 2/64 = 96.9%
    assert median_rank_for(10) == 2  # P(B < 2) = 11/1024 <= 2.5% < P(B < 3) = 56/1024
    assert median_rank_for(100) == 40  # the textbook ranks 40 and 61 for n = 100


def test_interval_of_known_rounds():
    est = median_interval([1.3, 1.1, 1.2, 1.0, 1.5, 1.4, 0.9, 1.25, 1.35, 1.15])
    assert est.median == pytest.approx(1.225)
    assert est.ci95 == (1.0, 1.4)  # the 2nd smallest and the 2nd largest
    assert est.samples == 10
    assert est.relative_half_width() == pytest.approx((1.225 - 1.0) / 1.225)  # the wider side
    assert median_interval([1.2, 1.3]).ci95 is None


def test_interval_covers_the_true_median_about_95_percent_of_the_time():
    rng = random.Random(7)
    covered = 0
    for _ in range(400):  # log-normal noise around a true median ratio of 1.2
        est = median_interval([1.2 * rng.lognormvariate(0, 0.3) for _ in range(30)])
        covered += est.ci95[0] <= 1.2 <= est.ci95[1]
    assert 0.93 <= covered / 400 <= 0.995


def test_verdict():
    assert verdict(Estimate(1.3, (1.1, 1.5), 20)) == "faster"
    assert verdict(Estimate(0.8, (0.7, 0.95), 20)) == "slower"
    assert verdict(Estimate(1.02, (0.95, 1.1), 20)) == "within-noise"
    assert verdict(Estimate(1.6, None, 3)) == "within-noise"  # too few rounds to say
    assert verdict(None) == "within-noise"


def _rule(ratios, elapsed=0.0, **kw):
    args = {"min_rounds": 10, "max_rounds": 100, "budget_s": 60.0, "tolerance": 0.05} | kw
    return stop_reason(ratios, elapsed, **args)


def test_stops_when_the_interval_is_narrow():
    steady = [1.2 + 0.001 * ((i * 7) % 11 - 5) for i in range(10)]
    assert _rule(steady[:9]) is None  # not before the fewest rounds
    assert _rule(steady) == "converged"


def test_noisy_rounds_go_on_until_the_budget_or_the_cap():
    rng = random.Random(3)
    noisy = [rng.choice([0.95, 1.3, 2.0, 6.7]) for _ in range(40)]
    assert median_interval(noisy).relative_half_width() > 0.05
    assert _rule(noisy, elapsed=10.0) is None
    assert _rule(noisy, elapsed=61.0) == "budget"
    assert _rule(noisy, elapsed=10.0, max_rounds=40) == "max-rounds"
    assert _rule([], elapsed=100.0) is None  # at least one round whatever the budget


def test_point_reads_every_stored_form():
    assert point(1.5) == 1.5 and point(None) is None
    assert point(Estimate(1.2, (1.1, 1.3), 8)) == 1.2
    assert point({"median": 1.4, "ci95": [1.3, 1.5], "samples": 9}) == 1.4
    assert Estimate.from_dict(Estimate(1.2, (1.1, 1.3), 8).to_dict()) == Estimate(1.2, (1.1, 1.3), 8)
