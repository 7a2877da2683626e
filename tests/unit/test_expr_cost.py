"""Static cost bounds of CEL expressions at registration (issue 12, item 10): what is refused,
why, and where; what is accepted and its estimate (CompiledExpr.cost)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fifolane.cli.listeners import listeners as listeners_cli
from fifolane.errors import ExpressionError
from listeners.cost import LIMITS, CostLimitError, estimate_unparsed
from listeners.expr import compile_converter, compile_filter

L10 = "[1,2,3,4,5,6,7,8,9,10]"


def nested_maps(depth: int) -> str:
    inner = "1"
    for d in range(depth - 1, 0, -1):
        inner = f"{L10}.map(a{d}, {inner})"
    return f"size({L10}.map(a0, {inner})) > 0"


def refused(src: str, role: str = "filter") -> ExpressionError:
    with pytest.raises(ExpressionError) as info:
        (compile_filter if role == "filter" else compile_converter)(src)
    assert info.value.expression == src
    assert info.value.position is not None and 0 <= info.value.position <= len(src)
    return info.value


def test_the_limits_are_the_documented_ones() -> None:
    assert (LIMITS.max_length, LIMITS.max_brackets, LIMITS.max_nesting, LIMITS.max_list_literal,
            LIMITS.max_string_literal, LIMITS.max_comprehension_depth, LIMITS.assumed_size,
            LIMITS.max_cost, LIMITS.max_size) == (8192, 24, 64, 1000, 4096, 3, 100, 100_000, 1_000_000)


@pytest.mark.parametrize(("src", "cost"), [
    ('value.amount > 500.0 && value.state == "CONFIRMED"', 9),
    ("value.items.exists(i, i.qty > 2) && value.tags.all(t, t != 'x')", 907),
    ('value.orders.exists(o, o.lines.exists(l, l.sku == "X"))', 50_403),
    (nested_maps(3), 4_555),  # three deep over 10 elements: 1,000 evaluations of the body
    ('value.name.matches("^a.*b$") && key.startsWith("R-")', 20),
])
def test_accepted_expressions_carry_their_estimate(src: str, cost: int) -> None:
    assert compile_filter(src).cost == cost


def test_six_nested_maps_are_refused_at_the_fourth() -> None:
    src = nested_maps(6)
    err = refused(src)
    fourth = [i for i in range(len(src)) if src.startswith("map(", i)][3]
    assert err.position == fourth
    assert str(err).startswith(f"invalid filter: comprehensions nested 4 deep (limit 3), at offset {fourth}; "
                               f"filters run for every change, so their cost is bounded")


def test_comprehensions_over_data_multiply_their_cost() -> None:
    src = "value.a.exists(x, value.b.exists(y, value.c.exists(z, z == x)))"
    err = refused(src)
    assert "estimated cost 5,040,403 steps over the limit 100,000" in str(err)
    assert err.position == src.index("exists(x")  # the comprehension whose cost crossed the limit


def test_a_value_doubled_in_a_chain_of_comprehensions_is_refused() -> None:
    src = "size([[1,2,3]]" + ".map(x, x + x)" * 20 + ") > 0"
    err = refused(src)
    assert "may build a value of 1,228,800 elements or characters (limit 1,000,000)" in str(err)
    assert src[err.position:].startswith("x + x)")  # the concatenation that grows too much


@pytest.mark.parametrize(("src", "words", "position"), [
    ("!" * 2000 + "true", "operators nested more than 64 deep (limit 64)", 64),
    ("1" + " + 1" * 1500 + " == 1", "operators nested more than 64 deep", None),
    (" || ".join(f"value.a == {i}" for i in range(80)), "split a long chain of && / || / + or use `in [...]`", None),
    ("(" * 30 + "1" + ")" * 30 + " == 1", "brackets nested more than 24 deep (limit 24)", 24),
    ("value.a == 1 && " * 600 + "true", "the expression is 9,604 characters long (limit 8,192)", 8192),
    ("value.a in [" + ",".join(map(str, range(1001))) + "]", "a list literal of 1,001 items (limit 1,000)", 11),
    ('value.a == "' + "x" * 5000 + '"', "a string literal of 5,002 characters (limit 4,096)", 11),
])
def test_oversized_expressions_are_refused_with_reason_and_position(src: str, words: str, position: int | None) -> None:
    err = refused(src)
    assert words in str(err), str(err)
    if position is not None:
        assert err.position == position


def test_converters_are_bounded_too() -> None:
    src = '{"x": value.a.map(i, value.b.map(j, value.c.map(k, k)))}'
    err = refused(src, "converter")
    assert str(err).startswith("invalid converter: estimated cost ")
    assert "converters run for every change" in str(err)


def test_unparsable_expressions_get_the_conservative_bound() -> None:
    assert estimate_unparsed("value.a.exists(x, x > 1)") == 24 * 100
    with pytest.raises(CostLimitError, match=r"4 comprehensions that may be nested \(limit 3 deep"):
        estimate_unparsed("a.map(x, 1) + b.map(x, 1) + c.map(x, 1) + d.map(x, 1)")
    with pytest.raises(CostLimitError, match=r"estimated cost 1,850,000 steps over the limit 100,000"):
        estimate_unparsed("value.a.exists(x, value.b.exists(y, x == y))" + " " * 141)


def test_cli_add_refuses_with_a_caret_under_the_position() -> None:
    src = nested_maps(6)
    res = CliRunner().invoke(listeners_cli, ["add", "x", "--filter", src])
    assert res.exit_code == 2
    lines = res.output.splitlines()
    assert lines[0].startswith("error: invalid filter: comprehensions nested 4 deep (limit 3), at offset ")
    assert lines[1] == "  " + src
    assert lines[2] == "  " + " " * src.index("map(a3") + "^"
