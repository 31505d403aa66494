"""`aah submit`: start a training job on one of the server's targets (local, ray, slurm) from a shell,
as the dashboard's "Launch a training run" does, and optionally follow it to its end."""

from __future__ import annotations

import argparse
import os
import sys
import time

DEFAULT_SERVER = "http://127.0.0.1:8000"
ENDED = ("FINISHED", "FAILED", "KILLED")
RESOURCE_FLAGS = (("gpus", int), ("cpus", int), ("memory_gb", float), ("nodes", int), ("time_limit_min", int))


def _overrides(pairs: list[str]) -> dict[str, str]:
    """--set key=value pairs; the server coerces and validates each value (422 naming the key)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value (e.g. train.max_steps=2000); got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _line(run: dict) -> str:
    where = run.get("target", "local") + (f" job {run['engine_job_id']}" if run.get("engine_job_id") else "")
    why = run.get("pending_reason") if run["status"] == "PENDING" else run.get("error")
    return f"run {run['id']} on {where}: {run['status']}" + (f" ({why})" if why else "")


def cmd_submit(args: argparse.Namespace) -> int:
    from aah_client import ApiClient, ApiError

    try:
        overrides = _overrides(args.set)
    except ValueError as exc:
        print(f"aah submit: error: {exc}", file=sys.stderr)
        return 2
    resources = {name: getattr(args, name) for name, _ in RESOURCE_FLAGS if getattr(args, name) is not None}
    client = ApiClient(args.server, token=args.token or os.environ.get("AAH_API_TOKEN") or None)
    try:
        run = client.create_run(args.preset, overrides=overrides, name=args.name, experiment=args.experiment,
                                target=args.target, resources=resources)
        print(_line(run), flush=True)
        if not args.follow:
            return 0
        seen = _line(run)
        while run["status"] not in ENDED:
            time.sleep(args.poll_s)
            run = client.run(run["id"])
            if _line(run) != seen:
                seen = _line(run)
                print(seen, flush=True)
        for line in client.run_logs(run["id"], tail=args.tail)["lines"]:
            print(f"  | {line}")
        return 0 if run["status"] == "FINISHED" else 1
    except ApiError as exc:
        print(f"aah submit: error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


def add_submit(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `aah submit` on the engine's parser."""
    p = sub.add_parser("submit", help="start a training job on a target of the server (local, ray, slurm)")
    p.add_argument("--preset", required=True, help="preset name (see `aah presets`)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. train.max_steps=2000")
    p.add_argument("--target", default="local", help="where the job runs (GET /api/v1/targets; default local)")
    p.add_argument("--gpus", type=int, help="GPUs per node (several: the job runs under torchrun)")
    p.add_argument("--cpus", type=int, help="CPU cores per node")
    p.add_argument("--memory-gb", dest="memory_gb", type=float, help="memory per node, GB")
    p.add_argument("--nodes", type=int, help="nodes (more than one: slurm only)")
    p.add_argument("--time-limit-min", dest="time_limit_min", type=int, help="wall-clock limit, minutes (slurm)")
    p.add_argument("--name", help="run name (default the preset)")
    p.add_argument("--experiment", help="experiment (default 'default')")
    p.add_argument("--server", default=os.environ.get("AAH_SERVER_URL", DEFAULT_SERVER),
                   help=f"the server's URL (default $AAH_SERVER_URL or {DEFAULT_SERVER})")
    p.add_argument("--token", help="the server's API token (default $AAH_API_TOKEN)")
    p.add_argument("--follow", action="store_true", help="print each change of state until the run ends, then its "
                   "log tail; exit 0 only if it FINISHED")
    p.add_argument("--poll-s", type=float, default=2.0, help="with --follow: seconds between two looks")
    p.add_argument("--tail", type=int, default=20, help="with --follow: log lines printed at the end")
    p.set_defaults(func=cmd_submit)
