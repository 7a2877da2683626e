"""A topic limit lowered while the worker runs, against a real broker.

The worker measures each state record against the state topic's ``max.message.bytes`` before
producing it, but it read that limit when it started. An operator lowers it
(``kafka-configs --alter``): the first state record over the new limit is refused by the
broker and its transaction aborts. The worker then reads the limits again, replays the
transaction, and dead-letters that record and every later one over the limit as ``too-large``
before producing it: one abort in all, no bisection (it bisected each time before, and
dead-lettered them as ``output-refused``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from worker_support import (
    CATALOG,
    WorkerThread,
    read_dlq,
    read_table,
    reservation,
    send_events,
    wait_accounted,
)

from fifolane.config import Settings
from fifolane.serde import make_codec
from services.worker import App, Event, GroupState

pytestmark = pytest.mark.integration

LIMIT = 20_000  # the state topic's max.message.bytes once lowered (Kafka's default: 1 MB)
BIG = 30_000  # a customer id this long makes a state record over LIMIT


def _app() -> App:
    app = App("refused-limits")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        state.put("reservation", event.value)

    return app


def _set_max_message_bytes(settings: Settings, topic: str, value: int) -> None:
    admin = AdminClient(settings.kafka_config())
    change = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", str(value), incremental_operation=AlterConfigOpType.SET)])
    for done in admin.incremental_alter_configs([change]).values():
        done.result(30)


@pytest.mark.parametrize("handler", ["table", "app"])
def test_a_state_topic_limit_lowered_at_run_time_costs_one_abort(settings: Settings, topics: Any, handler: str,
                                                                 tmp_path: Path) -> None:
    """200 reservations on 8 flights are processed; then the state topic's limit goes down to
    20,000 bytes, and 406 more events follow: updates and new reservations, among them 6 over
    the new limit on 6 flights (3 new reservations, 3 updates of processed ones). Every good
    event is applied (the table holds exactly their latest versions), the 6 are dead-lettered
    as too-large, and exactly one transaction aborts (the first refusal). How long it took is
    printed (before: each of the 6 was bisected, about 10 s per abort)."""
    # batch.size under the new limit: the broker checks a whole batch against max.message.bytes
    # (librdkafka batches up to 1,000,000 bytes and does not split a refused batch).
    settings = settings.model_copy(update={"librdkafka": {"batch.size": "16000"}})
    stats_file = tmp_path / "w1.stats.json"
    codec = make_codec(settings, CATALOG)
    first = [("reservation", reservation(f"R{i}", f"LH{i % 8}", 1, seats=1 + i % 5), "upsert") for i in range(200)]
    second: list[tuple[str, dict[str, Any], str]] = []
    big: list[dict[str, Any]] = []
    for i in range(400):
        if i % 2:  # an update of a processed reservation
            second.append(("reservation", reservation(f"R{i // 2}", f"LH{i // 2 % 8}", 2, seats=9, state="CONFIRMED"), "upsert"))
        else:
            second.append(("reservation", reservation(f"N{i}", f"LH{i % 8}", 1, amount=float(i)), "upsert"))
        if i % 70 == 35:  # 6 events over the new limit, each on its own flight
            rec = (reservation(f"BIG{i}", f"LH{i // 70 % 3 * 2 + 1}", 1, customer="c" * BIG) if i % 140 == 35
                   else reservation(f"R{i // 2}", f"LH{i // 2 % 8}", 3, customer="c" * BIG))
            big.append(rec)
            second.append(("reservation", rec, "upsert"))
    assert len(big) == 6 and len({r["flight_number"] for r in big}) == 6
    with WorkerThread(settings, _app() if handler == "app" else None, concurrency=4, stats_file=stats_file) as w:
        n = send_events(settings, first)
        wait_accounted([w], n, timeout=90)
        assert (w.stats.aborts, w.stats.dead_lettered) == (0, 0)
        _set_max_message_bytes(settings, settings.state_topic, LIMIT)
        started = time.monotonic()
        n += send_events(settings, second)
        wait_accounted([w], n, timeout=180)
        took = time.monotonic() - started
    stats = json.loads(stats_file.read_text())
    print(f"\n{handler}: {len(second)} events after the limit was lowered: {took:.1f} s, "
          f"{stats['aborts']} aborts, {stats['commits']} commits")
    # every input record accounted once; the six dead-lettered as too-large, before producing them
    assert (stats["processed"], stats["superseded"], stats["dead_lettered"]) == (200 + 400, 0, 6)
    assert stats["dead_letter_reasons"] == {"too-large": 6}
    assert (stats["aborts"], stats["bisecting"]) == (1, 0)
    assert sorted((d["reason"], d["key"], d["value"]) for d in read_dlq(settings)) == sorted(
        ("too-large", rec["flight_number"].encode(), codec.encode("reservation", rec)) for rec in big)
    # the table: the latest good version of every reservation, nothing of the six
    expected: dict[str, tuple[int, dict[str, Any]]] = {}
    for _t, rec, _op in first + second:
        if rec not in big:
            expected[f"reservation/{rec['reservation_id']}"] = (rec["version"], rec)
    assert read_table(settings) == expected
