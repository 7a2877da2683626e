"""Per-change listener matching: which listeners get a notification, of which kind, with what.

:class:`ListenerSet` holds the registered listeners; the worker calls :meth:`ListenerSet.match`
once per table change. View semantics (DESIGN.md §3): a listener's *view* holds the entities
its filter accepts; a change that makes an entity enter the view is ``created``, one that keeps
it inside is ``modified``, one that makes it leave (a delete, or no longer matching) is
``removed`` with a null projection. So the filter is evaluated on the old and on the new state.

Filters that read ``old`` or ``kind`` describe transitions, not states, so they cannot define a
view: they are evaluated once (``value`` = new, ``old`` = old, ``kind`` = the table change) and
a match is delivered with the table change's kind (the seed's event semantics).

Cost control, per change:
- nothing is built when no listener applies to the change's entity type;
- one CEL context per state (old, new) with only the fields registered expressions read,
  built lazily, and only if an expression actually has to run;
- identical filters (same normalised text) are evaluated once;
- ``value.<path> == <literal>`` conjuncts are looked up in a dict, so 10,000 per-entity
  listeners cost one lookup plus the candidates' remaining conditions. An indexed field that
  is absent counts as "not matching" (not as an error).
A filter that fails at run time counts as not matching; the error is counted per listener.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import cel

from fifolane.errors import ListenerError
from listeners.expr import CompiledExpr, EvaluationError, compile_converter, compile_filter
from listeners.index import MISSING, eq_key, lookup, project
from listeners.native import FALLBACK

__all__ = [
    "KINDS",
    "Change",
    "ListenerLike",
    "ListenerSet",
    "ListenerStats",
    "Matcher",
    "Notification",
]

KINDS = frozenset({"created", "modified", "removed"})


class Change(NamedTuple):
    """One table change as the worker sees it. ``meta``: partition, offset, timestamp, version, type.

    A named tuple: immutable and cheap to build (one per change on the worker's hot path).
    """

    type: str
    key: str
    new: Mapping[str, Any] | None
    old: Mapping[str, Any] | None
    table_change: str
    meta: Mapping[str, Any] = MappingProxyType({})


class Notification(NamedTuple):
    """What to send: the listener, the listener-side kind and the projection (None if removed).

    Without a converter the projection is the change's ``new`` map itself (not a copy).
    """

    listener: str
    kind: str
    value: Mapping[str, Any] | None


class ListenerLike(Protocol):
    """What the matcher needs from a registration (:class:`listeners.model.ListenerSpec` fits)."""

    @property
    def name(self) -> str: ...
    @property
    def filter(self) -> str: ...
    @property
    def convert(self) -> str | None: ...
    @property
    def kinds(self) -> Iterable[str]: ...
    @property
    def type(self) -> str | None: ...


@dataclass(slots=True)
class ListenerStats:
    """Per-listener counters: notifications produced, run-time errors and the last one."""

    notifications: int = 0
    errors: int = 0
    last_error: str | None = None


class _Listener:
    __slots__ = ("converter", "entry", "kinds", "name", "stats", "type")

    def __init__(self, name: str, entry: _Filter, converter: CompiledExpr | None,
                 kinds: frozenset[str], type_: str | None) -> None:  # fmt: skip
        self.name, self.entry, self.converter = name, entry, converter
        self.kinds, self.type = kinds, type_
        self.stats = ListenerStats()


class _Filter:
    """One distinct filter text, shared by all listeners that use it."""

    __slots__ = ("eval_expr", "expr", "indexed", "listeners", "transition")

    def __init__(self, expr: CompiledExpr) -> None:
        self.expr = expr
        self.transition = not expr.is_state_filter
        # Transition filters are not indexed: they are evaluated on one state only.
        self.indexed = expr.equality is not None and not self.transition
        # What CEL must run once the index said "candidate" (None: the lookup decided).
        self.eval_expr: CompiledExpr | None = (
            expr.equality.rest if self.indexed and expr.equality else expr
        )
        self.listeners: dict[str, _Listener] = {}


class _Scope:
    """The filters of the listeners restricted to one entity type (or to none: all types)."""

    __slots__ = ("general", "index", "old_refs", "transition", "uses", "value_refs", "var_refs")

    def __init__(self) -> None:
        self.general: dict[str, _Filter] = {}
        self.transition: dict[str, _Filter] = {}
        self.index: dict[tuple[str, ...], dict[tuple[str, Any], dict[str, _Filter]]] = {}
        self.uses: Counter[str] = Counter()  # listeners per filter text, in this scope
        self.var_refs: Counter[str] = Counter()
        self.value_refs: Counter[str] = Counter()  # field name, or "*" for the whole map
        self.old_refs: Counter[str] = Counter()

    def __bool__(self) -> bool:
        return bool(self.uses)

    def _refs(self, exprs: Iterable[CompiledExpr | None], sign: int) -> None:
        for e in exprs:
            if e is None:
                continue
            for v in e.variables:
                self.var_refs[v] += sign
            for var, counter in (("value", self.value_refs), ("old", self.old_refs)):
                if var in e.fields:
                    names = e.fields[var]
                    for n in ("*",) if names is None else names:
                        counter[n] += sign

    def add(self, lst: _Listener) -> None:
        f = lst.entry
        norm = f.expr.normalized
        self._refs((f.eval_expr, lst.converter), +1)
        self.uses[norm] += 1
        if self.uses[norm] > 1:
            return
        if f.transition:
            self.transition[norm] = f
        elif f.indexed and f.expr.equality is not None:
            key = eq_key(f.expr.equality.literal)
            assert key is not None  # the analyser only indexes scalar literals
            self.index.setdefault(f.expr.equality.path, {}).setdefault(key, {})[norm] = f
        else:
            self.general[norm] = f

    def remove(self, lst: _Listener) -> None:
        f = lst.entry
        norm = f.expr.normalized
        self._refs((f.eval_expr, lst.converter), -1)
        for c in (self.var_refs, self.value_refs, self.old_refs):
            c += Counter()  # drops zero counts
        self.uses[norm] -= 1
        if self.uses[norm] > 0:
            return
        del self.uses[norm]
        self.general.pop(norm, None)
        self.transition.pop(norm, None)
        if f.indexed and f.expr.equality is not None:
            buckets = self.index[f.expr.equality.path]
            key = eq_key(f.expr.equality.literal)
            assert key is not None
            buckets[key].pop(norm, None)
            if not buckets[key]:
                del buckets[key]
            if not buckets:
                del self.index[f.expr.equality.path]


class _Needs(NamedTuple):
    variables: frozenset[str]
    value_fields: frozenset[str] | None
    old_fields: frozenset[str] | None


def _fields(counters: Iterable[Counter[str]]) -> frozenset[str] | None:
    names = {n for c in counters for n, k in c.items() if k > 0}
    return None if "*" in names else frozenset(names)


class ListenerSet:
    """The registered listeners of a worker; :meth:`match` turns a change into notifications.

    Not thread-safe: the worker calls it from one thread (or guards it).
    """

    def __init__(self) -> None:
        self._listeners: dict[str, _Listener] = {}
        self._filters: dict[str, _Filter] = {}
        self._all = _Scope()
        self._typed: dict[str, _Scope] = {}
        self._needs: dict[str | None, _Needs] = {}
        #: CEL filter runs (indexed pure equalities do not count), converter runs, changes seen.
        self.evaluations = 0
        self.conversions = 0
        self.changes = 0

    # -- registration ------------------------------------------------------------------------
    def add(self, spec: ListenerLike) -> None:
        """Register (or replace) a listener. Raises ``ExpressionError`` for invalid expressions."""
        kinds = frozenset(spec.kinds)
        if not kinds or not kinds <= KINDS:
            raise ListenerError(
                f"listener {spec.name!r}: kinds must be a non-empty subset of {sorted(KINDS)}"
            )
        expr = compile_filter(spec.filter)
        converter = compile_converter(spec.convert) if spec.convert else None
        if spec.name in self._listeners:
            self.remove(spec.name)
        entry = self._filters.get(expr.normalized)
        if entry is None:
            entry = self._filters[expr.normalized] = _Filter(expr)
        lst = _Listener(spec.name, entry, converter, kinds, spec.type)
        entry.listeners[spec.name] = lst
        self._listeners[spec.name] = lst
        self._scope(spec.type, create=True).add(lst)
        self._needs.clear()

    def remove(self, name: str) -> bool:
        """Unregister a listener; return False if there was none with that name."""
        lst = self._listeners.pop(name, None)
        if lst is None:
            return False
        entry = lst.entry
        del entry.listeners[name]
        if not entry.listeners:
            del self._filters[entry.expr.normalized]
        scope = self._scope(lst.type, create=False)
        scope.remove(lst)
        if lst.type is not None and not scope:
            del self._typed[lst.type]
        self._needs.clear()
        return True

    def __len__(self) -> int:
        return len(self._listeners)

    def __contains__(self, name: object) -> bool:
        return name in self._listeners

    def names(self) -> list[str]:
        """Registered listener names, sorted."""
        return sorted(self._listeners)

    def stats(self, name: str) -> ListenerStats:
        """The counters of one listener (``ListenerError`` if unknown)."""
        try:
            return self._listeners[name].stats
        except KeyError:
            raise ListenerError(f"unknown listener {name!r}") from None

    def _scope(self, type_: str | None, *, create: bool) -> _Scope:
        if type_ is None:
            return self._all
        if create:
            return self._typed.setdefault(type_, _Scope())
        return self._typed[type_]

    def _needs_for(self, type_: str, scopes: list[_Scope]) -> _Needs:
        needs = self._needs.get(type_)
        if needs is None:
            variables = frozenset(v for s in scopes for v, k in s.var_refs.items() if k > 0)
            needs = _Needs(
                variables,
                _fields(s.value_refs for s in scopes),
                _fields(s.old_refs for s in scopes),
            )
            self._needs[type_] = needs
        return needs

    # -- matching ----------------------------------------------------------------------------
    def match(self, change: Change) -> list[Notification]:
        """The notifications one table change produces, in listener-registration-independent order."""
        self.changes += 1
        scopes = [s for s in (self._all, self._typed.get(change.type)) if s]
        if not scopes:
            return []
        new, old = change.new, change.old
        new_cands: dict[str, _Filter] = {}
        old_cands: dict[str, _Filter] = {}
        transition: dict[str, _Filter] = {}
        for s in scopes:
            transition.update(s.transition)
            for state, cands in ((new, new_cands), (old, old_cands)):
                if state is None:
                    continue
                cands.update(s.general)
                for path, buckets in s.index.items():
                    v = lookup(state, path)
                    key = eq_key(v) if v is not MISSING else None
                    bucket = buckets.get(key) if key is not None else None
                    if bucket:
                        cands.update(bucket)
        if not (new_cands or old_cands or transition):
            return []

        ctx = _Contexts(change, self._needs_for(change.type, scopes))
        in_new = {n: self._test(f, ctx, "new", change.type) for n, f in new_cands.items()}
        in_old = {n: self._test(f, ctx, "old", change.type) for n, f in old_cands.items()}

        out: list[Notification] = []
        for norm in {**old_cands, **new_cands}:
            a, b = in_old.get(norm, False), in_new.get(norm, False)
            if a or b:
                kind = ("modified" if a else "created") if b else "removed"
                self._notify(self._filters[norm], kind, change, ctx, out)
        for f in transition.values():
            if self._test(f, ctx, "event", change.type):
                self._notify(f, change.table_change, change, ctx, out)
        return out

    def match_current(self, name: str, change: Change) -> Notification | None:
        """For include-current-state: the ``created`` notification of one existing entity
        (``change.new``) for one listener, or None if it is not in the listener's view."""
        try:
            lst = self._listeners[name]
        except KeyError:
            raise ListenerError(f"unknown listener {name!r}") from None
        if change.new is None or (lst.type is not None and lst.type != change.type):
            return None
        expr = lst.entry.expr
        ctx = _Contexts(
            change,
            _Needs(
                expr.variables | (lst.converter.variables if lst.converter else frozenset()),
                None,
                None,
            ),
        )
        side = "event" if lst.entry.transition else "new"
        try:
            self.evaluations += 1
            native = expr.native
            result = native(change.key, change.new) if native is not None else FALLBACK
            if result is FALLBACK:
                result = expr.test(ctx.get(side))
            if not result:
                return None
        except EvaluationError as exc:
            _count_error(lst, exc)
            return None
        out: list[Notification] = []
        self._emit(lst, "created", change, ctx, out)
        return out[0] if out else None

    def _test(self, f: _Filter, ctx: _Contexts, side: str, type_: str) -> bool:
        expr = f.eval_expr
        if expr is None:
            return True  # a pure equality: the index lookup already matched
        self.evaluations += 1
        native = expr.native
        if native is not None:  # plain data and a simple filter: no CEL context at all
            c = ctx.change
            result = native(c.key, c.old if side == "old" else c.new)
            if result is not FALLBACK:
                return bool(result)
        try:
            return expr.test(ctx.get(side))
        except EvaluationError as exc:
            for lst in f.listeners.values():
                if lst.type is None or lst.type == type_:
                    _count_error(lst, exc)
            return False

    def _notify(
        self, f: _Filter, kind: str, change: Change, ctx: _Contexts, out: list[Notification]
    ) -> None:
        for lst in f.listeners.values():
            if kind in lst.kinds and (lst.type is None or lst.type == change.type):
                self._emit(lst, kind, change, ctx, out)

    def _emit(
        self, lst: _Listener, kind: str, change: Change, ctx: _Contexts, out: list[Notification]
    ) -> None:
        projection: Mapping[str, Any] | None = None
        if kind != "removed":
            if lst.converter is None:
                projection = change.new
            else:
                self.conversions += 1
                native = lst.converter.native
                result = native(change.key, change.new) if native is not None else FALLBACK
                if result is not FALLBACK:
                    lst.stats.notifications += 1
                    out.append(Notification(lst.name, kind, result))
                    return
                try:
                    projection = lst.converter.project(ctx.converter(kind))
                except EvaluationError as exc:
                    _count_error(lst, exc)
                    return
        lst.stats.notifications += 1
        out.append(Notification(lst.name, kind, projection))


def _count_error(lst: _Listener, exc: EvaluationError) -> None:
    lst.stats.errors += 1
    lst.stats.last_error = str(exc)


class _Contexts:
    """The CEL contexts of one change, each built at most once and only when needed."""

    __slots__ = ("_change", "_ctx", "_needs", "change")

    def __init__(self, change: Change, needs: _Needs) -> None:
        self.change = self._change = change
        self._needs = needs
        self._ctx: dict[str, Any] = {}

    def _build(self, value: Any, old: Any, kind: str) -> Any:
        n, c = self._needs, self._change
        variables: dict[str, Any] = {}
        if "key" in n.variables:
            variables["key"] = c.key
        if "value" in n.variables:
            variables["value"] = project(value, n.value_fields)
        if "old" in n.variables:
            variables["old"] = project(old, n.old_fields)
        if "kind" in n.variables:
            variables["kind"] = kind
        if "meta" in n.variables:
            variables["meta"] = dict(c.meta)
        return cel.Context(variables)

    def get(self, side: str) -> Any:
        """``new``: value=new (kind = table change); ``old``: the old state as the value
        (only state filters run there, so ``old``/``kind`` are unused); ``event``: like new."""
        ctx = self._ctx.get(side if side != "event" else "new")
        if ctx is None:
            c = self._change
            if side == "old":
                ctx = self._build(c.old, None, "modified")
            else:
                side = "new"
                ctx = self._build(c.new, c.old, c.table_change)
            self._ctx[side] = ctx
        return ctx

    def converter(self, kind: str) -> Any:
        """Converters see the new state and the listener-side kind."""
        ctx = self.get("new")
        if "kind" in self._needs.variables and kind != self._change.table_change:
            key = "conv:" + kind
            ctx = self._ctx.get(key)
            if ctx is None:
                ctx = self._ctx[key] = self._build(self._change.new, self._change.old, kind)
        return ctx


#: The brief's name for the same thing.
Matcher = ListenerSet
