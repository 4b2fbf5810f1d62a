"""The verifier's probe inputs (engine/verify/child.py): what a mask input becomes, which sample the
probes' loss leaves out, and non-contiguous copies of the same values. In-process, no sandbox."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.verify import child  # noqa: E402
from engine.verify.messages import MalformedMessage, _probes  # noqa: E402

pytestmark = pytest.mark.torch


class KeyPadded(torch.nn.Module):
    def forward(self, x, mask):  # noqa: D102 - only its signature is read
        return x


def _variants(model, inputs):
    return {v["label"]: v for v in child.probe_variants(model, inputs)}


def test_a_query_by_key_mask_gets_a_fully_masked_sample_and_a_fully_masked_row_for_each_extreme():
    x = torch.randn(3, 4, 8)
    mask = torch.ones(3, 4, 4, dtype=torch.long)
    mask[-1, :, -1] = 0  # the harness's own padding: no row fully masked
    variants = _variants(KeyPadded(), (x, mask))
    assert set(variants) == {"mask input.1(mask)=0", "mask input.1(mask)=1", "non-contiguous inputs"}
    zero = variants["mask input.1(mask)=0"]
    probed = zero["inputs"][1]
    assert (probed[-1] == 0).all()  # a fully padded sample
    assert (probed[0, -1] == 0).all() and (probed[0, :-1] == 1).all()  # one padded query of the first sample
    assert torch.equal(probed[1], mask[1])
    assert zero["sample"] == -1 and zero["batch"] == 3
    assert (variants["mask input.1(mask)=1"]["inputs"][1][-1] == 1).all()
    assert torch.equal(zero["inputs"][0], x)  # the other inputs are the harness's
    assert torch.equal(mask[-1, :, -1], torch.zeros(4, dtype=torch.long))  # the harness's mask is untouched


def test_boolean_and_additive_masks_get_their_own_extremes_and_named_dict_inputs_are_found():
    ids = torch.randint(0, 9, (2, 5))
    keep = torch.ones(2, 5, dtype=torch.bool)
    additive = torch.zeros(2, 1, 5, 5).masked_fill(torch.rand(2, 1, 5, 5) > 0.7, float("-inf"))
    variants = _variants(KeyPadded(), {"input_ids": ids, "keep": keep, "bias_mask": additive})
    assert {"mask input.keep=False", "mask input.keep=True", "mask input.bias_mask=-inf",
            "mask input.bias_mask=0"} <= set(variants)
    assert not variants["mask input.keep=False"]["inputs"]["keep"][-1].any()
    assert variants["mask input.bias_mask=-inf"]["inputs"]["bias_mask"][-1].isinf().all()
    assert variants["mask input.keep=False"]["batch"] == 2  # the batch is read from input_ids


def test_a_batch_shared_mask_gets_its_last_query_row_masked_not_the_whole_batch():
    x = torch.randn(2, 4, 8)
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    variants = _variants(KeyPadded(), (x, causal))
    probed = variants["mask input.1(mask)=False"]["inputs"][1]
    assert not probed[-1].any() and torch.equal(probed[:-1], causal[:-1])
    assert variants["mask input.1(mask)=False"]["sample"] is None


def test_non_contiguous_inputs_hold_the_same_values():
    x = torch.randn(2, 4, 8, requires_grad=True)
    probe = _variants(KeyPadded(), (x, torch.ones(2, 4, 4)))["non-contiguous inputs"]["inputs"]
    assert not probe[0].is_contiguous() and torch.equal(probe[0], x) and probe[0].requires_grad


def test_the_probe_loss_reads_nan_as_zero_and_leaves_the_fully_masked_sample_out():
    out = torch.randn(3, 4, requires_grad=True)
    with torch.no_grad():
        out[1, 2] = float("nan")
    loss = child.probe_loss(-1, 3)(out)
    loss.backward()
    assert torch.isfinite(loss)
    assert (out.grad[-1] == 0).all() and out.grad[1, 2] == 0 and (out.grad[0] != 0).all()
    # the same weights in float64 (the reference run) as in float32
    again = child.probe_loss(-1, 3)(out.detach().double().nan_to_num(0.0).requires_grad_())
    assert float(again.detach()) == pytest.approx(float(loss.detach()), rel=1e-6)


@pytest.mark.parametrize("forged", [
    {"x": "ok"},
    {"x": {"status": "passed"}},
    {"x; rm -rf /": {"status": "ok"}},
    {"x": ["ok"]},
])
def test_forged_probe_reports_are_rejected(forged):
    with pytest.raises(MalformedMessage):
        _probes(forged, "case")
    assert _probes({"bfloat16": {"status": "error", "message": "x\x1b[31m"}}, "case")["bfloat16"]["message"] == "x?[31m"


def test_dropout_shipped_at_zero_is_switched_on_for_the_dropout_probe_and_other_rates_are_kept():
    model = torch.nn.Sequential(torch.nn.Dropout(0.0), torch.nn.Dropout(0.3))
    model[0].attn_drop_rate = 0.0  # a float attribute read by F.dropout(x, self.attn_drop_rate)
    model[1].proj_drop = 0.2
    child.switch_dropout_on(model)
    assert model[0].p == child.SWITCHED_ON_P and model[1].p == 0.3
    assert model[0].attn_drop_rate == child.SWITCHED_ON_P and model[1].proj_drop == 0.2


def test_kernel_sites_are_carried_checked():
    from engine.verify.messages import _kernel_sites

    sdpa = "torch.nn.functional.scaled_dot_product_attention"
    good = {sdpa: {"/tmp/adopter-verify-1/002-rewritten/tree/model.py:42": 3}}
    assert _kernel_sites(good, "case") == good
    for forged in ({sdpa: {"model.py:42": 1}}, {sdpa: {"/tmp/m.py:x": 1}}, {sdpa: {"/tmp/m.py:4": -1}},
                   {"k; rm -rf /": {"/m.py:1": 1}}, {sdpa: {"/tmp/m\x1b.py:4": 1}}):
        with pytest.raises(MalformedMessage):
            _kernel_sites(forged, "case")


def test_two_runs_differ_as_dropout_makes_them_not_by_a_reductions_rounding():
    """The shipped-dropout probe asks whether a model drops by running it twice under different seeds:
    a threaded reduction summing in another order (a last-bit difference) is no dropout, zeroed and
    rescaled elements are; NaN and infinities must sit in the same places."""
    torch.manual_seed(0)
    out = torch.randn(4, 16)
    assert not child._differs(out, out.clone())
    assert not child._differs(out, out + 1e-7 * torch.randn(4, 16))  # rounding of a reordered sum
    dropped = torch.nn.functional.dropout(out, 0.1, training=True)
    assert child._differs(out, dropped)
    assert child._differs(out, out[:, :8])
    with_nan = out.clone()
    with_nan[0, 0] = float("nan")
    assert not child._differs(with_nan, with_nan.clone())
    assert child._differs(with_nan, out)


def test_the_probe_loss_is_summed_in_float64_whatever_the_runs_dtype():
    """In bfloat16 a loss of a few tens is rounded to steps of 1/8 or more, and comparing such losses
    compares one rounding, not the outputs: the probe loss sums the same projection in float64, so two
    bfloat16 outputs that differ by one rounding step of one element give losses that differ by as
    little, and the gradient still reaches the bfloat16 output."""
    torch.manual_seed(0)
    out = (4 * torch.randn(64, 64)).to(torch.bfloat16).requires_grad_()
    loss = child.probe_loss(None, 64)(out)
    assert loss.dtype == torch.float64
    expected = child.probe_loss(None, 64)(out.detach().double().requires_grad_())
    assert float(loss) == pytest.approx(float(expected), rel=1e-12)
    loss.backward()
    assert out.grad is not None and out.grad.dtype == torch.bfloat16
    nudged = out.detach().clone()
    nudged[0, 0] = torch.nextafter(nudged[0, 0].float(), torch.tensor(1e9)).to(torch.bfloat16)
    assert abs(float(child.probe_loss(None, 64)(nudged.requires_grad_())) - float(loss)) < 1.0
