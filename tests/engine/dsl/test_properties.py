"""Property: for any IR value the printer accepts, parse(print(x)) == x (and prints the same)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
from engine.dsl.parser import parse_file, parse_node, parse_operand
from engine.dsl.printer import print_file, print_node, print_operand

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Texts that stress the quoting: anything at all, plus shapes close to the syntax's own tokens.
tricky = st.sampled_from([
    "", " ", "`", "``", "e`", "\\", "\\`", "\n", "\r\n", "\t", "#0", "@1:2-3", "->", "//", "if", "not",
    "and", "via", "None", "True", "inf", "nan", "-inf", "...", "%", "<", ">", "=", ",", "(", ")", "[", "]",
    "x.1", "self.layers[0]", ".view", "?", "compare:is", "\u2028", "\x00", "😀", "ü",
])
any_text = st.one_of(st.text(max_size=12), tricky)
word = st.from_regex(r"\.?(?:[a-zA-Z_]\w{0,6}|\?)(?:[.:][a-zA-Z_]\w{0,4}|\.\d{1,2}|\[[^\[\]\s`]{0,4}\]){0,3}",
                     fullmatch=True)
name = st.one_of(word, any_text)
ssa = st.from_regex(r"[a-z_]\w{0,6}(?:\.\d{1,2})?", fullmatch=True)
ints = st.integers(min_value=0, max_value=10**6)
path_file = "src/m.py"

scalars = st.one_of(
    st.none(), st.booleans(), st.just(Ellipsis), st.integers(), st.floats(allow_nan=False),
    any_text, st.binary(max_size=6),
)
const_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=6)

leaves = st.one_of(
    st.builds(Var, st.one_of(ssa, name)),
    st.builds(Sym, any_text),
    st.builds(Const, const_values),
)
operands = st.recursive(
    leaves,
    lambda inner: st.builds(Seq, st.lists(inner, max_size=3).map(tuple), st.sampled_from(["tuple", "list"])),
    max_leaves=8,
)
positions = st.builds(Pos, st.sampled_from([path_file, "other.py", "", 'we"ird\n']), ints, ints, ints, ints)
conds = st.builds(Cond, st.integers(min_value=-5, max_value=50), any_text, st.booleans())
guards = st.lists(conds, max_size=3).map(tuple)
kwargs = st.lists(st.tuples(name, operands), max_size=2).map(tuple)

nodes = st.builds(
    Node,
    kind=st.one_of(st.sampled_from(["layer", "op", "phi", "return", "store", "yield"]), name),
    op=st.one_of(st.sampled_from(["phi", "return", "store", "yield", "matmul", ".masked_fill", "getitem"]), name),
    inputs=st.lists(operands, max_size=3).map(tuple),
    kwargs=kwargs,
    outputs=st.lists(st.one_of(ssa, name), max_size=3).map(tuple),
    target=st.one_of(st.none(), name),
    guard=guards,
    pos=st.one_of(st.none(), positions),
    via=st.lists(positions, max_size=2).map(tuple),
)

layer_defs = st.recursive(
    st.builds(LayerDef, name, name, st.lists(operands, max_size=2).map(tuple), kwargs,
              st.just(()), guards, st.one_of(st.none(), positions)),
    lambda inner: st.builds(LayerDef, name, name, st.lists(operands, max_size=2).map(tuple), kwargs,
                            st.lists(inner, max_size=3).map(tuple), guards, st.one_of(st.none(), positions)),
    max_leaves=5,
)


@st.composite
def param_lists(draw):
    """Parameters in Python signature order: normal* [*vararg] kwonly* [**varkw]."""
    def some(kind, with_default, lo=0, hi=3):
        return [Param(draw(name), draw(st.one_of(st.none(), operands)) if with_default else None, kind)
                for _ in range(draw(st.integers(lo, hi)))]
    params = some("normal", True)
    params += some("vararg", False, 0, 1)
    params += some("kwonly", True)
    params += some("varkw", False, 0, 1)
    return tuple(params)


methods = st.builds(Method, name, param_lists(), st.lists(nodes, max_size=4).map(tuple),
                    st.one_of(st.none(), positions), st.lists(any_text, max_size=2).map(tuple))
classes = st.builds(ClassModel, name, st.lists(name, max_size=2).map(tuple),
                    st.lists(layer_defs, max_size=3).map(tuple), st.lists(methods, max_size=2).map(tuple),
                    st.one_of(st.none(), positions))
diagnostics = st.builds(Diagnostic, st.sampled_from([path_file, "x.py"]), ints, any_text,
                        st.one_of(st.sampled_from(["warning", "error"]), name))
files = st.builds(FileModel, st.just(path_file), name, st.lists(classes, max_size=3).map(tuple),
                  st.lists(diagnostics, max_size=2).map(tuple))


def same(a, b) -> bool:
    return a == b and repr(a) == repr(b)


@SETTINGS
@given(operands)
def test_operand_round_trip(operand):
    assert same(parse_operand(print_operand(operand)), operand)


@SETTINGS
@given(nodes)
def test_node_round_trip(node):
    text = print_node(node, path_file)
    assert "\n" not in text and "\r" not in text
    assert same(parse_node(text, path_file), node)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(files)
def test_file_round_trip(fm):
    text = print_file(fm)
    back = parse_file(text)
    assert same(back, fm)
    assert print_file(back) == text
