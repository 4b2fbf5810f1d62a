"""The project's torch contract decides whether a rewrite needing a newer torch may be made."""

from __future__ import annotations

from engine.scan import scan_path
from engine.synthesize.contract import project_root, torch_contract

MODEL = '''import torch


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
'''


def _project(tmp_path, name, text):
    (tmp_path / ".git").mkdir()
    (tmp_path / name).write_text(text)
    (tmp_path / "train.py").write_text(MODEL)
    return tmp_path


def test_floor_from_each_kind_of_file(tmp_path):
    cases = {
        "pyproject.toml": '[project]\nname = "x"\ndependencies = ["numpy", "torch>=1.13,<3"]\n',
        "setup.py": 'setup(name="x", install_requires=["torch >= 1.13", "numpy"])\n',
        "setup.cfg": "[options]\ninstall_requires =\n    torch>=1.13\n",
        "requirements.txt": "numpy\ntorch>=1.13  # cuda 11\n",
        "environment.yml": "dependencies:\n  - python=3.10\n  - pytorch>=1.13\n",
    }
    for name, text in cases.items():
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        (folder / name).write_text(text)
        contract = torch_contract(folder)
        assert contract is not None and str(contract.floor) == "1.13", name
        assert "1.13" in contract.refuses(("torch>=2.4",))
        assert contract.refuses(("torch>=1.10",)) is None


def test_an_older_floor_skips_the_rewrite_with_the_reason(tmp_path):
    root = _project(tmp_path, "requirements.txt", "torch>=1.13\n")
    result = scan_path(root)
    assert not result.files
    (finding,) = [f for f in result.findings if f.rule_id == "fused-adamw"]
    assert finding.status == "near-miss"
    assert "torch>=1.13" in finding.reason and "torch>=2.4" in finding.reason


def test_a_new_enough_floor_rewrites_and_says_what_it_needs(tmp_path):
    root = _project(tmp_path, "requirements.txt", "torch>=2.4\n")
    result = scan_path(root)
    assert "fused=all(p.device.type in (\"cpu\", \"cuda\") for p in model.parameters())" in result.files["train.py"]
    (finding,) = [f for f in result.findings if f.rule_id == "fused-adamw"]
    assert "needs torch>=2.4" in finding.message


def test_no_packaging_files_means_no_contract(tmp_path):
    (tmp_path / ".git").mkdir()
    assert torch_contract(tmp_path) is None


def test_a_folder_with_its_own_requirements_is_its_own_project(tmp_path):
    # an example inside a larger repository states its own torch; the repository's floor is not its
    outer = _project(tmp_path, "pyproject.toml", '[project]\nname = "x"\ndependencies = ["torch>=2.1"]\n')
    inner = outer / "examples" / "demo"
    inner.mkdir(parents=True)
    (inner / "train.py").write_text((outer / "train.py").read_text())
    (inner / "requirements.txt").write_text("torch>=2.4\n")
    assert project_root(inner) == inner.resolve()
    assert "fused=" in scan_path(inner).files["train.py"]
    assert not scan_path(outer / "train.py").files  # the outer project's floor still holds there
