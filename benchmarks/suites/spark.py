"""Suite ``spark``: ``views build`` over E entities, through ``benchmarks/spark_views.py``.

That script belongs to the Spark engineer; this suite runs it when it exists
(``--entities E --bootstrap <ours> --result <file>``) and records its JSON result, the
views-build time taken from its warm build (``spark_build_warm_s``). Otherwise it records the skip.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from typing import Any

from benchmarks.harness import Bench, Metric
from fifolane.config import PROJECT_ROOT

__all__ = ["run"]


def run(bench: Bench) -> None:
    """Call ``benchmarks.spark_views.run`` if present; record its timing or the skip reason."""
    started = time.monotonic()
    n = bench.size(1_000_000, 50_000)
    if importlib.util.find_spec("benchmarks.spark_views") is None:
        reason = "skipped: benchmarks/spark_views.py not present"
        bench.write_result("spark", [Metric("spark", "views build", None, "entities/s", note=reason)],
                           started=started, settings={"entities": n}, raw={"skipped": reason}, notes=[reason])
        return
    # spark_views is a script (argparse main) owned by another engineer: run it as one, on our
    # Kafka (an explicit --bootstrap keeps it from starting or stopping a cluster of its own).
    out = bench.results_dir / "raw" / "spark_views.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.spark_views", "--entities", str(n),
           "--bootstrap", bench.bootstrap, "--result", str(out)]
    bench.step(f"spark: views build over {n:,} entities")
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=1800, check=False)
    raw: dict[str, Any]
    notes: list[str] = []
    try:
        raw = json.loads(out.read_text())
    except (OSError, ValueError):
        raw = {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"}
    raw.setdefault("seconds", raw.get("spark_build_warm_s") or raw.get("spark_build_cold_s"))
    seconds = raw.get("seconds")
    rate = n / seconds if isinstance(seconds, int | float) and seconds > 0 else None
    if "error" in raw:
        notes.append(f"spark_views failed: {raw['error']}")
    metric = Metric("spark", "views build", rate, "entities/s",
                    note=f"{n:,} entities in {seconds:.1f} s" if rate else notes[0] if notes else "")
    bench.write_result("spark", [metric], started=started, settings={"entities": n}, raw=raw, notes=notes)
