"""POST /v1/plans with a 100-stage profile at 200 requests per second on loopback: p50/p99 latency
and errors, against GET /v1/healthz at the same rate (the HTTP stack's own floor) and the library
call alone, all measured in this run. Open loop: latency counts from each request's scheduled
time, so a stalled server cannot hide queueing (no coordinated omission).

    .venv/bin/python benchmarks/bench_service.py [--rate 200] [--seconds 10] [--strategy sqrt]

Bounded: rate x seconds requests per phase (2,000 by default), 127.0.0.1 only. Writes
out/bench_service.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.service.conftest import make_profile  # noqa: E402
from tests.service.server import Server  # noqa: E402


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def _open_loop(url: str, method: str, path: str, body: list[bytes] | None, rate: float, n: int,
                     connections: int = 32):
    """`n` requests at `rate` per second over `connections` keep-alive HTTP/1.1 connections, with a
    minimal client on asyncio streams (httpx costs several ms of CPU a request, which on 2 cores
    would measure the client, not the server)."""
    host, port = url.removeprefix("http://").split(":")
    pool: asyncio.Queue = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await asyncio.open_connection(host, int(port)))
    lat: list[float] = []
    errors = 0
    start = time.perf_counter() + 0.2

    async def one(i: int) -> None:
        nonlocal errors
        due = start + i / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        reader, writer = await pool.get()
        try:
            if body is None:
                writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            else:
                data = body[i % len(body)]
                writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            if status != 200:
                errors += 1
            pool.put_nowait((reader, writer))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            errors += 1
            writer.close()
            pool.put_nowait(await asyncio.open_connection(host, int(port)))
        lat.append(time.perf_counter() - due)

    await asyncio.gather(*(one(i) for i in range(n)))
    while not pool.empty():
        _, writer = pool.get_nowait()
        writer.close()
    return lat, errors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--stages", type=int, default=100)
    ap.add_argument("--strategy", default="sqrt")
    ap.add_argument("--distinct", type=int, default=0,
                    help="distinct bodies (budgets) cycled; 0: every request distinct (no cache hits)")
    args = ap.parse_args()
    n = int(args.rate * args.seconds)
    if n > 20_000:
        raise SystemExit("--rate x --seconds: at most 20,000 requests")
    from memplan import planner
    profile = make_profile(args.stages)
    distinct = args.distinct or n
    base = planner.plan(profile, strategy="store-all").predicted.peak_bytes
    bodies = [json.dumps({"profile": profile, "budget_bytes": base - 97 * i, "strategy": args.strategy}).encode()
              for i in range(distinct)]
    t = time.perf_counter()
    for b in bodies[:200]:
        d = json.loads(b)
        planner.plan(d["profile"], budget_bytes=d["budget_bytes"], strategy=args.strategy)
    lib_ms = (time.perf_counter() - t) / min(200, len(bodies)) * 1e3

    with tempfile.TemporaryDirectory() as tmp:
        srv = Server(Path(tmp), env={"MEMPLAN_START_WORKER": "false"}).start(ready=False)
        try:
            asyncio.run(_open_loop(srv.url, "POST", "/v1/plans", bodies[:50], 50, 100))  # warm-up
            h_lat, h_err = asyncio.run(_open_loop(srv.url, "GET", "/v1/healthz", None, args.rate, n))
            p_lat, p_err = asyncio.run(_open_loop(srv.url, "POST", "/v1/plans", bodies, args.rate, n))
        finally:
            srv.stop()

    rows = []
    for name, lat, err in (("GET /v1/healthz", h_lat, h_err), (f"POST /v1/plans ({args.strategy})", p_lat, p_err)):
        rows.append({
            "endpoint": name, "requests": len(lat), "errors": err,
            "p50_ms": statistics.median(lat) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3, "max_ms": max(lat) * 1e3,
        })
    floor = rows[0]["p99_ms"]
    print(f"{args.stages}-stage profile, {args.rate:g} req/s open loop for {args.seconds:g} s, "
          f"{distinct} distinct bodies; library call alone: {lib_ms:.2f} ms")
    print(f"{'endpoint':<28}{'requests':>9}{'errors':>7}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'p99 / healthz':>15}")
    for r in rows:
        print(f"{r['endpoint']:<28}{r['requests']:>9}{r['errors']:>7}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
              f"{r['max_ms']:>9.2f}{r['p99_ms'] / floor:>15.2f}")
    target = rows[1]["p99_ms"] < 50 and rows[1]["errors"] == 0
    print(f"target p99 < 50 ms with no errors: {'met' if target else 'NOT met'}")
    out = ROOT / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_service.json").write_text(json.dumps(
        {"rate": args.rate, "seconds": args.seconds, "stages": args.stages, "strategy": args.strategy,
         "library_ms": lib_ms, "rows": rows, "target_met": target}, indent=2))


if __name__ == "__main__":
    main()
