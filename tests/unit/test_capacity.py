"""The capacity model (fifolane/capacity.py): exact sizings for given costs, and its errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from fifolane.capacity import Costs, Load, load_costs, plan, predict_local_rate, worker_cpu_us
from fifolane.errors import ConfigError

COSTS: dict[str, Any] = {
    "worker_us": {"table": 20.0, "app": 200.0},
    "listener_us": {"equality_fixed": 2.0, "filter_per_listener": 0.5, "prefix_per_listener": 0.25},
    "notification_us": 5.0,
    "converter_us": 10.0,
    "broker_us": 10.0,
    "restore_entities_per_s": 500_000.0,
    "spark_rows_per_core_s": 50_000.0,
    "bytes": {"input": 100.0, "state": 120.0, "notification": 300.0, "dead_letter": 400.0,
              "directory_claim": 80.0},
    "measured": {"at": "2026-01-01T00:00:00+0000"},
}


def costs() -> Costs:
    return Costs.from_dict(COSTS)


def test_the_issue_example_is_sized_exactly() -> None:
    """1,000,000 events/s, 100,000 groups, 10,000 indexed listeners, every other default."""
    p = plan(Load(events_per_s=1_000_000, listeners=10_000), costs())
    # 20 (table) + 2 (equality index) + 1 notification x 5 us
    assert p.breakdown == {"handler": 20.0, "equality index": 2.0, "CEL filters": 0.0, "prefix filters": 0.0,
                           "notifications": 5.0, "converters": 0.0}
    assert p.worker_cpu_us == 27.0
    assert p.process_rate == pytest.approx(1e6 / 27)
    assert p.workers == 39  # ceil(1e6 / (37,037 x 0.7))
    assert p.partitions == 78  # 2 per worker
    # bytes/event 100 + 120 + 300 + 0.001 x 400 + 0.1 x 80; x3 inbound = 1,585.2 MB/s over 87.5 MB/s
    assert p.bytes_per_event == pytest.approx(528.4)
    assert p.network_in_mb_s == pytest.approx(1585.2)
    assert p.network_out_mb_s == pytest.approx(1464.8)  # 2 x 528.4 replication + 408 read
    assert p.broker_reasons == {"network": 19, "CPU": 6, "partition replicas": 1, "replication factor": 3}
    assert p.brokers == 19
    assert p.spark_rows == 10_000_000 and p.spark_cores == 1
    assert p.restore_s == pytest.approx(1e7 / 39 / 500_000)
    assert p.hot_group_rate == 100.0
    assert p.hot_group_latency_ms == pytest.approx(0.027 + 0.0027 * 0.027 / (2 * 0.9973))
    util = {lim.name: lim.utilisation for lim in p.limits}
    assert util == pytest.approx({"worker CPU": 25641.026 / 37037.037, "hot-group latency": 0.0027,
                                  "per-partition order": (100 + 999_900 / 78) / (1e6 / 27),
                                  "broker network": 1585.2 / (19 * 125), "broker CPU": 30 / (19 * 8)},
                                 rel=1e-6)
    assert p.binding.name == "worker CPU" and p.feasible
    assert p.ceiling_events_per_s == pytest.approx(1e6 / ((100 + 999_900 / 78) / (1e6 / 27)))


def test_listener_kinds_add_their_costs() -> None:
    load = Load(events_per_s=1000, listeners=1000, filter_share=0.1, prefix_share=0.2, converter_share=0.5,
                notifications_per_event=2)
    parts = worker_cpu_us(load, costs())
    # 700 equality (fixed 2), 100 CEL x 0.5, 200 prefix x 0.25, 2 notifications x 5, half with a converter
    assert parts == {"handler": 20.0, "equality index": 2.0, "CEL filters": 50.0, "prefix filters": 50.0,
                     "notifications": 10.0, "converters": 10.0}
    no_listeners = worker_cpu_us(Load(events_per_s=1000, listeners=0), costs())
    assert sum(no_listeners.values()) == 20.0  # no index, and no notifications without listeners


def test_a_waiting_handler_is_bound_by_concurrency() -> None:
    p = plan(Load(events_per_s=10_000, listeners=0, handler_ms=5, handler="app"), costs())
    per_proc = 16 * 1000 / (5 + 0.2)  # 3,077 events/s: 16 groups in flight, 5.2 ms each
    assert p.process_rate == pytest.approx(per_proc)
    assert p.workers == math.ceil(10_000 / (per_proc * 0.7)) == 5
    assert p.binding.name == "handler concurrency"


def test_a_hot_group_that_one_serial_handler_cannot_follow_is_infeasible() -> None:
    # 10 groups, the hottest 10x the average: all 2,000 events/s in one group, 1 ms each
    p = plan(Load(events_per_s=2000, listeners=0, groups=10, handler_ms=1), costs())
    assert p.hot_group_rate == 2000
    assert p.hot_group_latency_ms == math.inf
    assert not p.feasible
    assert p.binding.name == "hot-group latency"
    assert p.binding.utilisation == pytest.approx(2000 * 1.02 / 1000)


def test_local_prediction_shares_the_cores_with_the_brokers() -> None:
    c = costs()
    assert predict_local_rate(c, 1, 2.0, replication=1) == 50_000  # one core per worker process
    assert predict_local_rate(c, 3, 2.0, replication=3) == pytest.approx(2e6 / 50)  # 20 + 3 x 10 us
    with pytest.raises(ConfigError, match="workers, cores and replication must be positive"):
        predict_local_rate(c, 0, 2.0)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"events_per_s": 0}, "--events-per-second must be > 0, got 0"),
    ({"listeners": -1}, "--listeners must be >= 0, got -1"),
    ({"handler": "spark"}, "--handler must be one of table, app, got 'spark'"),
    ({"skew": 0.5}, "--skew must be >= 1 (the hottest group is at least average), got 0.5"),
    ({"filter_share": 0.7, "prefix_share": 0.6}, "--filter-share + --prefix-share must be <= 1, got 1.3"),
    ({"headroom": 1.5}, "--headroom must be between 0 and 1, got 1.5"),
    ({"events_per_s": math.inf}, "numbers must be finite"),
])
def test_impossible_loads_are_refused_with_what_to_fix(overrides: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"events_per_s": 1000, "listeners": 10, **overrides}
    with pytest.raises(ConfigError, match="impossible load: .*" + _re(message)):
        Load(**args)


def _re(text: str) -> str:
    import re

    return re.escape(text)


def test_costs_name_every_bad_number(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(COSTS))
    bad["worker_us"]["app"] = None
    bad["bytes"]["state"] = -3
    del bad["broker_us"]
    path = tmp_path / "capacity.json"
    path.write_text(json.dumps({"suite": "capacity", "costs": bad}))
    with pytest.raises(ConfigError) as err:
        load_costs(path)
    text = str(err.value)
    assert text.startswith(f"{path}: invalid costs: worker_us.app = None (expected a positive number); ")
    assert "broker_us = None (expected a positive number)" in text
    assert "bytes.state = -3 (expected a positive number)" in text
    assert text.endswith("run `python -m benchmarks run --only capacity` to measure them")


def test_missing_costs_file_says_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no measured costs at .*nope\.json; run `python -m benchmarks "
                                          r"run --only capacity` to measure them, or pass --costs FILE"):
        load_costs(tmp_path / "nope.json")


def test_the_committed_costs_load() -> None:
    """benchmarks/results/capacity.json (written by the capacity suite) is complete."""
    c = load_costs()
    assert set(c.worker_us) == {"table", "app"} and c.worker_us["app"] > c.worker_us["table"]
    assert c.measured["machine"]["cpu_count"] >= 1
