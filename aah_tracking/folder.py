"""A finished run folder of `aah train` (checkpoint + metrics and plans histories) as tracking operations.

The run key is a hash of the folder's content, so importing the same run again names the same run
on the server (and every operation is idempotent there): `aah import` can be repeated safely. The run's
write secret is another hash of the same content, which the key does not reveal: whoever holds the
folder may import it again (or finish an import that was cut short), nobody else may write to the run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from aah_core.checkpoint import FILES, read_checkpoint_info
from aah_tracking.callback import log_ops, metric_value
from aah_tracking.transport import Op

NOT_METRICS = ("step", "time")


def histories(run_dir: Path) -> tuple[Path, Path]:
    """The metrics and plans JSONL files `aah train --out run_dir` writes beside the checkpoint."""
    return tuple(run_dir.parent / f"{run_dir.name}.{kind}.jsonl" for kind in ("metrics", "plans"))  # type: ignore[return-value]


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{path}, line {n}: not JSON; the history is corrupt") from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{path}, line {n}: expected an object with an integer 'step'")
        rows.append(row)
    return rows


def content_key(files: list[Path], salt: str = "") -> tuple[str, str]:
    """(run key, write secret) of ``salt`` and the files' names and bytes (missing files count as absent):
    'import-' + 40 hex digits of their SHA-256, and the SHA-256 of the same bytes followed by a marker (the
    key's truncated digest does not give it away)."""
    digest = hashlib.sha256(salt.encode())
    for file in files:
        if file.is_file():
            digest.update(file.name.encode() + b"\0")
            with file.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    secret = digest.copy()
    secret.update(b"\0aah write secret")
    return f"import-{digest.hexdigest()[:40]}", secret.hexdigest()


def suite_runs(path: Path) -> list[tuple[Path, dict[str, str]]] | None:
    """The runs of an `aah suite` output folder (it holds suite.json; one ``<row>-s<seed>/ckpt`` per run),
    each with its identity: one experiment for the folder, one group per row. None for another folder."""
    report_file = path / "suite.json"
    if not report_file.is_file():
        return None
    report = json.loads(report_file.read_text())
    experiment = f"{report.get('suite', 'paper')} suite · {report.get('scale', '?')} scale · {path.resolve().name}"
    runs = []
    for folder in sorted(p for p in path.iterdir() if (p / "ckpt" / "config.json").is_file()):
        group, _, seed = folder.name.rpartition("-s")
        runs.append((folder / "ckpt", {"experiment": experiment, "group": group or folder.name,
                                        "name": f"{group or folder.name} · seed {seed}", "source": "suite"}))
    return runs


def folder_ops(run_dir: str | Path, experiment: str = "imported", upload: bool = True, *, name: str | None = None,
               group: str | None = None, source: str = "imported") -> tuple[list[Op], str]:
    """The operations that register ``run_dir``, and a one-line summary of them."""
    run_dir = Path(run_dir).resolve()
    info = read_checkpoint_info(run_dir)  # validates config, plan and weights header; names the bad file
    metrics_file, plans_file = histories(run_dir)
    salt = "" if source == "imported" else f"{source}/{experiment}/{group}/{name}"  # suite seeds may be equal files
    key, secret = content_key([run_dir / f for f in FILES] + [metrics_file, plans_file], salt)
    config = info.config
    step = int(info.meta.get("step", config.train.max_steps))
    create = {"op": "create", "run_key": key, "body": {
        "run_key": key, "write_secret": secret, "name": name or run_dir.name, "experiment": experiment,
        "source": source, "group": group, "preset": config.preset,
        "config": config.to_dict(), "data_hash": info.meta.get("data_hash"), "git_rev": info.meta.get("git_rev"),
        "total_steps": config.train.max_steps, "seed": config.train.seed}}
    points = [{"key": k, "step": row["step"], "value": "nan" if v is None else metric_value(v),
               "time": float(row.get("time", 0.0))}
              for row in _rows(metrics_file) for k, v in row.items() if k not in NOT_METRICS]
    plans = [{"step": row["step"], "windows": row["windows"]} for row in _rows(plans_file) if "windows" in row]
    status: dict[str, Any] = {"status": "FINISHED", "step": step}
    ops: list[Op] = [create, *log_ops(key, points, plans, step)]
    if upload:
        ops.append({"op": "checkpoint", "run_key": key, "path": str(run_dir)})
    else:
        status["checkpoint_ref"] = str(run_dir)
    ops.append({"op": "status", "run_key": key, "body": status})
    summary = (f"{len(points)} metric points, {len(plans)} plans, checkpoint "
               + ("uploaded" if upload else "recorded as a reference"))
    return ops, summary
