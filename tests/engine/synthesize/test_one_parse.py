"""Synthesis does per file what it must once: one libcst parse of each edited function for all of
its findings, and no second search of the lines a rewrite left as they were."""

from __future__ import annotations

import random

import libcst as cst

from engine.scan import scan_source, select_rules
from engine.synthesize import _LineMap
from engine.synthesize.imports import _mentions, _mentions_edited

# two attention sites in one method
SOURCE = '''import math
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = dim ** -0.5
        self.attend = nn.Softmax(dim=-1)

    def forward(self, q, k, v, mask=None):
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = dots.softmax(dim=-1)
        out = torch.matmul(attn, v)
        dots2 = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        attn2 = dots2.softmax(dim=-1)
        out2 = torch.matmul(attn2, v)
        return out + out2

    def other(self, q, k, v):
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = self.attend(dots)
        return torch.matmul(attn, v)
'''


def test_a_method_with_several_findings_is_parsed_once(monkeypatch):
    parsed: list[str] = []
    real = cst.parse_module

    def counting(source, *args, **kwargs):
        parsed.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(cst, "parse_module", counting)
    findings, new = scan_source(SOURCE, select_rules("all"), "model.py", "model")
    forward = [f for f in findings if f.status == "rewritten" and f.method == "forward"]
    assert len(forward) == 2 and "scaled_dot_product_attention" in new
    # both findings are edits of one parse of the method (and nothing else is parsed whole)
    assert sum("def forward" in p for p in parsed) == 1
    assert not any("import math" in p for p in parsed)


def test_kept_runs_agree_with_the_line_map():
    rng = random.Random(7)
    for _ in range(300):
        moved = _LineMap()
        count = rng.randint(1, 60)
        lines = count
        for round_number in range(rng.randint(1, 3)):
            start = 1
            for _ in range(rng.randint(0, 3)):
                if start > lines:
                    break
                a = rng.randint(start, lines)
                b = rng.randint(a, min(lines, a + 5))
                moved.add(round_number, a, b, rng.randint(0, 8))
                start = b + 2
            lines += sum(n - (e - s + 1) for s, e, n in moved.rounds.get(round_number, []))
        expected = {line: moved(line) for line in range(1, count + 1)}
        got: dict[int, int | None] = dict.fromkeys(range(1, count + 1))
        for first, last, shift in moved.kept(count):
            for line in range(first, last + 1):
                assert got[line] is None
                got[line] = line + shift
        assert got == expected


def test_mentions_of_an_edit_are_those_of_the_whole_text():
    original = SOURCE
    lines = original.splitlines(keepends=True)
    names, attrs = {"math", "torch", "nn"}, {"attend"}
    cases = [
        (12, 19, ["        return torch.zeros(1)\n"]),  # forward's body replaced: math no longer read
        (21, 23, ["        return self.attend(q)\n", "        # math.\n"]),
        (1, 1, []),
    ]
    for start, end, replacement in cases:
        moved = _LineMap()
        moved.add(0, start, end, len(replacement))
        text = "".join(lines[:start - 1] + replacement + lines[end:])
        before = _mentions(original, names, attrs)
        got = _mentions_edited(original, text, moved.kept(len(lines)), before, names, attrs)
        assert got == _mentions(text, names, attrs)
    # a kept line that is not what the map says it is: searched whole, still right
    moved = _LineMap()
    moved.add(0, 3, 3, 1)
    text = original.replace("import math\n", "import mathx\n")
    assert _mentions_edited(original, text, moved.kept(len(lines)), _mentions(original, names, attrs),
                            names, attrs) == _mentions(text, names, attrs)
