"""The evaluation half of matching: which listeners a table change notifies, of which kind.

:class:`ListenerSet` holds the registered listeners (:class:`listeners.plan.Plans`); the
worker's listener runtime calls :meth:`ListenerSet.match_lazy` once per table change. View
semantics (docs/formats.md): a listener's *view* holds the entities its filter accepts; a
change that makes an entity enter the view is ``created``, one that keeps it inside is
``modified``, one that makes it leave (a delete, or no longer matching) is ``removed`` with a
null projection. So the filter is evaluated on the old and on the new state, by one routine
(:meth:`ListenerSet._hits`). Filters that read ``old`` or ``kind`` describe transitions, not
states: they are evaluated once (``value`` = new, ``old`` = old, ``kind`` = the table change)
and a match is delivered with the table change's kind.

Cost control, per change: nothing is built when no listener applies to the entity type;
``value.<path> == <literal>`` conjuncts are looked up in a dict (an indexed field that is
absent counts as "not matching"); the old state is decoded only if something needs it (the
index takes the old state's group and key fields from the stored row: ``known``); identical
filters run once per state; simple comparison chains run natively; one CEL context per
state, with only the fields registered expressions read. A filter that fails at run time
(any exception, building the context too) counts as not matching; the error is counted per
listener, at most once per change. A CEL evaluation that takes more
than ``budget`` CPU seconds counts against its listeners; one over budget too often
(:meth:`ListenerSet._timed`) is reported in :attr:`ListenerSet.overruns`, and the runtime
suspends it.

Order of the notifications of one change: leaving or staying in views (``removed``,
``modified``), then entering (``created``), then transition filters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from listeners.contexts import UNSET, Contexts
from listeners.index import MISSING, eq_key, lookup
from listeners.native import FALLBACK
from listeners.plan import (
    KINDS,
    Filter,
    General,
    Known,
    Listener,
    ListenerLike,
    ListenerStats,
    Needs,
    Plan,
    Plans,
    count_error,
)

__all__ = ["KINDS", "Change", "ListenerLike", "ListenerSet", "ListenerStats", "Notification"]

log = logging.getLogger(__name__)

#: CPU seconds one CEL evaluation may take before it counts against its listeners.
BUDGET_S = 0.05

#: No filter accepted a state (shared, never changed).
_NO_HITS: Mapping[str, Any] = MappingProxyType({})
#: Overruns within the window that make a listener over budget.
OVERRUNS, OVERRUN_WINDOW_S = 3, 60.0


class Change(NamedTuple):
    """One table change. ``meta``: partition, offset, timestamp, version, type."""

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


class ListenerSet:
    """The registered listeners of a worker; :meth:`match` turns a change into notifications.

    Not thread-safe: the worker calls it from one thread.
    """

    def __init__(self, budget: float = BUDGET_S) -> None:
        self._plans = Plans()
        #: the plans built so far, by entity type (read only)
        self.built = self._built = self._plans.built
        self.budget = budget
        #: names of listeners whose evaluation overran the budget since the last :meth:`take_overruns`
        self.overruns: set[str] = set()
        #: names of listeners with evaluation errors since the last :meth:`take_failing`
        self.failing: set[str] = set()
        #: CEL filter runs (indexed pure equalities do not count), converter runs, changes seen.
        self.evaluations = 0
        self.conversions = 0
        self.changes = 0

    # -- registration (see listeners.plan) -----------------------------------------------------
    def add(self, spec: ListenerLike) -> None:
        """Register (or replace) a listener. Raises ``ExpressionError`` for invalid expressions."""
        self._plans.add(spec)

    def remove(self, name: str) -> bool:
        """Unregister a listener; return False if there was none with that name."""
        self.overruns.discard(name)
        return self._plans.remove(name)

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, name: object) -> bool:
        return name in self._plans

    def names(self) -> list[str]:
        """Registered listener names, sorted."""
        return self._plans.names()

    def stats(self, name: str) -> ListenerStats:
        """The counters of one listener (``ListenerError`` if unknown)."""
        return self._plans.stats(name)

    def take_overruns(self) -> set[str]:
        """The listeners over budget since the last call."""
        out, self.overruns = self.overruns, set()
        return out

    def take_failing(self) -> set[str]:
        """The listeners whose evaluations failed since the last call."""
        out, self.failing = self.failing, set()
        return out

    def converter_failed(self, name: str, message: str) -> None:
        """A projection made by ``name``'s converter could not be sent: its error, not a notification."""
        if name in self._plans:
            st = self.stats(name)
            st.notifications -= 1
            count_error(self._plans.listener(name), message, self.failing, self.changes)

    # -- matching ------------------------------------------------------------------------------
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
        plan = self._built.get(type_, UNSET)
        if plan is UNSET:
            plan = self._plans.plan(type_)
        if plan is None:
            return []
        # The contexts are built only when an expression, the old state or a notification
        # needs them: most changes of an indexed listener set end at an index miss.
        args = (type_, key, new, old, table_change, meta, plan.needs)
        ctx: Contexts | None = None
        new_hits = old_hits = _NO_HITS
        if new is not None:
            new_hits, ctx = self._hits(plan, args, ctx, "new", new, ())
        if old is not None:
            old_hits, ctx = self._hits(plan, args, ctx, "old", UNSET, known)
        transition = plan.transition
        if not (new_hits or old_hits or transition):
            return []
        if ctx is None:
            ctx = Contexts(*args)
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

    def _hits(self, plan: Plan, args: tuple[Any, ...], ctx: Contexts | None, side: str, state: Any,
              known: tuple[Known, ...]) -> tuple[Mapping[str, Filter], Contexts | None]:
        """The filters that accept the ``side`` state (``new`` or ``old``), in step order,
        and the change's contexts (built from ``args`` here if ``ctx`` is None and an
        expression or the old state is needed).

        ``state`` is the state, or UNSET to decode it from the contexts when first needed.
        Each filter runs at most once; a pure equality does not run at all (the index decided).
        """
        hits: dict[str, Filter] | None = None
        for general, path, name, buckets in plan.steps:
            if general is not None:
                if ctx is None:
                    ctx = Contexts(*args)
                if state is UNSET:
                    state = ctx.old_state()
                if hits is None:
                    hits = {}
                self._run_general(general, ctx, state, side, hits)
                continue
            for kp, kv in known:
                if kp == path:
                    v = kv
                    break
            else:
                if state is UNSET:
                    if ctx is None:
                        ctx = Contexts(*args)
                    state = ctx.old_state()
                v = state.get(name, MISSING) if name is not None and type(state) is dict else lookup(state, path)
            bucket = buckets.get(("s", v)) if type(v) is str else _bucket(v, buckets)
            if not bucket:
                continue
            if hits is None:
                hits = {}
            for norm, f in bucket.items():
                if f.eval_expr is None:
                    hits[norm] = f
                    continue
                if ctx is None:
                    ctx = Contexts(*args)
                if state is UNSET:
                    state = ctx.old_state()
                if self._run(f, ctx, state, side):
                    hits[norm] = f
        return (_NO_HITS if hits is None else hits), ctx

    def _run_general(self, general: General, ctx: Contexts, state: Any, side: str,
                     hits: dict[str, Filter]) -> None:  # fmt: skip
        """Add the general filters that accept ``state`` to ``hits``."""
        found: list[Filter] = []
        unsure: list[Filter] = []
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

    def _run(self, f: Filter, ctx: Contexts, state: Any, side: str) -> bool:
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
        lst = self._plans.listener(name)
        if change.new is None or (lst.type is not None and lst.type != change.type):
            return None
        expr = lst.entry.expr
        needs = Needs(expr.variables | (lst.converter.variables if lst.converter else frozenset()),
                      None, None)
        ctx = Contexts(change.type, change.key, change.new, change.old, change.table_change,
                       change.meta, needs)  # fmt: skip
        side = "event" if lst.entry.transition else "new"
        try:
            self.evaluations += 1
            native = expr.native
            result = native(change.key, change.new) if native is not None else FALLBACK
            if result is FALLBACK:
                result = self._timed(expr.test, ctx.get(side), (lst,))
            if not result:
                return None
        except Exception as exc:  # noqa: BLE001 - any failure is the listener's, not the worker's
            count_error(lst, exc, self.failing)
            return None
        out: list[Notification] = []
        self._emit(lst, "created", ctx, out)
        return out[0] if out else None

    def _test(self, f: Filter, ctx: Contexts, side: str, type_: str) -> bool:
        expr = f.eval_expr
        if expr is None:
            return True  # a pure equality: the index lookup already matched
        self.evaluations += 1
        native = expr.native
        try:  # any exception (building the context too) is the listeners' error, not the worker's
            if native is not None:  # plain data and a simple filter: no CEL context at all
                result = native(ctx.key, ctx.old_state() if side == "old" else ctx.new)
                if result is not FALLBACK:
                    return bool(result)
            return bool(self._timed(expr.test, ctx.get(side), f.listeners.values()))
        except Exception as exc:  # noqa: BLE001
            for lst in f.listeners.values():
                if lst.type is None or lst.type == type_:
                    count_error(lst, exc, self.failing, self.changes)
            return False

    def _timed(self, run: Callable[[Any], Any], arg: Any, owners: Any) -> Any:
        """``run(arg)`` (a CEL evaluation), counted against ``owners`` if it overran.

        The time is this thread's CPU time, so a machine busy with other work (or a pause
        of this process) does not look like an expensive expression. A listener is over
        budget after :data:`OVERRUNS` overruns within :data:`OVERRUN_WINDOW_S`, or one of
        ten times the budget.
        """
        t0 = time.thread_time()
        try:
            return run(arg)
        finally:
            took = time.thread_time() - t0
            if took > self.budget:
                now = time.monotonic()
                for lst in owners:
                    st = lst.stats
                    if now - st.last_overrun > OVERRUN_WINDOW_S:
                        st.overruns = 0
                    st.overruns += 1
                    st.last_overrun = now
                    st.longest = max(st.longest, took)
                    if st.overruns >= OVERRUNS or took > 10 * self.budget > 0:
                        self.overruns.add(lst.name)

    def _notify(self, f: Filter, kind: str, ctx: Contexts, out: list[Notification]) -> None:
        type_ = ctx.type
        for lst in f.listeners.values():
            if kind in lst.kinds and (lst.type is None or lst.type == type_):
                if lst.converter is None:  # the projection is the new state itself
                    lst.stats.notifications += 1
                    out.append(_notification((lst.name, kind,
                                              None if kind == "removed" else ctx.new)))  # fmt: skip
                else:
                    self._emit(lst, kind, ctx, out)

    def _emit(self, lst: Listener, kind: str, ctx: Contexts, out: list[Notification]) -> None:
        projection: Mapping[str, Any] | None = None
        if kind != "removed":
            if lst.converter is None:
                projection = ctx.new
            else:
                self.conversions += 1
                native = lst.converter.native
                try:  # any exception is the listener's error, not the worker's
                    result = native(ctx.key, ctx.new) if native is not None else FALLBACK
                    if result is not FALLBACK:
                        lst.stats.notifications += 1
                        out.append(Notification(lst.name, kind, result))
                        return
                    projection = self._timed(lst.converter.project, ctx.converter(kind), (lst,))
                except Exception as exc:  # noqa: BLE001
                    count_error(lst, exc, self.failing, self.changes)
                    return
        lst.stats.notifications += 1
        out.append(Notification(lst.name, kind, projection))


def _bucket(v: Any, buckets: dict[Any, dict[str, Filter]]) -> dict[str, Filter] | None:
    """The filters whose indexed equality ``v`` satisfies (None if ``v`` is MISSING)."""
    if v is MISSING:
        return None
    k = eq_key(v)
    return buckets.get(k) if k is not None else None


def _notification(fields: tuple[str, str, Mapping[str, Any] | None]) -> Notification:
    """``Notification(*fields)`` without the named tuple's Python-level ``__new__``."""
    return tuple.__new__(Notification, fields)
