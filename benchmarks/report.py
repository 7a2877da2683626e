"""``latest.md``: the results of a run as one markdown table (included by the README)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["write_markdown"]


def _num(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"
    return f"{text} {unit}".strip()


def _met(met: bool | None) -> str:
    return "" if met is None else ("yes" if met else "**no**")


def write_markdown(path: Path, results: dict[str, dict[str, Any]], machine: dict[str, Any],
                   quick: bool) -> None:
    """One row per metric: value, baseline, ratio, target and whether it is met."""
    m = machine
    # Which general path each suite's worker ran (fifolane/compiled.py; suites run before it
    # existed ran pure Python): one clause when they agree, else one per suite.
    paths = {suite: data.get("machine", {}).get("general_path", "pure Python") for suite, data in results.items()}
    if len(set(paths.values())) > 1:
        by_path: dict[str, list[str]] = {}
        for suite, used in paths.items():
            by_path.setdefault(used, []).append(suite)
        general = ", fifolane's general path " + "; ".join(f"{p} in {', '.join(s)}" for p, s in by_path.items())
    else:
        general = f", fifolane's general path {next(iter(paths.values()), m.get('general_path'))}"
    lines = [
        f"Benchmarks{' (quick run)' if quick else ''}: {m['cpu_count']} CPUs ({m['cpu_model']}), "
        f"{m['memory_gb']} GB, Python {m['python']}, confluent-kafka {m['confluent_kafka']} "
        f"(librdkafka {m['librdkafka']}), {m['kafka']}" + (general if m.get("general_path") or results else "")
        + ". Ratios are to baselines measured in the same run.",
        "",
        "| suite | measurement | value | baseline | baseline value | ratio | target | met |",
        "|---|---|---:|---|---:|---:|---|---|",
    ]
    for suite, data in results.items():
        for row in data["metrics"]:
            ratio = row["ratio"]
            name = row["name"] + (f" ({row['note']})" if row.get("note") else "")
            lines.append(
                f"| {suite} | {name} | {_num(row['value'], row['unit'])} | {row['baseline']} | "
                f"{_num(row['baseline_value'])} | {'' if ratio is None else f'{ratio:.2f}x'} | "
                f"{row['target']} | {_met(row['met'])} |"
            )
    notes = [f"- {suite}: {n}" for suite, data in results.items() for n in data.get("notes", [])]
    if notes:
        lines += ["", "Notes:", "", *notes]
    path.write_text("\n".join(lines) + "\n")
