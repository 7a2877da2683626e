"""A static member killed between the two rounds of a cooperative rebalance (services/worker/
orphans.py): the partition it gave up in the first round must still find an owner.

k1 owns every partition, its handler calls held. k2 joins: in the first round the leader (k1)
takes a partition from k1 and gives it to no one; k1's ``on_revoke`` waits for the held calls,
so k1 never joins the second round. k1 is killed and restarted within its session time-out:
with the same ``--worker-id`` it joins a stable group, and the coordinator hands it its last
assignment back without a rebalance. Nobody owns the partition then, and nothing would make the
group rebalance: the worker with no partitions (k2) sees it and leaves the group and joins it
again, so the coordinator rebalances and gives it the partition.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from kafka_fixtures import wait_until
from worker_support import WorkerProcess, committed_input, reservation, send_events

from fifolane.config import Settings

pytestmark = pytest.mark.integration


def _members(admin: AdminClient, group: str, topic: str) -> dict[str, tuple[str, list[int]]] | None:
    """Instance id -> (member id, input partitions) while the group is stable, else None."""
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    if str(desc.state) != "ConsumerGroupState.STABLE":
        return None
    return {m.group_instance_id: (m.member_id, sorted(tp.partition for tp in m.assignment.topic_partitions
                                                      if tp.topic == topic)) for m in desc.members}


def test_partition_given_up_by_a_static_member_killed_mid_rebalance_gets_an_owner(
        settings: Settings, topics: Any, admin: AdminClient, tmp_path: Path) -> None:
    group = f"fifolane-orphans-{settings.input_topic}"
    hold = tmp_path / "hold"
    hold.touch()
    k1, k2 = (WorkerProcess(settings, wid, tmp_path, app="apps.hold_app:app",
                            extra=["--group-id", group, "--concurrency", "4"]) for wid in ("k1", "k2"))
    for w in (k1, k2):
        base = w.env
        w.env = lambda base=base: {**base(), "HOLD_FILE": str(hold)}
    n = send_events(settings, [("reservation", reservation(f"R{i}", f"F{i % 30}", 1), "upsert")
                               for i in range(90)])

    def members() -> dict[str, tuple[str, list[int]]]:
        return _members(admin, group, settings.input_topic) or {}

    def tails() -> str:
        return f"group {members()}\n{k1.log_tail(15)}\n{k2.log_tail(15)}"

    k1.start()
    try:
        wait_until(lambda: k1.snapshot().get("assigned") == [0, 1, 2] and k1.snapshot().get("in_flight"),
                   timeout=60, message=tails)
        k2.start()
        # Round one: k1 keeps two partitions and gives one up (its calls held: it never rejoins).
        first = wait_until(lambda: (m := members()).keys() == {"k1", "k2"} and len(m["k1"][1]) == 2 and m,
                           timeout=60, message=tails)
        assert first["k2"][1] == [], first
        orphan = ({0, 1, 2} - set(first["k1"][1])).pop()
        k1.kill()
        hold.unlink()
        k1.start()
        # The new k1 gets its last assignment back without a rebalance: nobody owns the orphan.
        again = wait_until(lambda: (m := members()).get("k1", first["k1"])[0] != first["k1"][0] and m,
                           timeout=30, message=tails)
        assert again["k1"][1] == first["k1"][1] and again["k2"] == first["k2"], again
        wait_until(lambda: k2.snapshot().get("assigned") == [orphan] and committed_input(settings, group) >= n,
                   timeout=120, interval=1, message=tails)
    finally:
        for w in (k1, k2):
            if w.alive():
                w.kill()
    assert "leaving the group and joining again" in k2.log_tail(200)
