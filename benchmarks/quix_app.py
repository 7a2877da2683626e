"""The stateful comparison app in Quix Streams (run by the harness in ``benchmarks/.venv-quix``).

JSON reservations in, a filter, a per-key (flight) count in RocksDB state, a JSON record out:
the Quix equivalent of fifolane's table handler. Runs until SIGTERM. Imports nothing from
fifolane: Quix pins its own confluent-kafka.
"""

from __future__ import annotations

import argparse
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--guarantee", choices=["exactly-once", "at-least-once"], required=True)
    parser.add_argument("--commit-interval", type=float, default=0.25)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka consumer setting (the harness pins fetch settings)")
    args = parser.parse_args()

    from quixstreams import Application, State

    app = Application(
        broker_address=args.bootstrap, consumer_group=args.group, auto_offset_reset="earliest",
        processing_guarantee=args.guarantee, commit_interval=args.commit_interval,
        state_dir=args.state_dir, loglevel="WARNING", auto_create_topics=True,
        use_changelog_topics=True,
        consumer_extra_config=dict(kv.split("=", 1) for kv in args.consumer_config),
    )
    source = app.topic(args.input, value_deserializer="json")
    sink = app.topic(args.output, value_serializer="json")

    def count(value: dict[str, Any], state: State) -> dict[str, Any]:
        n = state.get("count", 0) + 1
        state.set("count", n)
        return {"rid": value["reservation_id"], "version": value["version"], "count": n}

    sdf = app.dataframe(source)
    sdf = sdf.filter(lambda v: v["state"] != "CANCELLED")
    sdf = sdf.apply(count, stateful=True)
    sdf.to_topic(sink)
    app.run()


if __name__ == "__main__":
    main()
