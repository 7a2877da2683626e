"""A closed-loop load of key reads against one query endpoint (its own process).

    python -m benchmarks.query_load URL KEYS.json --seconds 10 --concurrency 32

KEYS.json is a list of ``[type, key, group]``. ``concurrency`` requests are kept in flight
(aiohttp, keep-alive connections) for ``seconds``; prints one JSON object: reads, reads/s,
latency percentiles (ms) of answered reads, and the count of each answer status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from typing import Any

import aiohttp

__all__ = ["main"]


async def _load(url: str, keys: list[list[str]], seconds: float, concurrency: int,
                token: str | None) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    conn = aiohttp.TCPConnector(limit=concurrency)
    end = time.monotonic() + seconds
    rng = random.Random(7)
    async with aiohttp.ClientSession(connector=conn, headers=headers) as session:
        async def one() -> None:
            while time.monotonic() < end:
                t, k, g = keys[rng.randrange(len(keys))]
                t0 = time.perf_counter()
                try:
                    async with session.get(f"{url}/v1/entities/{t}/{k}", params={"group": g}) as r:
                        body = await r.json()
                        status = str(body.get("status"))
                except (aiohttp.ClientError, ValueError) as exc:
                    status = type(exc).__name__
                latencies.append((time.perf_counter() - t0) * 1000)
                statuses[status] = statuses.get(status, 0) + 1

        t0 = time.monotonic()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        took = time.monotonic() - t0
    latencies.sort()

    def pct(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3) if latencies else None
    return {"reads": len(latencies), "seconds": round(took, 3), "reads_per_s": round(len(latencies) / took, 1),
            "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99), "max_ms": pct(1.0),
            "statuses": statuses, "concurrency": concurrency}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("keys")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--token", default=None)
    a = ap.parse_args(argv)
    with open(a.keys) as f:
        keys = json.load(f)
    result = asyncio.run(_load(a.url, keys, a.seconds, a.concurrency, a.token))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
