"""CEL filters/converters: registration errors with positions, references, run-time errors."""

from __future__ import annotations

import pytest

from fifolane.errors import ExpressionError
from listeners.expr import EvaluationError, compile_converter, compile_filter, normalize


@pytest.mark.parametrize(
    ("src", "position", "words"),
    [
        ("value.amount >", 14, "line 1, column 15"),
        ("a +* b", 3, "Syntax error"),
        ("value.x = 1", 8, "use '=='"),
        ('value.x == "abc', 11, "column 12"),
        ("value.a == 1 &&\n  value.b ++ 3", 27, "line 2, column 12"),
        ('"😀😀" == )', 8, "column 9"),  # columns count code points
    ],
)
def test_syntax_errors_carry_the_offset(src: str, position: int, words: str) -> None:
    with pytest.raises(ExpressionError) as info:
        compile_filter(src)
    assert info.value.position == position
    assert info.value.expression == src
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("src", "name", "position", "suggestion"),
    [
        ('value.amount > 500.0 && vaule.state == "C"', "vaule", 24, "value"),
        ("entity.x == 1", "entity", 0, None),
        ("size(olds) > 1", "olds", 5, "old"),
        ("meta.version > 1 || x > 1", "x", 20, None),
    ],
)
def test_unknown_variables_are_refused(
    src: str, name: str, position: int, suggestion: str | None
) -> None:
    with pytest.raises(ExpressionError) as info:
        compile_filter(src)
    assert info.value.position == position
    assert repr(name) in str(info.value)
    assert "key, kind, meta, old, value" in str(info.value)
    if suggestion:
        assert f"did you mean {suggestion!r}" in str(info.value)


def test_comprehension_variables_are_not_unknown() -> None:
    expr = compile_filter("value.items.exists(i, i.qty > 2) && value.tags.all(t, t != 'x')")
    assert expr.variables == {"value"}
    assert expr.fields == {"value": {"items", "tags"}}


def test_unknown_functions_are_refused_at_the_name() -> None:
    with pytest.raises(ExpressionError) as info:
        compile_filter('value.name.lowerAscii() == "a"')
    assert info.value.position == 11
    assert "unknown function 'lowerAscii'" in str(info.value)


@pytest.mark.parametrize(
    "src", ["value.amount + 1", '{"a": 1}', '"text"', "[true]", "size(key)", "-value.x"]
)
def test_filter_that_obviously_is_not_a_bool_is_refused(src: str) -> None:
    with pytest.raises(ExpressionError, match="must return a bool"):
        compile_filter(src)


@pytest.mark.parametrize("src", ["value.amount > 1", "true", "1 + 2", "[value.a]"])
def test_converter_that_obviously_is_not_a_map_is_refused(src: str) -> None:
    with pytest.raises(ExpressionError, match="must return a map"):
        compile_converter(src)


def test_empty_expression_is_refused() -> None:
    with pytest.raises(ExpressionError, match="empty") as info:
        compile_filter("   ")
    assert info.value.position == 0


@pytest.mark.parametrize(
    ("src", "variables", "fields"),
    [
        (
            'value.amount > 500.0 && value.state == "CONFIRMED"',
            {"value"},
            {"value": {"amount", "state"}},
        ),
        ('value["flight_number"] == "LH1"', {"value"}, {"value": {"flight_number"}}),
        ('value.flight.number == "LH1"', {"value"}, {"value": {"flight"}}),
        ("has(value.x) && old.y != value.y", {"value", "old"}, {"value": {"x", "y"}, "old": {"y"}}),
        ("size(value) > 2", {"value"}, {"value": None}),  # the map as a whole: needs everything
        ("value[key] == 1", {"value", "key"}, {"value": None}),  # dynamic index: cannot tell
        ("value != null && old == null", {"value", "old"}, {"value": set(), "old": set()}),
        (
            'key.startsWith("R-") && kind == "created" && meta.partition == 0',
            {"key", "kind", "meta"},
            {},
        ),
        ("[1, 2].exists(value, value > 1)", set(), {}),  # a comprehension variable shadows `value`
    ],
)
def test_field_usage(src: str, variables: set[str], fields: dict[str, set[str] | None]) -> None:
    expr = compile_filter(src)
    assert expr.variables == variables
    assert expr.fields == fields


def test_equality_conjunct_is_found_on_either_side() -> None:
    a = compile_filter('value.flight_number == "LH123"')
    b = compile_filter('"LH123" == value.flight_number && value.amount > 1.0')
    assert (
        a.equality is not None and a.equality.path == ("flight_number",) and a.equality.rest is None
    )
    assert b.equality is not None and b.equality.literal == "LH123"
    assert b.equality.rest is not None and b.equality.rest.source == "(value.amount > 1.0)"
    assert compile_filter('value.a == 1 || value.b == "x"').equality is None
    assert compile_filter("value.a == value.b").equality is None


def test_normalize_ignores_spacing_and_comments() -> None:
    assert normalize("value.a==1 // note") == normalize("value . a  ==  1")
    assert normalize('value.a == "x  y"') != normalize('value.a == "x y"')


def test_runtime_failures_raise_evaluation_error() -> None:
    f = compile_filter("value.missing == 1")
    with pytest.raises(EvaluationError, match="missing"):
        f.test({"value": {"a": 1}})
    with pytest.raises(EvaluationError, match="overload"):
        compile_filter('value.a + "x" == "y"').test({"value": {"a": 1}})
    with pytest.raises(EvaluationError, match="not a bool"):
        compile_filter("value.a").test({"value": {"a": 1}})
    with pytest.raises(EvaluationError, match="not a map"):
        compile_converter("value.a").project({"value": {"a": 1}})
    assert isinstance(EvaluationError("x"), ExpressionError)


def test_filter_and_converter_evaluate() -> None:
    ctx = {"key": "R1", "value": {"amount": 600.0, "state": "CONFIRMED"}}
    assert compile_filter('value.amount > 500.0 && value.state == "CONFIRMED"').test(ctx) is True
    assert compile_converter('{"id": key, "amount": value.amount}').project(ctx) == {
        "id": "R1",
        "amount": 600.0,
    }


@pytest.mark.parametrize(("src", "key", "repeats"), [
    ('{"a": 1, "a": 2}', '"a"', '"a"'),  # CEL refuses a repeated key
    ('{1: "one", true: "yes", "k": key}', "true", "1"),  # one key once evaluated: an entry was lost
    ('{1: 1, 1u: 2}', "1u", "1"),
    ('{1: "a", "1": "b"}', '"1"', "1"),  # one key in the notification's JSON
    ('{"id": key, "more": {"x": 1, "x": 2}}', '"x"', '"x"'),  # in a nested map too
    ('{-1: value.seats, "-1": "x"}', '"-1"', "-1"),  # a negative literal
    ('{-0: value.seats, 0: "x"}', "0", "-0"),
])
def test_map_keys_that_collide_are_refused_with_the_position(src: str, key: str, repeats: str) -> None:
    with pytest.raises(ExpressionError) as info:
        compile_converter(src)
    assert f"map key {key} repeats key {repeats}" in str(info.value)
    assert info.value.position == src.rindex(key)


def test_distinct_map_keys_are_kept() -> None:
    assert compile_converter('{"a": 1, "b": [1, 1], "1": key, "true": 2}').evaluate(
        {"key": "K", "value": None, "old": None, "kind": "created", "meta": {}}) == {"a": 1, "b": [1, 1], "1": "K", "true": 2}
