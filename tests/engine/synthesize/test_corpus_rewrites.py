"""Every rule on every file of the paper's corpus: the rewritten files compile, and scanning the
output again finds nothing new to rewrite (the engine is idempotent on its own output)."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from benchmarks.corpus import all_files
from engine.scan import scan_source, select_rules

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rules():
    return select_rules("all")


def _rewrite_one(path):
    text = path.read_text()
    module = "transformers.models." + path.parent.name + "." + path.stem
    findings, new_text = scan_source(text, _RULES, path.name, module)
    return path, text, findings, new_text


_RULES: list = []


def _rewrite_all(rules):
    # the files are independent: spread over the machine's cores (forked workers inherit the rules)
    _RULES[:] = rules
    files = all_files()
    jobs = min(2, os.cpu_count() or 1)
    if jobs < 2:
        return [_rewrite_one(p) for p in files]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_rewrite_one, files, chunksize=4))


@pytest.fixture(scope="module")
def rewritten(rules):
    return _rewrite_all(rules)


def test_corpus_rewrites_compile(rewritten):
    changed = [(p, new) for p, old, _, new in rewritten if new != old]
    assert len(changed) >= 20, "the default rules should rewrite a good part of the corpus"
    for path, new in changed:
        compile(new, str(path), "exec")


def test_second_scan_rewrites_nothing(rewritten, rules):
    for path, old, _, new in rewritten:
        if new == old:
            continue
        module = "transformers.models." + path.parent.name + "." + path.stem
        findings, again = scan_source(new, rules, path.name, module)
        assert again == new, f"{path.parent.name}: a second scan rewrote its own output"
        assert not [f for f in findings if f.status in ("rewritten", "guarded")], path.parent.name


def test_corpus_rewrites_are_mergeable(rewritten):
    """No new ruff finding (E501 at the length the file keeps to, F401, F841), no new dead branch
    or repeated guard, in any rewritten file of the corpus."""
    from engine.synthesize.mergeable import check
    from engine.synthesize.style import Style

    problems = []
    for path, old, _, new in rewritten:
        if new != old:
            verdict = check(old, new, Style().for_text(old).line_length)
            problems += [f"{path.parent.name}/{path.name}: {p}" for p in verdict.problems()]
    assert not problems, "\n".join(problems[:20])


def test_no_finding_is_refused_for_an_invalid_template(rewritten):
    bad = [f"{p.parent.name}: {f.reason}" for p, _, findings, _ in rewritten for f in findings
           if f.reason and "invalid Python" in f.reason]
    assert not bad, "\n".join(bad[:10])


def test_attention_helpers_are_rewritten_at_their_calls(rewritten):
    """GPT-2, GPT-Neo and CodeGen keep their attention in `_attn`, which returns the weights: each
    is rewritten at the call, under the caller's reason to need them, and the helper stays as is."""
    by_model = {p.parent.name: (old, findings, new) for p, old, findings, new in rewritten}
    for model in ("gpt2", "gpt_neo", "codegen"):
        old, findings, new = by_model[model]
        # (GPT-2's `_upcast_and_reordered_attn`, which views the scores to 4-D and never back, is a
        # near-miss of its own)
        attention = [f for f in findings if f.rule_id == "sdpa-attention" and f.method != "_upcast_and_reordered_attn"]
        assert [f.status for f in attention] == ["guarded"], (model, [(f.status, f.reason) for f in attention])
        assert "output_attentions" in (attention[0].guard_text or "")
        helper = old[old.index("    def _attn("):old.index("\n    def ", old.index("    def _attn(") + 1)]
        assert helper in new, f"{model}: the helper changed"
        assert new.count("scaled_dot_product_attention(") == old.count("scaled_dot_product_attention(") + 1
