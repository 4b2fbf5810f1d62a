"""The default rules on model code from outside the transformers corpus (benchmarks/wild_corpus.py):
sets of libraries at pinned versions (wild1: nine, wild2: fourteen, wild3 to wild9: labelled later), scored against labels read
from the code by what a correct rewrite could do, not by what the rules can do today.

The figures below are a ratchet, a regression guard set to what today's engine reaches on those
labels, not a goal (issue 10 asks for precision >= 0.98 and recall >= 0.95): on 2026-12-01 the
default rules reached, with manual fallbacks beside a fused path reported as already-fused
(engine/match/fused.py; before that the 19 `already-fused` rows were all false positives), the
shape and layout facts (engine/analysis), optimizers built in non-module classes, metadata reads
of the scores that only feed a dropped fill (`-torch.finfo(sim.dtype).max`, also in a statement of
its own) and additive biases with no expression of their own in the method (a helper's result, a
conditional expression: timm LeViT, TinyViT), and norms over an axis other than the last
(channels-first LayerNorm and RMSNorm: the kernel over that axis moved last), and guarded rewrites
after which a name assigned only on the original's path is read (ats_vit), and einsums with
batch axes in another order than the output's or missing from the key and value (heads after the
sequence, multi-query attention: ultralytics, timm, imagen), and two additive masks summed into
one (boltz's pair bias and padding mask), and the next match of a root written where the fullest
cannot be (video-diffusion: q reassigned by a rotary embedding after its scale)

    all    TP 119  FP 0  FN 15   P 1.000  R 0.888
    wild1  TP 88   FP 0  FN 11   P 1.000  R 0.889
    wild2  TP 31   FP 0  FN 4    P 1.000  R 0.886
    sdpa   TP 97   FP 0  FN 10   P 1.000  R 0.907
    norms  TP 15   FP 0  FN 5    P 1.000  R 0.750  (layer-norm and rms-norm)

(first labelled, before any of that: P 0.800, R 0.567)

wild3 (allennlp, parlai, mmpretrain, dalle-pytorch, torchtune so far), labelled before the tool ran
on it, has its own figures: on 2026-12-02 TP 29  FP 0  FN 16   P 1.000  R 0.644.
wild4 (torchvision, pytorch-widedeep, asteroid, stanza, tsai), held out the same way, has its own
figures too: on 2026-12-03, at its first scan, TP 11  FP 0  FN 11   P 1.000  R 0.500.

On 2026-12-03, after einsums over several axes (USES, SepViT), a softmax axis held by a setting of
the module under a guard (parlai), a base class from another file (mixmim) and fairseq's manual MHA
(ESM-2): wild1 TP 96 FN 1, wild2 TP 34 FN 1 (together TP 130 FN 2, sdpa TP 103 FN 2), wild3 TP 70
FN 8, all four sets FP 0; wild1-3 together TP 200 FN 10, R 0.952.

wild5 (torchaudio, torch-geometric, neuralforecast, recbole, deepctr-torch, enformer-pytorch), held out
and labelled the same way before the tool ran on it, has its own figures: on 2026-12-04, at its first
scan, TP 7  FP 0  FN 14   P 1.000  R 0.333.
wild6 (coqui-tts, funasr, transformer-lens, unimol-tools, rtdl-revisiting-models, audiocraft), held out and
labelled the same way before the tool ran on it, has its own figures: on 2026-12-04, at its first scan,
TP 15  FP 0  FN 21   P 1.000  R 0.417 (attention alone TP 2 FN 16: split across helpers, metadata reads of
the scores, ranks through torch.stack, a keyword cast back). After attention whose scores the caller
hands to a helper was matched through the call (2026-12-05): TP 20  FP 0  FN 16   R 0.556.
wild7 (fairseq, mmsegmentation, torchmultimodal, pytorch-tabular, lightly, audiolm-pytorch, musiclm-pytorch,
flamingo-pytorch, CoCa-pytorch, memorizing-transformers-pytorch, performer-pytorch), held out and labelled the same
way before the tool ran on it, has its own figures: on 2026-12-04, at its first scan, TP 16  FP 0  FN 10  TN 31
P 1.000  R 0.615 (attention TP 12 FN 7, fused-adamw TP 0 FN 3; norms and GELU all found).
On 2026-12-04, after the session's branches were merged (one-query and key-major attention, ranks
proven by bmm's use and through split/stack, fairseq-style views, helpers and post-softmax zero
re-fills, optimizer parameters materialized once, norms finished per branch): wild1 97/0/0, wild2
34/0/1, wild3 71/0/7, wild4 20/0/2, wild5 14/0/7, wild6 33/0/3, wild7 16/0/10 (unchanged: no branch
was merged that worked on it); all TP 285  FP 0  FN 30   P 1.000  R 0.905.

On 2026-12-04 the benchmark started to score what the command line does: a guarded rewrite whose
kernel never runs with the class's default settings is refused there, and the benchmark had counted
parlai's BasicAttention (every construction in the scanned files keeps `get_weights=True`) as found:
wild3 TP 69 FN 9. That figure was lowered because it had measured the wrong thing, not to let a change through.

On 2026-12-05, after one-query attention read by rank facts (a `torch.bmm` operand is 3-D wherever
the product runs, a query reshaped to a column, a module's state computed at run time, scores laid
out key-major and transposed back): parlai's memory hop, stanza's tree stack and recbole's RippleNet
(both addressings) are found: wild3 TP 70 FN 8, wild4 TP 19 FN 3, wild5 TP 9 FN 12, all FP 0.

On 2026-12-05 a guard holding by default is taken to never run only where every construction of the
class the scanned files hold keeps it holding (TabTransformer builds pytorch-tabular's attention with
keep_attn=False through TransformerEncoderBlock's own parameter): wild7 TP 17 FN 9, all 286/0/29.
Then the row maximum minus the scores read as the negated scores (mmsegmentation's DANet channel
attention, the kernel given the query negated): wild7 TP 18 FN 8, all 287/0/28. A read of the
parameters that a new assignment of the name follows before the optimizer never sees what it reads
(audiolm's get_optimizer, both calls): wild7 TP 20 FN 6, all 289/0/26 (R 0.917).

wild8 (local-attention, reformer-pytorch, OpenNMT-py, sockeye, stable-audio-tools, a labml-nn subset), held out and
labelled the same way before the tool ran on it, has its own figures: on 2026-12-05, at its first scan, TP 11  FP 0
FN 13  TN 21   P 1.000  R 0.458 (attention TP 3 FN 7: scores from an inherited or own `get_scores`, a softmax module of
another object, scores split across jit-scripted helpers, a metadata read of the scores in a helper; norms TP 3 FN 4:
statistics over `dim=[-1]` written as a list, a helper shadowed by its compiled redefinition; fused-adamw TP 4 FN 2: exclusive branches and a loop variable read as
escapes); all eight sets TP 300  FP 0  FN 39  R 0.885. Then statistics over axes written as a list literal
(`dim=[-1]`, labml's GroupNorm, InstanceNorm and ChannelNorm on their (B, groups, n) views) read as those constant
axes, a use of the parameter list on another branch of the `elif` chain choosing the optimizer no conflict, and a
list filled by `append` over `model.named_parameters()` a list of parameters (OpenNMT's build_torch_optimizer, both
calls): wild8 TP 16 FN 8 (R 0.667), all 305/0/34 (R 0.900).

On 2026-12-06 a fill value read from the scores' dtype that also feeds a fill on a path the match
does not take is kept with that path's original under the guard (imagen-video's causal fill: wild2 TP
35 FN 0), an einsum label of the key alone placed among the shared batch labels is a batch axis
(enformer's every sequence against every context: wild5 TP 15 FN 6), and keys and queries of unproven
rank whose axes the code names twice by non-negative indices are tested at run time (coqui-tts's GST
attention, twice: wild6 TP 35 FN 1): wild1-7 293/0/22 (R 0.930).
Both merged (with a shape check of the scores that also reads a bias handed to the kernel kept, restated
on the key, and a metadata read of the scores in local-attention's helper no longer an escape): wild8 TP 17 FN 7
(R 0.708), all eight sets 310/0/29 (R 0.914).
Then every `def` of a redefined module-level helper is a site of its own (stable-audio-tools' rms_norm
shadowed by its compiled redefinition), and a method inherited from a base class of another file of
the repository is inlined, read in its file (labml's ALiBi attention: the base's get_scores and
nn.Softmax(dim=1); its bias added in place keeps the scores' shape, an assert's mask.shape[2] proves
the mask's rank, and the cache's read of the heads from the permuted scores is restated on the
query): wild8 TP 19 FN 5 (R 0.792), all eight sets 312/0/27 (R 0.920); with wild9, all nine 326/0/30 (R 0.916).

wild9 (segmentation-models-pytorch, DALLE2-pytorch, x-clip, tab-transformer-pytorch, vocos, RETRO-pytorch), held out
and labelled the same way before the tool ran on it, has its own figures: on 2026-12-06, at its first scan, TP 14  FP 0
FN 3  TN 7   P 1.000  R 0.824 (misses: a weight standardization whose mean is an einops reduce and whose variance is
taken on a flattened view, a channels-first VQGAN attention with a helper's bias and a helper's shifted softmax, and
AdamW groups whose lists are built with list() from sets). Einops statistics (a reduce that only reduces axes, a
variance of a flattened view given its size-1 axes back) and the rank of a weight inherited from nn.Conv2d find the
weight standardization: wild9 TP 15 FN 2 (R 0.882), all nine sets 325/0/31 (R 0.913).

No look-alike is rewritten. Raise the figures when the engine improves; never lower them to
let a change through. Every rewritten file must also compile and be left alone by a second scan."""

from __future__ import annotations

import pytest

from benchmarks import wild_corpus as W

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scanned():
    rules, scans = W.run("default")  # fetches and unpacks the packages on first use
    return rules, scans


@pytest.fixture(scope="module")
def labels():
    return W.read_labels()


def test_labels_name_real_lines(scanned, labels):
    _, scans = scanned
    files = {(s.package.name, rel): path for s in scans for rel, path in W.package_files(s.package)}
    assert {lb.package for lb in labels} == {p.name for p in W.PACKAGES}
    for lb in labels:
        path = files.get((lb.package, lb.path))
        assert path is not None, f"{lb.package}/{lb.path}: no such file in the unpacked package"
        lines = path.read_text(encoding="utf-8").splitlines()
        assert 0 < lb.line <= len(lines) and lines[lb.line - 1].strip(), f"{lb.package}/{lb.path}:{lb.line} is blank"
    assert sum(lb.expected == "fire" for lb in labels) >= 130
    assert sum(lb.expected == "no" for lb in labels) >= 110
    assert len({p.name for p in W.PACKAGES if p.set == "wild2"}) >= 4


def _counts(result: W.Score) -> tuple[int, int, int]:
    return len(result.tp), len(result.fp), len(result.fn)


def _at_least(result: W.Score, tp: int, fp: int, fn: int, precision: float, recall: float, what: str) -> None:
    got_tp, got_fp, got_fn = _counts(result)
    detail = (what, [(s.package, s.path, s.line, s.rule) for s, _ in result.fp],
              [(lb.package, lb.path, lb.line, lb.rule) for lb, _ in result.fn])
    assert got_tp >= tp and got_fp <= fp and got_fn <= fn, (got_tp, got_fp, got_fn, detail)
    assert result.precision >= precision and result.recall >= recall, (result.precision, result.recall, what)


def test_precision_and_recall_against_the_labels(scanned, labels):
    _, scans = scanned
    every_site = [s for scan in scans for s in scan.sites]
    # the figures below were set on wild1 and wild2; wild3 to wild9, labelled later, have ratchets of their own
    wild3 = W.score(W.set_labels(labels, "wild3"), W.set_sites(every_site, "wild3"))
    _at_least(wild3, 71, 0, 7, 1.0, 0.91, "wild3")
    wild4 = W.score(W.set_labels(labels, "wild4"), W.set_sites(every_site, "wild4"))
    _at_least(wild4, 20, 0, 2, 1.0, 0.90, "wild4")
    wild5 = W.score(W.set_labels(labels, "wild5"), W.set_sites(every_site, "wild5"))
    _at_least(wild5, 15, 0, 6, 1.0, 0.71, "wild5")
    wild6 = W.score(W.set_labels(labels, "wild6"), W.set_sites(every_site, "wild6"))
    _at_least(wild6, 35, 0, 1, 1.0, 0.97, "wild6")
    wild7 = W.score(W.set_labels(labels, "wild7"), W.set_sites(every_site, "wild7"))
    _at_least(wild7, 20, 0, 6, 1.0, 0.76, "wild7")
    wild8 = W.score(W.set_labels(labels, "wild8"), W.set_sites(every_site, "wild8"))
    _at_least(wild8, 19, 0, 5, 1.0, 0.79, "wild8")
    wild9 = W.score(W.set_labels(labels, "wild9"), W.set_sites(every_site, "wild9"))
    _at_least(wild9, 15, 0, 2, 1.0, 0.88, "wild9")
    labels = W.set_labels(labels, "wild1") + W.set_labels(labels, "wild2")
    sites = W.set_sites(every_site, "wild1") + W.set_sites(every_site, "wild2")
    _at_least(W.score(labels, sites), 132, 0, 0, 1.0, 1.0, "all")
    _at_least(W.score(W.set_labels(labels, "wild1"), W.set_sites(sites, "wild1")), 97, 0, 0, 1.0, 1.0, "wild1")
    _at_least(W.score(W.set_labels(labels, "wild2"), W.set_sites(sites, "wild2")), 35, 0, 0, 1.0, 1.0, "wild2")
    sdpa = W.score([lb for lb in labels if lb.rule == "sdpa-attention"], [s for s in sites if s.rule == "sdpa-attention"])
    _at_least(sdpa, 104, 0, 0, 1.0, 1.0, "sdpa-attention")
    norm_rules = {"layer-norm", "rms-norm"}
    norms = W.score([lb for lb in labels if lb.rule in norm_rules], [s for s in sites if s.rule in norm_rules])
    _at_least(norms, 20, 0, 0, 1.0, 1.0, "norms")


def test_no_look_alike_is_rewritten(scanned, labels):
    """A rewrite of a true look-alike changes results: none is allowed. Nor is a rewrite of a manual
    fallback beside an existing fused path (`already-fused`): it changes no result, but no
    maintainer wants a second copy of the fused call."""
    _, scans = scanned
    sites = [s for scan in scans for s in scan.sites]
    total = W.score(labels, sites)
    hit = [(s, lb) for s, lb in total.fp if lb is not None]
    assert [(s.package, s.path, s.line, lb.reason) for s, lb in hit] == []
    assert [(s.package, s.path, s.line) for s, lb in total.fp if lb is None] == []  # every rewrite site is labelled
    # packages whose labels ask for rewrites and get some: a floor, today 11 of 16
    wanting = [scan for scan in scans if any(lb.expected == "fire" and lb.package == scan.package.name for lb in labels)]
    served = [scan.package.name for scan in wanting
              if W.score([lb for lb in labels if lb.package == scan.package.name], scan.sites).tp]
    assert len(served) >= 11, served


def test_rewrites_compile_and_a_second_scan_changes_nothing(scanned):
    rules, scans = scanned
    assert sum(len(s.rewritten) for s in scans) >= 40
    assert W.check_rewrites(scans, rules) == []
