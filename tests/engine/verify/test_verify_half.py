"""Half precision: in float16 and bfloat16 a rewrite is held against the original's own precision
over the tensors of a kind, not against the one rounding draw the original made on each tensor.

OPT's attention (transformers 4.34.1: `torch.max(s, torch.tensor(torch.finfo(s.dtype).min))` and a
float32 softmax for float16 scores) on SDPA: the rewrite's algebra reproduces the original's
float16 gradients exactly, and the CPU float16 kernel lands 6x the original's error on one LayerNorm
gradient while staying within the original's worst error over the gradients; a wrong rewrite
still fails the float16 comparison."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine.verify import child  # noqa: E402
from engine.verify.compare import check_run  # noqa: E402

pytestmark = pytest.mark.torch

KIND = "original's precision over its kind"


def _noisy(truth: torch.Tensor, relative: float, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    noise = torch.rand(truth.shape, generator=generator, dtype=torch.float64) * 2 - 1
    return truth + relative * float(truth.abs().max()) * noise / float(noise.abs().max())


def _gradients(errors: dict[str, float], seed: int) -> dict[str, torch.Tensor]:
    return {key: _noisy(TRUTH[key], error, seed + i) for i, (key, error) in enumerate(errors.items())}


_generator = torch.Generator().manual_seed(0)
TRUTH = {
    "grad/param.a": torch.randn(64, generator=_generator, dtype=torch.float64),
    "grad/param.b": 0.03 * torch.randn(64, generator=_generator, dtype=torch.float64),
}


def test_half_precision_tensor_within_the_originals_worst_over_its_kind_passes():
    """The original is 3% off on `a` and 0.2% off on `b`; a rewrite 2% off on `b` (10x the original's
    there, 0.6 of its own size in absolute terms) is as precise as the original is elsewhere."""
    original = _gradients({"grad/param.a": 0.03, "grad/param.b": 0.002}, seed=1)
    rewritten = _gradients({"grad/param.a": 0.03, "grad/param.b": 0.02}, seed=11)
    checks = {c.key: c for c in check_run(original, rewritten, "float16", TRUTH)}
    assert all(c.passed for c in checks.values()), [c.message for c in checks.values()]
    assert checks["grad/param.b"].criterion == KIND
    # float32 has no such allowance, and without a float64 run there is nothing to measure against
    assert not {c.key: c for c in check_run(original, rewritten, "float32", TRUTH)}["grad/param.b"].passed
    assert not {c.key: c for c in check_run(original, rewritten, "float16")}["grad/param.b"].passed


def test_half_precision_error_beyond_the_originals_worst_fails():
    original = _gradients({"grad/param.a": 0.03, "grad/param.b": 0.002}, seed=1)
    rewritten = _gradients({"grad/param.a": 0.03, "grad/param.b": 0.2}, seed=11)  # over 4x 3%
    checks = {c.key: c for c in check_run(original, rewritten, "float16", TRUTH)}
    assert not checks["grad/param.b"].passed and checks["grad/param.b"].criterion == "float64 reference"


def test_tensors_below_the_dtypes_step_and_other_kinds_do_not_widen_the_allowance():
    """A gradient below one float16 rounding step at the gradients' scale (zero in exact arithmetic,
    the original 100% off) says nothing of the original's precision; nor do the outputs' errors."""
    truth = {
        **TRUTH,
        "grad/param.tiny": torch.full((8,), 1e-5, dtype=torch.float64),
        "out": torch.randn(64, generator=torch.Generator().manual_seed(5), dtype=torch.float64),
    }
    original = _gradients({"grad/param.a": 0.001, "grad/param.b": 0.001}, seed=1)
    original["grad/param.tiny"] = torch.zeros(8, dtype=torch.float64)
    original["out"] = _noisy(truth["out"], 0.05, seed=3)
    rewritten = {**original, "grad/param.b": _noisy(TRUTH["grad/param.b"], 0.02, seed=11)}
    checks = {c.key: c for c in check_run(original, rewritten, "float16", truth)}
    assert not checks["grad/param.b"].passed


# --------------------------------------------------------------------------------------------------
# OPT of the installed transformers, its own rewrite


@pytest.fixture(scope="module")
def opt(tmp_path_factory):
    """The installed OPT module, the default rules' rewrite of it, and the verifier's small model."""
    from engine.scan import scan_path

    installed = Path(transformers.__file__).parent / "models" / "opt" / "modeling_opt.py"
    folder = tmp_path_factory.mktemp("opt")
    (folder / "modeling_opt.py").write_text(installed.read_text())
    rewritten = scan_path(folder).files["modeling_opt.py"]
    assert (
        "scaled_dot_product_attention" in rewritten and "torch.finfo(attention_mask.dtype).min" in rewritten
    )
    (folder / "modeling_opt_sdpa.py").write_text(rewritten)
    spec = importlib.util.spec_from_file_location(
        "transformers.models.opt.modeling_opt_sdpa", folder / "modeling_opt_sdpa.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    original = importlib.import_module("transformers.models.opt.modeling_opt")
    target = {"kind": "hf", "module": original.__name__, "model_class": "OPTModel", "config_overrides": {}}
    torch.manual_seed(0)
    built = child.build(target, {"batch_size": 2, "seq_len": 16}, no_dropout=True)
    child.reinit(built.model, 1)
    yield original, module, built
    del sys.modules[spec.name]


def _run(opt, forward, dtype: str) -> dict:
    original, _, built = opt
    kept = original.OPTAttention.forward
    original.OPTAttention.forward = forward
    try:
        return child.run_once(built, built.model, built.inputs, dtype=dtype, train=False, step=False)
    finally:
        original.OPTAttention.forward = kept


def _sdpa_forward(opt, **changed):
    """The rewritten OPTAttention.forward, with the SDPA call's keyword arguments changed."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def wrong(q, k, v, **kwargs):
        return sdpa(q, k, v, **{**kwargs, **changed})

    def forward(self, *args, **kwargs):
        torch.nn.functional.scaled_dot_product_attention = wrong
        try:
            return opt[1].OPTAttention.forward(self, *args, **kwargs)
        finally:
            torch.nn.functional.scaled_dot_product_attention = sdpa

    return forward


@pytest.fixture(scope="module")
def reference(opt):
    original = opt[0].OPTAttention.forward
    return _run(opt, original, "float64"), _run(opt, original, "float16")


def test_opt_rewrite_passes_float16_against_the_originals_precision(opt, reference):
    ref64, original = reference
    rewritten = _run(opt, opt[1].OPTAttention.forward, "float16")
    checks = check_run(original, rewritten, "float16", ref64)
    assert all(c.passed for c in checks), [c.message for c in checks if not c.passed]
    assert any(c.criterion == KIND for c in checks)  # the per-tensor comparison alone would drop it


def test_opt_rewrites_algebra_is_exact_in_float16(opt, reference):
    """The mask clamped before the kernel adds it, then the original's own float16 arithmetic
    (float32 softmax of float16 scores): every tensor equals the original's, so what the kernel
    adds is its rounding alone."""

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=None):
        scores = q @ k.transpose(-1, -2) + attn_mask
        return torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype) @ v

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def forward(self, *args, **kwargs):
        torch.nn.functional.scaled_dot_product_attention = attention
        try:
            return opt[1].OPTAttention.forward(self, *args, **kwargs)
        finally:
            torch.nn.functional.scaled_dot_product_attention = sdpa

    _, original = reference
    for key, value in _run(opt, forward, "float16").items():
        torch.testing.assert_close(value, original[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("changed", [{"scale": None}, {"attn_mask": None}], ids=["scale", "mask"])
def test_opt_wrong_rewrite_fails_float16(opt, reference, changed):
    ref64, original = reference
    checks = check_run(original, _run(opt, _sdpa_forward(opt, **changed), "float16"), "float16", ref64)
    assert not all(c.passed for c in checks)
