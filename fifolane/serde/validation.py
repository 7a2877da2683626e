"""Validate JSON input against an Avro schema, with a precise reason on failure.

A validator is compiled once per schema (a tree of small closures), then applied to every
JSON event. It checks required fields, refuses unknown ones, checks types (``bool`` is not an
``int``; ints are range-checked), enum symbols, and converts JSON forms to what the Avro writer
expects: ``date`` from ``"YYYY-MM-DD"`` or days since epoch, timestamps from ISO strings or
numbers, ``bytes`` from latin-1 strings. Missing fields with a default get the default.
"""

from __future__ import annotations

import copy
import datetime as dt
import decimal
import re
from collections.abc import Callable
from typing import Any

from fifolane.errors import ValidationError

__all__ = ["Validator", "compile_validator"]

#: ``(json value, dotted path) -> value ready for the Avro writer``; raises ValidationError.
Validator = Callable[[Any, str], Any]

_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(path: str, expected: str, value: Any) -> ValidationError:
    return ValidationError(f"field '{path}': expected {expected}, got {_show(value)}")


def _integer(kind: str) -> Validator:
    low, high = _INT_RANGE[kind]

    def check(value: Any, path: str) -> Any:
        if type(value) is not int:  # bool is an int subclass: refuse it too
            raise _fail(path, kind, value)
        if not low <= value <= high:
            raise ValidationError(f"field '{path}': {value} is out of range for {kind}")
        return value

    return check


def _floating(kind: str) -> Validator:
    def check(value: Any, path: str) -> Any:
        if type(value) is float:
            return value
        if type(value) is int:
            return float(value)
        raise _fail(path, kind, value)

    return check


def _simple(kind: type, label: str) -> Validator:
    def check(value: Any, path: str) -> Any:
        if type(value) is not kind:
            raise _fail(path, label, value)
        return value

    return check


def _null(value: Any, path: str) -> Any:
    if value is not None:
        raise _fail(path, "null", value)
    return None


def _bytes(value: Any, path: str) -> Any:
    # Avro's JSON encoding maps bytes to code points 0-255 of a string.
    if isinstance(value, str):
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            raise ValidationError(
                f"field '{path}': bytes given as a string may only use code points 0-255"
            ) from None
    raise _fail(path, "bytes (as a string)", value)


def _date(value: Any, path: str) -> Any:
    if type(value) is int:
        return _EPOCH_DATE + dt.timedelta(days=value)
    if isinstance(value, str) and _DATE_RE.fullmatch(value):
        try:
            return dt.date.fromisoformat(value)
        except ValueError as exc:
            raise ValidationError(f"field '{path}': invalid date {value!r}: {exc}") from None
    raise _fail(path, "date ('YYYY-MM-DD' or days since 1970-01-01)", value)


def _timestamp(unit: int) -> Validator:
    def check(value: Any, path: str) -> Any:
        if type(value) is int:
            return _EPOCH + dt.timedelta(microseconds=value * unit)
        if isinstance(value, str):
            try:
                stamp = dt.datetime.fromisoformat(value)
            except ValueError:
                raise _fail(path, "ISO-8601 timestamp", value) from None
            return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)
        raise _fail(path, "timestamp (ISO-8601 string or number since epoch)", value)

    return check


def _decimal(value: Any, path: str) -> Any:
    if type(value) in (int, float, str):
        try:
            return decimal.Decimal(str(value))
        except decimal.InvalidOperation:
            pass
    raise _fail(path, "decimal (number or numeric string)", value)


def _enum(symbols: list[str]) -> Validator:
    allowed = frozenset(symbols)
    expected = "one of " + ", ".join(symbols)

    def check(value: Any, path: str) -> Any:
        if not isinstance(value, str) or value not in allowed:
            raise _fail(path, expected, value)
        return value

    return check


def _fixed(size: int) -> Validator:
    def check(value: Any, path: str) -> Any:
        data = _bytes(value, path)
        if len(data) != size:
            raise ValidationError(f"field '{path}': expected {size} bytes, got {len(data)}")
        return data

    return check


def _array(items: Validator) -> Validator:
    def check(value: Any, path: str) -> Any:
        if not isinstance(value, list):
            raise _fail(path, "array", value)
        return [items(item, f"{path}[{i}]") for i, item in enumerate(value)]

    return check


def _map(values: Validator) -> Validator:
    def check(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _fail(path, "map (JSON object)", value)
        return {k: values(v, f"{path}.{k}") for k, v in value.items()}

    return check


def _union(branches: list[tuple[str, Validator]]) -> Validator:
    nullable = any(label == "null" for label, _ in branches)
    others = [(label, v) for label, v in branches if label != "null"]
    expected = " or ".join(label for label, _ in branches)

    def check(value: Any, path: str) -> Any:
        if value is None and nullable:
            return None
        for _, validator in others:
            try:
                return validator(value, path)
            except ValidationError:
                continue
        if len(others) == 1:  # ["null", T]: T's own reason is the precise one
            return others[0][1](value, path)
        raise _fail(path, expected, value)

    return check


def _record(fields: list[tuple[str, Validator, bool, Any]], name: str) -> Validator:
    known = {f[0] for f in fields}
    known_list = ", ".join(f[0] for f in fields)

    def check(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _fail(path or name, f"record {name} (JSON object)", value)
        prefix = path + "." if path else ""
        extra = value.keys() - known
        if extra:
            raise ValidationError(
                f"field '{prefix}{min(extra)}': unknown field (fields of {name}: {known_list})"
            )
        out: dict[str, Any] = {}
        for fname, validator, has_default, default in fields:
            if fname in value:
                out[fname] = validator(value[fname], prefix + fname)
            elif has_default:
                out[fname] = copy.deepcopy(default)
            else:
                raise ValidationError(f"field '{prefix}{fname}': missing (required)")
        return out

    return check


def _label(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("logicalType") or schema.get("type"))
    return str(schema)


class _Compiler:
    """Turns a raw Avro schema into a validator, following named-type references."""

    def __init__(self) -> None:
        self.named: dict[str, Validator] = {}

    def compile(self, schema: Any, namespace: str = "") -> Validator:
        if isinstance(schema, list):
            return _union([(_label(b), self.compile(b, namespace)) for b in schema])
        if isinstance(schema, str):
            return self._primitive(schema, namespace)
        if not isinstance(schema, dict):
            raise ValidationError(f"unsupported schema {schema!r}")
        kind = schema.get("type")
        logical = schema.get("logicalType")
        if logical == "date" and kind == "int":
            return _date
        if logical in ("timestamp-millis", "local-timestamp-millis") and kind == "long":
            return _timestamp(1000)
        if logical in ("timestamp-micros", "local-timestamp-micros") and kind == "long":
            return _timestamp(1)
        if logical == "decimal" and kind in ("bytes", "fixed"):
            return _decimal
        if kind == "record" or kind == "error":
            return self._record(schema, namespace)
        if kind == "enum":
            return self._register(schema, namespace, _enum(list(schema["symbols"])))
        if kind == "fixed":
            return self._register(schema, namespace, _fixed(int(schema["size"])))
        if kind == "array":
            return _array(self.compile(schema["items"], namespace))
        if kind == "map":
            return _map(self.compile(schema["values"], namespace))
        return self.compile(kind, namespace)

    def _primitive(self, name: str, namespace: str) -> Validator:
        if name in ("int", "long"):
            return _integer(name)
        if name in ("float", "double"):
            return _floating(name)
        simple = {"string": (str, "string"), "boolean": (bool, "boolean")}
        if name in simple:
            return _simple(*simple[name])
        if name == "null":
            return _null
        if name == "bytes":
            return _bytes
        for candidate in (f"{namespace}.{name}" if namespace else name, name):
            if candidate in self.named:
                # Late binding: a recursive record refers to itself before it is complete.
                return self._late(candidate)
        raise ValidationError(f"unknown type name {name!r}")

    def _late(self, name: str) -> Validator:
        named = self.named

        def check(value: Any, path: str) -> Any:
            return named[name](value, path)

        return check

    def _register(self, schema: dict[str, Any], namespace: str, validator: Validator) -> Validator:
        name = str(schema["name"])
        ns = schema.get("namespace", namespace)
        self.named[name] = validator
        if ns and "." not in name:
            self.named[f"{ns}.{name}"] = validator
        return validator

    def _record(self, schema: dict[str, Any], namespace: str) -> Validator:
        ns = schema.get("namespace", namespace)
        fields: list[tuple[str, Validator, bool, Any]] = []
        self._register(schema, namespace, _null)  # placeholder: the name is known from here on
        # Fields may refer back to this record (recursive types); named references bind
        # late, through self.named, so registering the finished validator afterwards works.
        for field in schema.get("fields", []):
            validator = self.compile(field["type"], ns)
            fields.append((field["name"], validator, "default" in field, field.get("default")))
        return self._register(schema, namespace, _record(fields, str(schema.get("name"))))


def compile_validator(schema: dict[str, Any]) -> Validator:
    """Compile a validator for a raw (unparsed) Avro record schema."""
    return _Compiler().compile(schema)
