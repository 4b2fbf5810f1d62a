"""Round trips of hand-built IR through the DSL text, and the exact text of common shapes."""

from __future__ import annotations

import pytest

from engine.dsl.ir import (
    ClassModel,
    Cond,
    Const,
    Diagnostic,
    FileModel,
    LayerDef,
    Method,
    Node,
    Param,
    Pos,
    Seq,
    Sym,
    Var,
)
from engine.dsl.lexical import quote_name, quote_string, quote_text, unquote_text
from engine.dsl.parser import (
    parse_class,
    parse_file,
    parse_layer,
    parse_method,
    parse_node,
    parse_operand,
)
from engine.dsl.printer import print_class, print_file, print_layer, print_method, print_node, print_operand

PATH = "src/modeling_bert.py"


def P(line, col, end_line, end_col, file=PATH):  # noqa: N802 - reads like a constructor
    return Pos(file, line, col, end_line, end_col)


def same(a, b) -> bool:
    """Equality that also tells 1 from 1.0 from True and 0.0 from -0.0 (== does not)."""
    return a == b and repr(a) == repr(b)


# ---------------------------------------------------------------------------------------------
# Operands

OPERANDS = [
    Var("x"), Var("x.1"), Var("hidden_states.12"), Var("ü"), Var("x y"), Var(""), Var("if"), Var("True"),
    Var("inf"), Var("nan"), Var("e"), Var("b"), Var("inf.1"), Var("seq"), Var("a`b"),
    Sym("config.hidden_size"), Sym("math.sqrt(self.head_dim)"), Sym(""), Sym("a`b"), Sym("``"),
    Sym("'\\n'"), Sym("x\ny"), Sym("\t"), Sym("\\"), Sym("\\`"), Sym("e`x`"), Sym("\ud800"), Sym("😀\x00"),
    Sym("{a: b}"), Sym("x[:, None]"),
    Const(None), Const(True), Const(False), Const(Ellipsis), Const(0), Const(-1), Const(10**40),
    Const(1e-12), Const(-0.5), Const(0.0), Const(-0.0), Const(1e16), Const(1.5e-7), Const(float("inf")),
    Const(float("-inf")), Const(2.0), Const(123456789.123456789),
    Const(""), Const("gelu"), Const("a'b\"c\\d\ne"), Const("😀ü\u2028\x7f"), Const(b"\x00ab'\""),
    Const(()), Const((1,)), Const((1, "a", None, (2.5, ()), ...)),
    Seq((), "tuple"), Seq((), "list"), Seq((Var("a"), Var("b")), "list"), Seq((Var("a"),), "tuple"),
    Seq((Const(1),), "tuple"), Seq((Const(1), Const(2)), "tuple"), Seq((Const(1), Var("n")), "tuple"),
    Seq((Seq((Var("x"),), "list"), Seq((), "tuple"), Const((1, 2))), "tuple"),
    Seq((Seq((Const(1),), "tuple"),), "list"), Seq((Sym("b"), Const(-1)), "tuple"),
]


@pytest.mark.parametrize("operand", OPERANDS, ids=repr)
def test_operand_round_trip(operand):
    text = print_operand(operand)
    assert "\n" not in text
    assert same(parse_operand(text), operand)


@pytest.mark.parametrize(("operand", "text"), [
    (Var("x.1"), "x.1"),
    (Var("if"), "%`if`"),
    (Sym("config.hidden_size"), "`config.hidden_size`"),
    (Sym("a`b"), "e`a\\`b`"),
    (Sym("x\ny"), "e`x\\ny`"),
    (Const("gelu"), '"gelu"'),
    (Const(1e-12), "1e-12"),
    (Const(-0.5), "-0.5"),
    (Const(float("-inf")), "-inf"),
    (Const(Ellipsis), "..."),
    (Const(()), "()"),
    (Const((1,)), "(1,)"),
    (Seq((), "tuple"), "%()"),
    (Seq((Const(1), Const(2)), "tuple"), "%(1, 2)"),
    (Seq((Var("a"), Const(2)), "tuple"), "(a, 2)"),
    (Seq((Var("a"),), "list"), "[a]"),
])
def test_operand_text(operand, text):
    assert print_operand(operand) == text


def test_parenthesized_constants_are_a_const_tuple():
    assert same(parse_operand("(1, (2,), 'x')"), Const((1, (2,), "x")))
    assert same(parse_operand("(x)"), Seq((Var("x"),), "tuple"))
    assert same(parse_operand("(1)"), Const((1,)))
    assert same(parse_operand("[1, 2,]"), Seq((Const(1), Const(2)), "list"))


@pytest.mark.parametrize("text", ["", "a", "a`b", "x\ny", "\\", "\\n", "\x00\x7f\u2028", "😀", "\ud800", "e`"])
def test_text_quoting(text):
    quoted = quote_text(text)
    assert unquote_text(quoted) == text
    assert quoted.isprintable()


@pytest.mark.parametrize(("name", "bare"), [
    ("torch.nn.Linear", True), (".masked_fill", True), ("self.layers[0]", True), ("self.blocks[*]", True),
    ("transformers.activations.ACT2FN[config.hidden_act]", True), ("?", True), ("x.1", True),
    ("compare:isnot", True), ("ACT2FN['gelu']", True),
    ("a b", False), ("", False), ("if", False), ("None", False), ("1x", False), ("x[a b]", False),
    ("x.", False), ("<lambda>", False),
])
def test_bare_names(name, bare):
    assert (quote_name(name) == name) is bare


def test_quote_string_is_double_quoted_python():
    import ast

    for value in ["", "'", '"', "a'\"b", "\\", "\n\r\t\x00", "😀", "\ud800"]:
        q = quote_string(value)
        assert q.startswith('"') and q.endswith('"') and "\n" not in q
        assert ast.literal_eval(q) == value


# ---------------------------------------------------------------------------------------------
# Nodes

NODES = [
    Node("layer", "torch.nn.Linear", (Var("hidden_states"),), outputs=("mixed_query_layer",),
         target="self.query", pos=P(31, 28, 31, 53)),
    Node("op", ".view", (Var("x"), Seq((Sym("b"), Const(-1), Const(Ellipsis)), "tuple")), outputs=("x.1",),
         pos=P(33, 8, 33, 30), via=(P(40, 1, 40, 9), P(50, 2, 51, 0, "other.py"))),
    Node("op", "softmax", (Var("scores.1"),), (("dim", Const(-1)),), ("probs",), pos=P(40, 8, 40, 40),
         guard=(Cond(1, "attention_mask is not None", True), Cond(2, "output_attentions", False))),
    Node("phi", "phi", (Var("x.1"), Var("x.2")), outputs=("x.3",)),
    Node("return", "return", (Var("outputs"),)),
    Node("return", "return"),
    Node("yield", "yield", (Var("x"),)),
    Node("store", "store", (Var("k"),), target="self.cache"),
    Node("op", "matmul", (Var("q"), Var("k")), outputs=("a", "b", "c")),
    Node("op", "torch.nn.functional.pad", (Var("x"), Const((0, 1))), (("value", Const(0.0)), ("mode", Const("constant")))),
    Node("layer", "transformers.activations.ACT2FN[config.hidden_act]", (Var("h"),), outputs=("h.1",), target="self.act"),
    Node("layer", "?", (Var("h"),), target="self.layers[0]"),
    Node("layer", "BertLayer", (Var("h"),), target="self.layer[*]"),
    # kinds that the short form does not imply
    Node("op", "phi", (Var("a"),)),
    Node("op", "return", (Var("a"),), target="self.x"),
    Node("layer", "torch.nn.Linear", (Var("x"),)),
    Node("phi", "merge", (Var("a"), Var("b")), outputs=("c",)),
    Node("store", "setattr", (Var("v"),), target="self.v"),
    Node("custom kind", "op with spaces", (), (("weird key", Var("x")), ("**", Var("kw")))),
    Node("op", "", outputs=("",), target="", guard=(Cond(-3, "", True), Cond(0, "a`b\nc", False))),
    Node("op", "add", (Var("a"), Sym("self.scale"), Const(None)), pos=P(0, 0, 0, 0)),
    Node("op", "add", pos=P(1, 2, 3, 4, "")),
    Node("op", "add", pos=P(1, 2, 3, 4, "a\"b\\c\nd.py")),
]


@pytest.mark.parametrize("node", NODES, ids=lambda n: print_node(n, PATH))
def test_node_round_trip(node):
    text = print_node(node, PATH)
    assert "\n" not in text
    assert same(parse_node(text, PATH), node)


def test_node_without_path_writes_the_file():
    node = Node("op", "add", (Var("a"), Var("b")), outputs=("c",), pos=P(3, 4, 3, 9))
    text = print_node(node)
    assert text == f'add(a, b) -> c @"{PATH}":3:4-9'
    assert parse_node(text) == node


@pytest.mark.parametrize(("node", "text"), [
    (NODES[0], "torch.nn.Linear<self.query>(hidden_states) -> mixed_query_layer @31:28-53"),
    (NODES[1], '.view(x, (`b`, -1, ...)) -> x.1 @33:8-30 via @40:1-9 @"other.py":50:2-51:0'),
    (NODES[2], "softmax(scores.1, dim=-1) -> probs @40:8-40 if #1 `attention_mask is not None` "
               "and not #2 `output_attentions`"),
    (NODES[3], "phi(x.1, x.2) -> x.3"),
    (NODES[4], "return(outputs)"),
    (NODES[7], "store<self.cache>(k)"),
    (NODES[8], "matmul(q, k) -> a, b, c"),
    (NODES[13], "op phi(a)"),
    (NODES[15], "layer torch.nn.Linear(x)"),
    (NODES[16], "phi merge(a, b) -> c"),
])
def test_node_text(node, text):
    assert print_node(node, PATH) == text


def test_hand_written_node_with_spacing_and_comment():
    node = parse_node("  softmax( s ,dim = -1 , )->p   @3:1-4:2   // a comment", PATH)
    assert node == Node("op", "softmax", (Var("s"),), (("dim", Const(-1)),), ("p",), pos=P(3, 1, 4, 2))


# ---------------------------------------------------------------------------------------------
# Layers, methods, classes, files

LAYERS = [
    LayerDef("self.query", "torch.nn.Linear", (Sym("config.hidden_size"), Sym("self.all_head_size")),
             pos=P(15, 8, 15, 70)),
    LayerDef("self.act", "transformers.activations.ACT2FN[config.hidden_act]", pos=P(18, 12, 18, 50),
             guard=(Cond(0, "isinstance(config.hidden_act, str)", True),)),
    LayerDef("self.act", "?", (Sym("config.hidden_act"),), guard=(Cond(0, "isinstance(config.hidden_act, str)", False),)),
    LayerDef("self.norm", "torch.nn.LayerNorm", (Sym("d"),), (("eps", Const(1e-12)), ("bias", Const(False)))),
    LayerDef("self.blocks", "torch.nn.ModuleList", pos=P(20, 8, 22, 9), items=(
        LayerDef("self.blocks[*]", "BertLayer", (Var("config"),), pos=P(20, 31, 20, 48)),
    )),
    LayerDef("self.mlp", "torch.nn.Sequential", items=(
        LayerDef("self.mlp[0]", "torch.nn.Linear", (Const(4), Const(8))),
        LayerDef("self.mlp[1]", "torch.nn.Sequential", guard=(Cond(3, "x", True),), items=(
            LayerDef("", "torch.nn.ReLU"),
            LayerDef("", "torch.nn.Dropout", (), (("p", Const(0.1)),)),
        )),
    )),
    LayerDef("weird attr", "weird type", (Seq((), "tuple"),)),
]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: print_layer(layer, PATH).splitlines()[0])
def test_layer_round_trip(layer):
    assert same(parse_layer(print_layer(layer, PATH), PATH), layer)


def test_layer_text():
    assert print_layer(LAYERS[1], PATH) == (
        "self.act = transformers.activations.ACT2FN[config.hidden_act] @18:12-50 "
        "if #0 `isinstance(config.hidden_act, str)`")
    assert print_layer(LAYERS[4], PATH) == (
        "self.blocks = torch.nn.ModuleList @20:8-22:9 [\n"
        "  self.blocks[*] = BertLayer(config) @20:31-48\n"
        "]")


METHODS = [
    Method("forward", (Param("self"), Param("hidden_states"), Param("attention_mask", Const(None)),
                       Param("args", kind="vararg"), Param("output_attentions", Const(False), "kwonly"),
                       Param("kwargs", kind="varkw")),
           tuple(NODES[:5]), pos=P(30, 4, 45, 20), notes=("path bound 64 hit", 'unknown "call"\n')),
    Method("f", (), ()),
    Method("g", (Param("a", Sym("config.x")), Param("b", kind="kwonly"), Param("c", Seq((Var("a"),), "list"), "kwonly")), ()),
    Method("h", (Param("a", kind="vararg"),), (NODES[8],)),
    Method("k", (Param("kw", kind="varkw"),), ()),
    Method("weird name", (Param("if"), Param("", kind="vararg"), Param("x y", kind="kwonly")), ()),
]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_method_round_trip(method):
    assert same(parse_method(print_method(method, PATH), PATH), method)


def test_method_text():
    assert print_method(METHODS[2], PATH) == "def g(a=`config.x`, *, b, c=[a]):"
    assert print_method(METHODS[0], PATH).splitlines()[:3] == [
        "def forward(self, hidden_states, attention_mask=None, *args, output_attentions=False, **kwargs): "
        "@30:4-45:20",
        '  note "path bound 64 hit"',
        '  note "unknown \\"call\\"\\n"',
    ]


@pytest.mark.parametrize("params", [
    (Param("a", kind="kwonly"), Param("b")),
    (Param("a", kind="vararg"), Param("b", kind="vararg")),
    (Param("a", kind="varkw"), Param("b")),
    (Param("a", kind="varkw"), Param("b", kind="varkw")),
    (Param("a", kind="positional"),),
    (Param("a", Const(1), kind="vararg"),),
])
def test_params_outside_python_order_do_not_print(params):
    with pytest.raises(ValueError):
        print_method(Method("f", params, ()))


def test_unprintable_values_are_refused():
    with pytest.raises(ValueError, match="constant of type list"):
        print_operand(Const([1]))
    with pytest.raises(ValueError, match="Seq of kind"):
        print_operand(Seq((), "set"))
    with pytest.raises(ValueError, match="non-negative"):
        print_node(Node("op", "a", pos=P(-1, 0, 0, 0)))


CLASSES = [
    ClassModel("BertSelfAttention", ("torch.nn.Module",), tuple(LAYERS), tuple(METHODS), pos=P(12, 0, 80, 0)),
    ClassModel("Empty", (), (), ()),
    ClassModel("Mixin", ("a.B", "transformers.modeling_utils.PreTrainedModel", "weird base"), (), (METHODS[1],)),
    ClassModel("OnlyLayers", (), (LAYERS[0],), ()),
]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.name)
def test_class_round_trip(cls):
    assert same(parse_class(print_class(cls, PATH), PATH), cls)


FILES = [
    FileModel(PATH, "transformers.models.bert.modeling_bert", tuple(CLASSES),
              (Diagnostic(PATH, 3, "could not resolve `x`"), Diagnostic("other.py", 0, "does not parse\n", "error"))),
    FileModel("", ""),
    FileModel("a b/c'd\".py", "weird module", (CLASSES[1],)),
    FileModel("x.py", "x", (ClassModel("A", (), (), (Method("f", (), (
        Node("op", "add", pos=Pos("x.py", 1, 2, 3, 4), via=(Pos("y.py", 5, 6, 7, 8),)),)),)),)),
]


@pytest.mark.parametrize("fm", FILES, ids=lambda f: f.path)
def test_file_round_trip(fm):
    text = print_file(fm)
    assert text.endswith("\n")
    assert print_file(parse_file(text)) == text
    assert same(parse_file(text), fm)


def test_file_text():
    fm = FileModel("m.py", "pkg.m", (ClassModel("A", ("torch.nn.Module",), (
        LayerDef("self.fc", "torch.nn.Linear", (Const(4), Const(4)), pos=Pos("m.py", 4, 8, 4, 36)),), (
        Method("forward", (Param("self"), Param("x")), (
            Node("layer", "torch.nn.Linear", (Var("x"),), outputs=("x.1",), target="self.fc",
                 pos=Pos("m.py", 7, 12, 7, 22)),
            Node("return", "return", (Var("x.1"),), pos=Pos("m.py", 8, 8, 8, 20)),
        ), pos=Pos("m.py", 6, 4, 8, 20)),), pos=Pos("m.py", 2, 0, 8, 20)),),
        (Diagnostic("m.py", 9, "path bound hit"),))
    assert print_file(fm) == (
        'file "m.py" module pkg.m\n'
        'diag warning @9 "path bound hit"\n'
        "\n"
        "class A(torch.nn.Module): @2:0-8:20\n"
        "  init:\n"
        "    self.fc = torch.nn.Linear(4, 4) @4:8-36\n"
        "  def forward(self, x): @6:4-8:20\n"
        "    torch.nn.Linear<self.fc>(x) -> x.1 @7:12-22\n"
        "    return(x.1) @8:8-20\n"
    )


def test_hand_written_file_with_comments_blank_lines_and_crlf():
    text = (
        "// structure of a tiny model\r\n"
        'file "m.py" module pkg.m   // header\r\n'
        "\r\n"
        "class A(torch.nn.Module,):\r\n"
        "  init:\r\n"
        "      self.fc = torch.nn.Linear(4, 4)\r\n"
        "  // the forward pass\r\n"
        "  def forward(self, x,):\r\n"
        "\r\n"
        "    torch.nn.Linear<self.fc>(x) -> x.1\r\n"
        "    return(x.1)"
    )
    fm = parse_file(text)
    cls = fm.cls("A")
    assert cls is not None and cls.bases == ("torch.nn.Module",)
    assert cls.layers == (LayerDef("self.fc", "torch.nn.Linear", (Const(4), Const(4))),)
    method = cls.method("forward")
    assert method is not None and [n.kind for n in method.nodes] == ["layer", "return"]


def test_structure_grammar_can_be_imported_by_another_grammar():
    """A rule grammar can %import the structure grammar's rules and terminals."""
    from pathlib import Path

    from lark import Lark

    import engine.dsl

    rules = Lark(
        'start: rule+\nrule: "rule" WORD _NL node+\n'
        "%import structure (node, WORD, _NL)\n%ignore /[ \\t]+/\n",
        parser="lalr", import_paths=[str(Path(engine.dsl.__file__).parent)], maybe_placeholders=True)
    tree = rules.parse("rule sdpa\n  matmul(q, k) -> s\n  softmax(s, dim=-1) -> p\n")
    assert len(tree.children[0].children) == 3


def test_docs_reproduce_the_grammar():
    from pathlib import Path

    from engine.dsl.parser import GRAMMAR_PATH

    doc = (Path(__file__).resolve().parents[3] / "docs" / "dsl.md").read_text(encoding="utf-8")
    grammar = GRAMMAR_PATH.read_text(encoding="utf-8")
    assert "```lark\n" + grammar + "```\n" in doc
    assert "## Rules" in doc


def test_docs_example_parses():
    """The example at the top of docs/dsl.md is valid structure syntax."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "dsl.md").read_text(encoding="utf-8")
    example = doc.split("## Example\n\n```\n", 1)[1].split("```\n", 1)[0]
    fm = parse_file(example)
    cls = fm.cls("BertSelfAttention")
    assert cls is not None and len(cls.layers) == 4 and cls.layers[3].items
    assert print_file(parse_file(print_file(fm))) == print_file(fm)


def test_keywords_may_come_before_positionals():
    node = parse_node("pad(value=0.0, x, (0, 1)) -> y")
    assert node.inputs == (Var("x"), Const((0, 1)))
    assert node.kwargs == (("value", Const(0.0)),)
    assert print_node(node) == "pad(x, (0, 1), value=0.0) -> y"
