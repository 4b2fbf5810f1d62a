"""The pure parts of verification: tolerances, merging candidates, finding targets, overlays."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.verify.merge import MergeConflict, merge_overlays, merge_texts
from engine.verify.targets import ConfigError, affected_model_classes, discover_targets, harness_target
from engine.verify.workspace import overlay_from
from tests.engine.verify.fixtures import write_repo

BASE = "a\nb\nc\nd\ne\n"


def test_merge_applies_disjoint_edits_and_rejects_overlapping_ones():
    one = BASE.replace("b\n", "B\n")
    two = BASE.replace("e\n", "E\nf\n")
    assert merge_texts(BASE, [one, two]) == "a\nB\nc\nd\nE\nf\n"
    assert merge_texts(BASE, [one, one]) == one
    with pytest.raises(MergeConflict):
        merge_texts(BASE, [one, BASE.replace("b\n", "X\n")])


def test_merge_overlays_by_file(tmp_path):
    (tmp_path / "m.py").write_text(BASE)
    merged = merge_overlays(tmp_path, [{"m.py": BASE.replace("a\n", "A\n")}, {"m.py": BASE.replace("d\n", "D\n"),
                                                                               "new.py": "x = 1\n"}])
    assert merged == {"m.py": "A\nb\nc\nD\ne\n", "new.py": "x = 1\n"}


def test_harness_config_forms(tmp_path):
    repo = write_repo(tmp_path / "a")
    target = harness_target(repo)
    assert target.module == "harness.py" and target.function == "build"
    assert target.shapes[1] == {"batch_size": 1, "seq_len": 5}
    assert target.bench_shape == {"batch_size": 4, "seq_len": 64}

    plain = write_repo(tmp_path / "b", config="harness: tools/h.py:make\n")
    target = harness_target(plain)
    assert (target.module, target.function) == ("tools/h.py", "make")
    assert any(shape.get("batch_size") == 1 for shape in target.shapes)

    github = write_repo(tmp_path / "c", config="")
    (github / ".adopter.yml").unlink()
    (github / ".github").mkdir()
    (github / ".github" / "adopter.yml").write_text("harness: harness.py:build\n")
    assert harness_target(github).module == "harness.py"

    outside = write_repo(tmp_path / "d", config="harness: ../../etc/evil.py:build\n")
    with pytest.raises(ConfigError):
        harness_target(outside)


def test_overlay_paths_must_stay_inside_the_tree(tmp_path):
    with pytest.raises(ValueError):
        overlay_from(tmp_path, {"../escape.py": "x"})
    with pytest.raises(ValueError):
        overlay_from(tmp_path, {"/etc/passwd": "x"})


def test_overlay_from_a_rewritten_tree_keeps_only_changed_files(tmp_path):
    original = write_repo(tmp_path / "orig")
    rewritten = write_repo(tmp_path / "new")
    (rewritten / "model.py").write_text("changed\n")
    (rewritten / "extra.py").write_text("new\n")
    assert overlay_from(original, rewritten) == {"extra.py": "new\n", "model.py": "changed\n"}


HF_SOURCE = '''
class FooPreTrainedModel(PreTrainedModel):
    pass

class FooAttention(nn.Module):
    def forward(self, x):
        return x

class FooLayer(nn.Module):
    def __init__(self):
        self.attn = FooAttention()

class FooPooler(nn.Module):
    pass

class FooModel(FooPreTrainedModel):
    def __init__(self):
        self.layers = [FooLayer()]

class FooForMaskedLM(FooPreTrainedModel):
    def __init__(self):
        self.foo = FooModel()

class FooForPooling(FooPreTrainedModel):
    def __init__(self):
        self.pooler = FooPooler()
'''


def test_affected_model_classes_follow_references_to_the_changed_class():
    attention_line = HF_SOURCE.splitlines().index("class FooAttention(nn.Module):") + 2
    assert affected_model_classes(HF_SOURCE, {attention_line}, limit=5) == ["FooModel", "FooForMaskedLM"]
    pooler_line = HF_SOURCE.splitlines().index("class FooPooler(nn.Module):") + 1
    assert affected_model_classes(HF_SOURCE, {pooler_line}, limit=5) == ["FooForPooling"]
    assert affected_model_classes(HF_SOURCE, None, limit=1) == ["FooModel"]


def test_hf_package_discovery(tmp_path):
    package = tmp_path / "pkg"
    folder = package / "models" / "foo"
    folder.mkdir(parents=True)
    for path in (package, package / "models", folder):
        (path / "__init__.py").write_text("")
    (folder / "configuration_foo.py").write_text("class FooConfig:\n    pass\n")
    (folder / "modeling_foo.py").write_text(HF_SOURCE)
    rewritten = HF_SOURCE.replace("        return x", "        return x + 0")
    targets = discover_targets(folder, {"modeling_foo.py": rewritten})
    assert [t.label for t in targets] == ["pkg.models.foo.modeling_foo.FooModel",
                                          "pkg.models.foo.modeling_foo.FooForMaskedLM"]
    assert targets[0].package_dir == package.resolve()
    assert discover_targets(Path(tmp_path), {"other.py": "x = 1\n"}) == []
