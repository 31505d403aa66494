"""API benchmark over HTTP on loopback, against a real uvicorn process:

- live evaluation latency (p50/p95) for one-head edits of the demo model (each plan new, so
  the result cache never answers; cache hits are reported separately);
- heatmap latency (GET /models/{id}/attention for every head);
- metrics reads under 50 concurrent clients (p50/p95/p99, errors);
- /health under load (issue 10 item 4): 20 clients sending heavy requests (one-head evaluations,
  heatmaps at random windows, allocations at random budgets, each honouring 429's Retry-After) and
  20 pollers of a run with a million metric rows (half of them zooming, so their reads miss the
  cache), while a prober asks /health every 50 ms. Target: p95 <= 50 ms.

    python -m bench.api [--quick] [--demo-dir data/demo] [--only-load]

Uses the shipped demo checkpoint when present; otherwise an untrained checkpoint of the same
architecture (latency depends on the shape, not the weights), and says which in the result.
Writes bench/results/api-<machine>.json (--only-load: api-load-<machine>.json). Targets (issue 5):
evaluate p50 <= 100 ms, p95 <= 200 ms; (issue 10) /health p95 <= 50 ms under the load above.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from aah_launcher.serve import API_PROTOCOL
from bench.common import percentiles, write_result

REPO = Path(__file__).resolve().parents[1]
API = "/api/v1"
N_CLIENTS = 50
HISTORY_STEPS = 3000  # a demo-length training history for the metrics reads
LOAD_STEPS = 330_000  # 3 keys a step + val_loss every 100: 1.0 M metric rows, as in issue 10's probe
LOAD_HEAVY_CLIENTS = 20
LOAD_POLLERS = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stand_in_demo(root: Path) -> Path:
    """A demo-shaped checkpoint (untrained), when data/demo is missing."""
    import torch

    from aah_core.checkpoint import save_checkpoint
    from aah_core.model import WindowedGPT
    from aah_core.presets import get_preset

    config = get_preset("demo")
    torch.manual_seed(0)
    path = save_checkpoint(root / "demo", WindowedGPT(config.model), config)
    return path


def _seed_history(db_path: Path, steps: int = HISTORY_STEPS) -> int:
    """A finished run with a history of ``steps`` steps (3 keys every step, val_loss every 100), written
    through the store while the server runs (WAL: a second writer is fine). Returns its id."""
    from backend.store import metric_store, run_store
    from backend.store.db import make_engine, make_session_factory, transaction

    rng = random.Random(0)
    engine = make_engine(db_path)
    sessions = make_session_factory(engine)
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name=f"bench history ({steps} steps)", experiment="bench", status="FINISHED")
    for first in range(1, steps + 1, 50_000):  # in batches: a million rows do not sit in memory at once
        rows = []
        for step in range(first, min(first + 50_000, steps + 1)):
            t = 1.7e9 + step
            rows += [("train_loss", step, 5 - step / 1000 + rng.random() / 10, t), ("lr", step, 1e-3, t),
                     ("tokens_per_s", step, 1e4 + rng.random(), t)]
            if step % 100 == 0:
                rows.append(("val_loss", step, 4.5 - step / 1500, t))
        with transaction(sessions) as s:
            metric_store.log_metrics(s, run_id, rows)
    engine.dispose()
    return run_id


def start_server(data_dir: Path, demo_dir: Path, port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A uvicorn child serving the API on loopback as `aah serve` does (extra ``env`` on top), once /health
    answers."""
    env = {**os.environ, "AAH_DATA_DIR": str(data_dir), "AAH_DEMO_DIR": str(demo_dir), "AAH_API_TOKEN": "",
           "PYTHONPATH": str(REPO), **(env or {})}
    cmd = [sys.executable, "-m", "uvicorn", "backend.app:app", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning", "--http", API_PROTOCOL]  # the protocol `aah serve` and the image run
    proc = subprocess.Popen(cmd, env=env, cwd=str(REPO))
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}{API}/health", timeout=2).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with code {proc.returncode}")
            time.sleep(0.3)
        raise RuntimeError("the API did not become healthy within 180 s")
    except BaseException:  # timeout, early exit or Ctrl-C: never leave the server behind
        proc.kill()
        proc.wait()
        raise


def _one_head_edits(plan: list[list[int | None]], buckets: list[int | None], n: int, seed: int = 0) -> list:
    """n distinct plans, each the model's own plan with one head set to another bucket."""
    rng = random.Random(seed)
    edits = [(layer, head, b) for layer in range(len(plan)) for head in range(len(plan[0])) for b in buckets
             if b != plan[layer][head]]
    rng.shuffle(edits)
    out = []
    for layer, head, b in edits[:n]:
        edited = [list(row) for row in plan]
        edited[layer][head] = b
        out.append(edited)
    return out


def bench_evaluate(client: httpx.Client, n: int) -> dict:
    own = client.get(f"{API}/models/demo/windows").json()["windows"]
    buckets = client.get(f"{API}/models/demo").json()["buckets"]
    client.post(f"{API}/models/demo/evaluate", json={"windows": own})  # baseline + evaluator warm-up
    plans = _one_head_edits(own, buckets, n)
    http_ms, server_ms = [], []
    for plan in plans:
        t0 = time.perf_counter()
        body = client.post(f"{API}/models/demo/evaluate", json={"windows": plan}).json()
        http_ms.append((time.perf_counter() - t0) * 1000)
        server_ms.append(body["elapsed_ms"])
    cached_ms = []
    for plan in plans[: min(20, len(plans))]:
        t0 = time.perf_counter()
        assert client.post(f"{API}/models/demo/evaluate", json={"windows": plan}).json()["cached"]
        cached_ms.append((time.perf_counter() - t0) * 1000)
    return {"one_head_edit_http_ms": percentiles(http_ms), "one_head_edit_server_ms": percentiles(server_ms),
            "cached_http_ms": percentiles(cached_ms)}


def bench_heatmaps(client: httpx.Client, info: dict) -> dict:
    samples = []
    for layer in range(info["n_layer"]):
        for head in range(info["n_head"]):
            for window in (None, 16):
                params = {"layer": layer, "head": head, **({"window": window} if window else {})}
                t0 = time.perf_counter()
                r = client.get(f"{API}/models/demo/attention", params=params)
                samples.append((time.perf_counter() - t0) * 1000)
                r.raise_for_status()
    return {"attention_http_ms": percentiles(samples), "n_tokens": r.json()["n_tokens"]}


async def _metrics_clients(base: str, run_id: int, per_client: int) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=N_CLIENTS)

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal errors
        for _ in range(per_client):
            t0 = time.perf_counter()
            try:
                r = await client.get(f"{API}/runs/{run_id}/metrics", params={"keys": "train_loss,val_loss,lr"})
                # the body is not parsed here: 50 clients decoding JSON would eat the server's CPU
                if r.status_code != 200 or b'"train_loss":{"step":[' not in r.content:
                    errors += 1
            except httpx.HTTPError:
                errors += 1
            latencies.append((time.perf_counter() - t0) * 1000)

    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        await asyncio.gather(*(one(client) for _ in range(N_CLIENTS)))
    return latencies, errors


def bench_metrics(base: str, client: httpx.Client, run_id: int, per_client: int) -> dict:
    points = client.get(f"{API}/runs/{run_id}/metrics", params={"keys": "train_loss,val_loss,lr"}).json()
    n_points = sum(len(s["step"]) for s in points["series"].values())
    t0 = time.perf_counter()
    latencies, errors = asyncio.run(_metrics_clients(base, run_id, per_client))
    wall = time.perf_counter() - t0
    return {"clients": N_CLIENTS, "requests": len(latencies), "errors": errors, "points_per_response": n_points,
            "latency_ms": percentiles(latencies), "requests_per_s": len(latencies) / wall}


async def _load(base: str, run_id: int, steps: int, own: list, buckets: list, seq_len: int,
                seconds: float) -> dict:
    """Heavy clients and metric pollers for ``seconds``, /health probed every 50 ms meanwhile."""
    rng = random.Random(1)
    edits = _one_head_edits(own, buckets, 10_000)
    deadline = time.perf_counter() + seconds
    counts = {"heavy_ok": 0, "heavy_429": 0, "heavy_errors": 0, "metrics_ok": 0, "metrics_429": 0,
              "metrics_errors": 0}
    health_ms: list[float] = []
    health_errors = 0

    def heavy_request() -> tuple[str, str, dict]:
        kind = rng.choice(("evaluate", "attention", "allocate"))
        if kind == "evaluate":
            return "POST", f"{API}/models/demo/evaluate", {"json": {"windows": rng.choice(edits)}}
        if kind == "attention":
            return "GET", f"{API}/models/demo/attention", {"params": {
                "layer": rng.randrange(len(own)), "head": rng.randrange(len(own[0])),
                "window": rng.randint(1, seq_len)}}
        return "POST", f"{API}/models/demo/allocate", {"json": {"budget": round(rng.uniform(0.05, 0.95), 3)}}

    async def heavy_client(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            method, path, kwargs = heavy_request()
            try:
                r = await client.request(method, path, **kwargs)
            except httpx.HTTPError:
                counts["heavy_errors"] += 1
                continue
            if r.status_code == 429:
                counts["heavy_429"] += 1
                await asyncio.sleep(float(r.headers.get("retry-after", 1)))
            else:
                counts["heavy_ok" if r.status_code == 200 else "heavy_errors"] += 1

    async def poller(client: httpx.AsyncClient, zoom: bool) -> None:
        while time.perf_counter() < deadline:
            params = {"keys": "train_loss,val_loss,lr", "max_points": 2000}
            if zoom:  # a zoomed chart: a step range of its own, so the read misses the cache
                lo = rng.randrange(1, steps)
                params.update(min_step=lo, max_step=lo + rng.randrange(1_000, steps // 3))
            try:
                r = await client.get(f"{API}/runs/{run_id}/metrics", params=params)
                key = {200: "metrics_ok", 429: "metrics_429"}.get(r.status_code, "metrics_errors")
                if key == "metrics_errors":
                    print("metrics read failed:", r.status_code, r.text[:300], params)
                counts[key] += 1
                if r.status_code == 429:
                    await asyncio.sleep(float(r.headers.get("retry-after", 1)))
            except httpx.HTTPError as exc:
                print("metrics read failed:", repr(exc), params)
                counts["metrics_errors"] += 1
            await asyncio.sleep(0.25)

    def prober() -> None:  # a thread with its own connection: the load's event loop does not delay it
        nonlocal health_errors
        with httpx.Client(base_url=base, timeout=30) as client:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    ok = client.get(f"{API}/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                health_ms.append((time.perf_counter() - t0) * 1000)
                health_errors += not ok
                time.sleep(0.05)

    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=300) as client:
        probe = asyncio.create_task(asyncio.to_thread(prober))
        await asyncio.gather(*(heavy_client(client) for _ in range(LOAD_HEAVY_CLIENTS)),
                             *(poller(client, zoom=i % 2 == 1) for i in range(LOAD_POLLERS)))
        await probe
    return {"health_ms": percentiles(health_ms) | {"max": max(health_ms)}, "health_errors": health_errors,
            **counts}


def bench_load(base: str, client: httpx.Client, db_path: Path, steps: int, seconds: float) -> dict:
    t0 = time.perf_counter()
    run_id = _seed_history(db_path, steps)
    seed_s = time.perf_counter() - t0
    own = client.get(f"{API}/models/demo/windows").json()["windows"]
    info = client.get(f"{API}/models/demo").json()
    idle = []
    for _ in range(50):
        t = time.perf_counter()
        client.get(f"{API}/health").raise_for_status()
        idle.append((time.perf_counter() - t) * 1000)
    loaded = asyncio.run(_load(base, run_id, steps, own, info["buckets"], info["seq_len"], seconds))
    return {"run_steps": steps, "metric_rows": steps * 3 + steps // 100, "seed_s": seed_s, "seconds": seconds,
            "heavy_clients": LOAD_HEAVY_CLIENTS, "pollers": LOAD_POLLERS, "health_idle_ms": percentiles(idle),
            "target_health_p95_ms": 50, **loaded}


def _latency_sections(client: httpx.Client, base: str, info: dict, db_path: Path, quick: bool) -> dict:
    n_edits, per_client = (15, 4) if quick else (100, 20)
    return {"targets": {"evaluate_p50_ms": 100, "evaluate_p95_ms": 200},
            "evaluate": bench_evaluate(client, n_edits), "heatmap": bench_heatmaps(client, info),
            "metrics_reads": bench_metrics(base, client, _seed_history(db_path), per_client)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests, a smaller run, a shorter load")
    parser.add_argument("--only-load", action="store_true", help="only /health under load (api-load-<machine>)")
    parser.add_argument("--demo-dir", type=Path, default=REPO / "data" / "demo")
    args = parser.parse_args(argv)
    steps, seconds = (LOAD_STEPS // 10, 10.0) if args.quick else (LOAD_STEPS, 30.0)
    with tempfile.TemporaryDirectory(prefix="aah-bench-api-") as tmp:
        root = Path(tmp)
        demo = args.demo_dir
        shipped = (demo / "model.safetensors").is_file()
        if not shipped:
            demo = _stand_in_demo(root)
        port = free_port()
        proc = start_server(root / "data", demo, port)
        base = f"http://127.0.0.1:{port}"
        db_path = root / "data" / "aah.db"
        try:
            with httpx.Client(base_url=base, timeout=120) as client:
                info = client.get(f"{API}/models/demo").json()
                result = {
                    "model": {k: info[k] for k in ("n_layer", "n_head", "seq_len", "n_params")},
                    "checkpoint": "shipped data/demo" if shipped else "untrained stand-in (demo shape)",
                    **({} if args.only_load else _latency_sections(client, base, info, db_path, args.quick)),
                    "load": bench_load(base, client, db_path, steps, seconds),
                    "quick": args.quick,
                    # a shared machine: the load says how much the numbers can be trusted
                    "load_average_1m_at_end": os.getloadavg()[0],
                }
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    path = write_result("api-load" if args.only_load else "api", result)
    load = result["load"]
    summary = (f"/health under load: p50 {load['health_ms']['p50']:.1f} ms, p95 {load['health_ms']['p95']:.1f} ms "
               f"(target 50), max {load['health_ms']['max']:.0f} ms; heavy ok {load['heavy_ok']}, "
               f"429 {load['heavy_429']}; metric reads ok {load['metrics_ok']}")
    if not args.only_load:
        ev = result["evaluate"]["one_head_edit_http_ms"]
        mr = result["metrics_reads"]
        summary = (f"evaluate one-head edit: p50 {ev['p50']:.1f} ms, p95 {ev['p95']:.1f} ms (target 100/200); "
                   f"heatmap p50 {result['heatmap']['attention_http_ms']['p50']:.1f} ms; "
                   f"metrics x{N_CLIENTS}: p99 {mr['latency_ms']['p99']:.1f} ms, errors {mr['errors']}; " + summary)
    print(f"{summary} -> {path}")


if __name__ == "__main__":
    main()
