"""Coverage per call site: each kernel call a rewrite adds must be seen running at its lines."""

from __future__ import annotations

from engine.verify.sites import Site, added_sites, kernel_name, unexercised

SDPA = "torch.nn.functional.scaled_dot_product_attention"
ORIGINAL = '''import torch.nn.functional as F


def vision(q, k, v):
    return (q @ k.transpose(-2, -1)).softmax(-1) @ v


def text(q, k, v):
    return (q @ k.transpose(-2, -1)).softmax(-1) @ v


def fused(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)
'''
REWRITTEN = ORIGINAL.replace("    return (q @ k.transpose(-2, -1)).softmax(-1) @ v\n", "    return F.scaled_dot_product_attention(\n        q, k, v, scale=1.0\n    )\n")


def test_the_calls_a_rewrite_adds_are_its_sites_and_calls_already_there_are_not(tmp_path):
    (tmp_path / "m.py").write_text(ORIGINAL)
    sites = added_sites(tmp_path, {"m.py": REWRITTEN, "notes.txt": "scaled_dot_product_attention("}, (SDPA,))
    # the same call text appears twice: both are new sites; the call `fused` already made is not
    assert [(s.path, s.first_line, s.last_line) for s in sites] == [("m.py", 5, 7), ("m.py", 11, 13)]
    assert kernel_name("torch.optim.AdamW(fused=True)") == "AdamW"
    assert added_sites(tmp_path, {"m.py": ORIGINAL}, (SDPA,)) == []


def test_a_site_no_call_came_from_is_unexercised():
    sites = [Site("m.py", SDPA, 5, 7), Site("m.py", SDPA, 11, 13)]
    tree = "/tmp/adopter-verify-x/002-rewritten/tree"
    hits = {SDPA: {f"{tree}/m.py:5": 4, f"{tree}/m.py:16": 2}}
    assert unexercised(sites, hits, tree) == [sites[1]]
    # a call of a multi-line site is recorded at any of its lines
    assert unexercised(sites, {SDPA: {f"{tree}/m.py:6": 1, f"{tree}/m.py:13": 1}}, tree) == []
    # calls from outside the working copy (torch's own files), or counted 0, prove nothing
    assert unexercised(sites, {SDPA: {"/usr/lib/python3/m.py:5": 3, f"{tree}/m.py:11": 0}}, tree) == sites
    # a package laid out under the copy (a Hugging Face model folder) is matched by its path's end
    nested = [Site("modeling_bert.py", SDPA, 40, 44)]
    assert unexercised(nested, {SDPA: {f"{tree}/transformers/models/bert/modeling_bert.py:41": 1}}, tree) == []
