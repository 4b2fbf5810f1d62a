"""Extraction of real classes of the paper's corpus (transformers 4.34.1): nodes and data flow."""

from __future__ import annotations

import pytest

from benchmarks.corpus import paper_file
from engine.dsl.ir import Const, Sym, Var
from engine.extract import extract_file
from tests.engine.extract.flow import guard_texts, one, ops, producer, source_of, sources


@pytest.fixture(scope="module")
def bert():
    return extract_file(paper_file("bert"))


def _inside(pos, method_pos) -> bool:
    return method_pos.line <= pos.line <= method_pos.end_line


# -- BERT self-attention ------------------------------------------------------------------------


def test_bert_self_attention_projections_are_linear_layers(bert):
    cls = bert.cls("BertSelfAttention")
    for attr in ("self.query", "self.key", "self.value"):
        (layer,) = cls.layer_defs(attr)
        assert layer.type == "torch.nn.Linear"
    forward = cls.method("forward")
    query = [n for n in forward.nodes if n.kind == "layer" and n.target == "self.query"]
    assert len(query) == 1 and query[0].op == "torch.nn.Linear"
    assert query[0].inputs == (Var("hidden_states"),)  # the parameter itself
    # key and value: one Linear call per branch (cross-attention, cache, plain)
    for target in ("self.key", "self.value"):
        calls = [n for n in forward.nodes if n.kind == "layer" and n.target == target]
        assert calls and all(n.op == "torch.nn.Linear" for n in calls)


def test_bert_transpose_for_scores_is_inlined_with_callee_positions(bert):
    cls = bert.cls("BertSelfAttention")
    helper = cls.method("transpose_for_scores").pos
    forward = cls.method("forward")
    query_linear = next(n for n in forward.nodes if n.target == "self.query")
    # query_layer = self.transpose_for_scores(mixed_query_layer): view + permute from the helper
    permutes = [n for n in forward.nodes if n.op == ".permute" and n.via]
    assert len(permutes) >= 4  # query, and key/value on each branch
    query_permute = next(n for n in permutes if source_of(forward, n.inputs[0]).inputs[0] == query_linear.outputs
                         or producer(forward, n.inputs[0]).inputs[0] == Var(query_linear.outputs[0]))
    assert _inside(query_permute.pos, helper), "inlined nodes keep the callee's positions"
    assert not _inside(query_permute.via[0], helper)
    assert _inside(query_permute.via[0], forward.pos), "via names the call site in forward"
    view = producer(forward, query_permute.inputs[0])
    assert view.op == ".view" and view.inputs[0] == Var(query_linear.outputs[0])
    assert view.via == query_permute.via


def test_bert_attention_scores_chain(bert):
    forward = bert.cls("BertSelfAttention").method("forward")
    # matmul(query, key^T) with the canonical transpose(dim0=-2, dim1=-1)
    scores = next(n for n in ops(forward, "matmul") if producer(forward, n.inputs[1]).op == "transpose")
    assert scores.target == "torch.matmul"
    transpose = producer(forward, scores.inputs[1])
    assert transpose.kwarg("dim0") == Const(-2) and transpose.kwarg("dim1") == Const(-1)
    assert transpose.target == ".transpose"  # written key_layer.transpose(-1, -2)
    query = producer(forward, scores.inputs[0])
    assert query.op == ".permute" and query.via  # from the inlined helper
    key = producer(forward, transpose.inputs[0])
    assert key.kind == "phi"  # the key comes from one of the cache / cross-attention branches
    # the scale: attention_scores / math.sqrt(self.attention_head_size), one `scale` node
    scale = one(forward, "scale")
    assert isinstance(scale.inputs[1], Sym) and "math.sqrt(self.attention_head_size)" in scale.inputs[1].text
    reaching = sources(forward, scale.inputs[0])  # through the relative-position phis
    assert scores in reaching and {n.op for n in reaching} == {"matmul", "add"}
    # the mask add sits under its guard
    mask_add = next(n for n in ops(forward, "add") if n.inputs[0] == Var(scale.outputs[0]))
    assert guard_texts(mask_add) == [("attention_mask is not None", True)]
    # softmax over the last dim reads the merge of "mask added" and "no mask"
    softmax = one(forward, "softmax")
    assert softmax.kwargs == (("dim", Const(-1)),)
    merged = producer(forward, softmax.inputs[0])
    assert merged.kind == "phi" and set(merged.inputs) == {Var(mask_add.outputs[0]), Var(scale.outputs[0])}
    # dropout is the nn.Dropout layer built in __init__
    dropout = one(forward, "torch.nn.Dropout", kind="layer")
    assert dropout.target == "self.dropout" and dropout.inputs == (Var(softmax.outputs[0]),)
    # context = matmul(probs, value)
    # (the relative-position einsums are matmuls too, lowered from their equations)
    context = next(n for n in ops(forward, "matmul") if n is not scores and n.target == "torch.matmul")
    probs = producer(forward, context.inputs[0])
    assert probs.kind == "phi" and Var(dropout.outputs[0]) in probs.inputs  # head_mask may multiply
    assert producer(forward, context.inputs[1]).kind == "phi"  # value from the branches


def test_bert_self_output_linear_dropout_residual_layernorm(bert):
    cls = bert.cls("BertSelfOutput")
    types = {layer.attr: layer.type for layer in cls.layers}
    assert types == {"self.dense": "torch.nn.Linear", "self.LayerNorm": "torch.nn.LayerNorm",
                     "self.dropout": "torch.nn.Dropout"}
    forward = cls.method("forward")
    assert [p.name for p in forward.params] == ["hidden_states", "input_tensor"]
    ret = one(forward, "return")
    norm = producer(forward, ret.inputs[0])
    assert (norm.kind, norm.op, norm.target) == ("layer", "torch.nn.LayerNorm", "self.LayerNorm")
    residual = producer(forward, norm.inputs[0])  # self.LayerNorm(hidden_states + input_tensor), unchained
    assert residual.op == "add" and residual.inputs[1] == Var("input_tensor")
    dropout = producer(forward, residual.inputs[0])
    assert (dropout.op, dropout.target) == ("torch.nn.Dropout", "self.dropout")
    dense = producer(forward, dropout.inputs[0])
    assert (dense.op, dense.target, dense.inputs) == ("torch.nn.Linear", "self.dense", (Var("hidden_states"),))
    assert [n.kind for n in forward.nodes] == ["layer", "layer", "op", "layer", "return"]
    assert all(not n.guard and not n.via for n in forward.nodes)


# -- ResNet, T5, GPT-2, DPT ---------------------------------------------------------------------------


def test_resnet_conv_feeds_batch_norm():
    fm = extract_file(paper_file("resnet"))
    cls = fm.cls("ResNetConvLayer")
    assert {layer.attr: layer.type for layer in cls.layers if layer.type.startswith("torch.")} == {
        "self.convolution": "torch.nn.Conv2d", "self.normalization": "torch.nn.BatchNorm2d"}
    forward = cls.method("forward")
    bn = one(forward, "torch.nn.BatchNorm2d", kind="layer")
    conv = producer(forward, bn.inputs[0])
    assert (conv.kind, conv.op, conv.target) == ("layer", "torch.nn.Conv2d", "self.convolution")
    assert conv.inputs == (Var("input"),)
    # the same pattern across the whole file: every BatchNorm2d call in ResNet reads a Conv2d
    pairs = 0
    for c in fm.classes:
        for m in c.methods:
            for n in m.nodes:
                if n.op == "torch.nn.BatchNorm2d" and n.kind == "layer":
                    assert producer(m, n.inputs[0]).op == "torch.nn.Conv2d", (c.name, m.name)
                    pairs += 1
    assert pairs >= 1


def test_t5_attention_softmax_over_float_scores():
    fm = extract_file(paper_file("t5"))
    cls = fm.cls("T5Attention")
    assert {a: cls.layer_defs(a)[0].type for a in ("self.q", "self.k", "self.v", "self.o")} == dict.fromkeys(
        ("self.q", "self.k", "self.v", "self.o"), "torch.nn.Linear")
    forward = cls.method("forward")
    softmax = one(forward, "softmax")
    assert softmax.target == "torch.nn.functional.softmax" and softmax.kwarg("dim") == Const(-1)
    upcast = producer(forward, softmax.inputs[0])  # nn.functional.softmax(scores.float(), dim=-1)
    assert upcast.op == ".float"
    type_as = next(n for n in forward.nodes if n.op == ".type_as" and n.inputs[0] == Var(softmax.outputs[0]))
    assert type_as.inputs[1] == upcast.inputs[0]  # cast back to the scores' dtype
    dropout = one(forward, "dropout")  # nn.functional.dropout(attn_weights, p=self.dropout, training=...)
    assert dropout.target == "torch.nn.functional.dropout"
    assert dropout.inputs == (Var(type_as.outputs[0]),) and dropout.kwarg("p") == Sym("self.dropout")
    scores = producer(forward, upcast.inputs[0])
    assert scores.op == "add"  # `scores += position_bias_masked`: no scale in T5
    assert all(n.via for n in ops(forward, "scale"))  # only inside the inlined bucket helper
    matmul = [n for n in sources(forward, scores.inputs[0]) if n.op == "matmul"]
    assert len(matmul) == 1 and producer(forward, matmul[0].inputs[1]).op == "transpose"
    # the nested `def shape`/`def unshape` are reported, not silently skipped
    assert any("nested definition 'shape'" in note for note in forward.notes)


def test_gpt2_attention_inlines_attn_and_resolves_conv1d():
    fm = extract_file(paper_file("gpt2"))
    cls = fm.cls("GPT2Attention")
    # `from ...pytorch_utils import Conv1D` in transformers.models.gpt2.modeling_gpt2
    c_attn = cls.layer_defs("self.c_attn")
    assert [d.type for d in c_attn] == ["transformers.pytorch_utils.Conv1D"] * 2
    assert [guard_texts(d) for d in c_attn] == [[("self.is_cross_attention", True)],
                                               [("self.is_cross_attention", False)]]
    forward = cls.method("forward")
    attn = cls.method("_attn").pos
    split = next(n for n in forward.nodes if n.op == ".split" and len(n.outputs) == 3)
    assert producer(forward, split.inputs[0]).target == "self.c_attn"
    # self._attn(query, key, value, ...) inlined: its softmax carries the callee's position
    softmaxes = ops(forward, "softmax")
    plain = [n for n in softmaxes if _inside(n.pos, attn)]
    assert len(plain) == 1 and plain[0].via and _inside(plain[0].via[0], forward.pos)
    assert guard_texts(plain[0]) == [("self.reorder_and_upcast_attn", False)]
    # inside _attn: matmul(query, key.transpose(-1, -2)) where query comes from the split
    scores = next(n for n in ops(forward, "matmul") if _inside(n.pos, attn) and n.inputs[0] != n.inputs[1]
                  and producer(forward, n.inputs[1]).op == "transpose")
    query = producer(forward, scores.inputs[0])
    assert query.op == ".permute" and query.via  # _split_heads, inlined too
    dropout = next(n for n in forward.nodes if n.target == "self.attn_dropout" and _inside(n.pos, attn))
    assert dropout.op == "torch.nn.Dropout"


def test_dpt_batch_norm_branch_merges_with_conv_output():
    fm = extract_file(paper_file("dpt"))
    cls = fm.cls("DPTPreActResidualLayer")
    bn_defs = cls.layer_defs("self.batch_norm1")
    assert [d.type for d in bn_defs] == ["torch.nn.BatchNorm2d"]
    assert guard_texts(bn_defs[0]) == [("self.use_batch_norm", True)]  # built only when configured
    forward = cls.method("forward")
    for conv_attr, bn_attr in (("self.convolution1", "self.batch_norm1"), ("self.convolution2", "self.batch_norm2")):
        conv = next(n for n in forward.nodes if n.target == conv_attr)
        bn = next(n for n in forward.nodes if n.target == bn_attr)
        assert conv.op == "torch.nn.Conv2d" and not conv.guard
        assert bn.inputs == (Var(conv.outputs[0]),)
        assert guard_texts(bn) == [("self.use_batch_norm", True)]
        # after the `if`, the value is a phi of the BN output (branch taken) and the conv output
        merge = next(n for n in forward.nodes if n.kind == "phi" and Var(bn.outputs[0]) in n.inputs)
        assert merge.inputs == (Var(bn.outputs[0]), Var(conv.outputs[0]))
        assert merge.kwarg("if") == Const(bn.guard[0].id)
        reader = next(n for n in forward.nodes if Var(merge.outputs[0]) in n.inputs)
        assert reader.kind == "layer" and reader.op.startswith("transformers.activations.ACT2FN") \
            or reader.op == "add"


def test_dpt_paths_see_conv_then_bn_on_one_branch_only():
    from engine.dsl.ir import paths

    forward = extract_file(paper_file("dpt")).cls("DPTPreActResidualLayer").method("forward")
    found, truncated = paths(forward)
    assert not truncated and len(found) == 4  # two independent `if self.use_batch_norm:` tests
    for path in found:
        kinds = [n.op for n in path if n.kind == "layer"]
        assert all(n.kind != "phi" for n in path)
        conv1 = next(n for n in path if n.target == "self.convolution1")
        after = next(n for n in path if n.inputs and n.inputs[0] == Var(conv1.outputs[0]))
        assert after.op in ("torch.nn.BatchNorm2d", 'transformers.activations.ACT2FN["relu"]'), kinds
    with_bn = [p for p in found if any(n.target == "self.batch_norm1" for n in p)]
    assert len(with_bn) == 2
