"""Smoke test of the benchmark harness: ``python -m benchmarks run --quick`` against the
session's Kafka writes complete result files. No timing is asserted: machines differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fifolane.config import PROJECT_ROOT

pytestmark = pytest.mark.integration

SUITES = ("ceiling", "stateful", "latency", "app", "slow")
KEYS = {"suite", "quick", "machine", "settings", "raw", "metrics", "notes"}


def _rates(data: dict) -> list[float]:
    return [m["value"] for m in data["metrics"] if m["unit"] in ("events/s", "x serial", "ms")
            and m["value"] is not None]


@pytest.mark.timeout(1500)
def test_quick_run_writes_results(kafka_bootstrap: str, tmp_path: Path) -> None:
    results = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    env["FIFOLANE_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    env["FIFOLANE_BENCH_WARM_BROKER"] = "0"  # the warm-up has its own test (test_broker_warm)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "--quick", "--only", ",".join(SUITES),
         "--results-dir", str(results)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=1480, check=False,
    )
    at = proc.stdout.find(" failed:")  # a failed suite's traceback, printed before the table
    failed = proc.stdout[max(0, at - 40):at + 6000] if at >= 0 else ""
    assert proc.returncode == 0, failed + proc.stdout[-4000:] + proc.stderr[-4000:]
    for suite in SUITES:
        data = json.loads((results / f"{suite}.json").read_text())
        assert set(data) >= KEYS, f"{suite}: missing {KEYS - set(data)}"
        assert data["quick"] is True
        assert data["machine"]["cpu_count"] >= 1
        rates = _rates(data)
        assert rates and all(r > 0 for r in rates), f"{suite}: {data['metrics']}"
    stateful = json.loads((results / "stateful.json").read_text())["raw"]
    assert {"ceiling", "fifolane_ALO", "fifolane_EOS", "quix_env", "kstreams_env"} <= set(stateful)
    assert stateful["kstreams_env"]["error"] is None
    # The Kafka Streams baseline (built by Maven on first use) ran both variants, exactly-once.
    assert {"kstreams_EOS", "kstreams1w_EOS"} <= set(stateful)
    for key in ("fifolane_EOS", "kstreams_EOS"):
        lat = stateful[key]["latency_ms"]
        assert lat["seen"] == lat["sent"] > 0, (key, lat)
    latency = json.loads((results / "latency.json").read_text())["raw"]
    for key in ("fifolane_EOS", "fifolane_ALO"):
        for load in ("10%", "50%"):
            outs = latency[key]["loads"][load]
            # Every timed probe event became visible on the state topic and as a notification.
            assert set(outs) == {"state", "notifications"}, (key, load, outs.keys())
            for out in outs.values():
                assert out["seen"] == out["sent"] > 0, (key, load, out)
                assert out["p50"] <= out["p99"]
                # The lead-in's events (the onset of the load) are timed on their own.
                assert out["onset"]["seen"] == out["onset"]["sent"] > 0, (key, load, out["onset"])
    assert (results / "latency.png").stat().st_size > 0
    app = json.loads((results / "app.json").read_text())["raw"]
    # Both flights apps computed the reference's flight loads: the same job.
    assert app["check"]["fifolane_matches_reference"] is True
    assert app["check"]["quix_matches_reference"] is True
    assert app["profile"]["samples"] > 0, app["profile"]
    slow = json.loads((results / "slow.json").read_text())["raw"]
    assert {"serial", "fifolane_c1", "fifolane_c16", "fifolane_c100"} <= set(slow)
    assert (results / "slow.png").stat().st_size > 0
    assert (results / "stateful.png").stat().st_size > 0
    table = (results / "latest.md").read_text()
    assert "| suite | measurement |" in table and "stateful" in table
