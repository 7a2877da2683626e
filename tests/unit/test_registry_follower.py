"""The registry follower survives its own failures (#12 item 7), and a worker does not
process a newly assigned partition while the follower is down. No Kafka: the follower's
consumer is a fake (the follower against real Kafka is in tests/integration)."""

from __future__ import annotations

from typing import Any

from kafka_fixtures import wait_until

from fifolane.config import Settings
from listeners.follower import RegistryFollower
from listeners.runtime import ListenerRuntime
from listeners.standin import StandInContext


class _Msg:
    def __init__(self, offset: int, key: bytes, value: bytes | None) -> None:
        self._o, self._k, self._v = offset, key, value

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> None:
        return None


class _Registry:
    """A registry topic of ``records``; its consumers fail while ``failures`` is positive
    (as when a broker is down: watermark time-outs, consume errors)."""

    def __init__(self, records: list[tuple[bytes, bytes | None]], failures: int) -> None:
        self.records = records
        self.failures = failures
        self.made = 0

    def consumer(self, _settings: Settings) -> Any:
        self.made += 1
        registry = self

        class Consumer:
            def __init__(self) -> None:
                self.pos = 0

            def assign(self, tps: list[Any]) -> None:
                self.pos = max(tps[0].offset, 0)

            def get_watermark_offsets(self, tp: Any, timeout: float = 0) -> tuple[int, int]:
                if registry.failures > 0:
                    registry.failures -= 1
                    raise RuntimeError("KafkaError{code=_TIMED_OUT}: watermark time-out")
                return 0, len(registry.records)

            def consume(self, n: int, timeout: float) -> list[_Msg]:
                out = [_Msg(i, k, v) for i, (k, v) in enumerate(registry.records) if i >= self.pos]
                self.pos = len(registry.records)
                return out

            def close(self) -> None:
                pass

        return Consumer()


def test_follower_restarts_after_failures_and_catches_up() -> None:
    reg = _Registry([(b"a", b"1"), (b"b", b"2")], failures=3)
    f = RegistryFollower(Settings(), poll_timeout=0.01, make_consumer=reg.consumer, max_backoff=0.05)
    f.start()
    try:
        f.mark()
        wait_until(f.caught_up, timeout=10, message=lambda: f"restarts {f.restarts}, error {f.last_error}")
        assert f.restarts == 3 and f.healthy and f.alive
        assert "watermark time-out" in (f.last_error or "")
        assert [(r.key, r.value) for r in f.drain()] == [("a", b"1"), ("b", b"2")]
        reg.records.append((b"c", None))
        f.mark()
        wait_until(f.caught_up, timeout=10)
        assert [(r.key, r.value) for r in f.drain()] == [("c", None)]  # no record read twice
    finally:
        f.stop()


def test_new_partitions_wait_for_a_live_follower() -> None:
    """While the follower is down, ``ready()`` says no: the worker keeps the partition
    paused rather than run it with a listener set that may be stale."""
    reg = _Registry([], failures=10**9)
    f = RegistryFollower(Settings(), poll_timeout=0.01, make_consumer=reg.consumer, max_backoff=0.02)
    rt = ListenerRuntime(Settings(), follower=f, topic_partitions=lambda _t: 3)
    rt.open(StandInContext(codec=None))
    try:
        rt.on_assign([0, 1])
        wait_until(lambda: f.restarts >= 3, timeout=10)
        assert not rt.ready()
        assert rt.metrics()["registry_follower_healthy"] == 0.0
        assert rt.metrics()["registry_follower_restarts"] >= 3
        reg.failures = 0  # the broker is back
        wait_until(rt.ready, timeout=10)
        assert rt.metrics()["registry_follower_healthy"] == 1.0
    finally:
        rt.close()
