"""An expired lease on a worker (suspected in #12): no tombstone from the workers. No Kafka.

A worker's tombstone for an expired lease, committed with its next transaction, could land
after the user registered the name again and delete that registration. Workers only make
the listener inactive; the registration stays until renewed or removed. End to end:
tests/integration/test_hostile_input.py::test_expired_lease_and_a_new_registration_of_the_name.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kafka_fixtures import wait_until

from fifolane.config import Settings
from listeners.follower import RegistryRecord
from listeners.model import ListenerSpec
from listeners.runtime import ListenerRuntime
from listeners.standin import QuietRegistry, StandInContext


def test_an_expired_lease_is_inactive_and_never_deleted_by_a_worker() -> None:
    settings = Settings()
    worker = StandInContext(codec=None)
    rt = ListenerRuntime(settings, topic_partitions=lambda _t: 3, follower=QuietRegistry(),  # type: ignore[arg-type]
                         housekeeping_interval=0.0)
    rt.open(worker)
    rt.on_assign([0, 1, 2])  # partition 0: this worker is the housekeeper
    assert rt.ready()
    spec = ListenerSpec(name="l", filter="true", lease=timedelta(seconds=30),
                        created_at=datetime.now(UTC) - timedelta(seconds=29))
    rt.apply_records([RegistryRecord("l", spec.to_json(), 0)])
    assert rt.names() == ["l"]
    wait_until(lambda: rt.after_commit() or rt.expired == 1, timeout=10, message="the lease expired")
    rt.after_commit()
    assert rt.names() == []
    to_registry = [(k, v) for t, v, k, _p in worker.sent if t == settings.registry_topic]
    assert [k for k, v in to_registry if v is None and k in ("l", b"l")] == []
    rt.close()


def test_only_leased_listeners_expire_and_a_removed_or_replaced_lease_is_forgotten() -> None:
    worker = StandInContext(codec=None)
    rt = ListenerRuntime(Settings(), topic_partitions=lambda _t: 3, follower=QuietRegistry(),  # type: ignore[arg-type]
                         housekeeping_interval=0.0)
    rt.open(worker)
    rt.on_assign([0, 1, 2])
    old = datetime.now(UTC) - timedelta(seconds=29)

    def rec(name: str, offset: int, lease: timedelta | None) -> RegistryRecord:
        return RegistryRecord(name, ListenerSpec(name=name, lease=lease, created_at=old).to_json(), offset)

    rt.apply_records([rec(f"u{i}", i, None) for i in range(50)] + [
        rec("leased", 50, timedelta(seconds=30)),
        rec("removed", 51, timedelta(seconds=30)),
        rec("replaced", 52, timedelta(seconds=30)),
    ])
    # Before the leases run out: one is removed, one registered again without a lease.
    rt.apply_records([RegistryRecord("removed", None, 53), rec("replaced", 54, None)])
    assert "removed" not in rt.names() and "replaced" in rt.names()
    wait_until(lambda: rt.after_commit() or rt.expired == 1, timeout=10, message="the lease expired")
    rt.after_commit()
    assert rt.expired == 1  # "leased" only: the removed one is gone, the replaced one has no lease
    assert rt.names() == sorted([f"u{i}" for i in range(50)] + ["replaced"])
    rt.close()
