"""The latency suite's paced load: only the timed events match fifolane's probe listener
(benchmarks.suites.latency.probes), the same ones benchmarks.latency.measure_outputs times."""

from __future__ import annotations

import json

from benchmarks import latency
from benchmarks.suites.latency import WARM, probes
from benchmarks.systems import PROBE_CUSTOMER, probe_records
from fifolane.config import Settings


def test_timed_takes_every_kth_of_the_onset_and_of_the_rest() -> None:
    chosen = [i for i in range(20) if latency.timed(i, lead_in=7, sample_every=5)]
    assert chosen == [0, 5, 7, 12, 17]
    assert all(latency.timed(i, lead_in=3, sample_every=1) for i in range(10))


def test_only_the_warm_up_and_the_timed_events_match_the_listener() -> None:
    lead, every, count = 7, 5, 40
    recs = probe_records(Settings(), "t", WARM + lead + count, "json", probes(lead, every))
    customers = [json.loads(value)["customer_id"] for _rid, _key, value in recs]
    matching = [i for i, c in enumerate(customers) if c == PROBE_CUSTOMER]
    assert matching == [*range(WARM), WARM + 0, WARM + 5, *(WARM + lead + j for j in range(0, count, every))]
    # The fillers are new entities of the drained events' kind, which the listener skips.
    assert all(c.startswith("c") for i, c in enumerate(customers) if i not in matching)
    assert len({rid for rid, _key, _value in recs}) == len(recs)


def test_without_a_choice_every_record_is_a_probe_event() -> None:
    recs = probe_records(Settings(), "u", 12, "json")
    assert {json.loads(value)["customer_id"] for _rid, _key, value in recs} == {PROBE_CUSTOMER}
