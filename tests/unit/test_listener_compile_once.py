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
