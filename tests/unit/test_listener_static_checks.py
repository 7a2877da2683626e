"""Registration refuses listeners that can never work (listeners.validate, listeners.typecheck):
an unknown type, fields the type's schema lacks, static type errors, a non-bool filter, a
division by a literal zero, map keys CEL refuses. What could be valid for some record is
accepted; workers never run these checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cel
import pytest
from click.testing import CliRunner

from fifolane.cli.listeners import listeners as listeners_cli
from fifolane.config import Settings
from fifolane.errors import ExpressionError, ListenerError
from fifolane.serde.catalog import SchemaCatalog
from listeners import registry
from listeners.follower import RegistryRecord
from listeners.model import ListenerSpec
from listeners.registry_view import RegistryView
from listeners.validate import check_registration

BUNDLED = SchemaCatalog.load()

ORDER = {
    "type": "record", "name": "Order", "namespace": "t", "fifolane.type": "order",
    "fields": [
        {"name": "id", "type": "string", "fifolane.key": True},
        {"name": "customer", "type": "string", "fifolane.group": True},
        {"name": "version", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "discount", "type": ["null", "double"], "default": None},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "int"], "default": None}]}},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
            {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
        {"name": "tags", "type": {"type": "map", "values": "string"}},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "either", "type": ["int", "string"]},
        {"name": "billing", "type": ["null", "Address"], "default": None},
        {"name": "paid", "type": "boolean"},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> SchemaCatalog:
    d: Path = tmp_path_factory.mktemp("schemas")
    (d / "order.avsc").write_text(json.dumps(ORDER))
    return SchemaCatalog.load(d)


def refusal(catalog: SchemaCatalog, **spec: Any) -> ExpressionError:
    with pytest.raises(ExpressionError) as info:
        check_registration(ListenerSpec(name="l", **spec), catalog)
    return info.value


# -- the new user's cases ----------------------------------------------------------------------
def test_a_field_the_type_lacks_is_refused_with_its_position_and_the_fields() -> None:
    exc = refusal(BUNDLED, type="reservation", filter="value.no_such_field > 3")
    assert str(exc) == (
        "invalid filter: unknown field 'no_such_field': reservation records have no such field (fields: "
        "amount, customer_id, flight_number, reservation_id, seats, state, version) (at offset 6)")
    assert (exc.expression, exc.position) == ("value.no_such_field > 3", 6)


def test_a_misspelt_field_gets_the_closest_one_in_old_and_in_the_converter() -> None:
    exc = refusal(BUNDLED, type="reservation", filter="old.amont > 3.0")
    assert "unknown field 'amont'" in str(exc) and "did you mean 'amount'?" in str(exc) and exc.position == 4
    exc = refusal(BUNDLED, type="reservation", filter="true", convert='{"a": value.amout}')
    assert str(exc).startswith("invalid converter: unknown field 'amout'")
    assert (exc.expression, exc.position) == ('{"a": value.amout}', 12)


def test_comparing_a_double_with_a_string_is_refused() -> None:
    exc = refusal(BUNDLED, type="reservation", filter='value.amount > "abc"')
    assert str(exc) == (
        "invalid filter: '>' cannot compare value.amount (a double) and \"abc\" (a string): CEL does not "
        "convert between types; compare with a value of the field's type (at offset 0)")


def test_a_filter_that_is_not_a_bool_is_refused() -> None:
    exc = refusal(BUNDLED, type="reservation", filter="value.amount")
    assert str(exc) == ("invalid filter: a filter must return a bool (true = the change matches), but this "
                        "returns a double; compare it, e.g. `value.amount > 500.0` (at offset 0)")


def test_a_division_by_a_literal_zero_is_refused_typed_or_not() -> None:
    exc = refusal(None, filter="true", convert='{"x": 1/0}')  # type: ignore[arg-type]
    assert str(exc) == "invalid converter: '/' by zero: 1/0 always fails (at offset 8)"
    assert exc.position == 8
    for src in ("value.seats % 0 == 1", "value.seats / -0 > 1", "value.seats / 0u > 1u", "value.seats / 0x0 > 1"):
        assert "by zero" in str(refusal(BUNDLED, type="reservation", filter=src)), src


def test_a_map_key_of_a_type_cel_refuses_is_refused() -> None:
    exc = refusal(BUNDLED, filter="true", convert="{true: 1, 2.5: 2}")
    assert str(exc) == ("invalid converter: map keys must be int, uint, bool or string; the key 2.5 is a "
                        "double (at offset 10)")
    for src in ('{null: 1}', '{b"k": 1}', '{[1]: 2}', '{"a": {value.amount: 1}}'):
        assert "map keys must be" in str(refusal(BUNDLED, type="reservation", filter="true", convert=src)), src


def test_an_unknown_type_is_refused_with_the_known_types_and_the_closest() -> None:
    with pytest.raises(ListenerError) as info:
        check_registration(ListenerSpec(name="l", type="reservatoin"), BUNDLED)
    assert str(info.value) == (
        "unknown entity type 'reservatoin'; did you mean 'reservation'? (known types: flight, flight_load, "
        "reservation, ticket); give one of them with --type, or leave --type out for every type")


# -- more refusals -----------------------------------------------------------------------------
@pytest.mark.parametrize("filter_, needle", [
    ('value.discount == "abc"', "never equal"),
    ("value.version != true", "always different"),
    ("value.version + 1.0 > 2.0", "'+' is not defined for value.version (an int) and 1.0 (a double)"),
    ("!value.discount", "'!' needs a bool, but value.discount is a double or null"),
    ("value.paid && value.version", "'&&' needs a bool, but value.version is an int"),
    ("-value.customer > 1", "'-' cannot negate value.customer"),
    ('value.customer in "abc"', "'in' needs a list or a map"),
    ("value.address.town == 'x'", "unknown field 'town': Address records have no such field"),
    ("value.lines.exists(l, l.qtty > 2)", "unknown field 'qtty': Line records have no such field; did you mean 'qty'?"),
    ("value.address.zip.x == 1", "value.address.zip is an int or null: it has no field 'x'"),
    ("value.discount % 2.0 > 0.0", "'%' is not defined"),
    ("meta.partitoin == 1", "unknown field 'partitoin': meta has no such field; did you mean 'partition'?"),
    ("kind == 1", "'==' compares kind (a string) and 1 (an int)"),
    ("value.lines.map(l, l.qty).exists(q, q > 'a')", "'>' cannot compare q (an int) and 'a' (a string)"),
    ("value.id.size() + 1u > 2u", "'+' is not defined"),
    ("value.id", "returns a string"),
    ("value.lines", "returns a list of record Line"),
    ("value.paid ? value.version : 2", "returns an int"),
])  # fmt: skip
def test_static_errors_against_a_richer_schema(catalog: SchemaCatalog, filter_: str, needle: str) -> None:
    assert needle in str(refusal(catalog, type="order", filter=filter_))


def test_a_converter_that_is_not_a_map_is_refused(catalog: SchemaCatalog) -> None:
    exc = refusal(catalog, type="order", filter="true", convert="value.address.city")
    assert "a converter must return a map (the projection to send), but this returns a string" in str(exc)


# -- acceptances: what could be valid for some record --------------------------------------------
@pytest.mark.parametrize("filter_", [
    "value.amount > 3",  # int and double compare in CEL
    "value.seats > 2.5 && value.seats == 3u",
    'value.state == "CONFIRMED"',  # an enum is a string
    "has(value.no_such_field) && value.no_such_field > 3",  # guarded by has()
    "has(value.later.inner) && value.later.inner == 1",
    "value == null || value.amount > 1.0",
    "old != null && old.amount < value.amount",
    'value["amount"] > 1.0',
    "meta.offset == null || meta.offset > 3",
    'kind == "created" && key.startsWith("R")',
    "dyn(value.amount) == 'x'",
    "value.seats / 2 > 1",  # not a literal zero
    "1.0 / 0.0 > value.amount",  # a double division by zero is Infinity, not an error
])  # fmt: skip
def test_valid_filters_of_the_bundled_type_are_accepted(filter_: str) -> None:
    check_registration(ListenerSpec(name="l", type="reservation", filter=filter_), BUNDLED)


@pytest.mark.parametrize("filter_", [
    "value.note == null || value.note.startsWith('x')",  # nullable string
    "value.discount > 0.5",  # nullable double: fails only when null
    "value.address.zip == null || value.address.zip > 1000",
    "value.lines.exists(l, l.qty > 2 && l.sku == 'X')",
    "value.tags.anything == 'x'",  # a map: any key may be there
    "'vip' in value.tags",
    "value.either == 'x' || value.either == 3",  # a union: dyn
    "value.placed > timestamp('2020-01-01T00:00:00Z')",  # a logical type: dyn
    "value.billing == null || value.billing.city == 'Oslo'",  # a named-type reference
    "has(value.billing.town)",
    "value.lines.filter(l, l.qty > 1).size() > 0",
    "size(value.lines) > 0 ? value.lines[0].qty > 1 : false",
    # where two types meet (a ternary's branches, list items, concatenation, a map
    # literal's keys), the value may be of either: nothing about it is refused
    '{1: "a", 2: "b"}.exists(k, k > 1)',  # a map literal's keys are ints
    '{1: "a"}.map(k, k + 1)[0] == 2',
    '{true: 1, "x": 2}.exists(k, k == "x")',  # keys of two types: dyn
    '(value.lines.map(l, l.qty) + ["a"]).exists(x, x == "a")',
    '(value.paid ? [1] : ["a"]).exists(x, x == "a")',
    '[1, "a"].exists(x, x == "a")',
    '[[1], ["a"]][1][0] == "a"',
    '(value.paid ? {"k": 1} : {"k": "v"}).k == "v"',
    'value.tags.exists(k, k.startsWith("x"))',  # an Avro map's keys are strings
])  # fmt: skip
def test_valid_filters_of_a_richer_schema_are_accepted(catalog: SchemaCatalog, filter_: str) -> None:
    check_registration(ListenerSpec(name="l", type="order", filter=filter_), catalog)


def test_where_two_types_agree_mismatches_are_still_refused(catalog: SchemaCatalog) -> None:
    assert "never equal" in str(refusal(catalog, type="order", filter='{1: "a"}.exists(k, k == "a")'))
    assert "never equal" in str(refusal(catalog, type="order", filter='(value.paid ? [1] : [2]).exists(x, x == "a")'))
    assert "never equal" in str(refusal(catalog, type="order", filter='value.tags.exists(k, k == 3)'))


def test_valid_converters_are_accepted(catalog: SchemaCatalog) -> None:
    for convert in ('{"id": key, "city": value.address.city, "n": size(value.lines)}', "value", "value.address",
                    "value.tags", '{1: "a", 2u: "b", false: "c", "d": value.paid}', "{value.id: value.version}"):
        check_registration(ListenerSpec(name="l", type="order", convert=convert), catalog)


def test_without_a_type_fields_are_not_checked_but_literal_errors_are() -> None:
    check_registration(ListenerSpec(name="l", filter="value.no_such_field > 3"), BUNDLED)
    check_registration(ListenerSpec(name="l", filter="value.amount"), BUNDLED)  # dyn: maybe a bool
    check_registration(ListenerSpec(name="l", filter="int(value.state) > 0"), None)
    assert "by zero" in str(refusal(BUNDLED, filter="value.a / 0 > 1"))
    with pytest.raises(ExpressionError, match="never equal"):
        check_registration(ListenerSpec(name="l", filter='size(value) == "3"'), None)


def test_the_checked_errors_are_the_ones_cel_raises_at_run_time() -> None:
    """Each refused case fails in the CEL library too (so nothing valid is refused)."""
    record = {"amount": 2.5, "seats": 3, "state": "NEW"}
    for src in ('value.amount > "abc"', "value.seats + 1.0 > 2.0", "!value.amount", '{"x": 1/0}',
                "{true: 1, 2.5: 2}", "value.no_such_field > 3", "value.seats % 0 == 1"):
        with pytest.raises(BaseException) as info:  # noqa: PT011 (the library raises several kinds)
            cel.evaluate(src, {"value": record})
        assert not isinstance(info.value, (KeyboardInterrupt, SystemExit)), src


def test_workers_still_take_registrations_that_would_now_be_refused() -> None:
    """Validation is at registration only: a registry record from an older version is active."""
    view = RegistryView(lambda _k, _p: None)
    old = ListenerSpec(name="old", type="reservation", filter="value.no_such_field > 3", convert='{"x": 1/0}')
    view.apply([RegistryRecord("old", old.to_json(), 0)])
    assert list(view.specs) == ["old"] and view.invalid == {}


# -- the API and the CLI refuse before anything reaches Kafka -----------------------------------------
class _NoKafka:
    def __init__(self, *_a: Any, **_k: Any) -> None:
        raise AssertionError("Kafka was contacted")


def test_register_refuses_before_asking_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "KafkaAccess", _NoKafka)
    settings = Settings(bootstrap_servers="127.0.0.1:1")
    with pytest.raises(ExpressionError, match="unknown field 'no_such_field'"):
        registry.register(settings, ListenerSpec(name="l", type="reservation", filter="value.no_such_field > 3"))
    with pytest.raises(ListenerError, match="unknown entity type 'reservatoin'"):
        registry.register(settings, ListenerSpec(name="l", type="reservatoin"))
    with pytest.raises(ListenerError, match="cannot check the listener's type against the entity schemas"):
        registry.register(Settings(bootstrap_servers="127.0.0.1:1", schemas_dir=Path("/nonexistent")),
                          ListenerSpec(name="l", type="reservation"))


@pytest.mark.parametrize("args, out", [
    (["--type", "reservation", "--filter", "value.no_such_field > 3"],
     "error: invalid filter: unknown field 'no_such_field': reservation records have no such field (fields: "
     "amount, customer_id, flight_number, reservation_id, seats, state, version) (at offset 6)\n"
     "  value.no_such_field > 3\n        ^\n"),
    (["--filter", "true", "--convert", '{"nan": 0.0/0.0, "x": 1/0}'],
     "error: invalid converter: '/' by zero: 1/0 always fails (at offset 24)\n"
     '  {"nan": 0.0/0.0, "x": 1/0}\n' + " " * 26 + "^\n"),
    (["--type", "reservatoin", "--filter", "true"],
     "error: unknown entity type 'reservatoin'; did you mean 'reservation'? (known types: flight, flight_load, "
     "reservation, ticket); give one of them with --type, or leave --type out for every type\n"),
])  # fmt: skip
def test_the_cli_refuses_with_exit_code_2(monkeypatch: pytest.MonkeyPatch, args: list[str], out: str) -> None:
    monkeypatch.setattr(registry, "KafkaAccess", _NoKafka)
    result = CliRunner().invoke(listeners_cli, ["add", "l", *args])
    assert (result.exit_code, result.stderr, result.stdout) == (2, out, "")
