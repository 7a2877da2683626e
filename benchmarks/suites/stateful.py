"""Suite ``stateful``: fifolane's table handler vs the ceiling loop and Quix Streams.

One input topic of N Avro events (and the same events as JSON for Quix) is pre-produced;
every system reads it with its own consumer group and writes its own output topics:

- the ceiling loop (baseline, see :mod:`benchmarks.suites.ceiling`);
- the fifolane worker (built-in table handler, RocksDB state, state-topic changelog),
  at-least-once and exactly-once, no listeners; and exactly-once with ``--no-directory``
  (no entity directory: entities never change group, as in the other systems; no target);
- Quix Streams: JSON in, filter, per-key count in RocksDB state, JSON out, both guarantees;
- Kafka Streams (``benchmarks/kstreams``, a JVM): the same table job on the same Avro
  input, exactly_once_v2 and at_least_once, as written naturally (RocksDB store with its
  changelog, plus the output topic: two writes per change) and with the store's changelog
  off (output only: fifolane's single write). Its JVM warms up inside the process on
  events of the same topic (own application id and output) before the measured run.

Every system runs in interleaved rounds and the median of each is reported (this 2-core
machine is noisy). After the last round's throughput run, the still-running system gets a
paced latency probe.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.events import events, produce_avro, produce_json
from benchmarks.harness import COMMIT_INTERVAL, Bench, Metric
from benchmarks.kafka_streams import java_version
from benchmarks.quix import quix_python
from benchmarks.systems import (
    CEILING_REPEAT,
    GUARANTEES,
    SHORT,
    fixed_probe,
    kstreams_build,
    measure_ceiling,
    median_run,
    repeated_input,
    run_kstreams,
    run_quix,
    run_worker,
)
from fifolane.cluster.jars import KAFKA_VERSION
from fifolane.topics import create_topic

__all__ = ["KSTREAMS", "run"]

PARTITIONS = 6
_SHORT = SHORT
#: Kafka Streams variants: raw-result prefix -> TableApp --variant.
KSTREAMS = {"kstreams": "changelog", "kstreams1w": "single-write"}
_KS_LABEL = {"kstreams": "Kafka Streams", "kstreams1w": "Kafka Streams single-write"}


def run(bench: Bench) -> None:
    """Pre-produce; then ``reps`` rounds of ceiling, fifolane ALO and EOS, Quix ALO and EOS
    over the same events (medians reported)."""
    started = time.monotonic()
    # 600,000: a drain is timed from its first commit to the one covering its last event, and
    # over 300,000 events fifolane's window was ~1.5 s, about four 0.25 s commits, which alone
    # spread its rounds by ~20% (benchmarks/README.md, "The plain loop's window").
    # Quick: enough for more than one commit (a rate needs two).
    n = bench.size(600_000, 100_000)
    reps = bench.size(3, 1)
    probe = {"count": bench.size(3000, 600), "rate": bench.size(500, 300)}
    base = bench.topic_set("stateful", PARTITIONS)
    json_topic = f"{base.input_topic}.json"
    create_topic(base, json_topic, PARTITIONS)
    bench.step(f"stateful: pre-producing {n:,} events (Avro and JSON)", 2 * n)
    produce_avro(base, events(n), on_progress=bench.advance)
    produce_json(base, events(n), json_topic, on_progress=lambda c: bench.advance(n + c))
    notes = ["Throughput is timed from the first offset commit to the commit covering the last "
             "event (start-up, group join and restore excluded), all systems with the same "
             f"{COMMIT_INTERVAL}s commit interval.",
             f"After one untimed warm-up pass, the ceiling loop, fifolane ALO/EOS, Quix "
             f"Streams ALO/EOS and Kafka Streams (changelog, then single-write) ran {reps} times "
             "each, interleaved in that order; the table shows each one's median run, "
             "raw/reps_events_per_s every run.",
             "fifolane runs the built-in table handler with no listeners registered (the "
             "listeners suite measures their cost).",
             "The targets are the default worker's, with the entity directory (a claim per new "
             "entity, so an entity may change group); 'EOS --no-directory' is the same worker "
             "without it, entities fixed to their group as in Quix and Kafka Streams.",
             "Latency: a paced producer sends new entities to the running system; a read_committed "
             "consumer in the same process notes when each output becomes visible (fifolane: the "
             "state topic); measured in the last round (the latency suite measures it under "
             "load).",
             f"The plain loop drains the same input repeated {CEILING_REPEAT} times (its own topic): "
             "over the input alone its timed window was one or two commit intervals.",
             "Every librdkafka consumer (plain loop, fifolane, Quix) runs with "
             "fetch.queue.backoff.ms=10 (benchmarks/README.md, 'Stable baselines')."]
    runs: dict[str, list[dict[str, Any]]] = {"ceiling": [], "fifolane_ALO": [], "fifolane_EOS": [],
                                             "fifolane_EOS_nodir": [], "quix_ALO": [], "quix_EOS": []}
    env = quix_python()
    if env.python is None:
        notes.append(f"Quix Streams not measured: {env.error}")
    # Quick runs only the exactly-once Kafka Streams pair (the target's row).
    ks_guarantees = ("exactly-once",) if bench.quick else GUARANTEES
    ks_build, ks_error = kstreams_build(bench)
    if ks_build is None:
        notes.append(f"Kafka Streams not measured: {ks_error}")
    ks_warm = f"{base.input_topic}.ks-warmup"
    create_topic(base, ks_warm, PARTITIONS)
    ks_warm_events = min(n, bench.size(100_000, 30_000))
    notes.append(f"Kafka Streams {'/'.join(_SHORT[g] for g in ks_guarantees)}: each run first warms "
                 f"its JVM on {ks_warm_events:,} events of the same input (own application id and "
                 "output, closed before the measured run starts); 'single-write' disables the "
                 "store's changelog (output topic only, like fifolane's one state-topic write; "
                 "such a store cannot be restored).")
    # A first pass over a freshly written topic is slower for whoever comes first (broker JIT
    # and caches still cold): one untimed ceiling run warms the broker for every system.
    bench.step("stateful: warm-up pass (not timed)")
    measure_ceiling(bench, base, n)
    ceiling = repeated_input(bench, base, n)
    for r in range(reps):
        last = r == reps - 1
        runs["ceiling"].append({"throughput": measure_ceiling(bench, ceiling, n * CEILING_REPEAT).to_dict()})
        for g in GUARANTEES:
            label = f"stateful-{_SHORT[g]}"
            after = fixed_probe(base, "avro", probe["count"], probe["rate"], tag=label) if last else None
            runs[f"fifolane_{_SHORT[g]}"].append(run_worker(bench, base, n, g, label=label, after=after))
        # The same worker without the entity directory: what its claims cost (one per new
        # entity, read back by the directory's owner). Quix and Kafka Streams have no group
        # changes at all; the target rows above are the default worker's.
        runs["fifolane_EOS_nodir"].append(run_worker(bench, base, n, "exactly-once", label="stateful-nodir",
                                                     extra=["--no-directory"]))
        for g in GUARANTEES if env.python is not None else ():
            try:
                after = fixed_probe(base, "json", probe["count"], probe["rate"],
                                    tag=f"quix-{_SHORT[g]}") if last else None
                runs[f"quix_{_SHORT[g]}"].append(run_quix(bench, str(env.python), base, json_topic, n, g,
                                                          label="stateful", after=after))
            except RuntimeError as exc:  # record it: the fifolane numbers still stand
                notes.append(f"Quix Streams {g} failed in round {r + 1}: {str(exc).splitlines()[0]}")
        for prefix, variant in KSTREAMS.items() if ks_build is not None else ():
            for g in ks_guarantees:
                try:
                    after = fixed_probe(base, "avro", probe["count"], probe["rate"],
                                        tag=f"{prefix}-{_SHORT[g]}") if last else None
                    runs.setdefault(f"{prefix}_{_SHORT[g]}", []).append(run_kstreams(
                        bench, ks_build, base, n, g, variant, warmup=(ks_warm, ks_warm_events),
                        label="stateful", after=after))
                except RuntimeError as exc:
                    notes.append(f"Kafka Streams {variant} {g} failed in round {r + 1}: "
                                 f"{str(exc).splitlines()[0]}")
    raw: dict[str, Any] = {k: median_run(v) for k, v in runs.items() if v}
    for key in raw:  # the latency of the last round belongs to the median entry too
        if key != "ceiling":
            raw[key]["latency_ms"] = runs[key][-1].get("latency_ms")
    raw["ceiling"] = {**raw["ceiling"]["throughput"], "reps_events_per_s": raw["ceiling"]["reps_events_per_s"]}
    raw["quix_env"] = {"python": str(env.python), "quixstreams": env.version,
                       "confluent_kafka": env.confluent_kafka, "error": env.error}
    raw["kstreams_env"] = {"kafka_streams": KAFKA_VERSION, "java": java_version(), "error": ks_error,
                           "warmup_events": ks_warm_events, "threads": 1}
    bench.write_result("stateful", _metrics(raw), started=started, raw=raw, notes=notes, settings={
        "events": n, "groups": 1000, "entities": n // 2, "partitions": PARTITIONS,
        "commit_interval_s": COMMIT_INTERVAL, "fifolane_concurrency": 16, "rounds": reps,
        "latency_probe": probe, "listeners": 0, "kstreams_guarantees": list(ks_guarantees),
    })


def _rate(raw: dict[str, Any], name: str) -> float | None:
    run = raw.get(name)
    return None if run is None else float(run["throughput"]["events_per_s"])


def _metrics(raw: dict[str, Any]) -> list[Metric]:
    ceiling = raw["ceiling"]["events_per_s"]
    alo, eos = _rate(raw, "fifolane_ALO"), _rate(raw, "fifolane_EOS")
    qalo, qeos = _rate(raw, "quix_ALO"), _rate(raw, "quix_EOS")
    m = [
        Metric("stateful", "fifolane table EOS", eos, "events/s", "ceiling loop", ceiling,
               ">= 0.5x", None if eos is None else eos / ceiling >= 0.5),
        Metric("stateful", "fifolane table ALO", alo, "events/s", "ceiling loop", ceiling),
        Metric("stateful", "fifolane EOS vs ALO", eos, "events/s", "fifolane ALO", alo,
               "cost <= 10% (>= 0.9x)", None if not (eos and alo) else eos / alo >= 0.9),
        Metric("stateful", "fifolane table EOS vs Quix EOS", eos, "events/s", "Quix EOS", qeos,
               ">= 3x", None if not (eos and qeos) else eos / qeos >= 3),
        Metric("stateful", "fifolane table ALO vs Quix ALO", alo, "events/s", "Quix ALO", qalo,
               ">= 3x", None if not (alo and qalo) else alo / qalo >= 3),
    ]
    nodir = _rate(raw, "fifolane_EOS_nodir")
    if nodir is not None:
        m += [Metric("stateful", "fifolane table EOS --no-directory", nodir, "events/s", "fifolane EOS", eos,
                     note="entities never change group (what Quix and Kafka Streams do); no target"),
              Metric("stateful", "fifolane table EOS --no-directory vs Quix EOS", nodir, "events/s",
                     "Quix EOS", qeos)]
    for prefix, label in _KS_LABEL.items():
        for short, rate in (("EOS", eos), ("ALO", alo)):
            ks = _rate(raw, f"{prefix}_{short}")
            if ks is None:
                continue
            headline = prefix == "kstreams" and short == "EOS"
            m.append(Metric("stateful", f"fifolane table {short} vs {label} {short}", rate, "events/s",
                            f"{label} {short}", ks, ">= 1.0x" if headline else "",
                            (None if not rate else rate / ks >= 1.0) if headline else None))
    names = {"fifolane_ALO": "fifolane ALO", "fifolane_EOS": "fifolane EOS", "quix_ALO": "Quix ALO",
             "quix_EOS": "Quix EOS"}
    names.update({f"{p}_{s}": f"{label} {s}" for p, label in _KS_LABEL.items() for s in ("ALO", "EOS")})
    for name, label in names.items():
        lat = raw.get(name, {}).get("latency_ms")
        if not lat:
            continue
        mine = raw.get(f"fifolane_{name[-3:]}", {}).get("latency_ms") if not name.startswith("fifolane") else None
        m.append(Metric("stateful", f"{label} latency p50", lat["p50"], "ms",
                        note=f"p99 {lat['p99']:.0f} ms, {lat['seen']}/{lat['sent']} seen"))
        m.append(Metric("stateful", f"{label} latency p99", lat["p99"], "ms"))
        if mine and name.startswith("kstreams"):  # latency ratio: below 1.0x fifolane is faster
            for p in ("p50", "p99"):
                m.append(Metric("stateful", f"fifolane {name[-3:]} latency {p} vs {label}", mine[p], "ms",
                                f"{label} {p}", lat[p]))
    return m
