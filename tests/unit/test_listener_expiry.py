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
