"""Extraction of small hand-written sources: import resolution, canonical forms, layer tables,
diagnostics and the path bound."""

from __future__ import annotations

import textwrap

import pytest

from engine.dsl import canonical as C
from engine.dsl.ir import Const, Seq, Sym, Var, paths
from engine.extract import extract_path, extract_source
from tests.engine.extract.flow import one, ops, producer


def _method(source: str, cls: str = "M", method: str = "forward", module: str = "pkg.mod"):
    fm = extract_source(textwrap.dedent(source), "mod.py", module)
    assert not [d for d in fm.diagnostics if d.severity == "error"], fm.diagnostics
    model = fm.cls(cls)
    assert model is not None, [c.name for c in fm.classes]
    return model, model.method(method)


# -- import and alias resolution -------------------------------------------------------------------

_LINEAR_FORWARD = """
    class M({base}):
        def __init__(self):
            super().__init__()
            self.proj = {linear}(4, 4)

        def forward(self, x):
            return self.proj(x)
"""


@pytest.mark.parametrize("imports, base, linear", [
    ("import torch.nn as nn", "nn.Module", "nn.Linear"),
    ("from torch import nn", "nn.Module", "nn.Linear"),
    ("import torch", "torch.nn.Module", "torch.nn.Linear"),
    ("from torch.nn import Linear, Module", "Module", "Linear"),
    ("from torch.nn import Linear as Dense\nfrom torch import nn", "nn.Module", "Dense"),
])
def test_layer_types_resolve_under_every_import_spelling(imports, base, linear):
    model, forward = _method(imports + "\n" + textwrap.dedent(_LINEAR_FORWARD.format(base=base, linear=linear)))
    assert model.bases == ("torch.nn.Module",)
    assert [(d.attr, d.type) for d in model.layers] == [("self.proj", "torch.nn.Linear")]
    call = one(forward, "torch.nn.Linear", kind="layer")
    assert call.target == "self.proj" and call.inputs == (Var("x"),)


@pytest.mark.parametrize("imports, call", [
    ("import torch.nn.functional as F", "F.gelu(x)"),
    ("from torch.nn import functional as F", "F.gelu(x)"),
    ("import torch.nn as nn", "nn.functional.gelu(x)"),
    ("from torch import nn", "nn.functional.gelu(x)"),
    ("import torch", "torch.nn.functional.gelu(x)"),
    ("from torch.nn.functional import gelu", "gelu(x)"),
    ("from torch.nn.functional import gelu as act", "act(x)"),
])
def test_functional_under_every_alias(imports, call):
    _, forward = _method(f"""
        {imports}
        import torch

        class M(torch.nn.Module):
            def forward(self, x):
                return {call}
    """)
    node = one(forward, "gelu")
    assert node.target == "torch.nn.functional.gelu" and node.inputs == (Var("x"),)


def test_relative_imports_inside_a_package():
    source = """
        from torch import nn
        from ...activations import ACT2FN
        from ...pytorch_utils import Conv1D
        from .configuration_x import XConfig
        from ..other.modeling_other import OtherLayer

        class M(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.act = ACT2FN[config.hidden_act]
                self.c_attn = Conv1D(8, 4)
                self.other = OtherLayer(config)

            def forward(self, x):
                return self.act(self.c_attn(x))
    """
    model, forward = _method(source, module="transformers.models.x.modeling_x")
    types = {d.attr: d.type for d in model.layers}
    assert types == {
        "self.act": "transformers.activations.ACT2FN[config.hidden_act]",
        "self.c_attn": "transformers.pytorch_utils.Conv1D",
        "self.other": "transformers.models.other.modeling_other.OtherLayer",
    }
    act = producer(forward, one(forward, "return").inputs[0])
    assert act.kind == "layer" and act.target == "self.act"
    assert producer(forward, act.inputs[0]).op == "transformers.pytorch_utils.Conv1D"


def test_relative_imports_in_a_package_folder(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .layers import Block\n")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "layers.py").write_text("ACT2FN = {}\n")
    (pkg / "models" / "net.py").write_text(textwrap.dedent("""
        from torch import nn
        from ..layers import ACT2FN, Block

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.block = Block()
                self.act = ACT2FN["gelu"]

            def forward(self, x):
                return self.act(self.block(x))
    """))
    files = {fm.path: fm for fm in extract_path(tmp_path)}
    net = files["pkg/models/net.py"]
    assert net.module == "pkg.models.net"
    assert {d.attr: d.type for d in net.cls("Net").layers} == {
        "self.block": "pkg.layers.Block", "self.act": 'pkg.layers.ACT2FN["gelu"]'}


# -- canonical forms ----------------------------------------------------------------------------------

_CANONICAL = """
    import math
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.softmax = nn.Softmax(dim=-1)
            self.drop = nn.Dropout(0.1)
            self.scale = 0.125
            self.head_dim = 64

        def forward(self, a, b):
            m1 = a @ b
            m2 = torch.matmul(a, b)
            m3 = torch.bmm(a, b)
            m4 = a.matmul(b)
            s1 = F.softmax(m1, dim=-1)
            s2 = torch.softmax(m2, -1)
            s3 = m3.softmax(-1)
            s4 = self.softmax(m4)
            t1 = s1.transpose(-1, -2)
            t2 = s2.transpose(-2, -1)
            t3 = torch.transpose(s3, -1, -2)
            c1 = t1 / math.sqrt(self.head_dim)
            c2 = t2 * self.head_dim ** -0.5
            c3 = t3 * self.scale
            d1 = F.dropout(c1, p=0.1, training=self.training)
            d2 = self.drop(c2)
            return d1, d2, c3
"""


def test_matmul_spellings_are_one_op():
    _, forward = _method(_CANONICAL)
    matmuls = ops(forward, "matmul")
    assert [n.outputs[0] for n in matmuls] == ["m1", "m2", "m3", "m4"]
    assert all(n.inputs == (Var("a"), Var("b")) and not n.kwargs for n in matmuls)
    assert [n.target for n in matmuls] == [None, "torch.matmul", "torch.bmm", ".matmul"]


def test_softmax_spellings_are_one_op_and_the_layer_maps_to_it():
    model, forward = _method(_CANONICAL)
    softmaxes = ops(forward, "softmax")
    assert [(n.outputs[0], n.kwargs) for n in softmaxes] == [(f"s{i}", (("dim", Const(-1)),)) for i in (1, 2, 3)]
    assert [producer(forward, n.inputs[0]).outputs[0] for n in softmaxes] == ["m1", "m2", "m3"]
    layer = one(forward, "torch.nn.Softmax", kind="layer")
    assert layer.outputs == ("s4",) and layer.target == "self.softmax"
    assert C.LAYER_OPS[layer.op][0] == "softmax"
    (built,) = model.layer_defs("self.softmax")
    assert built.kwarg("dim") == Const(-1)


def test_transpose_dims_in_either_order_are_one_form():
    _, forward = _method(_CANONICAL)
    transposes = ops(forward, "transpose")
    assert len(transposes) == 3
    assert {n.kwargs for n in transposes} == {(("dim0", Const(-2)), ("dim1", Const(-1)))}
    assert [n.target for n in transposes] == [".transpose", ".transpose", "torch.transpose"]


def test_scale_spellings_bind_one_scale_node():
    _, forward = _method(_CANONICAL)
    scales = ops(forward, "scale")
    assert [n.outputs[0] for n in scales] == ["c1", "c2", "c3"]
    assert [n.inputs[0] for n in scales] == [Var("t1"), Var("t2"), Var("t3")]
    factors = [n.inputs[1] for n in scales]
    assert all(isinstance(f, Sym) for f in factors)
    assert "math.sqrt(self.head_dim)" in factors[0].text and factors[0].text != "math.sqrt(self.head_dim)"
    assert factors[1] == Sym("self.head_dim ** -0.5")
    assert factors[2] == Sym("self.scale")
    assert not ops(forward, "div") and not ops(forward, "mul")


def test_dropout_function_and_layer():
    _, forward = _method(_CANONICAL)
    fn = one(forward, "dropout")
    assert fn.target == "torch.nn.functional.dropout" and fn.inputs == (Var("c1"),)
    assert fn.kwarg("p") == Const(0.1) and fn.kwarg("training") == Sym("self.training")
    layer = one(forward, "torch.nn.Dropout", kind="layer")
    assert layer.inputs == (Var("c2"),) and C.LAYER_OPS[layer.op][0] == "dropout"


def test_tensor_divided_by_tensor_is_not_a_scale():
    _, forward = _method("""
        import torch
        class M(torch.nn.Module):
            def forward(self, x, y):
                return x / y
    """)
    assert ops(forward, "div") and not ops(forward, "scale")


# -- layer tables ---------------------------------------------------------------------------------------


def test_sequential_and_module_list_tables():
    model, forward = _method("""
        from torch import nn

        class Block(nn.Module):
            def forward(self, x):
                return x

        class M(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
                self.heads = nn.ModuleList([nn.Linear(4, 2), nn.Linear(4, 3)])
                self.blocks = nn.ModuleList([Block() for _ in range(n)])

            def forward(self, x):
                h = self.mlp(x)
                for block in self.blocks:
                    h = block(h)
                return self.heads[1](h)
    """)
    mlp, heads, blocks = (model.layer_defs(a)[0] for a in ("self.mlp", "self.heads", "self.blocks"))
    assert mlp.type == "torch.nn.Sequential"
    assert [(i.attr, i.type) for i in mlp.items] == [("self.mlp[0]", "torch.nn.Linear"), ("self.mlp[1]", "torch.nn.GELU"),
                                                     ("self.mlp[2]", "torch.nn.Linear")]
    assert [i.type for i in heads.items] == ["torch.nn.Linear", "torch.nn.Linear"]
    assert heads.items[1].args == (Const(4), Const(3))
    assert [(i.attr, i.type) for i in blocks.items] == [("self.blocks[*]", "pkg.mod.Block")]
    # calling the Sequential runs its items in order, chained by data flow
    layers = [n for n in forward.nodes if n.kind == "layer"]
    assert [(n.target, n.op) for n in layers] == [
        ("self.mlp[0]", "torch.nn.Linear"), ("self.mlp[1]", "torch.nn.GELU"), ("self.mlp[2]", "torch.nn.Linear"),
        ("self.blocks[*]", "pkg.mod.Block"), ("self.heads[1]", "torch.nn.Linear")]
    for earlier, later in zip(layers[:2], layers[1:3], strict=True):
        assert later.inputs == (Var(earlier.outputs[0]),)
    assert layers[0].inputs == (Var("x"),)
    assert layers[3].guard and layers[3].guard[0].text == "for block in self.blocks"


def test_attribute_assigned_from_attribute_and_config_choice():
    model, forward = _method("""
        from torch import nn
        from transformers.activations import ACT2FN

        class M(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dense = nn.Linear(4, 4)
                self.proj = self.dense
                if config.use_norm:
                    self.norm = nn.LayerNorm(4)
                else:
                    self.norm = nn.Identity()
                self.act = ACT2FN[config.hidden_act]
                layer = nn.Linear(4, 2)
                self.out = layer

            def forward(self, x):
                return self.out(self.act(self.norm(self.proj(x))))
    """)
    assert model.layer_defs("self.proj")[0].type == "torch.nn.Linear"
    assert model.layer_defs("self.proj")[0].args == (Const(4), Const(4))
    norms = model.layer_defs("self.norm")
    assert [(d.type, d.guard[0].text, d.guard[0].taken) for d in norms] == [
        ("torch.nn.LayerNorm", "config.use_norm", True), ("torch.nn.Identity", "config.use_norm", False)]
    assert model.layer_defs("self.act")[0].type == "transformers.activations.ACT2FN[config.hidden_act]"
    assert model.layer_defs("self.out")[0].type == "torch.nn.Linear"
    assert [n.op for n in forward.nodes if n.kind == "layer"] == [
        "torch.nn.Linear", "torch.nn.LayerNorm", "transformers.activations.ACT2FN[config.hidden_act]", "torch.nn.Linear"]


def test_unchained_nested_calls_and_reassignment():
    _, forward = _method("""
        from torch import nn
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.LayerNorm = nn.LayerNorm(4)
                self.dropout = nn.Dropout(0.1)
            def forward(self, h, x):
                h = self.LayerNorm(self.dropout(h) + x)
                h = h * 2
                return h
    """)
    drop, add, norm, mul, ret = forward.nodes
    assert (drop.op, add.op, norm.op, ret.op) == ("torch.nn.Dropout", "add", "torch.nn.LayerNorm", "return")
    assert add.inputs == (Var(drop.outputs[0]), Var("x")) and norm.inputs == (Var(add.outputs[0]),)
    assert norm.outputs == ("h.1",) and drop.inputs == (Var("h"),)
    assert mul.op == "scale" and mul.inputs == (Var("h.1"), Const(2)) and mul.outputs == ("h.2",)
    assert ret.inputs == (Var("h.2"),)


def test_tuple_and_list_operands():
    _, forward = _method("""
        import torch
        class M(torch.nn.Module):
            def forward(self, a, b):
                return torch.cat([a, b], dim=-1)
    """)
    cat = one(forward, "torch.cat")
    assert cat.inputs == (Seq((Var("a"), Var("b")), "list"),) and cat.kwarg("dim") == Const(-1)


# -- diagnostics, notes, the path bound -------------------------------------------------------------


def test_file_that_does_not_parse_gives_an_error_and_the_folder_goes_on(tmp_path):
    (tmp_path / "a_broken.py").write_text("class M(:\n    pass\n")
    (tmp_path / "b_good.py").write_text(textwrap.dedent("""
        from torch import nn
        class Good(nn.Module):
            def forward(self, x):
                return x
    """))
    (tmp_path / "c_binary.py").write_bytes(b"\xff\xfe\x00bad")
    models = {fm.path: fm for fm in extract_path(tmp_path)}
    broken = models["a_broken.py"]
    assert broken.classes == ()
    (diag,) = broken.diagnostics
    assert diag.severity == "error" and diag.line == 1 and "does not parse" in diag.message
    assert models["c_binary.py"].diagnostics[0].severity == "error"
    good = models["b_good.py"]
    assert good.cls("Good") is not None and not good.diagnostics


@pytest.mark.parametrize("depth", [400, 2500])
@pytest.mark.parametrize("shape", ["a + b", "a if c else b", "f(b)", "a[b]"])
def test_deeply_nested_expressions_extract_or_stop_with_a_note(shape, depth):
    # the interpreted extractor stops at the recursion limit with a note, the compiled one goes
    # deeper; neither raises, and the class around the expression is still there
    expr = "x"
    for _ in range(depth):
        expr = shape.replace("b", expr, 1) if shape != "f(b)" else f"(x.f({expr}))"
    text = f"from torch import nn\nclass M(nn.Module):\n    def forward(self, x, a, c):\n        return {expr}\n"
    fm = extract_source(text, "deep.py", "deep")
    if fm.diagnostics:  # the parser's own limit (nesting of brackets) comes first for some shapes
        assert fm.classes == () and "does not parse" in fm.diagnostics[0].message
        return
    (forward,) = fm.cls("M").methods
    assert len(forward.nodes) > depth or forward.notes == ("expression nesting too deep; extraction stopped",)


def test_parser_stack_overflow_is_a_parse_error():
    text = "f = " + "lambda: " * 3000 + "0\n"
    fm = extract_source(text, "lambdas.py", "lambdas")
    (diag,) = fm.diagnostics
    assert diag.severity == "error" and diag.message.startswith("does not parse:")


def test_constructs_not_understood_give_notes_and_extraction_goes_on():
    _, forward = _method("""
        from torch import nn
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)
            def forward(self, x, mode):
                def helper(y):
                    return y
                match mode:
                    case "a":
                        x = helper(x)
                return self.lin(x)
    """)
    assert any("nested definition 'helper' not followed" in note for note in forward.notes)
    assert any("match statement not followed" in note for note in forward.notes)
    lin = one(forward, "torch.nn.Linear", kind="layer")
    assert lin.inputs == (Var("x"),)  # the statements after them are still extracted


def test_path_bound_reports_truncation():
    body = "\n".join(f"        if flag{i}:\n            x = x + {i}" for i in range(4))
    params = ", ".join(f"flag{i}" for i in range(4))
    _, forward = _method(f"""
import torch
class M(torch.nn.Module):
    def forward(self, x, {params}):
{body}
        return x
""")
    every, truncated = paths(forward)
    assert len(every) == 16 and not truncated
    few, truncated = paths(forward, bound=5)
    assert truncated and len(few) == 5
    # on each path every phi is resolved: the return reads the last add taken on that path
    for path in every:
        ret = path[-1]
        assert ret.op == "return" and all(n.kind != "phi" for n in path)
        adds = [n for n in path if n.op == "add"]
        assert ret.inputs == ((Var(adds[-1].outputs[0]),) if adds else (Var("x"),))


def test_mask_add_guard_and_merge():
    _, forward = _method("""
        import torch
        class M(torch.nn.Module):
            def forward(self, scores, attention_mask=None):
                if attention_mask is not None:
                    scores = scores + attention_mask
                return scores.softmax(dim=-1)
    """)
    add = one(forward, "add")
    assert [(c.text, c.taken) for c in add.guard] == [("attention_mask is not None", True)]
    softmax = one(forward, "softmax")
    phi = producer(forward, softmax.inputs[0])
    assert phi.kind == "phi" and phi.inputs == (Var(add.outputs[0]), Var("scores"))
    test = producer(forward, phi.kwarg("test"))
    assert test.op == "compare:isnot" and test.inputs == (Var("attention_mask"), Const(None))


def test_extract_many_in_processes_equals_one_by_one(tmp_path):
    from engine.extract import extract_file, extract_many

    for i in range(3):
        (tmp_path / f"m{i}.py").write_text(f"from torch import nn\nclass M{i}(nn.Module):\n"
                                           f"    def forward(self, x):\n        return x * {i}\n")
    files = sorted(tmp_path.glob("*.py"))
    assert extract_many(files, jobs=2) == [extract_file(p) for p in files]
