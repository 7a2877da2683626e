"""Finding the input record whose output Kafka refuses, by bisecting transactions.

A transaction fails as a whole when Kafka refuses one of its records for what it is (too
large for its topic, invalid there: :data:`services.worker.kafka_errors.RECORD_ERRORS`); replayed as
it was, it would fail again, for ever. So after such a failure the checkpoint limits the input
records per transaction (:meth:`Bisection.room`) to half of the failed one's, halving again
after each such failure, until a transaction of one input record fails: that record is
*poisoned* (:meth:`Bisection.poison_of`), and when it comes again the worker dead-letters it
(reason ``output-refused``) instead of processing it. Within the input a failed transaction
took, the limit only shrinks: a transaction that commits there (of records before the refused
one, or of another topic's: the directory's records take turns with the input's) says nothing
about the rest, and doubling then let the next one fail as large as before, for ever. Once
the commits have passed that input, or the record is found, each successful transaction
doubles the limit again, up to the size of the first failed one; then the limit is lifted.
While bisecting, the producer reports each record's delivery, so the log names the refused one.

A refused record that no input record is to blame for is not bisected either: a cluster
listener's notification to an output topic that was deleted, or that the worker may no
longer write, suspends the listeners writing there (:attr:`Bisection.answer`,
listeners.runtime), and the transaction is replayed without them.

A record refused as too large is often refused because an operator lowered its topic's
``max.message.bytes`` after the worker read it. So first the limits are read again
(``reread``, :meth:`services.worker.limits.Limits.refresh`): if one changed, the transaction is
replayed as it was, and the size check before producing dead-letters what no longer fits
(``too-large``) with no bisection. Only a refusal the limits as read now do not explain (a
batch over the limit, a record invalid for its topic) is bisected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from fifolane.errors import KafkaClientError
from services.worker.kafka import TxnProducer
from services.worker.limits import TOO_LARGE_CODES

__all__ = ["Bisection"]

log = logging.getLogger(__name__)

#: An input record: topic, partition, offset.
Origin = tuple[str, int, int]
#: Where a partition's input stands now (its committed offset; None: not ours any more).
Position = Callable[[str, int], "int | None"]


def _own(exc: KafkaClientError) -> tuple[str, KafkaClientError] | None:
    """The error with the topic it is about (an at-least-once flush raises the delivery report's own)."""
    return (exc.topic, exc) if exc.topic is not None else None


class Bisection:
    """The bisection state of one worker's transactions (see the module docstring)."""

    def __init__(self, producer: TxnProducer, reread: Callable[[], object] | None = None) -> None:
        self._producer = producer
        #: read the topics' limits again; truthy if one changed (see the module docstring)
        self._reread = reread
        #: max input records per transaction (None: no limit)
        self.limit: int | None = None
        self._goal = 0
        self._poisoned: dict[Origin, str] = {}
        self._settled: list[Origin] = []  # poisoned records dead-lettered in the open transaction
        #: Whoever else answers for a refused record of a topic (the cluster listeners, for
        #: their output topics): called with the topic (None: records timed out, where is not
        #: known) and the error; True: it stopped producing there, and the transaction is
        #: replayed as it was (no input record is to blame).
        self.answer: Callable[[str | None, KafkaClientError], bool] | None = None
        #: (topic, partition) -> the end of the input failed transactions took, not yet found
        #: or committed past: the limit does not grow before (see the module docstring)
        self._ends: dict[tuple[str, int], int] = {}

    @property
    def active(self) -> bool:
        return self.limit is not None or bool(self._poisoned)

    def room(self, count: int) -> int | None:
        """How many more input records a transaction that has ``count`` may take."""
        return None if self.limit is None else max(0, self.limit - count)

    def poison_of(self, origin: Origin) -> str | None:
        """Why Kafka refused what this input record produced, if it did."""
        return self._poisoned.get(origin) if self._poisoned else None

    def dead_lettered(self, origin: Origin) -> None:
        """The worker dead-lettered a poisoned record in the open transaction."""
        self._settled.append(origin)

    def failed(self, exc: KafkaClientError, count: int, last: Origin | None,
               ends: Mapping[tuple[str, int], int] | None = None) -> None:
        """A transaction of ``count`` input records (the last one ``last``; ``ends``: per
        partition, the offset after the input it took) aborted."""
        self._settled.clear()
        if exc.code == "_STATE" and self._reread is not None and self._reread():
            # produce() refused because the transaction had already failed: its cause (a batch
            # the broker refused, whose report an exactly-once producer does not get) is not
            # said, and a lowered topic limit is the one the worker can find out about itself.
            log.warning("the transaction failed before its commit (%s), and a topic's limit changed: "
                        "replaying it against the limits as they are now", exc)
            return
        if not exc.refused:  # records timed out: maybe to a topic deleted meanwhile (listeners.refusals)
            if self.answer is not None and self.answer(None, exc):
                log.warning("records timed out (%s), and a topic they went to is gone: replaying the "
                            "transaction without what produced there", exc)
            return
        failed = self._producer.report.take()
        where = f" (delivery to {failed[0]}: {failed[1]})" if failed is not None else ""
        too_large = exc.code in TOO_LARGE_CODES or (failed is not None and failed[1].code in TOO_LARGE_CODES)
        if too_large and self._reread is not None and self._reread():
            log.warning("Kafka refused a record as too large%s, and a topic's limit changed: replaying "
                        "the transaction against the limits as they are now", where)
        elif self.answer is not None and (culprit := failed or _own(exc)) is not None and self.answer(*culprit):
            log.warning("Kafka refused a record%s, and what produced it stopped producing there: replaying "
                        "the transaction without it", where)
        elif count == 0:  # snapshots, housekeeping: nothing to bisect (the checkpoint backs off)
            log.error("Kafka refused a record%s that no input record produced: retrying the transaction "
                      "after a pause", where)
        elif count <= 1 and last is not None:
            self._poisoned[last] = f"{exc.code}: {exc}{where}"
            self._ends.clear()  # found: the rest of that input may go faster again
            log.warning("input record %s[%d]@%d produces a record Kafka refuses%s: dead-lettering it",
                        *last, where)
        else:
            self._goal = max(self._goal, count)
            self.limit = max(1, count // 2)
            for tp, end in (ends or {}).items():
                self._ends[tp] = max(end, self._ends.get(tp, end))
            log.warning("Kafka refused a record of the transaction%s: finding its input record "
                        "(%d records a transaction now)", where, self.limit)
        self._producer.report_each(True)

    def committed(self, position: Position | None = None) -> None:
        """A transaction committed: poisoned records it dead-lettered are done with.
        ``position``: where each partition's input stands now."""
        for origin in self._settled:
            self._poisoned.pop(origin, None)
        self._settled.clear()
        if self._ends and position is not None:
            for tp, end in list(self._ends.items()):
                now = position(*tp)
                if now is None or now >= end:
                    del self._ends[tp]
        if self.limit is not None and not self._ends:
            self.limit *= 2
            if self.limit > max(self._goal, 1):
                self.limit = None
                self._goal = 0
        if not self.active:
            self._producer.report_each(False)
