"""``fifolane plan``: the sizing printed from given costs, its JSON, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_capacity import COSTS

from fifolane.config import PROJECT_ROOT


@pytest.fixture
def costs_file(tmp_path: Path) -> Path:
    path = tmp_path / "capacity.json"
    path.write_text(json.dumps({"suite": "capacity", "costs": COSTS}))
    return path


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fifolane.cli", "plan", *args], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def test_plan_prints_the_sizing_and_the_binding_limit(costs_file: Path) -> None:
    out = _plan("--events-per-second", "1000000", "--listeners", "10000", "--costs", str(costs_file))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == ("target: 1,000,000 events/s, 10,000 listeners, table handler (0 ms wait per event), "
                        "100,000 groups (hottest 10x average), 10,000,000 entities")
    assert lines[1] == f"costs: {costs_file} (measured 2026-01-01T00:00:00+0000)"
    assert "worker CPU per event   27.00 us (handler 20.00, equality index 2.00, notifications 5.00)" in lines
    assert "worker processes       39 (27.0 cores busy; planned at 70% of capacity)" in lines
    assert ("partitions             78 per partitioned topic (2.0 per worker: room to add workers "
            "without re-partitioning)") in lines
    assert "brokers                19 (network 19, CPU 6, partition replicas 1, replication factor 3)" in lines
    assert "Spark cores            1 (a views build over 10,000,000 rows within 600 s)" in lines
    limits = lines[lines.index("limits at this load (utilisation on the planned cluster):") + 1:]
    assert [line.split()[0:2] for line in limits[:5]] == [
        ["worker", "CPU"], ["broker", "network"], ["per-partition", "order"], ["broker", "CPU"],
        ["hot-group", "latency"]]
    assert "binds first: worker CPU at 69.2% -> add worker processes (up to one per partition)" in lines
    assert lines[-1] == ("with more workers and brokers (same partitions) the load can grow to 2,866,814 "
                         "events/s before per-partition order binds")


def test_plan_json_has_the_same_numbers(costs_file: Path) -> None:
    out = _plan("--events-per-second", "1e6", "--listeners", "10000", "--handler-ms", "2",
                "--costs", str(costs_file), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    # 16 groups in flight x 1000 / (2 + 0.027) ms = 7,893 events/s per process
    assert data["process_rate"] == pytest.approx(16_000 / 2.027)
    assert data["workers"] == 181 and data["binding"] == "handler concurrency" and data["feasible"] is True
    assert data["load"]["handler_ms"] == 2.0


def test_infeasible_load_exits_1_and_says_what_to_change(costs_file: Path) -> None:
    out = _plan("--events-per-second", "5000", "--listeners", "0", "--groups", "1", "--handler-ms", "1",
                "--costs", str(costs_file))
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "error: this load cannot be met: hot-group latency at 510% (hottest group 5,000.0 events/s x "
        "1.020 ms each, handled serially); split the hottest group (a finer group key) or make its "
        "handler faster")


@pytest.mark.parametrize(("args", "message"), [
    (["--events-per-second", "-5", "--listeners", "1"], "error: impossible load: --events-per-second must be > 0, got -5"),
    (["--events-per-second", "10", "--listeners", "1", "--filter-share", "2"],
     "error: impossible load: --filter-share must be between 0 and 1, got 2; "
     "--filter-share + --prefix-share must be <= 1, got 2"),
])
def test_impossible_input_exits_2_with_the_fix(costs_file: Path, args: list[str], message: str) -> None:
    out = _plan(*args, "--costs", str(costs_file))
    assert out.returncode == 2
    assert out.stderr.strip() == message
    assert out.stdout == ""


def test_missing_costs_file_exits_2(tmp_path: Path) -> None:
    out = _plan("--events-per-second", "10", "--listeners", "1", "--costs", str(tmp_path / "none.json"))
    assert out.returncode == 2
    assert out.stderr.strip() == (f"error: no measured costs at {tmp_path / 'none.json'}; run `python -m "
                                  "benchmarks run --only capacity` to measure them, or pass --costs FILE")


def test_required_options_are_named() -> None:
    out = _plan("--listeners", "1")
    assert out.returncode == 2
    assert "Missing option '--events-per-second'" in out.stderr
