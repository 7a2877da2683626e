"""The capacity and scaling suites end to end: ``python -m benchmarks run --quick --only
capacity,scaling`` against the session's Kafka (scaling starts its own 3 brokers), then
``fifolane plan`` from the costs that run measured. No timing is asserted (machines
differ); counts and the shape of the results are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fifolane.capacity import Load, load_costs, plan
from fifolane.config import PROJECT_ROOT

pytestmark = pytest.mark.integration

QUICK_EVENTS = 120_000  # the capacity suite's quick size (more than the full run: a fast table worker drained 60,000 within its first commit, nothing to time)


@pytest.mark.timeout(2400)
def test_capacity_and_scaling_quick_run(kafka_bootstrap: str, tmp_path: Path) -> None:
    results = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    env["FIFOLANE_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    env["FIFOLANE_BENCH_WARM_BROKER"] = "0"  # the warm-up has its own test (test_broker_warm)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "--quick", "--only", "capacity,scaling",
         "--results-dir", str(results)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=2350, check=False,
    )
    at = proc.stdout.find(" failed:")  # a failed suite's traceback, printed before the table
    failed = proc.stdout[max(0, at - 40):at + 6000] if at >= 0 else ""
    assert proc.returncode == 0, failed + proc.stdout[-4000:] + proc.stderr[-4000:]

    data = json.loads((results / "capacity.json").read_text())
    cases = data["raw"]["cases"]
    assert set(cases) == {"table", "1 equality", "1000 equality", "100 CEL filters", "100 prefix filters",
                          "100 CEL filters + converter", "app"}
    # Every event names one of the 1,000 flights: with a listener per flight each notifies once.
    assert cases["1000 equality"]["notifications"] == QUICK_EVENTS
    assert cases["100 prefix filters"]["notifications"] == 0  # no customer id starts with c<i>x
    assert cases["table"]["notifications"] == 0
    # The converter changes what is sent, not what matches.
    assert cases["100 CEL filters + converter"]["notifications"] == cases["100 CEL filters"]["notifications"] > 0
    for label, case in cases.items():
        assert case["worker_cpu_s"] > 0 and case["broker_cpu_s"] > 0, (label, case)
    dlq = data["raw"]["bytes"]["dead_letter"]
    assert dlq["records"] == dlq["expected"] == 100  # every 50th of 5,000 events was undecodable
    sizes = data["raw"]["bytes"]
    assert sizes["input"]["records"] == QUICK_EVENTS
    assert sizes["notification"]["records"] == QUICK_EVENTS
    assert sizes["state"]["records"] >= QUICK_EVENTS  # one upsert per event, plus the app's
    for kind in ("input", "state", "notification", "directory_claim", "dead_letter"):
        # Batches and headers on disk: more than the records' own bytes.
        assert sizes[kind]["disk_bytes"] > sizes[kind]["record_bytes"] > 0, (kind, sizes[kind])
    assert data["raw"]["restore"]["entities"] == 50_000
    assert data["raw"]["spark"]["results_equal"] is True

    # The model reads what the suite wrote, and `fifolane plan` prints from it.
    costs = load_costs(results / "capacity.json")
    assert costs.worker_us["app"] > costs.worker_us["table"] > 0
    sized = plan(Load(events_per_s=1_000_000, listeners=10_000), costs)
    assert sized.workers >= 1 and sized.brokers >= 3
    out = subprocess.run([sys.executable, "-m", "fifolane.cli", "plan", "--events-per-second", "1000000",
                          "--listeners", "10000", "--costs", str(results / "capacity.json")],
                         cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert f"worker processes       {sized.workers:,} " in out.stdout
    assert f"binds first: {sized.binding.name}" in out.stdout

    scaling = json.loads((results / "scaling.json").read_text())
    rows = scaling["raw"]["rows"]
    assert sorted((r["partitions"], r["workers"]) for r in rows) == [
        (p, w) for p in (6, 12) for w in (1, 2, 3)]
    for row in rows:
        assert row["events_per_s"] > 0 and row["worker_us_per_event"] > 0, row
        assert row["broker_us_per_event"] > 0 and row["predicted_2_cores"] > 0, row
    assert scaling["raw"]["costs_from"] == str(results / "capacity.json")  # the same run's costs
    assert (results / "scaling.png").stat().st_size > 0
