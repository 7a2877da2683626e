"""Per-change listener matching: which listeners get a notification, of which kind, with what.

:class:`ListenerSet` holds the registered listeners; the worker calls :meth:`ListenerSet.match`
once per table change. View semantics (DESIGN.md §3): a listener's *view* holds the entities
its filter accepts; a change that makes an entity enter the view is ``created``, one that keeps
it inside is ``modified``, one that makes it leave (a delete, or no longer matching) is
``removed`` with a null projection. So the filter is evaluated on the old and on the new state.

Filters that read ``old`` or ``kind`` describe transitions, not states, so they cannot define a
view: they are evaluated once (``value`` = new, ``old`` = old, ``kind`` = the table change) and
a match is delivered with the table change's kind (the seed's event semantics).

Cost control, per change (:meth:`ListenerSet.match_lazy`, the worker's entry point):
- nothing is built when no listener applies to the change's entity type;
- ``value.<path> == <literal>`` conjuncts are looked up in a dict, so 10,000 per-entity
  listeners cost one lookup per state plus the candidates' remaining conditions. An indexed
  field that is absent counts as "not matching" (not as an error);
- the old state is decoded only if something needs it: the worker passes it as a function,
  and the index takes the old state's group and key fields from the stored row and the
  entity key (``known``). So a change that no per-entity listener can match costs two dict
  lookups, and a listener leaving an entity's group needs no decode either;
- identical filters (same normalised text) are evaluated once per state;
- simple comparison chains run natively (:mod:`listeners.native`), and general filters that
  differ only in their literals (``value.amount > 100.0``, ``value.amount > 250.0``) run
  together: their operands are read and checked once per state;
- one CEL context per state (old, new) with only the fields registered expressions read,
  built lazily, and only if an expression actually has to run in CEL.
A filter that fails at run time counts as not matching; the error is counted per listener.

Order of the notifications of one change: leaving or staying in views (``removed``,
``modified``), then entering (``created``), then transition filters; each listener gets at
most one notification per change, so the order only matters on a shared output topic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import cel

from fifolane.errors import ListenerError
from listeners.expr import CompiledExpr, EvaluationError, compile_converter, compile_filter
from listeners.index import MISSING, eq_key, lookup, project
from listeners.native import FALLBACK, SharedComparisons, shape_of

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

    __slots__ = ("eval_expr", "expr", "indexed", "listeners", "norm", "transition")

    def __init__(self, expr: CompiledExpr) -> None:
        self.expr = expr
        self.norm = expr.normalized
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


class _General(NamedTuple):
    """A scope's general (not indexed) state filters, as :meth:`ListenerSet.match_lazy`
    evaluates them: native comparison chains grouped by shape, the others one by one."""

    groups: tuple[SharedComparisons, ...]
    others: tuple[_Filter, ...]


#: One step of finding a state's matching filters: a scope's general filters, or an index
#: lookup (path, its only name if it has one, the buckets).
_Step = tuple[_General | None, tuple[str, ...], str | None, dict[Any, dict[str, "_Filter"]]]


def _general(filters: Iterable[_Filter]) -> _General:
    groups: dict[tuple[Any, ...], SharedComparisons] = {}
    others: list[_Filter] = []
    for f in filters:
        terms = f.expr.comparisons
        if terms is None:
            others.append(f)
            continue
        shape = shape_of(terms)
        group = groups.get(shape)
        if group is None:
            group = groups[shape] = SharedComparisons(shape)
        group.add(f, terms)
    return _General(tuple(groups.values()), tuple(others))


class _Plan(NamedTuple):
    """What matching a change of one entity type involves (cached until the set changes)."""

    scopes: tuple[_Scope, ...]
    needs: _Needs
    steps: tuple[_Step, ...]  # in scope order: general filters, then index lookups
    transition: dict[str, _Filter]


#: A state path whose value is known without decoding the state, and that value.
Known = tuple[tuple[str, ...], Any]


class ListenerSet:
    """The registered listeners of a worker; :meth:`match` turns a change into notifications.

    Not thread-safe: the worker calls it from one thread (or guards it).
    """

    def __init__(self) -> None:
        self._listeners: dict[str, _Listener] = {}
        self._filters: dict[str, _Filter] = {}
        self._all = _Scope()
        self._typed: dict[str, _Scope] = {}
        self._plans: dict[str, _Plan | None] = {}
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
        self._plans.clear()

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
        self._plans.clear()
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

    def _plan(self, type_: str) -> _Plan | None:
        try:
            return self._plans[type_]
        except KeyError:
            pass
        scopes = tuple(s for s in (self._all, self._typed.get(type_)) if s)
        plan = None
        if scopes:
            variables = frozenset(v for s in scopes for v, k in s.var_refs.items() if k > 0)
            needs = _Needs(
                variables,
                _fields(s.value_refs for s in scopes),
                _fields(s.old_refs for s in scopes),
            )
            # A filter used in both scopes (typed and untyped) is one filter: evaluated once.
            transition: dict[str, _Filter] = {}
            general: dict[str, _Filter] = {}
            index: dict[tuple[str, ...], dict[Any, dict[str, _Filter]]] = {}
            for s in scopes:
                transition.update(s.transition)
                general.update(s.general)
                for path, buckets in s.index.items():
                    have = index.get(path)
                    if have is None:
                        index[path] = buckets  # the scope's own (usual: one scope)
                        continue
                    merged = {k: dict(b) for k, b in have.items()}
                    for k, b in buckets.items():
                        merged.setdefault(k, {}).update(b)
                    index[path] = merged
            steps: list[_Step] = []
            if general:
                steps.append((_general(general.values()), (), None, {}))
            for path, buckets in index.items():
                steps.append((None, path, path[0] if len(path) == 1 else None, buckets))
            plan = _Plan(scopes, needs, tuple(steps), transition)
        self._plans[type_] = plan
        return plan

    # -- matching ----------------------------------------------------------------------------
    def match(self, change: Change) -> list[Notification]:
        """The notifications one table change produces (see the module docstring)."""
        return self.match_lazy(change.type, change.key, change.new, change.old,
                               change.table_change, change.meta)  # fmt: skip

    def match_lazy(
        self,
        type_: str,
        key: str,
        new: Mapping[str, Any] | None,
        old: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None,
        table_change: str,
        meta: Mapping[str, Any] | tuple[int, int | None, int, int] = MappingProxyType({}),
        known: tuple[Known, ...] = (),
    ) -> list[Notification]:
        """:meth:`match` for the worker's hot path: the same notifications, less work.

        ``old`` may be a zero-argument function that returns the old state: it is called at
        most once, and only if some expression or index lookup needs the old state. ``meta``
        may be given as ``(partition, offset, timestamp, version)``: the map is built only if
        an expression reads it. ``known``: ``(path, value)`` pairs of the *old* state that are
        known without decoding it (the entity's group and key fields); the equality index uses
        them, so a change that no listener's filter can match costs no decode.
        """
        self.changes += 1
        plan = self._plan(type_)
        if plan is None:
            return []
        steps, transition = plan.steps, plan.transition
        ctx: _Contexts | None = None  # built when an expression needs more than the index
        # The filters that accept the new state, then the old one (norm -> filter, in step
        # order). Each filter runs at most once per state; a pure equality does not run at
        # all (the index decided); one that fails counts as not matching.
        new_hits: dict[str, _Filter] = {}
        if new is not None:
            plain = type(new) is dict
            for general, path, name, buckets in steps:
                if general is not None:
                    if ctx is None:
                        ctx = _Contexts(type_, key, new, old, table_change, meta, plan.needs)
                    self._run_general(general, ctx, new, "new", new_hits)
                    continue
                v = new.get(name, MISSING) if plain and name is not None else lookup(new, path)
                bucket = buckets.get(("s", v)) if type(v) is str else _bucket(v, buckets)
                if bucket:
                    for norm, f in bucket.items():
                        if f.eval_expr is None:
                            new_hits[norm] = f
                            continue
                        if ctx is None:
                            ctx = _Contexts(type_, key, new, old, table_change, meta, plan.needs)
                        if self._run(f, ctx, new, "new"):
                            new_hits[norm] = f
        old_hits: dict[str, _Filter] = {}
        if old is not None:
            state: Any = _UNSET  # the old state, decoded when first needed
            for general, path, name, buckets in steps:
                if general is not None:
                    if ctx is None:
                        ctx = _Contexts(type_, key, new, old, table_change, meta, plan.needs)
                    if state is _UNSET:
                        state = ctx.old_state()
                    self._run_general(general, ctx, state, "old", old_hits)
                    continue
                for kp, kv in known:
                    if kp == path:
                        v = kv
                        break
                else:
                    if state is _UNSET:
                        if ctx is None:
                            ctx = _Contexts(type_, key, new, old, table_change, meta, plan.needs)
                        state = ctx.old_state()
                    if name is not None and type(state) is dict:
                        v = state.get(name, MISSING)
                    else:
                        v = lookup(state, path)
                bucket = buckets.get(("s", v)) if type(v) is str else _bucket(v, buckets)
                if not bucket:
                    continue
                for norm, f in bucket.items():
                    if f.eval_expr is None:
                        old_hits[norm] = f
                        continue
                    if ctx is None:
                        ctx = _Contexts(type_, key, new, old, table_change, meta, plan.needs)
                    if state is _UNSET:
                        state = ctx.old_state()
                    if self._run(f, ctx, state, "old"):
                        old_hits[norm] = f
        if not (new_hits or old_hits or transition):
            return []
        if ctx is None:
            ctx = _Contexts(type_, key, new, old, table_change, meta, plan.needs)

        out: list[Notification] = []
        notify = self._notify
        for norm, f in old_hits.items():  # in the view before: it stays or leaves
            notify(f, "modified" if norm in new_hits else "removed", ctx, out)
        for norm, f in new_hits.items():  # in the view now only: it enters
            if norm not in old_hits:
                notify(f, "created", ctx, out)
        for f in transition.values():
            if self._test(f, ctx, "event", type_):
                notify(f, table_change, ctx, out)
        return out

    def _run_general(self, general: _General, ctx: _Contexts, state: Any, side: str,
                     hits: dict[str, _Filter]) -> None:  # fmt: skip
        """Add the general filters that accept ``state`` to ``hits``."""
        found: list[_Filter] = []
        unsure: list[_Filter] = []
        key = ctx.key
        runs = 0
        for group in general.groups:
            runs += group.run(key, state, found, unsure)
        self.evaluations += runs
        for f in found:
            hits[f.norm] = f
        for f in unsure:  # the data is not the plain case: CEL decides
            if self._test(f, ctx, side, ctx.type):
                hits[f.norm] = f
        for f in general.others:
            if self._run(f, ctx, state, side):
                hits[f.norm] = f

    def _run(self, f: _Filter, ctx: _Contexts, state: Any, side: str) -> bool:
        """Whether ``f`` accepts ``state`` (the ``side`` state of ``ctx``): natively if it
        can, else with CEL."""
        e = f.eval_expr
        assert e is not None
        native = e.native
        if native is not None:
            r = native(ctx.key, state)
            if r is not FALLBACK:
                self.evaluations += 1
                return bool(r)
        return self._test(f, ctx, side, ctx.type)

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
        needs = _Needs(
            expr.variables | (lst.converter.variables if lst.converter else frozenset()),
            None,
            None,
        )
        ctx = _Contexts(change.type, change.key, change.new, change.old, change.table_change,
                        change.meta, needs)  # fmt: skip
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
        self._emit(lst, "created", ctx, out)
        return out[0] if out else None

    def _test(self, f: _Filter, ctx: _Contexts, side: str, type_: str) -> bool:
        expr = f.eval_expr
        if expr is None:
            return True  # a pure equality: the index lookup already matched
        self.evaluations += 1
        native = expr.native
        if native is not None:  # plain data and a simple filter: no CEL context at all
            result = native(ctx.key, ctx.old_state() if side == "old" else ctx.new)
            if result is not FALLBACK:
                return bool(result)
        try:
            return expr.test(ctx.get(side))
        except EvaluationError as exc:
            for lst in f.listeners.values():
                if lst.type is None or lst.type == type_:
                    _count_error(lst, exc)
            return False

    def _notify(self, f: _Filter, kind: str, ctx: _Contexts, out: list[Notification]) -> None:
        type_ = ctx.type
        for lst in f.listeners.values():
            if kind in lst.kinds and (lst.type is None or lst.type == type_):
                if lst.converter is None:  # the projection is the new state itself
                    lst.stats.notifications += 1
                    out.append(_notification((lst.name, kind,
                                              None if kind == "removed" else ctx.new)))  # fmt: skip
                else:
                    self._emit(lst, kind, ctx, out)

    def _emit(self, lst: _Listener, kind: str, ctx: _Contexts, out: list[Notification]) -> None:
        projection: Mapping[str, Any] | None = None
        if kind != "removed":
            if lst.converter is None:
                projection = ctx.new
            else:
                self.conversions += 1
                native = lst.converter.native
                result = native(ctx.key, ctx.new) if native is not None else FALLBACK
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


def _bucket(v: Any, buckets: dict[Any, dict[str, _Filter]]) -> dict[str, _Filter] | None:
    """The filters whose indexed equality ``v`` satisfies (None if ``v`` is MISSING)."""
    if v is MISSING:
        return None
    k = eq_key(v)
    return buckets.get(k) if k is not None else None


def _notification(fields: tuple[str, str, Mapping[str, Any] | None]) -> Notification:
    """``Notification(*fields)`` without the named tuple's Python-level ``__new__``."""
    return tuple.__new__(Notification, fields)


def _count_error(lst: _Listener, exc: EvaluationError) -> None:
    lst.stats.errors += 1
    lst.stats.last_error = str(exc)


_UNSET: Any = object()


class _Contexts:
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
        needs: _Needs,
    ) -> None:
        self.type, self.key, self.new = type_, key, new
        self._old = old
        self.table_change = table_change
        self._meta = meta
        self._needs = needs
        self._ctx: dict[str, Any] = {}

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
        return cel.Context(variables)

    def get(self, side: str) -> Any:
        """``new``: value=new (kind = table change); ``old``: the old state as the value
        (only state filters run there, so ``old``/``kind`` are unused); ``event``: like new."""
        ctx = self._ctx.get(side if side != "event" else "new")
        if ctx is None:
            if side == "old":
                ctx = self._build(self.old_state(), False, "modified")
            else:
                side = "new"
                ctx = self._build(self.new, True, self.table_change)
            self._ctx[side] = ctx
        return ctx

    def converter(self, kind: str) -> Any:
        """Converters see the new state and the listener-side kind."""
        ctx = self.get("new")
        if "kind" in self._needs.variables and kind != self.table_change:
            key = "conv:" + kind
            ctx = self._ctx.get(key)
            if ctx is None:
                ctx = self._ctx[key] = self._build(self.new, True, kind)
        return ctx


#: The brief's name for the same thing.
Matcher = ListenerSet
