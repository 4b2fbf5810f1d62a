"""Hugging Face-style models: BERT of the installed transformers 4.34.1, verified through a patched
copy of the package (the installed one is never touched)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine.verify import Verifier, VerifyConfig  # noqa: E402
from tests.engine.verify.fixtures import bert_sdpa_patch  # noqa: E402

pytestmark = pytest.mark.torch

BERT = Path(transformers.__file__).parent / "models" / "bert"


@pytest.fixture(scope="module")
def verifier():
    config = VerifyConfig(timeout_s=180, threads=1, hf_max_models=1,
                          shapes=({"batch_size": 2, "seq_len": 12}, {"batch_size": 1, "seq_len": 5}))
    with Verifier(BERT, config=config) as v:
        yield v


def test_bert_self_attention_on_sdpa_passes(verifier):
    installed = (BERT / "modeling_bert.py").read_text()
    result = verifier.check({"modeling_bert.py": bert_sdpa_patch(installed)})
    assert result.passed, result.message
    assert result.targets == ["transformers.models.bert.modeling_bert.BertModel"]
    # the padded attention_mask probed at both extremes: a fully padded sample, and none padded
    assert {c.run for c in result.cases} == {"eval|float32", "train|float32", "train-dropout", "eval-as-shipped",
                                             "probe:mask input.attention_mask=0", "probe:mask input.attention_mask=1",
                                             "probe:non-contiguous inputs", "probe:bfloat16", "probe:float16"}
    assert all(c.passed for c in result.cases)
    assert any("batch_size=1" in c.name for c in result.cases)
    assert (BERT / "modeling_bert.py").read_text() == installed  # the installed package is untouched


def test_bert_patch_with_wrong_scale_fails(verifier):
    installed = (BERT / "modeling_bert.py").read_text()
    result = verifier.check({"modeling_bert.py": bert_sdpa_patch(installed, wrong_scale=True)})
    assert result.status == "failed"
    assert result.max_rel_err > 1e-2


def test_bert_patch_that_does_not_import_is_an_error(verifier):
    installed = (BERT / "modeling_bert.py").read_text()
    broken = installed.replace("import math\n", "import math\nfrom torch.nn.functional import no_such_kernel\n", 1)
    result = verifier.check({"modeling_bert.py": broken})
    assert result.status == "error"
    assert "no_such_kernel" in result.message


def test_raw_waveform_model_is_built_and_its_rewrite_verified(tmp_path):
    """Wav2Vec2 reads a waveform (`input_values`), whose length the feature encoder's convolutions
    turn into frames: the harness gives it the samples for the shape's `seq_len` frames, with a
    padded last sample, so that its BART-style attention rewrite is verified, not dropped."""
    from engine.scan import scan_path

    installed = Path(transformers.__file__).parent / "models"
    folder = installed / "wav2vec2"
    # scanned as a copy, with BART, the source of its `# Copied from` attention, which the rewrite
    # keeps in step with: the installed package may sit inside a project whose torch floor the
    # scan would respect (a virtual environment in a checkout)
    models = tmp_path / "transformers" / "models"
    for rel in ("bart/modeling_bart.py", "wav2vec2/modeling_wav2vec2.py"):
        (models / rel).parent.mkdir(parents=True, exist_ok=True)
        (models / rel).write_text((installed / rel).read_text())
    for package in (models.parent, models, models / "bart", models / "wav2vec2"):  # module names as installed
        (package / "__init__.py").touch()
    scanned = scan_path(models)
    assert "wav2vec2/modeling_wav2vec2.py" in scanned.files, "the default rules rewrite Wav2Vec2's attention"
    config = VerifyConfig(timeout_s=300, threads=1, hf_max_models=1, shapes=({"batch_size": 2, "seq_len": 12},))
    with Verifier(folder, config=config) as v:
        result = v.check({"modeling_wav2vec2.py": scanned.files["wav2vec2/modeling_wav2vec2.py"]})
    assert result.passed, result.message
    assert "transformers.models.wav2vec2.modeling_wav2vec2.Wav2Vec2Model" in result.targets
    assert any(c.run.startswith("probe:mask input.attention_mask") for c in result.cases)
