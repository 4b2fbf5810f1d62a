"""Parser errors name the line and column and say what was expected."""

from __future__ import annotations

import pytest

from engine.dsl.lexical import DSLSyntaxError
from engine.dsl.parser import parse_file, parse_method, parse_node, parse_operand

HEAD = 'file "a.py" module m\nclass X:\n  def f(x):\n'


def error(text: str, parse=parse_file) -> DSLSyntaxError:
    with pytest.raises(DSLSyntaxError) as info:
        parse(text)
    return info.value


def test_is_a_value_error_with_line_and_column():
    err = error(HEAD + "    add(x, $y) -> z\n")
    assert isinstance(err, ValueError)
    assert (err.line, err.column) == (4, 12)
    assert str(err).startswith("line 4, column 12: unexpected character '$'")
    # the offending line and a caret under the column
    assert str(err).splitlines()[1:] == ["        add(x, $y) -> z", "               ^"]


def test_unexpected_token_lists_what_was_expected():
    err = error(HEAD + "    add(x, y -> z\n")
    assert (err.line, err.column) == (4, 14)
    assert "unexpected '->'" in err.message
    assert "expected ')', ',', '='" in err.message


def test_unexpected_name_says_it_is_a_name():
    err = error('file "a.py" module m\nclass X:\n  init:\n    self.x torch.nn.Linear()\n')
    assert (err.line, err.column) == (4, 12)
    assert err.message == "unexpected 'torch.nn.Linear' (a name); expected '='"


def test_missing_header_part():
    err = error('file "a.py"\n')
    assert (err.line, err.column) == (1, 12)
    assert err.message == "unexpected end of line; expected 'module'"


def test_end_of_input():
    err = error("add(x", parse_node)
    assert "unexpected end" in err.message
    assert err.line == 1


def test_unterminated_string():
    err = error(HEAD + '    add(x, "abc) -> z\n')
    assert (err.line, err.column) == (4, 12)
    assert "unexpected character '\"'" in err.message


def test_unknown_escape_in_text():
    err = error(HEAD + "    add(x, e`\\q`) -> z\n")
    assert (err.line, err.column) == (4, 12)
    assert "unknown escape \\q" in err.message


def test_positions():
    err = error(HEAD + "    add(x) -> z @3:4\n")
    assert (err.line, err.column) == (4, 17)
    assert "needs @line:col-end_col" in err.message
    err = error('file "a.py" module m\ndiag warning @3:4-5 "x"\n')
    assert (err.line, err.column) == (2, 14)
    assert "a diagnostic's position is @line" in err.message


def test_parameter_order():
    err = error('file "a.py" module m\nclass X:\n  def f(**kw, x):\n')
    assert (err.line, err.column) == (3, 9)
    assert err.message == "in def f: **kw must be the last parameter (x follows it)"
    err = error("def f(*a, *b):", parse_method)
    assert (err.line, err.column) == (1, 11)
    assert err.message == "in def f: a second * parameter"


def test_free_text_must_be_str_not_bytes():
    err = error(HEAD + '    note b"n"\n')
    assert (err.line, err.column) == (4, 10)
    assert "str literal" in err.message


def test_operand_errors():
    assert "unexpected" in error("(a, ", parse_operand).message
    assert error("`a\nb`", parse_operand).line == 1


def test_notes_may_sit_between_nodes():
    method = parse_method('def f(x):\n  add(x) -> y\n  note "n"\n  return(y)\n')
    assert method.notes == ("n",)
    assert [n.kind for n in method.nodes] == ["op", "return"]
