"""The history checker itself, on clean histories and on histories with planted violations."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from fifolane.testing import (
    FAILOVER_DELTA,
    KINDS,
    Effect,
    History,
    Notification,
    ProducedEvent,
    Report,
    TableEntry,
    check_history,
    expected_effects,
    reference_table,
)
from fifolane.testing.listener_check import materialize
from fifolane.testing.workload import Workload

ZERO = dict.fromkeys(KINDS, 0)


def only(**counts: int) -> dict[str, int]:
    return {**ZERO, **counts}


def clean_history() -> History:
    """A history as a correct worker leaves it: one effect per fresh event, in order."""
    produced = list(Workload(events=400, groups=6, entities=30, deletes=0.3, seed=3).generate())
    expect = expected_effects(produced)
    effects: list[Effect] = []
    clock: dict[str, float] = defaultdict(float)
    offset = 0
    for e in sorted(produced, key=lambda e: (e.group, e.seq)):
        if (e.group, e.seq) in expect:
            start = 1000.0 + clock[e.group]
            effects.append(Effect(e.group, e.seq, "w1", start, start + 0.5, 0, offset))
            clock[e.group] += 1.0
            offset += 1
    table = {key: options[0] for key, options in reference_table(produced).items() if options[0] is not None}
    return History(produced, effects, table, compare_values=True)


def group_effects(h: History, group: str) -> list[int]:
    assert h.effects is not None
    return [i for i, e in enumerate(h.effects) if e.group == group]


def with_effects(h: History, effects: list[Effect]) -> History:
    return replace(h, effects=effects)


def test_clean_history_has_no_violations() -> None:
    h = clean_history()
    report = check_history(h)
    assert report.ok, report.summary()
    assert report.counts == ZERO
    assert report.stats["produced"] == 400
    assert h.effects is not None
    assert report.stats["required"] == len(h.effects) < 400  # the workload has stale events


def test_expected_effects_drop_stale_events_in_group_order() -> None:
    p = [ProducedEvent("g", 0, "t/a", 1), ProducedEvent("g", 1, "t/a", 3),
         ProducedEvent("g", 2, "t/a", 2), ProducedEvent("g", 3, "t/a", 3, "delete"),
         ProducedEvent("g", 4, "t/b", 1), ProducedEvent("g", 5, "t/a", 4, "delete")]
    assert expected_effects(p) == {("g", 0): "required", ("g", 1): "required",
                                   ("g", 4): "required", ("g", 5): "required"}


@pytest.mark.parametrize(("events", "final"), [
    ([(1, "upsert"), (2, "upsert")], TableEntry(2, {})),
    ([(1, "upsert"), (2, "delete")], TableEntry(2, None)),
    ([(1, "delete"), (2, "upsert")], TableEntry(2, {})),
    ([(2, "upsert"), (1, "upsert")], TableEntry(2, {})),
    ([(2, "delete"), (1, "upsert")], TableEntry(2, None)),
    ([(2, "upsert"), (1, "delete")], TableEntry(2, {})),
    ([(2, "upsert"), (2, "delete")], TableEntry(2, {})),  # a tie: the first one wins
])
def test_reference_table_follows_the_seed_cases(events: list[tuple[int, str]], final: TableEntry) -> None:
    produced = [ProducedEvent("g", i, "t/a", v, op) for i, (v, op) in enumerate(events)]  # type: ignore[arg-type]
    assert reference_table(produced) == {"t/a": [final]}


def test_lost_effect() -> None:
    h = clean_history()
    assert h.effects is not None
    victim = h.effects[17]
    report = check_history(with_effects(h, [e for i, e in enumerate(h.effects) if i != 17]))
    assert report.counts == only(lost=1)
    (v,) = report.of("lost")
    assert v.subject == victim.group
    assert v.detail.startswith(f"seq {victim.seq} (")
    assert "has no committed effect" in v.detail


def test_duplicated_effect_committed_later() -> None:
    h = clean_history()
    assert h.effects is not None
    dup = replace(h.effects[5], worker="w2", start=9000.0, end=9000.5, offset=10_000)
    report = check_history(with_effects(h, [*h.effects, dup]))
    assert report.counts == only(duplicated=1)
    (v,) = report.of("duplicated")
    assert v.offset == 10_000
    assert f"seq {dup.seq} committed 2 times" in v.detail
    assert "w2@0:10000" in v.detail


def test_unexpected_effects_of_stale_and_unknown_events() -> None:
    h = clean_history()
    assert h.effects is not None
    expect = expected_effects(h.produced)
    stale = next(e for e in h.produced if (e.group, e.seq) not in expect)
    extra = [Effect(stale.group, stale.seq, "w1", 0.0, 0.0, 0, 20_000),
             Effect("nope", 0, "w1", 0.0, 0.0, 0, 20_001)]
    report = check_history(with_effects(h, [*h.effects, *extra]))
    assert report.counts == only(unexpected=2)
    details = sorted(v.detail for v in report.of("unexpected"))
    assert "is stale" in details[1] and stale.key in details[1]
    assert "was never produced" in details[0]


def test_order_violation_in_the_effect_log() -> None:
    h = clean_history()
    assert h.effects is not None
    effects = list(h.effects)
    i, j = group_effects(h, "F1")[3:5]
    # Swap which events the two records are about: the log shows seq b before seq a.
    effects[i], effects[j] = (replace(effects[i], seq=effects[j].seq), replace(effects[j], seq=effects[i].seq))
    report = check_history(with_effects(h, effects))
    assert report.counts == only(order=1)
    (v,) = report.of("order")
    assert v.subject == "F1"
    assert v.detail == (f"seq {h.effects[i].seq} committed after seq {h.effects[j].seq} "
                        f"(offsets {effects[i].offset} then {effects[j].offset})")


def test_order_violation_in_time_only() -> None:
    h = clean_history()
    assert h.effects is not None
    effects = list(h.effects)
    i, j = group_effects(h, "F2")[0:2]
    a, b = effects[i], effects[j]
    effects[i], effects[j] = replace(a, start=b.start, end=b.end), replace(b, start=a.start, end=a.end)
    report = check_history(with_effects(h, effects))
    assert report.counts == only(order=1)
    assert report.of("order")[0].detail.startswith(f"seq {a.seq} started at")


def test_overlapping_calls_within_a_group() -> None:
    h = clean_history()
    assert h.effects is not None
    effects = list(h.effects)
    i = group_effects(h, "F3")[6]
    effects[i] = replace(effects[i], worker="w2", start=effects[i].start - 0.75)  # starts before the previous ended
    report = check_history(with_effects(h, effects))
    assert report.counts == only(overlap=1)
    (v,) = report.of("overlap")
    assert v.subject == "F3"
    assert f"seq {effects[i].seq} on w2" in v.detail and "overlaps" in v.detail


def test_overlaps_across_groups_are_fine() -> None:
    h = clean_history()
    assert h.effects is not None
    # Every group's calls start at t=1000: groups run concurrently, which is the point.
    firsts = [e for e in h.effects if e.seq == 0]
    assert len(firsts) == 6 and {e.start for e in firsts} == {1000.0}
    assert check_history(h).ok


def test_stale_table_entries() -> None:
    h = clean_history()
    assert h.table is not None
    table = dict(h.table)
    present = sorted(k for k, t in table.items() if t.present)
    deleted = sorted(k for k, t in table.items() if not t.present)
    assert present and deleted
    table[present[0]] = replace(table[present[0]], version=table[present[0]].version - 1)  # stale version
    del table[present[1]]  # lost entity
    table[present[2]] = replace(table[present[2]], value={"seats": -1})  # wrong content
    table[deleted[0]] = TableEntry(table[deleted[0]].version, {})  # delete not applied
    table["reservation/ghost"] = TableEntry(1, {})
    report = check_history(replace(h, table=table))
    assert report.counts == only(stale=5)
    by_key = {v.subject: v.detail for v in report.of("stale")}
    want = h.table[present[0]].version
    assert by_key[present[0]] == (f"table has version {want - 1} (present), "
                                  f"reference version {want} (present)")
    assert by_key[present[1]] == f"table has no record, reference version {h.table[present[1]].version} (present)"
    assert by_key[present[2]].endswith("with different content, reference "
                                       f"version {h.table[present[2]].version} (present)")
    assert "(present)" in by_key[deleted[0]] and "(deleted)" in by_key[deleted[0]]
    assert by_key["reservation/ghost"] == "table has version 1 (present) for an entity never produced"
    # Without content comparison the wrong content passes.
    assert check_history(replace(h, table=table, compare_values=False)).counts == only(stale=4)


def test_compacted_tombstone_is_not_stale() -> None:
    h = clean_history()
    assert h.table is not None
    table = {k: t for k, t in h.table.items() if t.present}  # compaction removed the tombstones
    assert check_history(replace(h, table=table)).ok


def test_indeterminate_produces_may_or_may_not_take_effect() -> None:
    p = [ProducedEvent("g", 0, "t/a", 1, value={"n": 1}), ProducedEvent("g", 1, "t/a", 2, value={"n": 2}, acked=False),
         ProducedEvent("g", 2, "t/a", 3, value={"n": 3})]
    assert expected_effects(p) == {("g", 0): "required", ("g", 1): "allowed", ("g", 2): "required"}
    for effects in ([0, 1, 2], [0, 2]):
        h = History(p, [Effect("g", s, "w", 10.0 + s, 10.5 + s) for s in effects], {"t/a": TableEntry(3, {"n": 3})})
        assert check_history(h).ok
    assert check_history(History(p, [Effect("g", 1, "w", 1, 2)])).counts == only(lost=2)
    # A failed produce with the highest version may be the table's state, or not.
    q = [*p, ProducedEvent("g", 3, "t/a", 9, "delete", acked=False)]
    for final in (TableEntry(3, {"n": 3}), TableEntry(9, None), None):  # None: tombstone compacted
        table = {} if final is None else {"t/a": final}
        assert check_history(History(q, table=table, compare_values=True)).ok
    for wrong in (TableEntry(2, {"n": 2}), TableEntry(3, None), TableEntry(9, {"n": 9})):
        report = check_history(History(q, table={"t/a": wrong}, compare_values=True))
        assert report.counts == only(stale=1)


def notes(seqs: list[int], partition: int = 0, listener: str = "L") -> list[Notification]:
    return [Notification(listener, partition, s, f"t/k{s % 1000}", "modified", s % 1000 + 1, {"s": s % 1000}, i)
            for i, s in enumerate(seqs)]


def check_notes(ns: list[Notification]) -> Report:
    return check_history(History([], notifications=ns))


def test_listener_clean_stream_with_failover_and_exact_repeats() -> None:
    run1 = list(range(0, 10))
    run2 = list(range(FAILOVER_DELTA + 10, FAILOVER_DELTA + 20))
    ns = notes(run1 + run2)
    repeat = ns[12]  # redelivered after the failover with the same seq and payload
    report = check_notes([*ns[:15], repeat, *ns[15:], *notes([5, 6, 7], partition=1)])
    assert report.ok, report.summary()


def test_listener_gap_within_a_run() -> None:
    report = check_notes(notes([0, 1, 2, 4, 5, 9, 10]))
    assert report.counts == only(listener_gap=2)
    assert [v.detail for v in report.of("listener_gap")] == [
        "seq 3 missing (1 notification(s)) between offsets 2 and 3",
        "seq 6..8 missing (3 notification(s)) between offsets 4 and 5",
    ]


def test_listener_jump_below_delta_is_a_gap_and_at_delta_a_failover() -> None:
    assert check_notes(notes([0, FAILOVER_DELTA])).ok
    assert check_notes(notes([0, FAILOVER_DELTA - 1])).counts == only(listener_gap=1)


def test_listener_duplicates_that_cannot_be_dropped() -> None:
    ns = notes([0, 1, 2, 3])
    other = replace(ns[1], key="t/other")  # same seq, different change
    again = replace(ns[2], seq=FAILOVER_DELTA + 4, offset=9)  # same change, new seq
    report = check_notes([*ns, other, again])
    assert report.counts == only(listener_duplicate=2)
    details = [v.detail for v in report.of("listener_duplicate")]
    assert details[0].startswith("seq 1 reused for a different change")
    assert details[1] == (f"modified t/k2 v3 delivered twice with seqs 2 and {FAILOVER_DELTA + 4}: "
                          "not droppable by seq")


def test_listener_seq_going_backwards() -> None:
    ns = notes([10, 11, 12])
    back = Notification("L", 0, 3, "t/x", "created", 1, None, 3)
    assert check_notes([*ns, back]).counts == only(listener_order=1)


def test_materialize_applies_changes_and_drops_repeats() -> None:
    ns = [Notification("L", 0, 0, "a", "created", 1, {"v": 1}), Notification("L", 0, 1, "b", "created", 1, {"v": 1}),
          Notification("L", 0, 2, "a", "modified", 2, {"v": 2}), Notification("L", 0, 3, "b", "removed", 2, None),
          Notification("L", 0, 1, "b", "created", 1, {"v": 1}), Notification("M", 0, 0, "c", "created", 1, 1)]
    assert materialize(ns, "L") == {"a": {"v": 2}}


def test_report_is_readable() -> None:
    h = clean_history()
    assert h.effects is not None
    report = check_history(with_effects(h, h.effects[10:]))
    text = report.summary()
    lines = text.splitlines()
    assert lines[0].startswith("history: produced=400, indeterminate=0, groups=6, required=")
    assert lines[1] == "violations: " + ", ".join(f"{k}={10 if k == 'lost' else 0}" for k in KINDS)
    assert lines[2] == "first 5 of 10 lost:"
    assert len(lines) == 8
    assert all(line.startswith("  [lost] F") for line in lines[3:])
    assert str(report) == text
