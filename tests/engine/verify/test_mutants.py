"""Mutation testing of the verifier: each known-wrong rewrite of ``engine.verify.mutants`` breaks the
call it is meant to break, and the verifier rejects every mutant of a real rewrite."""

from __future__ import annotations

import pytest

from engine.verify.mutants import MUTANTS, mutants

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
                  if (r := verifier.check({"model.py": text}, kernels)).passed}
    assert not missed, f"the verifier passed known-wrong rewrites: {missed}"
