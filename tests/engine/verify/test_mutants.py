"""Mutation testing of the verifier: each known-wrong rewrite of ``engine.verify.mutants`` breaks the
call it is meant to break, and the verifier rejects every mutant of a real rewrite."""

from __future__ import annotations

import pytest

from engine.verify.mutants import MUTANTS, ON_ORIGINAL, mutants

CALL = ("        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=~(m == 0), "
        "dropout_p=(self.drop.p if self.drop.training else 0.0), scale=(1 / 8))\n")


def test_each_mutant_breaks_the_call_in_its_own_way():
    out = {name: make(CALL) for name, make in MUTANTS.items()}
    assert "scale=((1 / 8)) / (q.size(-1) ** 0.5)" in out["scale off by sqrt(d)"]
    assert "attn_mask=_inverted(~(m == 0))" in out["mask inverted"] and "def _inverted" in out["mask inverted"]
    assert "attn_mask=_other_kind(~(m == 0))" in out["mask converted to the other kind"]
    assert "attn_mask" not in out["mask dropped"]
    assert "dropout_p=self.drop.p," in out["dropout in eval mode"]
    assert out["output transposed"].rstrip().endswith("scale=(1 / 8)).transpose(-2, -1)")
    assert "_by_hand(q, k, v" in out["kernel never runs"] and "scaled_dot_product_attention" not in \
        out["kernel never runs"].split("def _by_hand")[0]


FIXED_UP = ("        y = F.scaled_dot_product_attention(\n"
            "            q.masked_fill((m == 0).all(-1, keepdim=True), 0),\n"
            "            k,\n"
            "            v,\n"
            "            attn_mask=~(m == 0) | (m == 0).all(-1, keepdim=True),\n"
            "            scale=0.125,\n"
            "        ).masked_fill((m == 0).all(-1, keepdim=True), float('nan'))  # (B, nh, T, hs)\n")


def test_fix_up_dropped_undoes_each_part_of_the_exact_form():
    out = MUTANTS["fully masked rows' fix-up dropped"](FIXED_UP)
    assert out == ("        y = F.scaled_dot_product_attention(q, k, v, attn_mask=~(m == 0), scale=0.125)"
                   "  # (B, nh, T, hs)\n")
    # a file of double-quoted strings gets the NaN rows written float("nan")
    assert MUTANTS["fully masked rows' fix-up dropped"](FIXED_UP.replace("float('nan')", 'float("nan")')) == out
    where = ("y = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(d.all(-1, keepdim=True), 0.0, "
             "torch.where(d, float('-inf'), bias)))\n")
    assert MUTANTS["fully masked rows' fix-up dropped"](where) == \
        "y = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(d, float('-inf'), bias))\n"
    assert MUTANTS["fully masked rows' fix-up dropped"](CALL) is None  # no fix-up to drop


def test_bias_dropped_loses_one_additive_term_and_leaves_boolean_masks_alone():
    summed = ("y = F.scaled_dot_product_attention(q, k, v, attn_mask=(torch.zeros(s).masked_fill(~keep, lo) "
              "+ (mask if mask is not None else 0)), scale=1.0)\n")
    assert MUTANTS["bias dropped"](summed) == \
        "y = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(s).masked_fill(~keep, lo), scale=1.0)\n"
    swin = "c = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=relative_position_bias.unsqueeze(0))\n"
    assert MUTANTS["bias dropped"](swin) == "c = nn.functional.scaled_dot_product_attention(q, k, v)\n"
    # minigpt's causal mask lives in a buffer named `bias`: a boolean expression is a mask, not a bias
    assert MUTANTS["bias dropped"](FIXED_UP) is None
    # the same text is one mutant, under its first name
    assert "bias dropped" in mutants("", swin) and "mask dropped" not in mutants("", swin)


def test_mutants_that_do_not_apply_are_left_out():
    plain = "        y = F.scaled_dot_product_attention(q, k, v)\n"
    names = set(mutants("p = s.softmax(dim=-1)\n", plain))
    assert names == {"scale off by sqrt(d)", "output transposed", "kernel never runs", "softmax over the query axis"}


@pytest.mark.torch
def test_verifier_rejects_every_mutant_of_a_real_rewrite(tmp_path):
    pytest.importorskip("torch")
    from engine.verify import Verifier, VerifyConfig
    from tests.engine.verify.fixtures import sdpa_rewrite, write_repo

    repo = write_repo(tmp_path / "repo")
    original = (repo / "model.py").read_text()
    rewritten = sdpa_rewrite(repo)["model.py"]
    config = VerifyConfig(timeout_s=120, threads=1, shapes=({"batch_size": 2, "seq_len": 5},))
    kernels = ("torch.nn.functional.scaled_dot_product_attention",)
    with Verifier(repo, config=config) as verifier:
        assert verifier.check({"model.py": rewritten}, kernels).passed
        found = mutants(original, rewritten)
        assert len(found) >= 5
        missed = {name: r.message for name, text in found.items()
                  if (r := verifier.check({"model.py": text}, () if name in ON_ORIGINAL else kernels)).passed}
    assert not missed, f"the verifier passed known-wrong rewrites: {missed}"


@pytest.mark.torch
def test_verifier_rejects_every_mutant_of_a_rewrite_with_an_input_mask(tmp_path):
    """The masks a model takes as inputs (a padded batch, masked_fill(mask == 0, -1e9)): the engine's
    exact rewrite passes, and every mutant of it, the fix-up of fully masked rows dropped among them,
    is rejected; the softmax over the wrong axis by its numbers, not by coverage."""
    pytest.importorskip("torch")
    from engine.scan import scan_source, select_rules
    from engine.verify import Verifier, VerifyConfig
    from tests.engine.verify.fixtures import write_masked_repo

    repo = write_masked_repo(tmp_path / "repo")
    original = (repo / "model.py").read_text()
    _, rewritten = scan_source(original, select_rules("sdpa-attention"), "model.py", "model")
    config = VerifyConfig(timeout_s=120, threads=1, shapes=({"batch_size": 2, "seq_len": 5},))
    kernels = ("torch.nn.functional.scaled_dot_product_attention",)
    with Verifier(repo, config=config) as verifier:
        assert verifier.check({"model.py": rewritten}, kernels).passed
        found = mutants(original, rewritten)
        assert {"fully masked rows' fix-up dropped", "mask inverted", "softmax over the query axis"} <= set(found)
        outcomes = {name: verifier.check({"model.py": text}, () if name in ON_ORIGINAL else kernels)
                    for name, text in found.items()}
    assert not [name for name, r in outcomes.items() if r.passed], {n: r.message for n, r in outcomes.items()}
    assert outcomes["softmax over the query axis"].status == "failed"
    assert "probe mask" in outcomes["fully masked rows' fix-up dropped"].message
