"""Differential verification through a repository harness: correct rewrites pass, a wrong one fails
and is dropped, an incompatible checkpoint is reported as such."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from engine.verify import Candidate, Verifier, VerifyConfig, verify  # noqa: E402
from tests.engine.verify.fixtures import gelu_rewrite, renamed_parameter_rewrite, sdpa_rewrite, write_repo  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return write_repo(tmp_path_factory.mktemp("tiny") / "repo")


@pytest.fixture(scope="module")
def verifier(repo):
    with Verifier(repo, config=VerifyConfig(timeout_s=120, threads=1)) as v:
        yield v


def test_candidates_keep_correct_rewrites_and_drop_a_wrong_scale(repo, verifier):
    candidates = [
        Candidate("sdpa", sdpa_rewrite(repo)),
        Candidate("wrong-scale", sdpa_rewrite(repo, scale=", scale=1.0 / q.size(-1)")),
        Candidate("gelu", gelu_rewrite(repo)),
    ]
    outcome = verifier.candidates(candidates)

    sdpa = outcome.per_rewrite["sdpa"]
    assert sdpa.passed, sdpa.message
    runs = {(c.name, c.run) for c in sdpa.cases}
    # several shapes, batch size 1 among them, eval and train mode, the dropout smoke run, and eval
    # mode with dropout as the model ships, and the probes (no mask input here: layout, bfloat16, float16)
    assert any("batch_size=1" in name for name, _ in runs)
    assert {run for _, run in runs} == {"eval|float32", "train|float32", "train-dropout", "eval-as-shipped",
                                        "probe:non-contiguous inputs", "probe:bfloat16", "probe:float16"}
    assert sdpa.max_rel_err is not None and sdpa.max_rel_err < 1e-3
    # gradients of the input that requires grad and of every parameter were compared
    assert all(c.tensors >= 8 for c in sdpa.cases if c.run.startswith("eval|"))

    wrong = outcome.per_rewrite["wrong-scale"]
    assert wrong.status == "failed"
    assert "grad/" in wrong.message or "out" in wrong.message
    assert wrong.max_rel_err > 1e-2

    assert outcome.per_rewrite["gelu"].passed
    assert outcome.accepted == ["sdpa", "gelu"]
    assert "wrong-scale" in outcome.dropped
    # the accepted rewrites were verified together, in one merged file
    assert outcome.combined is not None and outcome.combined.passed
    merged = outcome.combined_files["model.py"]
    assert "scaled_dot_product_attention" in merged and "F.gelu" in merged
    json.dumps(outcome.to_dict())  # JSON-serializable


def test_renamed_parameter_is_reported_as_checkpoint_incompatible(repo, verifier):
    result = verifier.check(renamed_parameter_rewrite(repo))
    assert result.status == "incompatible"
    assert "out_proj" in result.message or "proj" in result.message


def test_verify_accepts_a_rewritten_tree(repo, tmp_path):
    rewritten = write_repo(tmp_path / "rewritten")
    (rewritten / "model.py").write_text(sdpa_rewrite(repo)["model.py"])
    result = verify(repo, rewritten, config=VerifyConfig(timeout_s=120, threads=1, shapes=({"batch_size": 1, "seq_len": 4},)))
    assert result.passed, result.message
    assert result.targets == ["harness.py:build"]
