"""engine.analysis.numbers: what every call of a private helper passes, read from the source, or
nothing where some use of the helper is not such a call."""

from __future__ import annotations

import ast

import pytest

from engine.analysis.numbers import ast_number, attribute_int_values, call_site_values, call_sites

SOURCE = '''
def _helper(q, scale=None):
    return q * scale

def caller(q):
    return _helper(q) + _helper(q, 0.5) + _helper(q, scale=2 ** -0.5)

class A:
    def _m(self, q, scale=1.0):
        return q * scale

    def forward(self, q):
        return self._m(q) + self._m(q, scale=3)
'''


def _values(source: str, cls: str, name: str, param: str):
    values = call_site_values(ast.parse(source), cls, name, param)
    return None if values is None else [ast.unparse(v) for v in values]


def test_every_call_binds_the_parameter():
    assert sorted(_values(SOURCE, "__module__", "_helper", "scale")) == ["0.5", "2 ** (-0.5)", "None"]
    assert sorted(_values(SOURCE, "A", "_m", "scale")) == ["1.0", "3"]


@pytest.mark.parametrize(("edit", "cls", "name"), [
    (("def _helper(", "def helper("), "__module__", "helper"),  # public: callers elsewhere
    (("return _helper(q) +", "f = _helper\n    return f(q) +"), "__module__", "_helper"),  # a value
    (("_helper(q, 0.5)", "_helper(*[q, 0.5])"), "__module__", "_helper"),  # unpacked arguments
    (("    def _m(", "    @staticmethod\n    def _m("), "A", "_m"),  # decorated
    (("class A:", "class B:\n    def g(self, q):\n        return self._m(q, q)\n\nclass A:"), "A", "_m"),  # B's own _m
])
def test_a_use_that_is_not_a_plain_call_proves_nothing(edit, cls, name):
    assert _values(SOURCE.replace(*edit), cls, name, "scale") is None


CALLERS = '''
def _h(x, s=None):
    return x

class A:
    def forward(self, x):
        def inner(self):
            return _h(x, self.t)
        return _h(x, self.s) + inner(x)

    class B:
        def forward(self, x):
            return _h(x, self.u)

def f(x):
    return _h(x)
'''


def test_call_sites_name_the_class_whose_self_a_call_reads():
    """`self.s` is A's attribute only in A's own methods: not under a nested function or class that
    has its own `self`."""
    sites = call_sites(ast.parse(CALLERS), "__module__", "_h", "s")
    assert sorted((ast.unparse(v), str(c)) for v, c in sites) == [
        ("None", "None"), ("self.s", "A"), ("self.t", "None"), ("self.u", "None")]
    public = ast.parse(CALLERS.replace("_h", "h"))
    assert call_sites(public, "__module__", "h", "s") is None  # callers outside the file may pass anything
    assert len(call_sites(public, "__module__", "h", "s", public=True)) == 4  # what the file's calls pass


@pytest.mark.parametrize(("text", "none_ok", "expected"), [
    ("0.125", False, True), ("None", False, False), ("None", True, True), ("1 / math.sqrt(64)", False, True),
    ("-(8 ** 0.5)", False, True), ("math.floor(x)", False, False), ("self.scale", False, False), ("'a' * 2", False, False),
])
def test_number_expressions(text, none_ok, expected):
    assert ast_number(ast.parse(text, mode="eval").body, none_ok) is expected


NORM_SOURCE = '''
from functools import partial

class Norm:
    def __init__(self, feats, stable=False, dim=-1):
        self.stable = stable
        self.dim = dim

ChanNorm = partial(Norm, dim=-3)

class Block:
    def __init__(self, d):
        self.dim = d  # another class's own attribute
        self.a = Norm(d)
        self.b = ChanNorm(d, stable=True)
        self.c = Norm(d, False, -2)
'''


def test_an_attribute_set_from_a_parameter_holds_what_every_construction_passes():
    assert attribute_int_values(ast.parse(NORM_SOURCE), "Norm", "dim") == frozenset({-1, -2, -3})
    constant = NORM_SOURCE.replace("self.dim = dim", "self.dim = 1")
    assert attribute_int_values(ast.parse(constant), "Norm", "dim") == frozenset({1})
    # integer arithmetic of parameters, every combination of their values (ESPnet's
    # `dim if dim >= 0 else total_dim + dim`, with `stable` standing in for the total)
    computed = NORM_SOURCE.replace("self.dim = dim", "self.dim = dim * 2")
    assert attribute_int_values(ast.parse(computed), "Norm", "dim") == frozenset({-2, -4, -6})
    wrapped = NORM_SOURCE.replace("stable=False", "stable=4").replace("stable=True", "stable=5").replace(
        "Norm(d, False, -2)", "Norm(d, 6, -2)").replace(
        "self.dim = dim", "self.dim = dim if dim >= 0 else stable + dim")
    assert attribute_int_values(ast.parse(wrapped), "Norm", "dim") == frozenset({1, 2, 3, 4, 5})


@pytest.mark.parametrize("edit", [
    ("Norm(d, False, -2)", "Norm(d, False, d)"),  # not a literal
    ("Norm(d, False, -2)", "Norm(d, dim=(1, 2))"),  # a tuple of axes
    ("ChanNorm(d, stable=True)", "ChanNorm(d, dim=d)"),  # through the partial
    ("ChanNorm(d, stable=True)", "ChanNorm(*d)"),  # unpacked arguments
    ("self.a = Norm(d)", "self.a = [Norm][0](d)"),  # the class passed as a value
    ("class Block:", "class Sub(Norm):\n    pass\n\nclass Block:"),  # a subclass constructs it out of sight
    ("self.stable = stable", "self.stable = stable\n        if stable:\n            self.dim = 1"),  # set twice
    ("self.c = Norm(d, False, -2)", "self.c = Norm(d, False, -2)\n        self.a.dim = d"),  # set from outside
    ("self.dim = dim", "self.dim = dim / 2"),  # computed, but no integer
    ("self.dim = dim", "self.dim = dim * feats"),  # from a parameter not proven an integer
])
def test_an_attribute_not_proven_an_integer(edit):
    assert attribute_int_values(ast.parse(NORM_SOURCE.replace(*edit)), "Norm", "dim") is None
