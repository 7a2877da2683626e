"""The native fast paths (:mod:`listeners.native`) agree with CEL on random inputs."""

from __future__ import annotations

import math
import random
from typing import Any

import cel
import pytest

from listeners.expr import EvaluationError, compile_converter, compile_filter
from listeners.native import FALLBACK, SharedComparisons, shape_of

FIELDS = ("a", "b", "s", "t")
LITERALS: list[tuple[str, Any]] = [
    ("0", 0), ("3", 3), ("-2", -2), ("9223372036854775807", 2**63 - 1), ("0.0", 0.0),
    ("2.5", 2.5), ("-1.5", -1.5), ('"x"', "x"), ('"F1"', "F1"), ("''", ""), ("true", True),
    ("false", False), ('"\\u00e9"', "é"),
]  # fmt: skip
VALUES: list[Any] = [
    0, 1, 3, -2, 2**63 - 1, 2**63, 0.0, 2.5, -1.5, 3.0, math.nan, math.inf, "x", "F1", "", "é",
    "y", True, False, None, [1], {"n": 1}, b"x",
]  # fmt: skip
OPS = ("==", "!=", "<", "<=", ">", ">=")


def _cel(src: str, key: str, value: Any) -> tuple[str, Any]:
    """CEL's verdict: ("ok", result) or ("error", None)."""
    try:
        return "ok", compile_filter(src).program.execute(cel.Context({"key": key, "value": value}))
    except Exception:
        return "error", None


def _random_filter(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 3)):
        lit = rng.choice(LITERALS)[0]
        operand = "key" if rng.random() < 0.1 else f"value.{rng.choice(FIELDS)}"
        if operand == "key":
            lit = rng.choice(['"k1"', '"k2"', '""'])
        op = rng.choice(OPS)
        parts.append(f"{lit} {op} {operand}" if rng.random() < 0.3 else f"{operand} {op} {lit}")
    return " && ".join(parts)


def _random_value(rng: random.Random) -> dict[str, Any]:
    return {f: rng.choice(VALUES) for f in FIELDS if rng.random() < 0.9}


def test_native_filters_agree_with_cel() -> None:
    rng = random.Random(1234)
    decided = fallbacks = 0
    for _ in range(400):
        src = _random_filter(rng)
        native = compile_filter(src).native
        assert native is not None, src
        for _ in range(25):
            key, value = rng.choice(["k1", "k2", ""]), _random_value(rng)
            got = native(key, value)
            if got is FALLBACK:
                fallbacks += 1
                continue
            decided += 1
            verdict, result = _cel(src, key, value)
            assert (verdict, result) == ("ok", got), (src, key, value)
    assert decided > 1000 and fallbacks > 1000  # both paths were exercised


def test_native_converters_agree_with_cel() -> None:
    rng = random.Random(99)
    decided = 0
    for _ in range(200):
        entries = []
        for i in range(rng.randint(1, 4)):
            r = rng.random()
            expr = "key" if r < 0.15 else rng.choice(LITERALS)[0] if r < 0.3 else (
                f"value.{rng.choice(FIELDS)}")  # fmt: skip
            entries.append(f'"o{i}": {expr}')
        src = "{" + ", ".join(entries) + "}"
        conv = compile_converter(src)
        assert conv.native is not None, src
        for _ in range(20):
            value = _random_value(rng)
            got = conv.native("k1", value)
            if got is FALLBACK:
                continue
            decided += 1
            expected = conv.project(cel.Context({"key": "k1", "value": value}))
            assert got == expected and list(map(type, got.values())) == list(
                map(type, (expected[k] for k in got))), (src, value)  # fmt: skip
    assert decided > 1000


@pytest.mark.parametrize("src", [
    "value.a == 1 || value.b == 2", "old.a == 1", "value.a + 1 == 2", "size(value.s) > 1",
    "value.a == 1u", "value.a == null", "value.a in [1, 2]", "kind == \"created\"",
    "value.s == r'x'", "!(value.a == 1)", 'value["a"] == 1', "meta.partition == 0",
])  # fmt: skip
def test_other_shapes_have_no_native_path(src: str) -> None:
    assert compile_filter(src).native is None


def test_constant_filters_and_nested_paths() -> None:
    assert compile_filter("true").native("k", None) is True  # type: ignore[misc]
    nested = compile_filter('value.a.b == "x" && value.n >= 2').native
    assert nested is not None
    assert nested("k", {"a": {"b": "x"}, "n": 2}) is True
    assert nested("k", {"a": {"b": "y"}, "n": 2}) is False
    assert nested("k", {"a": "x", "n": 2}) is FALLBACK  # not a map: CEL reports the error


def test_fallback_keeps_cel_errors() -> None:
    f = compile_filter("value.a > 1")
    assert f.native is not None and f.native("k", {"b": 1}) is FALLBACK
    with pytest.raises(EvaluationError):
        f.test(cel.Context({"value": {"b": 1}}))


def test_shared_comparisons_agree_with_the_closures() -> None:
    """Filters differing only in literals, evaluated together, give each closure's verdict."""
    rng = random.Random(777)
    by_type: dict[type, list[str]] = {}
    for text, value in LITERALS:
        by_type.setdefault(type(value), []).append(text)
    checked = {"hit": 0, "miss": 0, "unsure": 0}
    for _ in range(150):
        # A shape: operands, operators and literal types; members differ in literals only.
        shape = []
        for _ in range(rng.randint(1, 3)):
            operand = "key" if rng.random() < 0.1 else f"value.{rng.choice(FIELDS)}"
            typ = str if operand == "key" else rng.choice(list(by_type))
            shape.append((operand, rng.choice(OPS), typ, rng.random() < 0.3))
        group: SharedComparisons | None = None
        members = []
        for i in range(rng.randint(1, 12)):
            parts = []
            for operand, op, typ, mirrored in shape:
                lit = rng.choice(['"k1"', '"k2"', '""'] if operand == "key" else by_type[typ])
                parts.append(f"{lit} {op} {operand}" if mirrored else f"{operand} {op} {lit}")
            expr = compile_filter(" && ".join(parts))
            assert expr.comparisons is not None and expr.native is not None
            if group is None:
                group = SharedComparisons(shape_of(expr.comparisons))
            group.add(i, expr.comparisons)
            members.append(expr.native)
        assert group is not None and len(group) == len(members)
        for _ in range(20):
            key, value = rng.choice(["k1", "k2", ""]), _random_value(rng)
            hits: list[Any] = []
            unsure: list[Any] = []
            decided = group.run(key, value, hits, unsure)
            assert decided == len(members) - len(unsure)
            for i, native in enumerate(members):
                want = native(key, value)
                got = "unsure" if i in unsure else "hit" if i in hits else "miss"
                assert got == ("unsure" if want is FALLBACK else "hit" if want else "miss")
                checked[got] += 1
    assert min(checked.values()) > 300, checked
