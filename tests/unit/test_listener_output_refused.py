"""A listener whose output topic Kafka refuses for good (no Kafka here; end to end:
tests/integration/test_deleted_output_topics.py). Refused at once by produce(), or later
in a delivery report (the worker asks the sink through ``answer_refusals``): the listeners
writing to that topic are suspended on this worker with the reason, the change's other
notifications are sent, and a refusal on a topic no listener writes to is not the sink's."""

from __future__ import annotations

import json
from typing import Any

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.errors import RecordRefusedError
from fifolane.serde import SchemaCatalog, make_codec
from listeners.follower import RegistryRecord
from listeners.model import ListenerSpec
from listeners.runtime import ListenerRuntime
from listeners.standin import QuietRegistry, StandInContext
from services.worker.state import Row


def _runtime() -> tuple[ListenerRuntime, StandInContext, Any]:
    settings = Settings()
    codec = make_codec(settings, SchemaCatalog.load(PROJECT_ROOT / "schemas"))
    ctx = StandInContext(codec)
    rt = ListenerRuntime(settings, topic_partitions=lambda _t: 3, follower=QuietRegistry())  # type: ignore[arg-type]
    rt.open(ctx)
    rt.on_assign([0, 1, 2])
    assert rt.ready()
    specs = [ListenerSpec(name="a", filter="true", output_topic="out-a"),
             ListenerSpec(name="a2", filter="true", output_topic="out-a"),
             ListenerSpec(name="b", filter="true", output_topic="out-b")]
    rt.apply_records([RegistryRecord(s.name, s.to_json(), i) for i, s in enumerate(specs)])
    assert rt.names() == ["a", "a2", "b"] and ctx.answer is not None
    return rt, ctx, codec


def _change(rt: ListenerRuntime, codec: Any, i: int) -> None:
    rec = {"reservation_id": f"R{i}", "flight_number": "F1", "customer_id": "c", "seats": 1, "amount": 1.0,
           "state": "NEW", "version": 1}
    rt.on_change(i % 3, i, 1000 + i, f"reservation/R{i}".encode(), None,
                 Row(1, False, "F1", codec.encode("reservation", rec)), rec)


def test_a_notification_refused_at_once_suspends_the_listeners_of_that_topic_only() -> None:
    rt, ctx, codec = _runtime()
    _change(rt, codec, 0)
    ctx.refuse.add("out-a")
    _change(rt, codec, 1)
    _change(rt, codec, 2)
    assert rt.names() == ["b"]
    assert set(rt.suspended()) == {"a", "a2"} and "'out-a'" in rt.suspended()["a"]
    sent = [(t, json.loads(v)["listener"], json.loads(v)["key"]) for t, v, _k, _p in ctx.sent if t != rt.settings.registry_topic]
    assert sent == [("out-a", "a", "R0"), ("out-a", "a2", "R0"), ("out-b", "b", "R0"),
                    ("out-b", "b", "R1"), ("out-b", "b", "R2")]
    assert rt.live_sent == 5
    assert ctx.answer is not None
    # Delivery reports of a's earlier notifications, in the transaction that suspended it: its own.
    assert ctx.answer("out-a", _gone("delivery to out-a"))
    assert not ctx.answer("emitted-by-a-handler", _gone("x"))
    rt.after_commit()  # the status records, at the safe point
    statuses = [json.loads(v) for t, v, k, _p in ctx.sent if t == rt.settings.registry_topic and b"/status/" in k]
    assert sorted((s["listener"], s["state"]) for s in statuses) == [("a", "suspended"), ("a2", "suspended")]
    # After it, nobody here writes to out-a: a refusal there is a handler's emit (its input is to blame).
    assert not ctx.answer("out-a", _gone("delivery to out-a"))
    assert rt.names() == ["b"]


def test_only_a_topic_that_is_gone_or_not_writable_suspends() -> None:
    """A record too large or invalid for the topic is not the topic's fault: not answered (the
    bisection finds its input record); the listeners stay."""
    rt, ctx, _codec = _runtime()
    assert ctx.answer is not None
    for code in ("MSG_SIZE_TOO_LARGE", "INVALID_RECORD", "_INVALID_DIFFERENT_RECORD", "_INVALID_ARG"):
        assert not ctx.answer("out-b", RecordRefusedError("delivery to out-b", code=code, refused=True))
    assert rt.names() == ["a", "a2", "b"] and rt.suspended() == {}
    for code in ("TOPIC_AUTHORIZATION_FAILED", "_UNKNOWN_TOPIC"):
        rt, ctx, _codec = _runtime()
        assert ctx.answer is not None and ctx.answer("out-b", RecordRefusedError("x", code=code, refused=True))
        assert rt.names() == ["a", "a2"]


def test_a_refusal_in_a_delivery_report_suspends_before_the_replay() -> None:
    rt, ctx, codec = _runtime()
    _change(rt, codec, 0)
    assert ctx.answer is not None and ctx.answer("out-b", _gone("delivery to out-b"))
    rt.after_abort()
    assert rt.names() == ["a", "a2"] and set(rt.suspended()) == {"b"}
    _change(rt, codec, 0)  # the replay: b gets nothing
    assert [json.loads(v)["listener"] for t, v, _k, _p in ctx.sent if t == "out-b"] == ["b"]  # the aborted one only
    # The replay fails again on out-b: a handler's emit there, not b's (b is suspended since the abort).
    assert not ctx.answer("out-b", _gone("delivery to out-b"))


def _gone(message: str) -> RecordRefusedError:
    return RecordRefusedError(message, code="UNKNOWN_TOPIC_OR_PART", refused=True)


def test_records_that_timed_out_look_the_listeners_topics_up_and_suspend_those_gone() -> None:
    """Records to a topic deleted after the producer knew it time out (librdkafka retries them):
    the transaction fails with a time-out and no topic (exactly-once has no per-record
    reports). The listeners' topics are looked up; those writing to one that is gone are
    suspended. A time-out with every topic there, or the cluster not answering, is nobody's."""
    from listeners.refusals import OutputRefusals

    rt, ctx, _codec = _runtime()
    there: list[set[str] | None] = [{"out-a", "out-b"}]
    asked: list[set[str]] = []

    def exists(topics: Any) -> set[str] | None:
        asked.append(set(topics))
        return there[0]

    rt._refusals = OutputRefusals(exists)
    timed_out = RecordRefusedError("commit_transaction: 200 message(s) timed out", code="_TIMED_OUT")
    assert ctx.answer is not None
    assert not ctx.answer(None, timed_out)  # every topic there: a slow broker
    there[0] = None
    assert not ctx.answer(None, timed_out)  # the cluster does not say
    assert not ctx.answer(None, _gone("x")) and len(asked) == 2  # not a time-out: no look-up
    there[0] = {"out-b"}
    assert ctx.answer(None, timed_out)
    assert asked[-1] == {"out-a", "out-b"} and rt.names() == ["b"] and set(rt.suspended()) == {"a", "a2"}


def test_a_suspension_holds_after_the_worker_restarts_and_a_new_registration_lifts_it() -> None:
    """The status record a worker wrote when it suspended a listener is read back by the same
    worker after a restart: the listener stays suspended there (the worker neither sends to
    it nor creates its deleted topic again). Another worker's suspension does not hold here;
    a new registration of the name lifts it. Activating a listener makes the producer read
    its topic's metadata again (it may have seen the topic deleted)."""
    rt, ctx, codec = _runtime()
    assert ctx.refresh == ["out-a", "out-b"]  # once per output topic
    ctx.refuse.add("out-a")
    _change(rt, codec, 0)
    rt.after_commit()
    statuses = [RegistryRecord(k.decode(), v, 100 + i) for i, (t, v, k, _p) in enumerate(ctx.sent)
                if t == rt.settings.registry_topic and b"/status/" in k]
    assert len(statuses) == 2
    settings = rt.settings
    registrations = [RegistryRecord(n, s.to_json(), i) for i, (n, s) in enumerate(sorted(rt.view.specs.items()))]
    for worker_id, suspended in (("standin", {"a", "a2"}), ("another-worker", set())):
        again = ListenerRuntime(settings, topic_partitions=lambda _t: 3, follower=QuietRegistry())  # type: ignore[arg-type]
        again.open(StandInContext(codec, worker_id=worker_id))
        again.apply_records(registrations + statuses)
        assert set(again.suspended()) == suspended and set(again.names()) == {"a", "a2", "b"} - suspended
    renewed = ListenerSpec(name="a", filter="true", output_topic="out-a")  # a new created_at
    again.apply_records([RegistryRecord("a", renewed.to_json(), 200)])
    assert set(again.names()) == {"a", "a2", "b"}
