"""The verifier looks where bugs hide: a rewrite whose kernel never ran is "not exercised", not
passed; a rewrite that drops in eval mode (as `F.dropout(x, p)` does) fails against dropout as the
model ships, though every comparison with dropout forced off agrees; a rewrite wrong only on fully
masked rows, or only in bfloat16, fails the probes beyond the harness's inputs."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from engine.scan import scan_source, select_rules  # noqa: E402
from engine.verify import Verifier, VerifyConfig  # noqa: E402
from engine.verify import result as R  # noqa: E402
from tests.engine.verify.fixtures import (  # noqa: E402
    ATTENTION_BLOCK,
    HARNESS,
    TINY_MODEL,
    masked_rewrite,
    sdpa_rewrite,
    write_masked_repo,
    write_repo,
)

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


def test_calls_no_fused_kernel_takes_fail_the_rewrite(verifier, repo):
    """The same attention on 3-D (batch * heads, tokens, head size) tensors: equivalent, and the
    kernel runs, but only its math path can take 3-D inputs, so the rewrite cannot pay: it fails,
    saying where and why. The same call on 4-D views of those tensors passes."""
    text = (repo / "model.py").read_text()
    flat = text.replace(ATTENTION_BLOCK, (
        "        y = F.scaled_dot_product_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),\n"
        "                                           dropout_p=self.drop.p if self.training else 0.0)\n"
        "        y = y.view(q.shape)\n"))
    result = verifier.check({"model.py": flat}, (SDPA,))
    assert result.status == R.FAILED, result.message
    assert "runs the math path only" in result.message and "model.py:" in result.message
    assert "4 dimensional" in result.message
    eligibility = result.kernel_eligibility[SDPA]
    assert eligibility["math only"] > 0 and eligibility["fused"] == 0
    assert "4 dimensional" in eligibility["why"]
    assert any("no fused kernel takes" in note for note in result.notes)
    viewed = flat.replace("q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)",
                          "q.flatten(0, 1).unsqueeze(0), k.flatten(0, 1).unsqueeze(0), v.flatten(0, 1).unsqueeze(0)")
    viewed = viewed.replace("y = y.view(q.shape)", "y = y.squeeze(0).view(q.shape)")
    assert viewed.count("unsqueeze(0)") == 3
    four_d_views = verifier.check({"model.py": viewed}, (SDPA,))
    assert four_d_views.passed, four_d_views.message
    assert four_d_views.kernel_eligibility[SDPA]["math only"] == 0
    four_d = verifier.check(sdpa_rewrite(repo), (SDPA,))
    assert four_d.kernel_eligibility[SDPA]["math only"] == 0 and four_d.kernel_eligibility[SDPA]["fused"] > 0


def test_eligibility_is_asked_on_the_device_and_dtype_the_rewrite_runs_in(repo):
    """The fused backends are offered each call in the benchmark's device and dtype, not the
    compared float32 on the CPU: FlashAttention on CUDA takes only half precision, so a float32
    verdict would say nothing about a bfloat16 run there. Where the device asked for is not here, the
    CPU answers and the entry says so; a 3-D call is refused in bfloat16 as in float32."""
    import torch

    config = VerifyConfig(timeout_s=120, threads=1, shapes=({"batch_size": 2, "seq_len": 5},),
                          eligibility_device="cuda", eligibility_dtype="bfloat16")
    expected_on = "cuda bfloat16" if torch.cuda.is_available() else "cpu bfloat16"
    with Verifier(repo, config=config) as verifier:
        four_d = verifier.check(sdpa_rewrite(repo), (SDPA,))
        flat = verifier.check({"model.py": (repo / "model.py").read_text().replace(ATTENTION_BLOCK, (
            "        y = F.scaled_dot_product_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1))\n"
            "        y = y.view(q.shape)\n"))}, (SDPA,))
    assert four_d.passed, four_d.message
    entry = four_d.kernel_eligibility[SDPA]
    assert entry["on"] == expected_on and entry["fused"] > 0 and entry["math only"] == 0
    assert flat.status == R.FAILED and "runs the math path only" in flat.message
    assert flat.kernel_eligibility[SDPA]["on"] == expected_on
    assert any(f"no fused kernel takes on {expected_on}" in note for note in flat.notes)


def test_the_probes_made_up_inputs_are_not_held_to_eligibility(verifier, repo):
    """Eligibility is judged on the calls the model makes with the harness's inputs: a call that only
    the probes make (here a 3-D call taken only in the bfloat16 probe) is neither counted nor blamed.
    (Their verdicts once leaked into the compared runs' call sites, and a rewrite whose every counted
    call was fused failed as "runs the math path only".)"""
    text = sdpa_rewrite(repo)["model.py"]
    call = "        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.drop.p if self.training else 0.0)\n"
    assert call in text
    branching = text.replace(call, (
        "        shape = q.shape\n"
        "        if q.dtype == torch.bfloat16:\n"
        "            q, k, v = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)\n"
        + call.replace("0.0)\n", "0.0).view(shape)\n")))
    result = verifier.check({"model.py": branching}, (SDPA,))
    assert result.passed, result.message
    entry = result.kernel_eligibility[SDPA]
    assert entry["math only"] == 0 and entry["fused"] > 0
    assert any(c.run == "probe:bfloat16" for c in result.cases)  # the 3-D call did run, in the probe


def test_the_repositorys_own_math_only_call_is_a_note_not_the_rewrites_failure(tmp_path):
    """Only the calls the rewrite adds are held to eligibility: a 3-D call the original already makes
    (here on the block's (batch, tokens, features) input) is reported, and the rewrite, whose own
    call the fused kernel takes, passes."""
    own = "        x = x + F.scaled_dot_product_attention(x, x, x)\n"
    model = TINY_MODEL.replace("        x = x + self.attn(x)\n", own + "        x = x + self.attn(x)\n")
    assert own in model
    repo = write_repo(tmp_path / "repo", model=model)
    config = VerifyConfig(timeout_s=120, threads=1, shapes=({"batch_size": 2, "seq_len": 5},))
    with Verifier(repo, config=config) as verifier:
        result = verifier.check(sdpa_rewrite(repo), (SDPA,))
    assert result.passed, result.message
    eligibility = result.kernel_eligibility[SDPA]
    assert eligibility["math only"] > 0 and eligibility["fused"] > 0
    assert any("no fused kernel takes" in note for note in result.notes)


# --------------------------------------------------------------------------------------------------
# Probes beyond the harness's inputs

NAIVE_BOOLEAN_MASK = ("        y = F.scaled_dot_product_attention(q, k, v, attn_mask=~(mask == 0), "
                      "scale=1 / math.sqrt(q.size(-1)))\n")


@pytest.fixture(scope="module")
def masked_repos(tmp_path_factory):
    base = tmp_path_factory.mktemp("masked")
    return {fill: write_masked_repo(base / str(i), fill) for i, fill in enumerate(("-1e9", "float('-inf')"))}


def _config(**extra) -> VerifyConfig:
    return VerifyConfig(timeout_s=120, threads=1, shapes=({"batch_size": 2, "seq_len": 5},), **extra)


def test_a_boolean_mask_without_the_fix_up_of_fully_masked_rows_fails_the_mask_probe(masked_repos):
    """The issue's own example: `scores.masked_fill(mask == 0, -1e9)` rewritten to
    `attn_mask=~(mask == 0)`. On a fully masked row the original gives the plain average of v, the
    rewrite something else; the harness's inputs have no such row, so only the probe sees it."""
    repo = masked_repos["-1e9"]
    naive = masked_rewrite(repo, NAIVE_BOOLEAN_MASK)
    with Verifier(repo, config=_config(probes=False)) as blind:
        assert blind.check(naive, (SDPA,)).passed  # what the verifier said before it probed
    with Verifier(repo, config=_config()) as verifier:
        result = verifier.check(naive, (SDPA,))
    assert result.status == R.FAILED, result.message
    assert "probe mask input.1(mask)=0" in result.message
    failed = {c.run for c in result.cases if not c.passed}
    assert failed == {"probe:mask input.1(mask)=0"}  # every comparison on the harness's inputs agreed


@pytest.mark.parametrize("fill", ["-1e9", "float('-inf')"])
def test_the_engine_rewrite_of_each_fill_passes_the_mask_probes(masked_repos, fill):
    repo = masked_repos[fill]
    original = (repo / "model.py").read_text()
    _, rewritten = scan_source(original, select_rules("sdpa-attention"), "model.py", "model")
    assert "all(-1, keepdim=True)" in rewritten  # the exact form: a fix-up of fully masked rows
    with Verifier(repo, config=_config()) as verifier:
        result = verifier.check({"model.py": rewritten}, (SDPA,))
    assert result.passed, result.message
    probes = {c.run: c for c in result.cases if c.run.startswith("probe:")}
    assert {"probe:mask input.1(mask)=0", "probe:mask input.1(mask)=1", "probe:non-contiguous inputs",
            "probe:bfloat16"} <= set(probes)
    assert all(c.passed and c.tensors > 0 for c in probes.values())
    if "inf" in fill:  # NaN rows on both sides; v's gradient NaN only in the original: said, not hidden
        assert any("gradient is NaN" in note for note in result.notes)


def test_a_rewrite_that_does_not_keep_the_dtype_fails_the_bfloat16_probe(verifier, repo):
    """The kernel run on `.float()` copies and its result not cast back: in float32 nothing changes,
    in a bfloat16 model the float32 output meets a bfloat16 projection, where the original runs."""
    text = sdpa_rewrite(repo)["model.py"].replace("F.scaled_dot_product_attention(q, k, v,",
                                                  "F.scaled_dot_product_attention(q.float(), k.float(), v.float(),")
    assert "q.float()" in text
    with Verifier(repo, config=_config(low_precision=())) as float32_only:
        assert float32_only.check({"model.py": text}, (SDPA,)).passed
    result = verifier.check({"model.py": text}, (SDPA,))
    assert result.status == R.FAILED, result.message
    assert "probe bfloat16: the rewritten model fails where the original runs" in result.message


def test_low_precision_errors_are_listed_but_not_the_headline_error(verifier, repo):
    result = verifier.check(sdpa_rewrite(repo), (SDPA,))
    assert result.passed, result.message
    low = next(c for c in result.cases if c.run == "probe:bfloat16")
    assert low.passed and not low.headline and low.max_rel_err > 1e-4
    assert result.max_rel_err < 1e-5  # the float32 comparisons' error, as the pull request reports it


def test_dropout_in_eval_mode_fails_where_the_model_ships_without_dropout(tmp_path):
    """A model shipped with dropout 0 (Swin's attention dropout): neither side drops as shipped, so
    the probe switches dropout on, and the rewrite that drops in eval mode shows."""
    repo = write_repo(tmp_path / "repo", harness=HARNESS.replace("dropout=0.1", "dropout=0.0"))
    assert "dropout=0.0" in (repo / "harness.py").read_text()
    rewrite = sdpa_rewrite(repo)["model.py"].replace("dropout_p=self.drop.p if self.training else 0.0",
                                                     "dropout_p=self.drop.p")
    with Verifier(repo, config=_config()) as verifier:
        assert verifier.check(sdpa_rewrite(repo), (SDPA,)).passed
        result = verifier.check({"model.py": rewrite}, (SDPA,))
    assert result.status == R.FAILED, result.message
    assert "eval mode the original does not drop and the rewrite does" in result.message


def test_a_new_kernel_call_that_never_ran_is_not_exercised_though_another_one_did(verifier, repo):
    """Two kernel calls added, one on a path no verification input takes (and wrong: it would halve
    the scale). Coverage summed over the file says the kernel ran; per call site it did not run at
    the line of the second call, and that call's numbers were never checked."""
    text = (repo / "model.py").read_text()
    two = text.replace(ATTENTION_BLOCK, (
        "        if x.shape[0] > 1000:\n"
        "            y = F.scaled_dot_product_attention(q, k, v, scale=0.5 / math.sqrt(q.size(-1)))\n"
        "        else:\n"
        "            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.drop.p if self.training else 0.0)\n"))
    line = next(i for i, s in enumerate(two.splitlines(), 1) if "scale=0.5" in s)
    result = verifier.check({"model.py": two}, (SDPA,))
    assert result.kernel_calls[SDPA][1] > 0  # the kernel ran, at the other call
    assert result.status == R.NOT_EXERCISED, result.message
    assert f"model.py:{line} never ran" in result.message and "1 of its 2 new call sites did" in result.message
