"""Suite ``spark``: ``views build`` over E entities, through ``benchmarks/spark_views.py``.

That module belongs to the Spark engineer; this suite only calls it when it exists:
``run(entities=E, bootstrap=..., quick=...)`` returning a dict with ``seconds`` (and any raw
numbers it likes). Otherwise the result records why it was skipped.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import time
from typing import Any

from benchmarks.harness import Bench, Metric

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
    module = importlib.import_module("benchmarks.spark_views")
    fn = getattr(module, "run", None)
    offered: dict[str, Any] = {"entities": n, "bootstrap": bench.bootstrap, "quick": bench.quick,
                               "work_dir": bench.work}
    raw: dict[str, Any]
    notes: list[str] = []
    if fn is None:
        raw = {"error": "benchmarks.spark_views has no run()"}
    else:
        params = inspect.signature(fn).parameters
        kwargs = {k: v for k, v in offered.items() if k in params}
        bench.step(f"spark: views build over {n:,} entities")
        try:
            result = fn(**kwargs)
            raw = dict(result) if isinstance(result, dict) else {"result": result}
        except Exception as exc:  # noqa: BLE001 - another team's code: record, do not crash the run
            raw = {"error": f"{type(exc).__name__}: {exc}"}
    seconds = raw.get("seconds")
    rate = n / seconds if isinstance(seconds, int | float) and seconds > 0 else None
    if "error" in raw:
        notes.append(f"spark_views failed: {raw['error']}")
    metric = Metric("spark", "views build", rate, "entities/s",
                    note=f"{n:,} entities in {seconds:.1f} s" if rate else notes[0] if notes else "")
    bench.write_result("spark", [metric], started=started, settings={"entities": n}, raw=raw, notes=notes)
