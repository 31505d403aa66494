"""The tracking side of the `aah` command: `train --tracking-uri ...`, `aah sync` and `aah import`.

Registered on the engine's parser by aah_launcher.cli; `train` gets its tracking options and a
callback factory (``train_callbacks``) that aah_core.cli calls, so the engine never imports HTTP code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only in annotations: `aah serve`, `aah submit` and `aah sync` never import torch
    from aah_core.config import RunConfig
    from aah_core.train import Callback

DEFAULT_URI = "http://127.0.0.1:8000"
RUN_ENV, SECRET_ENV = "AAH_TRACKING_RUN_ID", "AAH_TRACKING_SECRET"  # set by the server for the jobs it submits


def _uri(args: argparse.Namespace) -> str | None:
    uri = args.tracking_uri or os.environ.get("AAH_TRACKING_URI")
    if uri is not None and not uri.startswith(("http://", "https://")):
        raise ValueError(f"--tracking-uri {uri!r}: give the server's URL, e.g. http://127.0.0.1:8000")
    return uri


def _token(args: argparse.Namespace) -> str | None:
    return args.tracking_token or os.environ.get("AAH_API_TOKEN") or None


def tracking_callback(args: argparse.Namespace, config: RunConfig, out: Path) -> Callback | None:
    """The train command's tracking callback, when a tracking URI is given (flag or AAH_TRACKING_URI)."""
    uri = _uri(args)
    if uri is None or int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return None
    from aah_tracking.callback import TrackingCallback
    from aah_tracking.spool import Spool, spool_path
    from aah_tracking.transport import Transport

    spool = spool_path(out)
    if args.resume is None and spool.is_file():  # a new run in this folder: its histories start afresh too
        kept = spool.with_name(f"{spool.stem}.unsent-{int(spool.stat().st_mtime)}.jsonl")
        spool.rename(kept)
        print(f"aah tracking: an earlier run's unsent spool was moved to {kept} (send it with `aah sync {kept}`)",
              file=sys.stderr)
    # a job the server submitted to a cluster reports to the run made for it, with that run's write secret
    # (never the API token); both come in the environment
    run_id, secret = os.environ.get(RUN_ENV), os.environ.get(SECRET_ENV)
    attach = (int(run_id), secret) if run_id and secret else None
    transport = Transport(uri, None if attach else _token(args))
    return TrackingCallback(transport, Spool(spool), config, name=args.run_name or out.name,
                            experiment=args.experiment, group=args.group, tags=args.tag, upload=not args.no_upload,
                            flush_s=args.tracking_flush_s, reconnect_s=args.tracking_reconnect_s, attach=attach)


def _add_server_args(p: argparse._ActionsContainer, uri_help: str) -> None:
    """On a parser or an argument group (their common base)."""
    p.add_argument("--tracking-uri", help=uri_help)
    p.add_argument("--tracking-token", help="bearer token of the server (default $AAH_API_TOKEN)")


def add_train_tracking(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Give `aah train` its tracking options and callback."""
    p = sub.choices["train"]
    g = p.add_argument_group("tracking (report the run to an AAH Studio server)")
    _add_server_args(g, "server URL, e.g. http://gpu-box:8000 (default $AAH_TRACKING_URI; none: no tracking)")
    g.add_argument("--experiment", default="tracked", help="experiment name on the server (default tracked)")
    g.add_argument("--run-name", help="run name on the server (default the --out folder's name)")
    g.add_argument("--group", help="group of seeds this run belongs to (e.g. a suite row)")
    g.add_argument("--tag", action="append", default=[], help="a tag for the run (repeatable)")
    g.add_argument("--no-upload", action="store_true", help="record the checkpoint's path instead of uploading it")
    g.add_argument("--tracking-flush-s", type=float, default=2.0, help="send a batch at least this often (s)")
    g.add_argument("--tracking-reconnect-s", type=float, default=10.0,
                   help="while the server is unreachable, try it again this often (s)")
    p.set_defaults(train_callbacks=[tracking_callback])


def cmd_sync(args: argparse.Namespace) -> int:
    """Replay a run's spool (RUN_DIR's <name>.tracking.jsonl, or the spool file itself)."""
    from aah_tracking.spool import Spool, replay, spool_path
    from aah_tracking.transport import Refused, Transport, Unreachable

    given = Path(args.run)
    spool = Spool(given if given.suffix == ".jsonl" else spool_path(given))
    ops = spool.read()
    if not ops:
        print(f"aah sync: nothing to send: {spool.path} is missing or empty")
        return 0
    transport = Transport(_uri(args) or DEFAULT_URI, _token(args))
    try:
        sent = replay(transport, ops)
    except (Unreachable, Refused) as exc:
        print(f"aah sync: error: {exc}; the spool {spool.path} is kept", file=sys.stderr)
        return 1
    finally:
        transport.close()
    spool.clear()
    run_ids = sorted(set(transport.run_ids.values()))
    print(f"sent {sent} operations to {transport.uri} (run {', '.join(map(str, run_ids))}); removed {spool.path}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Register finished run folders of `aah train` with the server, idempotently."""
    from aah_core.errors import AAHError
    from aah_tracking.folder import folder_ops, suite_runs
    from aah_tracking.spool import tracked_marker
    from aah_tracking.transport import Refused, Transport, Unreachable

    transport = Transport(_uri(args) or DEFAULT_URI, _token(args))
    failed = 0
    try:
        for path in args.paths:
            suite = suite_runs(Path(path))
            for run_dir, identity in suite if suite is not None else [(Path(path), {"experiment": args.experiment})]:
                marker = tracked_marker(run_dir.resolve())
                if marker.is_file():  # trained with --tracking-uri: importing it would make a second run
                    print(f"{run_dir}: already tracked as run key {json.loads(marker.read_text()).get('run_key')} "
                          f"({marker.name}); nothing imported (`aah sync {run_dir}` sends what it spooled)")
                    continue
                try:
                    ops, summary = folder_ops(run_dir, upload=not args.no_upload, **identity)
                    created = transport.send(ops[0])
                    for op in ops[1:]:
                        transport.send(op)
                except (AAHError, ValueError, OSError) as exc:
                    print(f"aah import: {run_dir}: not imported: {exc}", file=sys.stderr)
                    failed += 1
                    continue
                except (Unreachable, Refused) as exc:
                    print(f"aah import: {run_dir}: error: {exc}", file=sys.stderr)
                    return 1
                run = created["run"]
                state = "new run" if created["created"] else "already there, nothing duplicated"
                print(f"{run_dir}: run {run['id']} in experiment {run['experiment']!r} ({state}): {summary}")
    finally:
        transport.close()
    return 2 if failed else 0


def add_sync_and_import(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `aah sync` and `aah import`."""
    p = sub.add_parser("sync", help="send a tracked run's spool to the server (what it could not send live)")
    p.add_argument("run", help="the run's --out folder, or its <name>.tracking.jsonl spool")
    _add_server_args(p, f"server URL (default $AAH_TRACKING_URI or {DEFAULT_URI})")
    p.set_defaults(func=cmd_sync)
    p = sub.add_parser("import", help="register finished `aah train` run folders with the server (idempotent)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run folders (--out of aah train: the checkpoint, "
                   "with <name>.metrics.jsonl and <name>.plans.jsonl beside it), or an `aah suite` output folder "
                   "(one experiment, a group per row, source suite)")
    _add_server_args(p, f"server URL (default $AAH_TRACKING_URI or {DEFAULT_URI})")
    p.add_argument("--experiment", default="imported", help="experiment name on the server (default imported; "
                   "a suite folder names its own)")
    p.add_argument("--no-upload", action="store_true", help="record the checkpoint's path instead of uploading it")
    p.set_defaults(func=cmd_import)
