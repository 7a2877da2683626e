"""A deterministic event stream for fault tests, produced with per-record delivery tracking.

Events are reservations ``R<n>`` of flights ``F<n % groups>`` (the group). Versions mostly
grow per entity; a fraction is stale (out of order) and a fraction are deletes. Each event
carries header ``test.seq``: its number within its group. Every produce ends either
acknowledged or reported failed: :class:`TrackedProducer` records which.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from fifolane.config import Settings
from fifolane.serde.codec import Codec
from fifolane.testing.model import ProducedEvent

__all__ = ["SEQ_HEADER", "TrackedProducer", "Workload", "reservation"]

SEQ_HEADER = "test.seq"


def reservation(rid: str, flight: str, version: int) -> dict[str, Any]:
    """A reservation record whose content depends on its version (content checks see it)."""
    return {"reservation_id": rid, "flight_number": flight, "customer_id": f"c{version % 7}",
            "seats": version % 9 + 1, "amount": float(version), "state": "NEW", "version": version}


@dataclass(frozen=True, slots=True)
class Workload:
    """``events`` events over ``entities`` entities in ``groups`` groups.

    ``stale`` is the share of events sent with an old version, ``deletes`` the share of
    deletes; ``stale=0`` gives strictly growing versions per entity (every event fresh).
    ``initial`` first creates every entity once (in entity order, a random version of 1-9;
    these count towards ``events``), so the table is full before the random stream starts.
    """

    events: int
    groups: int = 40
    entities: int = 300
    stale: float = 0.1
    deletes: float = 0.08
    seed: int = 7
    initial: bool = False

    def generate(self) -> Iterator[ProducedEvent]:
        rng = random.Random(self.seed)
        versions: dict[str, int] = defaultdict(int)
        group_seq: dict[str, int] = defaultdict(int)
        for i in range(self.events):
            if self.initial and i < self.entities:
                rid, group = f"R{i}", f"F{i % self.groups}"
                v = versions[rid] = rng.randrange(1, 10)  # every content (seats) occurs
                seq = group_seq[group]
                group_seq[group] += 1
                yield ProducedEvent(group, seq, f"reservation/{rid}", v, "upsert", reservation(rid, group, v))
                continue
            n = rng.randrange(self.entities)
            rid, group = f"R{n}", f"F{n % self.groups}"
            versions[rid] += rng.choice((1, 1, 2))
            v = versions[rid]
            if rng.random() < self.stale:
                v = max(1, v - 3)
            op = "delete" if rng.random() < self.deletes else "upsert"
            seq = group_seq[group]
            group_seq[group] += 1
            value = None if op == "delete" else reservation(rid, group, v)
            yield ProducedEvent(group, seq, f"reservation/{rid}", v, op, value)  # type: ignore[arg-type]


@dataclass
class TrackedProducer:
    """Produce :class:`ProducedEvent` s and record each one's outcome.

    ``acked`` holds the events the broker acknowledged, ``failed`` those whose produce was
    reported failed (delivery error, or ``produce()`` raising), with the error text.
    """

    settings: Settings
    codec: Codec
    conf: dict[str, Any] = field(default_factory=dict)
    acked: list[ProducedEvent] = field(default_factory=list)
    failed: list[tuple[ProducedEvent, str]] = field(default_factory=list)
    attempted: int = 0

    def __post_init__(self) -> None:
        conf = {"enable.idempotence": True, "acks": "all", "linger.ms": 2, **self.conf}
        self.producer = Producer(self.settings.kafka_config(**conf))
        self._lock = threading.Lock()

    def _report(self, event: ProducedEvent) -> Any:
        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            with self._lock:
                if err is None:
                    self.acked.append(event)
                else:
                    self.failed.append((event, str(err)))
        return on_delivery

    def send(self, event: ProducedEvent) -> None:
        """Queue one event (blocks while the local queue is full)."""
        if event.op == "delete":
            value = self.codec.encode_delete("reservation", event.key.split("/", 1)[1], event.group,
                                             event.version)
        else:
            assert event.value is not None
            value = self.codec.encode("reservation", event.value)
        self.attempted += 1
        while True:
            try:
                self.producer.produce(self.settings.input_topic, value, event.group.encode(),
                                      headers=[(SEQ_HEADER, str(event.seq).encode())],
                                      on_delivery=self._report(event))
                return
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as exc:
                with self._lock:
                    self.failed.append((event, f"produce raised: {exc}"))
                return

    def run(self, events: Iterator[ProducedEvent] | list[ProducedEvent], rate: float,
            stop: threading.Event | None = None, burst: int = 0) -> None:
        """Send ``events`` at about ``rate`` per second (until ``stop`` is set), then flush.

        The first ``burst`` events go out at once (unpaced); the pace starts after them.
        """
        t0 = time.monotonic()
        for i, event in enumerate(events):
            if stop is not None and stop.is_set():
                break
            self.send(event)
            self.producer.poll(0)
            if i < burst:
                t0 = time.monotonic()
                continue
            ahead = t0 + (i + 1 - burst) / rate - time.monotonic()
            if ahead > 0 and stop is not None:
                stop.wait(ahead)
        self.flush()

    def flush(self, timeout: float = 60.0) -> int:
        """Wait for every outcome; returns how many are still unknown (0 normally)."""
        return int(self.producer.flush(timeout))

    def outcomes(self) -> list[ProducedEvent]:
        """Acknowledged events as they are, failed ones with ``acked=False`` (indeterminate)."""
        with self._lock:
            return [*self.acked, *(replace(e, acked=False) for e, _ in self.failed)]
