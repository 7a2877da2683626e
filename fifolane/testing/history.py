"""The rules: what a history must look like if fifolane kept its promises.

Reference semantics (docs/formats.md, the README's guarantees):

- Events of a group are handled in ``seq`` order. An event is *stale* when its version is
  not newer than the highest version of its entity among the group's earlier events; a
  stale event is dropped, every other event has exactly one committed effect.
- The table holds, per entity, the event with the highest version (the first one on ties);
  a delete leaves the entity absent (a tombstone or no record).
- A produce that was not acknowledged is indeterminate: its effect may or may not exist,
  and it may or may not be the entity's latest state.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from fifolane.testing.listener_check import check_notifications
from fifolane.testing.model import Effect, History, ProducedEvent, TableEntry
from fifolane.testing.report import Report

__all__ = ["Expectation", "check_history", "expected_effects", "reference_table"]

#: ``required``: must have exactly one effect; ``allowed``: at most one (indeterminate).
Expectation = Literal["required", "allowed"]


def _by_group(produced: Iterable[ProducedEvent]) -> dict[str, list[ProducedEvent]]:
    groups: dict[str, list[ProducedEvent]] = defaultdict(list)
    for e in produced:
        groups[e.group].append(e)
    for events in groups.values():
        events.sort(key=lambda e: e.seq)
    return groups


def expected_effects(produced: Iterable[ProducedEvent]) -> dict[tuple[str, int], Expectation]:
    """Which ``(group, seq)`` must (``required``) or may (``allowed``) have an effect.

    Events absent from the result must have none (stale ones).
    """
    out: dict[tuple[str, int], Expectation] = {}
    for group, events in _by_group(produced).items():
        acked_max: dict[str, int] = {}
        maybe_max: dict[str, int] = {}
        for e in events:
            sure = acked_max.get(e.key, -1)
            maybe = max(sure, maybe_max.get(e.key, -1))
            if e.acked:
                if e.version > maybe:
                    out[(group, e.seq)] = "required"
                elif e.version > sure:
                    out[(group, e.seq)] = "allowed"
                if e.version > sure:
                    acked_max[e.key] = e.version
            else:
                if e.version > sure:
                    out[(group, e.seq)] = "allowed"
                    maybe_max[e.key] = max(maybe_max.get(e.key, -1), e.version)
    return out


def reference_table(produced: Iterable[ProducedEvent]) -> dict[str, list[TableEntry | None]]:
    """Per entity key, the acceptable final states (None = no record at all).

    The first option is the state of the acknowledged events; indeterminate events with a
    higher version add options.
    """
    sure: dict[str, ProducedEvent] = {}
    maybe: dict[str, list[ProducedEvent]] = defaultdict(list)
    for events in _by_group(produced).values():
        for e in events:
            if e.acked:
                cur = sure.get(e.key)
                if cur is None or e.version > cur.version:
                    sure[e.key] = e
            else:
                maybe[e.key].append(e)
    out: dict[str, list[TableEntry | None]] = {}
    for key in set(sure) | set(maybe):
        best = sure.get(key)
        options: list[TableEntry | None] = [None if best is None else _entry(best)]
        floor = -1 if best is None else best.version
        options += [_entry(e) for e in maybe[key] if e.version > floor]
        out[key] = options
    return out


def _entry(e: ProducedEvent) -> TableEntry:
    if e.op == "delete":
        return TableEntry(e.version, None)
    return TableEntry(e.version, e.value if e.value is not None else {})


def _same(observed: TableEntry | None, option: TableEntry | None, values: bool) -> bool:
    obs_present = observed is not None and observed.present
    if option is None or not option.present:
        # Deleted (or never written): a tombstone of that version, or no record at all.
        if option is None:
            return observed is None
        return not obs_present and (observed is None or observed.version == option.version)
    if observed is None or not obs_present or observed.version != option.version:
        return False
    return not values or not option.value or dict(observed.value or {}) == dict(option.value)


def _describe(entry: TableEntry | None) -> str:
    if entry is None:
        return "no record"
    return f"version {entry.version} ({'present' if entry.present else 'deleted'})"


def check_table(report: Report, produced: Sequence[ProducedEvent],
                table: Mapping[str, TableEntry], values: bool) -> None:
    """``stale``: an entity whose committed state is none of the reference's options."""
    ref = reference_table(produced)
    for key in sorted(ref):
        options = ref[key]
        observed = table.get(key)
        if any(_same(observed, o, values) for o in options):
            continue
        want = " or ".join(_describe(o) for o in options)
        got = _describe(observed)
        if observed is not None and options[0] is not None and observed.version == options[0].version \
                and observed.present == options[0].present:
            got += " with different content"
        report.add("stale", key, f"table has {got}, reference {want}")
    for key in sorted(set(table) - set(ref)):
        report.add("stale", key, f"table has {_describe(table[key])} for an entity never produced")


def check_effects(report: Report, produced: Sequence[ProducedEvent], effects: Sequence[Effect]) -> None:
    """``lost``, ``duplicated``, ``unexpected``, ``order`` and ``overlap``."""
    expect = expected_effects(produced)
    events = {(e.group, e.seq): e for e in produced}
    seen: dict[tuple[str, int], list[Effect]] = defaultdict(list)
    per_group: dict[str, list[Effect]] = defaultdict(list)
    for eff in effects:
        seen[(eff.group, eff.seq)].append(eff)
        per_group[eff.group].append(eff)

    for (group, seq), how in sorted(expect.items()):
        if how == "required" and not seen.get((group, seq)):
            e = events[(group, seq)]
            report.add("lost", group, f"seq {seq} ({e.op} {e.key} v{e.version}) has no committed effect")
    for (group, seq), effs in sorted(seen.items()):
        where = ", ".join(f"{f.worker or '?'}@{f.partition}:{f.offset}" for f in effs)
        if len(effs) > 1:
            report.add("duplicated", group, f"seq {seq} committed {len(effs)} times ({where})",
                       effs[1].offset)
        if (group, seq) not in expect:
            ev = events.get((group, seq))
            why = "was never produced" if ev is None else f"is stale ({ev.key} v{ev.version})"
            report.add("unexpected", group, f"seq {seq} has an effect but {why} ({where})", effs[0].offset)

    for group in sorted(per_group):
        known = [e for e in per_group[group] if (group, e.seq) in expect]
        _check_group(report, group, known, per_group[group])


def _check_group(report: Report, group: str, effs: list[Effect], calls: list[Effect]) -> None:
    """Order of the expected ``effs`` (log, then time) and exclusivity of all ``calls``."""
    # Order in the effect log (duplicates and unexpected effects are reported as such).
    top, top_eff, logged, done = -1, None, False, set()
    for eff in effs:
        if eff.seq in done:
            continue
        done.add(eff.seq)
        if eff.seq < top and top_eff is not None:
            report.add("order", group, f"seq {eff.seq} committed after seq {top} "
                       f"(offsets {top_eff.offset} then {eff.offset})", eff.offset)
            logged = True
        else:
            top, top_eff = eff.seq, eff
    if not logged:
        # Order in time: the first committed call of each event, in seq order of starts.
        firsts: dict[int, Effect] = {}
        for eff in sorted((e for e in effs if e.end > 0), key=lambda e: (e.start, e.end)):
            firsts.setdefault(eff.seq, eff)
        distinct = sorted(firsts.values(), key=lambda e: (e.start, e.end))
        for a, b in zip(distinct, distinct[1:], strict=False):
            if b.seq < a.seq:
                report.add("order", group, f"seq {b.seq} started at {b.start:.6f} after seq {a.seq} "
                           f"started at {a.start:.6f}", b.offset)
    # Exclusivity: no call starts before the previous one of its group ended.
    longest: Effect | None = None
    for eff in sorted((e for e in calls if e.end > 0), key=lambda e: (e.start, e.end)):
        if longest is not None and eff.start < longest.end:
            report.add("overlap", group,
                       f"seq {eff.seq} on {eff.worker or '?'} [{eff.start:.6f}, {eff.end:.6f}] overlaps "
                       f"seq {longest.seq} on {longest.worker or '?'} [{longest.start:.6f}, {longest.end:.6f}]",
                       eff.offset)
        if longest is None or eff.end > longest.end:
            longest = eff


def check_history(history: History) -> Report:
    """Check every part of ``history`` that is present; see the module docstring."""
    report = Report()
    produced = history.produced
    report.stats.update(
        produced=len(produced),
        indeterminate=sum(1 for e in produced if not e.acked),
        groups=len({e.group for e in produced}),
    )
    if history.effects is not None:
        expect = expected_effects(produced)
        report.stats.update(
            required=sum(1 for v in expect.values() if v == "required"),
            effects=len(history.effects),
            workers=len({e.worker for e in history.effects}),
        )
        check_effects(report, produced, history.effects)
    if history.table is not None:
        report.stats["table"] = len(history.table)
        check_table(report, produced, history.table, history.compare_values)
    if history.notifications is not None:
        report.stats["notifications"] = len(history.notifications)
        check_notifications(report, history.notifications)
    return report
