"""A registration's filter and converter are compiled once (the spec carries them into the
matcher's plans), whatever the compile cache holds: with more distinct filters than the
cache, validating them all and then adding them all compiled every one twice."""

from __future__ import annotations

import cel
import pytest

import listeners.expr as expr_module
from listeners.matcher import ListenerSet
from listeners.model import ListenerSpec


def test_adding_specs_compiles_nothing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[str] = []
    real = cel.compile

    def counting(src: str) -> object:
        compiled.append(src)
        return real(src)

    monkeypatch.setattr(expr_module.cel, "compile", counting)
    expr_module._compile.cache_clear()
    specs = [ListenerSpec(name=f"l{i}", filter=f'value.flight == "F{i}"', convert="{'id': key}")
             for i in range(20)]
    assert len(compiled) == 21  # 20 filters, 1 converter shared through the cache
    expr_module._compile.cache_clear()  # as if the cache had evicted them meanwhile
    matcher = ListenerSet()
    for spec in specs:
        matcher.add(spec)
    assert len(compiled) == 21
    assert [n.listener for n in matcher.match_lazy("reservation", "k", {"flight": "F3"}, None, "created")] == ["l3"]


def test_a_spec_with_its_compiled_expressions_copies_and_pickles() -> None:
    import copy
    import dataclasses
    import pickle

    spec = ListenerSpec(name="a", filter='value.flight == "F1" && value.seats > 2', convert="{'id': key}")
    for other in (copy.copy(spec), copy.deepcopy(spec), pickle.loads(pickle.dumps(spec))):
        assert other == spec
        assert other.compiled_filter is not None and other.compiled_filter.source == spec.filter
        assert other.compiled_convert is not None and other.compiled_convert.source == spec.convert
        matcher = ListenerSet()
        matcher.add(other)
        hits = matcher.match_lazy("reservation", "k", {"flight": "F1", "seats": 3}, None, "created")
        assert [(n.listener, n.value) for n in hits] == [("a", {"id": "k"})]
    assert dataclasses.asdict(spec)["filter"] == spec.filter
