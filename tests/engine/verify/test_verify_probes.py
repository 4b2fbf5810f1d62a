"""The verifier looks where bugs hide: a rewrite whose kernel never ran is "not exercised", not
passed; a rewrite that drops in eval mode (as `F.dropout(x, p)` does) fails against dropout as the
model ships, though every comparison with dropout forced off agrees."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from engine.verify import Verifier, VerifyConfig  # noqa: E402
from engine.verify import result as R  # noqa: E402
from tests.engine.verify.fixtures import ATTENTION_BLOCK, sdpa_rewrite, write_repo  # noqa: E402

pytestmark = pytest.mark.torch

SDPA = "torch.nn.functional.scaled_dot_product_attention"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return write_repo(tmp_path_factory.mktemp("probes") / "repo")


@pytest.fixture(scope="module")
def verifier(repo):
    config = VerifyConfig(timeout_s=120, threads=1, shapes=({"batch_size": 2, "seq_len": 5},))
    with Verifier(repo, config=config) as v:
        yield v


def test_kernel_that_ran_is_counted(verifier, repo):
    result = verifier.check(sdpa_rewrite(repo), (SDPA,))
    assert result.passed, result.message
    original, rewritten = result.kernel_calls[SDPA]
    assert original == 0 and rewritten > 0
    assert "kernel ran" in result.message


def test_rewrite_whose_kernel_never_ran_is_not_exercised(verifier, repo):
    """The kernel sits behind a guard no verification input takes: the outputs agree exactly, and
    that proves nothing about the kernel."""
    text = (repo / "model.py").read_text()
    guarded = text.replace(ATTENTION_BLOCK, (
        "        if x.shape[0] > 1000:\n"
        "            y = F.scaled_dot_product_attention(q, k, v)\n"
        "        else:\n" + "".join("    " + line for line in ATTENTION_BLOCK.splitlines(keepends=True))))
    result = verifier.check({"model.py": guarded}, (SDPA,))
    assert result.status == R.NOT_EXERCISED, result.message
    assert not result.passed and "never ran" in result.message


def test_dropout_in_eval_mode_fails_against_the_model_as_shipped(verifier, repo):
    """`dropout_p=self.drop.p` drops in eval mode: with dropout forced off every comparison agrees,
    but the model as shipped (dropout 0.1) drops in eval mode only after the rewrite."""
    rewrite = sdpa_rewrite(repo)["model.py"].replace("dropout_p=self.drop.p if self.training else 0.0", "dropout_p=self.drop.p")
    assert "dropout_p=self.drop.p)" in rewrite
    result = verifier.check({"model.py": rewrite}, (SDPA,))
    assert result.status == R.FAILED, result.message
    assert "eval mode the original does not drop and the rewrite does" in result.message
    shipped = [c for c in result.cases if c.run == "eval-as-shipped"]
    assert shipped and not any(c.passed for c in shipped)
    # every comparison with dropout off agreed: only the shipped probe saw it
    assert all(c.passed for c in result.cases if c.run in ("eval|float32", "train|float32"))


def test_calls_no_fused_kernel_takes_are_reported(verifier, repo):
    """The same attention on 3-D (batch * heads, tokens, head size) tensors: equivalent, and the
    kernel runs, but only its math path can take 3-D inputs; verification says so and why."""
    text = (repo / "model.py").read_text()
    flat = text.replace(ATTENTION_BLOCK, (
        "        y = F.scaled_dot_product_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),\n"
        "                                           dropout_p=self.drop.p if self.training else 0.0)\n"
        "        y = y.view(q.shape)\n"))
    result = verifier.check({"model.py": flat}, (SDPA,))
    assert result.passed, result.message
    eligibility = result.kernel_eligibility[SDPA]
    assert eligibility["math only"] > 0 and eligibility["fused"] == 0
    assert "4 dimensional" in eligibility["why"]
    assert any("no fused kernel takes" in note for note in result.notes)
    four_d = verifier.check(sdpa_rewrite(repo), (SDPA,))
    assert four_d.kernel_eligibility[SDPA]["math only"] == 0 and four_d.kernel_eligibility[SDPA]["fused"] > 0
