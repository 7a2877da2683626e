"""One change as the matcher sees it: the old state and ``meta`` produced on first use, and
the CEL contexts, each built at most once and only when an expression needs one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from listeners.celvalues import cel_context
from listeners.index import project
from listeners.plan import Needs

__all__ = ["UNSET", "Contexts"]

UNSET: Any = object()


class Contexts:
    """One change as the matcher sees it: the old state and ``meta`` produced on first use,
    and the CEL contexts, each built at most once and only when needed."""

    __slots__ = ("_ctx", "_meta", "_needs", "_old", "key", "new", "table_change", "type")

    def __init__(
        self,
        type_: str,
        key: str,
        new: Mapping[str, Any] | None,
        old: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None,
        table_change: str,
        meta: Mapping[str, Any] | tuple[int, int | None, int, int],
        needs: Needs,
    ) -> None:
        self.type, self.key, self.new = type_, key, new
        self._old = old
        self.table_change = table_change
        self._meta = meta
        self._needs = needs
        self._ctx: dict[str, Any] | None = None  # built on the first get(): most changes need none

    def old_state(self) -> Any:
        """The old state (decoded now if it was handed over as a function)."""
        old = self._old
        if callable(old):
            old = self._old = old()
        return old

    def _build(self, value: Any, with_old: bool, kind: str) -> Any:
        n = self._needs
        variables: dict[str, Any] = {}
        if "key" in n.variables:
            variables["key"] = self.key
        if "value" in n.variables:
            variables["value"] = project(value, n.value_fields)
        if "old" in n.variables:
            variables["old"] = project(self.old_state() if with_old else None, n.old_fields)
        if "kind" in n.variables:
            variables["kind"] = kind
        if "meta" in n.variables:
            meta = self._meta
            if isinstance(meta, tuple):
                p, offset, ts, version = meta
                meta = self._meta = {"partition": p, "offset": offset, "timestamp": ts,
                                     "version": version, "type": self.type}  # fmt: skip
            variables["meta"] = dict(meta)
        return cel_context(variables)  # converts dates, times, UUIDs only if CEL refused them

    def get(self, side: str) -> Any:
        """``new``: value=new (kind = table change); ``old``: the old state as the value
        (only state filters run there, so ``old``/``kind`` are unused); ``event``: like new."""
        built = self._ctx
        if built is None:
            built = self._ctx = {}
        ctx = built.get(side if side != "event" else "new")
        if ctx is None:
            if side == "old":
                ctx = self._build(self.old_state(), False, "modified")
            else:
                side = "new"
                ctx = self._build(self.new, True, self.table_change)
            built[side] = ctx
        return ctx

    def converter(self, kind: str) -> Any:
        """Converters see the new state and the listener-side kind."""
        ctx = self.get("new")
        if "kind" in self._needs.variables and kind != self.table_change:
            key = "conv:" + kind
            built = self._ctx
            assert built is not None  # get() made it
            ctx = built.get(key)
            if ctx is None:
                ctx = built[key] = self._build(self.new, True, kind)
        return ctx
