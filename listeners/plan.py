"""The plan half of matching: registered listeners, grouped into what to evaluate per type.

:class:`Plans` keeps the registered listeners (:class:`ListenerLike`), one :class:`Filter`
per distinct filter text (identical filters are evaluated once per change), and per entity
type a :class:`Plan`: which variables and fields expressions read (the CEL context is built
with just those), the general filters (native comparison chains grouped by shape, so filters
that differ only in their literals read their operands once), the equality-index lookups,
and the transition filters. Plans are cached until the set of listeners changes.
:mod:`listeners.matcher` evaluates a change against a plan.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from fifolane.errors import ListenerError
from listeners.expr import CompiledExpr, EvaluationError, compile_converter, compile_filter
from listeners.index import eq_key
from listeners.native import SharedComparisons, shape_of

__all__ = ["KINDS", "Filter", "General", "Known", "Listener", "ListenerLike", "ListenerStats", "Needs", "Plan", "Plans",
           "count_error"]

log = logging.getLogger("listeners.matcher")  # where these warnings were always logged

KINDS = frozenset({"created", "modified", "removed"})


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
    """Per-listener counters: notifications produced, run-time errors and the last one,
    evaluations over the per-change budget and the longest one (seconds)."""

    notifications: int = 0
    errors: int = 0
    last_error: str | None = None
    overruns: int = 0
    longest: float = 0.0
    last_overrun: float = 0.0
    error_change: int = -1  # the change whose error was counted last (see count_error)


class Listener:
    __slots__ = ("converter", "entry", "kinds", "name", "stats", "type")

    def __init__(self, name: str, entry: Filter, converter: CompiledExpr | None,
                 kinds: frozenset[str], type_: str | None) -> None:  # fmt: skip
        self.name, self.entry, self.converter = name, entry, converter
        self.kinds, self.type = kinds, type_
        self.stats = ListenerStats()


def count_error(lst: Listener, error: str | Exception, failing: set[str], change: int | None = None) -> None:
    """A run-time evaluation error of ``lst``: counted, kept as its last error, its name added
    to ``failing`` (the runtime reports it in a status record, rate-limited) and logged.

    ``error``: the message, or the exception (any: building a context or running CEL may raise
    more than :class:`EvaluationError`). ``change``: the number of the change (the matcher's
    count); a listener's errors count once per change (a filter fails on the old and on the
    new state: one error), None counts every call."""
    if isinstance(error, str | EvaluationError):
        message = str(error)
    else:
        message = f"{type(error).__name__}: {error}"
    st = lst.stats
    if change is not None:
        if st.error_change == change:
            st.last_error = message
            return
        st.error_change = change
    st.errors += 1
    st.last_error = message
    failing.add(lst.name)
    if st.errors == 1 or st.errors % 10_000 == 0:  # the first, then now and then: not a line a change
        log.warning("listener %r: evaluation failed (%d time(s) on this worker; the change is not "
                    "notified), last: %s", lst.name, st.errors, message)


class Filter:
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
        self.listeners: dict[str, Listener] = {}


class _Scope:
    """The filters of the listeners restricted to one entity type (or to none: all types)."""

    __slots__ = ("general", "index", "old_refs", "transition", "uses", "value_refs", "var_refs")

    def __init__(self) -> None:
        self.general: dict[str, Filter] = {}
        self.transition: dict[str, Filter] = {}
        self.index: dict[tuple[str, ...], dict[tuple[str, Any], dict[str, Filter]]] = {}
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

    def add(self, lst: Listener) -> None:
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

    def remove(self, lst: Listener) -> None:
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


class Needs(NamedTuple):
    variables: frozenset[str]
    value_fields: frozenset[str] | None
    old_fields: frozenset[str] | None


def _fields(counters: Iterable[Counter[str]]) -> frozenset[str] | None:
    names = {n for c in counters for n, k in c.items() if k > 0}
    return None if "*" in names else frozenset(names)


class General(NamedTuple):
    """A scope's general (not indexed) state filters, as :meth:`ListenerSet.match_lazy`
    evaluates them: native comparison chains grouped by shape, the others one by one."""

    groups: tuple[SharedComparisons, ...]
    others: tuple[Filter, ...]


#: One step of finding a state's matching filters: a scope's general filters, or an index
#: lookup (path, its only name if it has one, the buckets).
Step = tuple[General | None, tuple[str, ...], str | None, dict[Any, dict[str, "Filter"]]]


def _general(filters: Iterable[Filter]) -> General:
    groups: dict[tuple[Any, ...], SharedComparisons] = {}
    others: list[Filter] = []
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
    return General(tuple(groups.values()), tuple(others))


class Plan(NamedTuple):
    """What matching a change of one entity type involves (cached until the set changes)."""

    scopes: tuple[_Scope, ...]
    needs: Needs
    steps: tuple[Step, ...]  # in scope order: general filters, then index lookups
    transition: dict[str, Filter]
    indexed: bool  # some step is an index lookup (it may use known old-state fields)


#: A state path whose value is known without decoding the state, and that value.
Known = tuple[tuple[str, ...], Any]



class Plans:
    """The registered listeners and their per-type plans (see the module docstring)."""

    def __init__(self) -> None:
        self._listeners: dict[str, Listener] = {}
        self._filters: dict[str, Filter] = {}
        self._all = _Scope()
        self._typed: dict[str, _Scope] = {}
        self._plans: dict[str, Plan | None] = {}
        #: The plans built so far, by type (read only; :meth:`plan` builds a missing one).
        self.built: Mapping[str, Plan | None] = self._plans

    def add(self, spec: ListenerLike) -> None:
        """Register (or replace) a listener. Raises ``ExpressionError`` for invalid expressions."""
        kinds = frozenset(spec.kinds)
        if not kinds or not kinds <= KINDS:
            raise ListenerError(
                f"listener {spec.name!r}: kinds must be a non-empty subset of {sorted(KINDS)}"
            )
        # A ListenerSpec brings its compiled expressions (compiling 10,000 filters twice took
        # seconds: more than the compile cache holds, so the second pass missed every time).
        expr = getattr(spec, "compiled_filter", None) or compile_filter(spec.filter)
        converter = (getattr(spec, "compiled_convert", None) or compile_converter(spec.convert)) if spec.convert else None
        if spec.name in self._listeners:
            self.remove(spec.name)
        entry = self._filters.get(expr.normalized)
        if entry is None:
            entry = self._filters[expr.normalized] = Filter(expr)
        lst = Listener(spec.name, entry, converter, kinds, spec.type)
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

    def plan(self, type_: str) -> Plan | None:
        """What matching a change of ``type_`` involves (None: no listener applies to it)."""
        try:
            return self._plans[type_]
        except KeyError:
            pass
        scopes = tuple(s for s in (self._all, self._typed.get(type_)) if s)
        plan = None
        if scopes:
            variables = frozenset(v for s in scopes for v, k in s.var_refs.items() if k > 0)
            needs = Needs(
                variables,
                _fields(s.value_refs for s in scopes),
                _fields(s.old_refs for s in scopes),
            )
            # A filter used in both scopes (typed and untyped) is one filter: evaluated once.
            transition: dict[str, Filter] = {}
            general: dict[str, Filter] = {}
            index: dict[tuple[str, ...], dict[Any, dict[str, Filter]]] = {}
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
            steps: list[Step] = []
            if general:
                steps.append((_general(general.values()), (), None, {}))
            for path, buckets in index.items():
                steps.append((None, path, path[0] if len(path) == 1 else None, buckets))
            plan = Plan(scopes, needs, tuple(steps), transition, bool(index))
        self._plans[type_] = plan
        return plan

    def listener(self, name: str) -> Listener:
        """The registered listener of that name (``ListenerError`` if unknown)."""
        try:
            return self._listeners[name]
        except KeyError:
            raise ListenerError(f"unknown listener {name!r}") from None
