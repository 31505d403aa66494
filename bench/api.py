"""API benchmark over HTTP on loopback, against a real uvicorn process:

- live evaluation latency (p50/p95) for one-head edits of the demo model (each plan new, so
  the result cache never answers; cache hits are reported separately);
- heatmap latency (GET /models/{id}/attention for every head);
- metrics reads under 50 concurrent clients (p50/p95/p99, errors).

    python -m bench.api [--quick] [--demo-dir data/demo]

Uses the shipped demo checkpoint when present; otherwise an untrained checkpoint of the same
architecture (latency depends on the shape, not the weights), and says which in the result.
Writes bench/results/api-<machine>.json. Targets (issue 5): evaluate p50 <= 100 ms, p95 <= 200 ms.
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

from bench.common import percentiles, write_result

REPO = Path(__file__).resolve().parents[1]
API = "/api/v1"
N_CLIENTS = 50
HISTORY_STEPS = 3000  # a demo-length training history for the metrics reads


def _free_port() -> int:
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


def _seed_history(db_path: Path) -> int:
    """A finished run with a demo-length history (3 keys every step, val_loss every 100), written
    through the store while the server runs (WAL: a second writer is fine). Returns its id."""
    from backend import store
    from backend.db import make_engine, make_session_factory, transaction

    rng = random.Random(0)
    rows = []
    for step in range(1, HISTORY_STEPS + 1):
        t = 1.7e9 + step
        rows += [("train_loss", step, 5 - step / 1000 + rng.random() / 10, t), ("lr", step, 1e-3, t),
                 ("tokens_per_s", step, 1e4 + rng.random(), t)]
        if step % 100 == 0:
            rows.append(("val_loss", step, 4.5 - step / 1500, t))
    engine = make_engine(db_path)
    with transaction(make_session_factory(engine)) as s:
        run_id = store.create_run(s, name="bench history", experiment="bench", status="FINISHED")
        store.log_metrics(s, run_id, rows)
    engine.dispose()
    return run_id


def _start_server(data_dir: Path, demo_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "AAH_DATA_DIR": str(data_dir), "AAH_DEMO_DIR": str(demo_dir), "AAH_API_TOKEN": "",
           "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "uvicorn", "backend.app:app", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning"]
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--demo-dir", type=Path, default=REPO / "data" / "demo")
    args = parser.parse_args(argv)
    n_edits, per_client = (15, 4) if args.quick else (100, 20)
    with tempfile.TemporaryDirectory(prefix="aah-bench-api-") as tmp:
        root = Path(tmp)
        demo = args.demo_dir
        shipped = (demo / "model.safetensors").is_file()
        if not shipped:
            demo = _stand_in_demo(root)
        port = _free_port()
        proc = _start_server(root / "data", demo, port)
        base = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=base, timeout=120) as client:
                info = client.get(f"{API}/models/demo").json()
                result = {
                    "model": {k: info[k] for k in ("n_layer", "n_head", "seq_len", "n_params")},
                    "checkpoint": "shipped data/demo" if shipped else "untrained stand-in (demo shape)",
                    "targets": {"evaluate_p50_ms": 100, "evaluate_p95_ms": 200},
                    "evaluate": bench_evaluate(client, n_edits),
                    "heatmap": bench_heatmaps(client, info),
                    "metrics_reads": bench_metrics(base, client, _seed_history(root / "data" / "aah.db"),
                                                   per_client),
                    "quick": args.quick,
                    # a shared machine: the load says how much the numbers can be trusted
                    "load_average_1m_at_end": os.getloadavg()[0],
                }
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    path = write_result("api", result)
    ev = result["evaluate"]["one_head_edit_http_ms"]
    mr = result["metrics_reads"]
    print(f"evaluate one-head edit: p50 {ev['p50']:.1f} ms, p95 {ev['p95']:.1f} ms (target 100/200); "
          f"heatmap p50 {result['heatmap']['attention_http_ms']['p50']:.1f} ms; "
          f"metrics x{N_CLIENTS}: p99 {mr['latency_ms']['p99']:.1f} ms, errors {mr['errors']} -> {path}")


if __name__ == "__main__":
    main()
