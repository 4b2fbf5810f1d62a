"""The paper's detection benchmark (Table 2) as a regression guard: the paper rules on the paper's
corpus, scored against the published labels, must keep at least the figures reached so far (the
remaining differences are label errors, listed in the issue notes)."""

from __future__ import annotations

import pytest

from benchmarks.corpus import GROUNDTRUTH
from benchmarks.paper_table2 import count_findings, read_truth, score
from engine.scan import select_rules

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not GROUNDTRUTH.exists(), reason="../shared/benchmarks/adopter-paper is not beside the checkout")
def test_paper_rules_precision_and_recall_against_the_labels():
    truth = read_truth()
    rules = select_rules("paper")
    found = {model: count_findings(model, rules) for model in truth}
    per_rule = score(truth, found)
    tp = sum(r[0] for r in per_rule)
    fn = sum(r[1] for r in per_rule)
    fp = sum(r[2] for r in per_rule)
    assert tp + fn == 474  # the published labels
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert precision >= 0.975, (precision, per_rule)
    assert recall >= 0.985, (recall, per_rule)
    # every one of the nine rules finds its labelled locations in the reference models
    assert found["bert"][0] == 1 and found["t5"][1] == 2 and found["gpt2"][2] == 2
    assert found["gpt_neo"][8] == 1 and found["gptj"][8] == 1
