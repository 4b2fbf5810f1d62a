"""Tolerances: rounding-level differences pass, real differences fail, float64 arbitrates."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.verify.compare import check_run, check_tensor  # noqa: E402

pytestmark = pytest.mark.torch


def test_rounding_differences_pass_and_real_ones_fail():
    a = torch.randn(64, 64)
    assert check_tensor("t", a, a + 1e-7 * torch.randn(64, 64), "float32").passed
    wrong = check_tensor("t", a, a * 1.01, "float32")
    assert not wrong.passed and wrong.max_rel_err == pytest.approx(0.01, rel=1e-3)


def test_float64_reference_accepts_a_more_precise_kernel():
    truth = torch.randn(1000, dtype=torch.float64)
    original = (truth + 1e-3 * torch.randn(1000, dtype=torch.float64)).float()  # an imprecise original
    rewritten = (truth + 1e-6 * torch.randn(1000, dtype=torch.float64)).float()  # closer to the truth
    assert not check_tensor("t", original, rewritten, "float32").passed
    check = check_tensor("t", original, rewritten, "float32", truth)
    assert check.passed and check.criterion == "float64 reference"
    worse = (truth + 1e-1 * torch.randn(1000, dtype=torch.float64)).float()
    assert not check_tensor("t", original, worse, "float32", truth).passed


def test_missing_gradient_shape_and_nan_are_failures():
    a = torch.ones(3)
    checks = check_run({"grad/param.w": a, "out": a}, {"out": a}, "float32")
    assert [c.key for c in checks if not c.passed] == ["grad/param.w"]
    assert check_tensor("t", a, torch.ones(4), "float32").criterion == "shape"
    nan = torch.tensor([1.0, float("nan")])
    assert check_tensor("t", nan, nan.clone(), "float32").passed
    assert not check_tensor("t", nan, torch.tensor([1.0, 2.0]), "float32").passed


def test_bfloat16_tolerance_is_wider():
    a = torch.randn(256)
    b = a + 5e-3 * a.abs().max() * torch.randn(256).clamp(-1, 1)
    assert not check_tensor("t", a, b, "float32").passed
    assert check_tensor("t", a, b, "bfloat16").passed


def test_a_gradient_zero_in_exact_arithmetic_compares_against_its_kind():
    """The key-bias gradient under softmax is zero in exact arithmetic: float32 gives noise on both
    sides (ViT's SDPA rewrite was dropped over 5.6e-8 vs 1.2e-8 of noise); real gradients set the scale."""
    big = torch.randn(256, dtype=torch.float64)
    ref64 = {"grad/param.w": big, "grad/param.key.bias": torch.zeros(16, dtype=torch.float64)}
    original = {"grad/param.w": big.float(), "grad/param.key.bias": torch.full((16,), 1e-8)}
    rewritten = {"grad/param.w": big.float(), "grad/param.key.bias": torch.full((16,), -5e-8)}  # 5x the noise
    checks = {c.key: c for c in check_run(original, rewritten, "float32", ref64)}
    assert checks["grad/param.key.bias"].passed and checks["grad/param.key.bias"].criterion == "zero in exact arithmetic"
    assert not check_run(original, rewritten, "float32", None)[0].passed  # without float64 there is no proof
    # a tensor that is not zero in exact arithmetic gets no such allowance, however small its error
    ref64["grad/param.key.bias"] = torch.full((16,), 1e-3, dtype=torch.float64)
    original["grad/param.key.bias"] = ref64["grad/param.key.bias"].float()
    rewritten["grad/param.key.bias"] = 2 * original["grad/param.key.bias"]
    checks = {c.key: c for c in check_run(original, rewritten, "float32", ref64)}
    assert not checks["grad/param.key.bias"].passed


def test_reported_error_of_a_noise_level_gradient_is_measured_against_its_kind():
    """A gradient that is rounding noise on both sides passes, and its error is reported against
    the largest gradient (not against itself, where it reads as an error of several hundred percent
    beside "passed"); a real error still reads as one."""
    truth = {"grad/param.w": torch.randn(64, 64, dtype=torch.float64), "grad/param.b": torch.zeros(64, dtype=torch.float64)}
    original = {"grad/param.w": truth["grad/param.w"].float(), "grad/param.b": 1e-8 * torch.randn(64)}
    rewritten = {"grad/param.w": truth["grad/param.w"].float(), "grad/param.b": 3e-8 * torch.randn(64)}
    checks = {c.key: c for c in check_run(original, rewritten, "float32", truth)}
    noise = checks["grad/param.b"]
    assert noise.passed
    assert noise.max_rel_err < 1e-6  # about 1e-7 / the largest gradient, not ~3 (noise / noise)
    wrong = dict(rewritten, **{"grad/param.w": 1.01 * truth["grad/param.w"].float()})
    bad = {c.key: c for c in check_run(original, wrong, "float32", truth)}["grad/param.w"]
    assert not bad.passed and bad.max_rel_err == pytest.approx(0.01, rel=1e-2)


def test_probe_gradients_where_only_the_original_is_nan_are_left_out_and_the_rest_still_compared():
    """Under a -inf fill the original's v gradient is NaN for a sample holding a fully masked row
    (its softmax backward multiplies by NaN probabilities) where the rewrite's is finite."""
    original = torch.tensor([1.0, 2.0, float("nan"), float("nan")])
    rewritten = torch.tensor([1.0, 2.0, 0.5, -3.0])
    assert not check_tensor("grad/v", original, rewritten, "float32").passed
    excused = check_tensor("grad/v", original, rewritten, "float32", nan_original_ok=True)
    assert excused.passed and excused.criterion == "original's gradient is NaN" and "2 elements" in excused.message
    # the elements that are finite on both sides must still agree
    assert not check_tensor("grad/v", original, torch.tensor([1.0, 2.5, 0.5, -3.0]), "float32",
                            nan_original_ok=True).passed
    # and a NaN the rewrite adds is never excused
    assert not check_tensor("grad/v", torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("nan")]), "float32",
                            nan_original_ok=True).passed
    # check_run excuses gradients only: an output that is NaN in the original must be NaN in the rewrite
    checks = {c.key: c for c in check_run({"out.0": original, "grad/q": original},
                                          {"out.0": rewritten, "grad/q": rewritten}, "float32",
                                          nan_original_grads_ok=True)}
    assert checks["grad/q"].passed and not checks["out.0"].passed


def test_where_the_float64_reference_overflowed_the_sides_are_compared_directly():
    """A fully masked sample under a fill of the dtype's lowest value: in float64 two such fills add
    up to -inf and the reference's softmax is NaN, while bfloat16 stays finite. Those elements are no
    reference; there the rewrite must agree with the original directly, and the float64 run still
    judges every other element."""
    torch.manual_seed(0)
    truth = torch.randn(64, dtype=torch.float64)
    rewritten = truth.to(torch.bfloat16).float()
    original = rewritten.clone()
    original[8:16] += 0.25  # the original is imprecise there: only the float64 run can excuse the difference
    reference = truth.clone()
    reference[:8] = float("nan")
    check = check_tensor("out", original, rewritten, "bfloat16", reference)
    assert check.passed and check.criterion == "float64 reference", check.message
    wrong = rewritten.clone()
    wrong[:8] += 1.0  # where there is no reference, the sides disagree
    check = check_tensor("out", original, wrong, "bfloat16", reference)
    assert not check.passed and "float64 reference is not finite" in check.message
    # in half precision each side may be off by what the original's error over its kind allows
    noisy = rewritten.clone()
    noisy[:8] += 0.3
    assert not check_tensor("out", original, noisy, "bfloat16", reference).passed
    assert check_tensor("out", original, noisy, "bfloat16", reference, kind_noise=0.05).passed
    assert not check_tensor("out", original, wrong, "bfloat16", reference, kind_noise=0.05).passed
