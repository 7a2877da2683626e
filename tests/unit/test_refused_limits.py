"""Topic limits read again after Kafka refused a record as too large. No broker.

The worker measures every record it derives against its topic's ``max.message.bytes``
before producing it (services/worker/limits.py). An operator may lower (or raise) that limit
while the worker runs; the broker then refuses a record the kept limit let through, and the
transaction aborts. After such a refusal the worker reads the limits again: the replay and
later records are measured against the limit as it is now (dead-lettered as ``too-large`` at
once, with no bisection), and a raised limit takes what it would have refused before. The
same against a real broker: tests/integration/test_refused_limits.py.
"""

from __future__ import annotations

from fifolane.errors import WorkerError
from services.worker.limits import FRAMING, Limits, TopicConfigs


class _Topics:
    """A broker's topic configs that a test changes, and how often they were asked for."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits
        self.asked: list[list[str]] = []
        self.down = False

    def lookup(self, names: list[str]) -> dict[str, dict[str, str]]:
        self.asked.append(sorted(names))
        if self.down:
            raise WorkerError("the worker cannot start: no broker")
        return {n: {"max.message.bytes": str(self.limits[n])} if n in self.limits else {} for n in names}


def test_limits_are_kept_until_refreshed_then_read_again() -> None:
    """No broker round trip per record: the limits are read once per topic. ``refresh`` reads
    the topics measured so far again, in one look-up, and says which rooms changed (lowered
    and raised); a look-up that fails keeps the limits read before."""
    broker = _Topics({"state": 20_000, "dlq": 5_000, "in": 9_000})
    configs = TopicConfigs(broker.lookup)
    limits = Limits(1_000_000, configs.max_bytes, reread=configs.reread)
    assert (limits.room("state"), limits.room("dlq")) == (20_000 - FRAMING, 5_000 - FRAMING)
    broker.limits.update(state=10_000, dlq=60_000, **{"in": 1_000})
    for _ in range(3):
        assert (limits.room("state"), limits.room("dlq")) == (20_000 - FRAMING, 5_000 - FRAMING)
    assert broker.asked == [["state"], ["dlq"]]
    assert limits.refresh() == {"state": (20_000 - FRAMING, 10_000 - FRAMING),
                                "dlq": (5_000 - FRAMING, 60_000 - FRAMING)}
    assert broker.asked[2:] == [["dlq", "state"]]  # one look-up, of the topics measured only
    assert (limits.room("state"), limits.room("dlq")) == (10_000 - FRAMING, 60_000 - FRAMING)
    assert limits.refresh() == {}  # nothing changed since
    broker.down, broker.limits["state"] = True, 3_000
    assert limits.refresh() == {}
    assert limits.room("state") == 10_000 - FRAMING  # not Kafka's default
