"""The demo checks itself: the table, dead letters, listeners and Spark views against the input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.demo.stream import count_superseded, malformed
from fifolane.readers import read_to_end
from fifolane.serde import SchemaCatalog, make_codec

__all__ = ["check_results"]


def _table(settings: Settings) -> dict[str, dict[str, Any]]:
    codec = make_codec(settings, SchemaCatalog.load(settings.schemas_dir))
    table: dict[str, dict[str, Any] | None] = {}
    for msg in read_to_end(settings, settings.state_topic):
        value = msg.value()
        table[msg.key().decode()] = None if value is None else codec.decode(value).record
    return {k: v for k, v in table.items() if v is not None}


def _views(settings: Settings, names: list[str]) -> tuple[dict[str, dict[str, Any]], Counter[str], int]:
    """Fold each listener's notifications into a view (dropping duplicates by partition+seq)."""
    views: dict[str, dict[str, Any]] = {n: {} for n in names}
    counts: Counter[str] = Counter()
    seen: set[tuple[str, int, int]] = set()
    dupes = 0
    for msg in read_to_end(settings, settings.listener_output_topic):
        n = json.loads(msg.value())
        ident = (n["listener"], n["partition"], n["seq"])
        if ident in seen:
            dupes += 1
            continue
        seen.add(ident)
        counts[n["listener"]] += 1
        view = views.setdefault(n["listener"], {})
        key = f'{n["type"]}/{n["key"]}'  # as on the state topic
        if n["kind"] == "removed":
            view.pop(key, None)
        else:
            view[key] = n["value"]
    return views, counts, dupes


def _expected_views(table: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    high = {k: {"id": r["reservation_id"], "flight": r["flight_number"], "amount": r["amount"]}
            for k, r in table.items()
            if k.startswith("reservation/") and r["amount"] >= 3000.0 and r["state"] == "CONFIRMED"}
    over = {k: {"flight": r["flight_number"], "sold": r["seats_sold"], "capacity": r["capacity"],
                "rejected": r["rejected_seats"]}
            for k, r in table.items() if k.startswith("flight_load/") and r["rejected_seats"] > 0}
    return {"high-value": high, "overbooked-flights": over}


def example(module: str, name: str) -> Any:
    """An object of the checkout's examples (not an installed package: found from the
    project root)."""
    import importlib
    import sys

    if str(PROJECT_ROOT) not in sys.path:
        sys.path.append(str(PROJECT_ROOT))
    return getattr(importlib.import_module(module), name)


def check_results(settings: Settings, stream: Any, result: dict[str, Any], views: dict[str, Any] | None,
                  console: Console, run_dir: Path, names: list[str]) -> bool:
    reference = example("examples.flights", "reference")

    checks: list[tuple[str, bool, str]] = []
    table = _table(settings)
    expected = reference(stream.events)

    def shape(t: dict[str, dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
        return {k: (r.get("state"), r.get("seats"), r.get("seats_sold"), r.get("rejected_seats"))
                for k, r in t.items()}

    got, want = shape(table), shape(expected)
    wrong = [k for k in set(got) | set(want) if got.get(k) != want.get(k)]
    checks.append(("table = sequential per-flight reference (states, seats sold, refusals)", not wrong,
                   f"{len(table):,} entities" if not wrong else f"{len(wrong)} differ, e.g. {sorted(wrong)[:3]}"))

    letters = read_to_end(settings, settings.dlq_topic)
    reasons = Counter(dict(m.headers() or ())["fifolane.dlq.reason"].decode() for m in letters)
    want_reasons = Counter(r for _k, _v, r in malformed(b"x" * 20))
    checks.append(("every malformed record dead-lettered with its reason", reasons == want_reasons,
                   ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items()))))

    stats = [json.loads(p.read_text()) for p in sorted(run_dir.glob("*.stats.json"))]
    superseded = count_superseded(stream.events)

    lviews, lcounts, dupes = _views(settings, names)
    want_views = _expected_views(table)
    for name in names:
        same = lviews.get(name, {}) == want_views[name]
        checks.append((f"listener {name}: view from notifications = filtered table", same,
                       f"{len(lviews.get(name, {})):,} keys from {lcounts[name]:,} notifications"))

    top: list[tuple[str, float]] = []
    if views is not None:
        loads = {r["flight_number"]: r["seats_sold"] for k, r in table.items() if k.startswith("flight_load/")}
        spark_seats = {f: row["seats_sold"] for f, row in views["seats"].items()}
        same = all(spark_seats.get(f, 0) == n for f, n in loads.items())
        checks.append(("Spark seats per flight = worker's seat counts", same, f"{len(spark_seats)} flights"))
        top = views["top"]

    summary = Table(title="fifolane demo summary", show_lines=False)
    summary.add_column("what")
    summary.add_column("count", justify="right")
    summary.add_row("events produced", f"{result['total']:,}")
    summary.add_row("superseded (stale/duplicate) in the input", f"{superseded:,}")
    summary.add_row("  workers' counters: processed / superseded / dead-lettered",
                    " / ".join(f"{sum(s.get(k, 0) for s in stats):,}" for k in ("processed", "superseded", "dead_lettered")))
    summary.add_row("dead-lettered (by reason)", f"{sum(reasons.values())}: " +
                    ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())))
    for name in names:
        summary.add_row(f"notifications: {name}", f"{lcounts[name]:,}")
    if dupes:
        summary.add_row("duplicate notifications dropped (same seq)", str(dupes))
    summary.add_row("end-to-end time (produce -> committed)", f"{result['seconds']:.1f}s")
    console.print(summary)
    console.print("[dim]workers' counters include work redone after the SIGKILL (uncommitted work is "
                  "replayed); the committed results below are exact.[/]")
    if top:
        t = Table(title="top flights by confirmed revenue (Spark view)")
        t.add_column("flight")
        t.add_column("revenue", justify="right")
        for flight, revenue in top:
            t.add_row(flight, f"{revenue:,.2f}")
        console.print(t)
    if views is not None:
        console.print(f"Parquet views: {views['out']}")
    console.print(f"worker logs: {run_dir / 'logs'}")
    ok = all(passed for _n, passed, _d in checks)
    for name, passed, detail in checks:
        mark = "[green]PASS[/]" if passed else "[red]FAIL[/]"
        console.print(f"{mark} {name} ({detail})")
    console.print("[bold green]all checks passed[/]" if ok else "[bold red]some checks failed[/]")
    return ok
