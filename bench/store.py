"""The run store at lab scale, over HTTP against a real uvicorn (issue 14), on SQLite and PostgreSQL:

- batch writes: one tracked run of 1 M steps x 6 keys (6 M points) posted through the tracking API
  (``POST /tracking/runs/{id}/log``) in batches of 1,500 steps (9,000 points, about 0.7 MB: under the
  default AAH_MAX_BODY_BYTES and the 20,000 points a batch may hold);
- downsampled reads by 50 concurrent clients (``GET /runs/{id}/metrics?max_points=2000``):
  * ``poll``: every client asks for the whole run, all 6 keys (what open dashboards do); the first,
    cold read (nothing cached) is timed on its own before the clients start;
  * ``zoom``: every request asks for another random step range (1-10 % of the run) of one key, so
    every request is computed in the database (no response-cache hit);
  while both run, ``/health`` is probed every 100 ms (it must stay fast).

    python -m bench.store [--steps 1000000] [--db sqlite postgresql] [--body series|metrics] [--writes-only]
                          [--zoom-per-client N] [--keep DIR [--postgres-url URL]] [--name NAME]

Batches are sent in the columnar ``series`` form the client sends (``--body metrics``: one object per
point, the older form: results in store[-writes]-metrics-body-<machine>.json); ``--writes-only`` skips the
reads (results in store-writes-<machine>.json). ``--keep DIR`` keeps each database's data dir under
``DIR/<db>`` and the tracked run's id beside it: a later run with the same DIR (and steps) reads that run
again instead of writing it anew (the writes are the long part). PostgreSQL's rows live in its server, so
it is kept only with ``--postgres-url`` (a server that outlives the bench) and reused only on the same URL.
``--name`` names the result file (store-<name>-<machine>.json), for repeated runs.

PostgreSQL is a throwaway server started like the tests' (tests/postgres.py: Debian's package, a unix
socket, fsync and synchronous_commit off, so its write figure is an upper bound for a durable server);
SQLite is the default store (WAL, synchronous=NORMAL). Writes the figures with the load average to
bench/results/store-<machine>.json. Targets: read p99 <= 200 ms (SQLite), writes >= 50,000 points/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

from bench.api import API, REPO, free_port, start_server
from bench.common import percentiles, write_result

KEYS = ("train_loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "causal_coverage")
BATCH_STEPS = 1_500
MAX_POINTS = 2_000
N_CLIENTS = 50


def _new_run(client: httpx.Client) -> int:
    """A tracked run, created as a training process would (POST /tracking/runs); the client then carries
    the run's write secret on every request."""
    from aah_core.presets import get_preset

    body = {"run_key": f"bench-store-{time.time_ns()}", "name": "lab-scale", "experiment": "bench",
            "config": get_preset("demo").to_dict(), "total_steps": 1}
    r = client.post(f"{API}/tracking/runs", json=body)
    r.raise_for_status()
    client.headers["X-AAH-Run-Secret"] = r.json()["write_secret"]
    return r.json()["run"]["id"]


def _batch(steps: range, rng: random.Random, form: str) -> bytes:
    """One batch in the body form the client sends (``series``: columns per key) or in the row form."""
    values = {k: [rng.gauss(2.0, 0.5) for _ in steps] for k in KEYS}
    if form == "series":
        body = {"series": {k: {"step": list(steps), "value": values[k], "time": [1.7e9 + s / 10 for s in steps]}
                           for k in KEYS}}
    else:
        body = {"metrics": [{"key": k, "step": s, "value": values[k][i], "time": 1.7e9 + s / 10}
                            for i, s in enumerate(steps) for k in KEYS]}
    return json.dumps({**body, "step": steps[-1]}, separators=(",", ":")).encode()


def bench_writes(client: httpx.Client, run_id: int, n_steps: int, form: str) -> dict:
    rng = random.Random(0)
    post_s, body_bytes, written = [], 0, 0
    t0 = time.perf_counter()
    for start in range(0, n_steps, BATCH_STEPS):
        body = _batch(range(start, min(start + BATCH_STEPS, n_steps)), rng, form)
        body_bytes = max(body_bytes, len(body))
        t = time.perf_counter()
        r = client.post(f"{API}/tracking/runs/{run_id}/log", content=body, headers={"content-type": "application/json"})
        post_s.append(time.perf_counter() - t)
        r.raise_for_status()
        written += r.json()["metrics_written"]
    wall = time.perf_counter() - t0
    points = n_steps * len(KEYS)
    assert written == points, (written, points)
    return {"endpoint": "POST /tracking/runs/{id}/log", "body": form, "points": points, "batches": len(post_s),
            "points_per_batch": BATCH_STEPS * len(KEYS), "largest_body_bytes": body_bytes,
            "points_per_s": points / sum(post_s), "points_per_s_with_client_encoding": points / wall,
            "batch_ms": percentiles([x * 1000 for x in post_s])}


async def _health_probe(session: aiohttp.ClientSession, stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        async with session.get(f"{API}/health") as r:
            await r.read()
        out.append((time.perf_counter() - t) * 1000)
        await asyncio.sleep(0.1)


async def _clients(base: str, path: str, params_for, per_client: int, probe_health: bool = True) -> dict:
    """N_CLIENTS closed-loop clients (each sends its next request when the last one is answered) on one
    aiohttp session: its C parser leaves the server most of the CPU (httpx's clients took a third of a
    core and capped the server at 35-60 answers/s here)."""
    latencies: list[float] = []
    health: list[float] = []
    errors: dict[str, int] = {}
    sizes: list[int] = []

    async def one(session: aiohttp.ClientSession, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(per_client):
            t = time.perf_counter()
            try:
                async with session.get(path, params=params_for(rng)) as r:
                    body = await r.read()  # not parsed: 50 clients decoding JSON would eat the CPU
                if r.status == 200:
                    sizes.append(len(body))
                else:
                    errors[str(r.status)] = errors.get(str(r.status), 0) + 1
            except aiohttp.ClientError as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            latencies.append((time.perf_counter() - t) * 1000)

    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=N_CLIENTS + 1)
    async with aiohttp.ClientSession(base, connector=connector, timeout=aiohttp.ClientTimeout(total=300),
                                     auto_decompress=False) as session:
        probe = asyncio.create_task(_health_probe(session, stop, health)) if probe_health else None
        t0 = time.perf_counter()
        await asyncio.gather(*(one(session, i) for i in range(N_CLIENTS)))
        wall = time.perf_counter() - t0
        stop.set()
        if probe is not None:
            await probe
    out = {"clients": N_CLIENTS, "requests": len(latencies), "errors": errors, "latency_ms": percentiles(latencies),
           "requests_per_s": len(latencies) / wall, "largest_response_bytes": max(sizes, default=0)}
    return {**out, "health_ms_meanwhile": percentiles(health)} if probe_health else out


def bench_reads(base: str, client: httpx.Client, run_id: int, n_steps: int, per_client: int,
                zoom_per_client: int) -> dict:
    every_key = {"keys": ",".join(KEYS), "max_points": MAX_POINTS}
    t = time.perf_counter()
    body = client.get(f"{API}/runs/{run_id}/metrics", params=every_key).json()
    cold_ms = (time.perf_counter() - t) * 1000
    assert sorted(body["downsampled"]) == sorted(KEYS), body["downsampled"]
    assert all(len(series["step"]) <= MAX_POINTS for series in body["series"].values())

    def zoom(rng: random.Random) -> dict:
        span = rng.randint(n_steps // 100, n_steps // 10)
        lo = rng.randint(0, n_steps - span)
        return {"keys": rng.choice(KEYS), "max_points": MAX_POINTS, "min_step": lo, "max_step": lo + span - 1}

    metrics = f"{API}/runs/{run_id}/metrics"
    return {"cold_first_read_all_keys_ms": cold_ms,
            # the same clients asking for /health only: what this machine's HTTP stack gives any answer
            "health_only": asyncio.run(_clients(base, f"{API}/health", lambda rng: {}, per_client, False)),
            "poll": asyncio.run(_clients(base, metrics, lambda rng: every_key, per_client)),
            "zoom": asyncio.run(_clients(base, metrics, zoom, zoom_per_client))}


def _reused_run(saved: Path, n_steps: int, url: str | None) -> int | None:
    """The run a kept data dir holds (written by an earlier run with the same steps and store), if any."""
    if not saved.is_file():
        return None
    kept = json.loads(saved.read_text())
    return kept["run_id"] if (kept["steps"], kept["url"]) == (n_steps, url) else None


def bench_database(kind: str, n_steps: int, per_client: int, zoom_per_client: int, form: str, writes_only: bool,
                   keep: Path | None = None, postgres_url: str | None = None) -> dict:
    server = None
    with tempfile.TemporaryDirectory(prefix="aah-bench-store-") as tmp:
        data = Path(tmp) / "data" if keep is None else keep / kind
        env = {}
        if kind != "postgresql":
            postgres_url = None
        elif postgres_url is not None:
            env["AAH_DATABASE_URL"] = postgres_url
        else:
            from tests.postgres import PostgresServer, find_bin_dir

            bin_dir = find_bin_dir()
            if bin_dir is None:
                return {"skipped": "PostgreSQL is not installed (Debian package `postgresql`)"}
            server = PostgresServer(bin_dir)
            env["AAH_DATABASE_URL"] = server.new_database()
            keep = None  # its rows go with the throwaway server
        port = free_port()
        proc = start_server(data, REPO / "data" / "demo", port, env)
        writes = None
        saved = data / "bench-store-run.json"
        try:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=300) as client:
                load_before = os.getloadavg()[0]
                run_id = None if keep is None else _reused_run(saved, n_steps, postgres_url)
                if run_id is None:
                    run_id = _new_run(client)
                    writes = bench_writes(client, run_id, n_steps, form)
                    print(f"{kind}: {writes['points_per_s']:,.0f} points/s written ({form} bodies, load average "
                          f"{load_before:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
                    if keep is not None:
                        saved.write_text(json.dumps({"run_id": run_id, "steps": n_steps, "url": postgres_url}))
                else:
                    writes = {"reused": f"run {run_id}, written by an earlier run into {data}"}
                reads = (None if writes_only else
                         bench_reads(base, client, run_id, n_steps, per_client, zoom_per_client))
            return {"writes": writes, "load_average_1m_before": load_before,
                    "load_average_1m_at_end": os.getloadavg()[0], **({} if reads is None else {"reads": reads})}
        except httpx.TimeoutException as exc:  # say how far it got; the other database still runs
            return {"failed": f"{type(exc).__name__}: a request took longer than the client's 300 s",
                    "writes": writes, "load_average_1m_at_end": os.getloadavg()[0]}
        finally:
            proc.kill()  # a read still running in a thread would keep a terminated uvicorn waiting
            proc.wait(timeout=60)
            if server is not None:
                server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000, help="steps of the run (x 6 keys)")
    parser.add_argument("--db", nargs="+", choices=("sqlite", "postgresql"), default=["sqlite", "postgresql"])
    parser.add_argument("--per-client", type=int, default=20, help="poll requests per client (zoom: a tenth)")
    parser.add_argument("--body", choices=("series", "metrics"), default="series",
                        help="batch body form: columns per key (what aah_tracking sends) or one object per point")
    parser.add_argument("--writes-only", action="store_true", help="measure the writes only, no reads")
    parser.add_argument("--zoom-per-client", type=int, help="zoom requests per client (default: a tenth of "
                        "--per-client, at least 1)")
    parser.add_argument("--keep", type=Path, help="keep the data dirs here; read the run kept there, if any, "
                        "instead of writing it again")
    parser.add_argument("--postgres-url", help="PostgreSQL store to use instead of a throwaway server (with "
                        "--keep: its run is kept too)")
    parser.add_argument("--name", help="result file store-<name>-<machine>.json (default: store[-writes])")
    args = parser.parse_args(argv)
    result = {"steps": args.steps, "keys": list(KEYS), "max_points": MAX_POINTS,
              "targets": {"read_p99_ms_sqlite": 200, "write_points_per_s": 50_000}}
    name = ("store-writes" if args.writes_only else "store") + ("" if args.body == "series" else "-metrics-body")
    name = name if args.name is None else f"store-{args.name}"
    zoom_per_client = args.zoom_per_client or max(1, args.per_client // 10)
    result["zoom_requests"] = zoom_per_client * N_CLIENTS
    for kind in args.db:
        result[kind] = bench_database(kind, args.steps, args.per_client, zoom_per_client, args.body,
                                      args.writes_only, args.keep, args.postgres_url)
        path = write_result(name, result)  # after each database: a later failure keeps what was measured
        r = result[kind]
        if "reads" in r:
            print(f"{kind}: cold read {r['reads']['cold_first_read_all_keys_ms']:.0f} ms; "
                  f"health-only p99 {r['reads']['health_only']['latency_ms']['p99']:.0f} ms, "
                  f"poll p99 {r['reads']['poll']['latency_ms']['p99']:.0f} ms, "
                  f"zoom p99 {r['reads']['zoom']['latency_ms']['p99']:.0f} ms", flush=True)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
