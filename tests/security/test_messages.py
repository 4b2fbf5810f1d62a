"""Forged messages from the child: the benchmark's JSON lines and the verification's result and
tensor files are untrusted input; each forgery fails that one run with a clear reason and never
crashes the parent."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from engine.bench import bench  # noqa: E402
from engine.verify import verify  # noqa: E402
from tests.engine.verify.fixtures import sdpa_rewrite  # noqa: E402
from tests.security.hostile import bench_config, hostile_repo, verify_config  # noqa: E402

pytestmark = pytest.mark.torch

# Attack code: write ``LINES`` into every pipe the harness can write to (the benchmark's channel
# to the parent is one of them), before the real "ready" message.
_FORGE_ON_PIPES = """
import stat
for fd in range(3, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, LINES)
    except OSError:
        pass
return {}
"""

VALID_READY = b'{"status": "ready", "parameters": 1, "input_shapes": {}, "threads": 1, "device_name": "cpu"}\n'


@pytest.mark.parametrize("lines, reason", [
    (b"this is not json\n", "not valid JSON"),
    (b"[1, 2, 3]\n", "not a JSON object"),
    (b'{"status": "ready", "parameters": "all of them", "input_shapes": {}, "threads": 1}\n', "not a number"),
    (b"x" * (3 * 1024 * 1024), "byte limit"),
    (VALID_READY + b'{"status": "ok", "times": [-1.0]}\n', "out of range"),
    (VALID_READY + b'{"status": "ok", "times": [NaN]}\n', "out of range"),
    (b'{"status": "error", "phase": "' + b"\\u001b[31m" * 3 + b'", "message": "forged failure"}\n', "forged failure"),
])
def test_a_forged_benchmark_message_fails_the_benchmark_cleanly(tmp_path, lines, reason):
    repo = hostile_repo(tmp_path / "repo", f"LINES = {lines!r}\n" + _FORGE_ON_PIPES)
    result = bench(repo, sdpa_rewrite(repo), config=bench_config(tmp_path / "bench"))
    assert result.status == "error", (result.status, result.message)
    assert reason in result.message
    assert "\x1b" not in result.message
    assert result.speedup is None and result.baseline_step_s is None


_FORGE_RESULT = """
import atexit
job = json.load(open(sys.argv[1]))

def forge():
    with open(job[WHICH], "wb") as handle:
        handle.write(CONTENT)

atexit.register(forge)  # after the child wrote its real result
return {}
"""


@pytest.mark.parametrize("which, content, reason", [
    ("result_file", b"{not json", "not valid JSON"),
    ("result_file", b'{"status": "ok", "cases": {"x": {"status": "ok", "runs": "all"}}}', "malformed runs"),
    ("result_file", b'{"status": "ok", "cases": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
    ("result_file", b'{"status": "fine"}', "unknown status"),
    ("result_file", b" " * (33 * 1024 * 1024), "byte limit"),
    ("tensors_file", b"PK\x03\x04 not a torch file", "tensors were rejected"),
])
def test_a_forged_verification_result_fails_the_verification_cleanly(tmp_path, which, content, reason):
    repo = hostile_repo(tmp_path / "repo", f"WHICH = {which!r}\nCONTENT = {content!r}\n" + _FORGE_RESULT)
    result = verify(repo, sdpa_rewrite(repo), config=verify_config(tmp_path / "verify"))
    assert result.status == "error", (result.status, result.message)
    assert "rejected" in result.message and reason in result.message


def _result_file(tmp_path, case_extra: dict):
    import json

    case = {"status": "ok", "runs": ["eval|float32"], **case_extra}
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"status": "ok", "cases": {"harness.py:build": case}}))
    return path


def test_coverage_and_dropout_probe_fields_are_carried_checked(tmp_path):
    from engine.verify.messages import read_result_file

    good = {"kernel_calls": {"eval|float32": {"torch.nn.functional.scaled_dot_product_attention": 3,
                                              "torch.optim.AdamW(fused=True)": 0}},
            "shipped": {"drops": {"eval": False, "train": True}, "extra": "dropped"},
            "kernel_eligibility": {"torch.nn.functional.scaled_dot_product_attention":
                                   {"fused": 2, "math only": 1, "why": "requires 4 dimensional\x1b[31m inputs"}}}
    case = read_result_file(_result_file(tmp_path, good))["cases"]["harness.py:build"]
    assert case["kernel_calls"] == good["kernel_calls"]
    assert case["shipped"] == {"drops": {"eval": False, "train": True}}
    assert case["kernel_eligibility"]["torch.nn.functional.scaled_dot_product_attention"]["fused"] == 2
    assert "\x1b" not in case["kernel_eligibility"]["torch.nn.functional.scaled_dot_product_attention"]["why"]


@pytest.mark.parametrize("extra", [
    {"kernel_calls": {"eval|float32": {"torch.nn.functional.scaled_dot_product_attention": -1}}},
    {"kernel_calls": {"eval|float32": {"x; rm -rf /": 1}}},
    {"kernel_calls": {"sideways": {}}},
    {"kernel_calls": {"eval|float32": {"k": 1.5}}},
    {"shipped": {"drops": {"eval": "yes"}}},
    {"kernel_eligibility": {"k": {"fused": float("nan")}}},
])
def test_forged_coverage_or_probe_fields_are_rejected(tmp_path, extra):
    from engine.verify.messages import MalformedMessage, read_result_file

    with pytest.raises(MalformedMessage):
        read_result_file(_result_file(tmp_path, extra))
