"""Which helper a call runs, as Python binds it: every `def` of a module-level name is a function of
its own (a shadowed one too, stable-audio-tools' `rms_norm` and its compiled redefinition), a call runs
what the name is bound to last (another binding after the `def` leaves no def to inline, a wrapper
of the function itself, `f = compile(f)`, keeps it), and a `@torch.jit.script` helper computes what
its body says (sockeye's interleaved matmuls): its steps are the caller's, the rewrite is written in
the caller and the helper stays. Rewrites run beside the originals in float64."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SHADOWED_NORM = '''
import torch
from torch import nn


def compile(fn):
    return fn


def rms_norm(x, scale, eps):
    ms = torch.mean(x ** 2, dim=-1, keepdim=True)
    return x * torch.rsqrt(ms + eps) * scale


rms_norm = compile(rms_norm)


@compile
def rms_norm(x, scale, eps):
    ms = torch.mean(x ** 2, dim=-1, keepdim=True)
    return x * torch.rsqrt(ms + eps) * scale


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.scale, self.eps)
'''


def _norm_lines(source: str) -> list[int]:
    findings, _ = scan_source(source, select_rules("rms-norm"), "case.py", "case")
    return sorted(f.line for f in findings if f.status == "rewritten")


def _def_line(source: str, nth: int) -> int:
    lines = [i for i, row in enumerate(source.splitlines(), 1) if row.startswith("def rms_norm")]
    return lines[nth]


def test_each_def_of_a_redefined_helper_is_a_site_of_its_own():
    findings, new = scan_source(SHADOWED_NORM, select_rules("rms-norm"), "case.py", "case")
    rewritten = sorted(f.line for f in findings if f.status == "rewritten")
    assert _def_line(SHADOWED_NORM, 0) < rewritten[0] < _def_line(SHADOWED_NORM, 1) < rewritten[-1], \
        [(f.line, f.status, f.reason) for f in findings]
    assert new.count("nn.functional.rms_norm(x, x.shape[-1:], eps=eps)") == 2 and "rsqrt" not in new, new
    scan_again = scan_source(new, select_rules("rms-norm"), "case.py", "case")[1]
    assert scan_again == new
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w = torch.rand(8, generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 0.5
    old_ns: dict = {}
    new_ns: dict = {}
    exec(compile(SHADOWED_NORM, "<old>", "exec"), old_ns)  # noqa: S102 - sources written in this file
    exec(compile(new, "<new>", "exec"), new_ns)  # noqa: S102
    torch.testing.assert_close(new_ns["rms_norm"](x, w, 1e-6), old_ns["rms_norm"](x, w, 1e-6), rtol=1e-10, atol=1e-12)


def test_a_redefinition_that_is_no_norm_is_no_site_and_the_shadowed_norm_still_is():
    source = SHADOWED_NORM.replace('''@compile
def rms_norm(x, scale, eps):
    ms = torch.mean(x ** 2, dim=-1, keepdim=True)
    return x * torch.rsqrt(ms + eps) * scale''', '''@compile
def rms_norm(x, scale, eps):
    ms = torch.mean(x ** 2, dim=-1, keepdim=True)
    return x * torch.sqrt(ms + eps) * scale''')
    assert source != SHADOWED_NORM
    lines = _norm_lines(source)
    # the first def alone: the last one (which the module's calls run) multiplies by the root mean square
    assert len(lines) == 1 and _def_line(source, 0) < lines[0] < _def_line(source, 1), lines


CALLER_OF_REBOUND = '''
import torch
import torch.nn.functional as F
from torch import nn


def scores_of(q, k):
    return q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5


{rebinding}


class Attention(nn.Module):
    def forward(self, q, k, v):
        return F.softmax(scores_of(q, k), dim=-1) @ v
'''


def _attention_statuses(source: str) -> dict[str, list[str]]:
    findings, _ = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    out: dict[str, list[str]] = {}
    for f in findings:
        out.setdefault(f.method, []).append(f.status)
    return out


def test_a_call_runs_the_name_as_bound_last():
    # a wrapper of the function itself keeps it: the scores the caller's softmax reads are its
    for rebinding in ("", "scores_of = torch.no_grad()(scores_of)"):
        statuses = _attention_statuses(CALLER_OF_REBOUND.format(rebinding=rebinding))
        assert statuses == {"forward": ["rewritten"]}, (rebinding, statuses)
    # bound again to something else: the caller's call runs that, no attention to inline there
    for rebinding in ("scores_of = torch.mul", "from torch import mul as scores_of",
                      "def scores_of(q, k):\n    return q * k",
                      "if torch.cuda.is_available():\n    scores_of = torch.mul"):
        statuses = _attention_statuses(CALLER_OF_REBOUND.format(rebinding=rebinding))
        assert not statuses, (rebinding, statuses)


SCRIPTED_SCORER = '''
import torch
import torch.nn.functional as F
from torch import nn


@torch.jit.script
def scores_of(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    q = q * q.size(-1) ** -0.5
    return torch.matmul(q, k.transpose(-1, -2))


class Attention(nn.Module):
    def forward(self, q, k, v):
        logits = scores_of(q, k)
        probs = F.softmax(logits, dim={dim})
        return torch.matmul(probs, v)
'''


def test_a_scripted_scorer_is_not_read():
    # `@torch.jit.script` helpers are compiled on their own and not read (extractor `_is_scripted`):
    # reading them gave findings the paper's labels do not count (gpt_bigcode's softmax helpers)
    source = SCRIPTED_SCORER.format(dim=-1)
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    assert new == source and not [f for f in findings if f.status in ("rewritten", "guarded")], findings


def test_a_scripted_scorer_whose_softmax_runs_over_the_queries_is_no_attention():
    source = SCRIPTED_SCORER.format(dim=-2)
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    assert new == source and not [f for f in findings if f.status != "near-miss"], findings
