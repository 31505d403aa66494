"""A finished suite as one compressed file to ship (data/suite/): every run's config, result, metric
history and window plans over training, so that a fresh store can show the reproduction.

Format: gzip'd JSON lines, written deterministically (sorted runs, gzip mtime 0). The first line is
the suite's header ``{"kind": "suite", ...}`` (its report without the per-run rows, plus the
summary); each further line is one run ``{"kind": "run", "row", "seed", "impl", "corpus", "lr_scale", "config",
"meta", "result", "metrics": [event, ...], "plans": [{"step", "time", "windows"}, ...]}``, the events exactly as
`aah train` wrote them to the run's metrics and plans JSONL. A study (aah_core/suite_study.py) keeps each
corpus and learning-rate scale in a subfolder: its runs are packed too. Packs written before the study
lack "corpus" and "lr_scale": they read as the code corpus at x1. Checkpoints are not packed (about 0.8 MB
each at the tiny model size; the histories are what the dashboard shows).

A pack may thin the per-step training events (`every` > 1, the header's "history_every"; a 5,000-step run logs
5,000 of them, and a fresh store imports every point at start): it then keeps the first and last events, every
`every`-th step, every evaluation, every event with a non-finite value, and in each `every`-step window the
events holding the lowest and the highest train_loss, so that no divergence and no spike drops out of the
shipped curve; of the window plans (an adaptive run stores one every few steps) it keeps the first of each
`every`-step window and the last. The run folders keep every event and plan.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aah_core.errors import AAHError

RUN_FOLDER = re.compile(r"^(?P<row>[a-z_]+?)(?:-(?P<impl>fixed))?(?:-lr(?P<lr>[0-9.]+))?-s(?P<seed>\d+)$")
CORPUS_NAMES = {"default": "code", "english": "english"}  # data.corpus -> the study's name (suite.CORPORA)
MAX_LINE_BYTES = 64 << 20  # one run's line: a few hundred kB at the shipped scale


DENSE_KEY = "train_loss"  # the per-step curve whose extremes a thinned history keeps in every window
EVAL_PREFIXES = ("val_", "retrieval")  # an evaluation event's keys


def thin_history(events: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """The events a pack keeps of one run's metric history with `every` (module docstring); all when every <= 1."""
    if every <= 1 or not events:
        return list(events)
    keep = {0, len(events) - 1}
    extremes: dict[int, list[int]] = {}  # window -> indices of its lowest and highest train_loss
    for i, event in enumerate(events):
        values = [v for k, v in event.items() if k not in ("step", "time")]
        if (event["step"] % every == 0 or any(k.startswith(EVAL_PREFIXES) for k in event)
                or any(isinstance(v, float) and not math.isfinite(v) for v in values)):
            keep.add(i)
        loss = event.get(DENSE_KEY)
        if isinstance(loss, (int, float)) and math.isfinite(loss):
            low_high = extremes.setdefault(event["step"] // every, [i, i])
            low_high[0] = i if loss < events[low_high[0]][DENSE_KEY] else low_high[0]
            low_high[1] = i if loss > events[low_high[1]][DENSE_KEY] else low_high[1]
    keep.update(i for low_high in extremes.values() for i in low_high)
    return [event for i, event in enumerate(events) if i in keep]


def thin_plans(plans: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """The plans a pack keeps with `every`: the first of each `every`-step window and the last; all when every <= 1."""
    if every <= 1:
        return list(plans)
    return [p for i, p in enumerate(plans)
            if i == 0 or i == len(plans) - 1 or p["step"] // every != plans[i - 1]["step"] // every]


@dataclass(frozen=True)
class PackedRun:
    row: str
    seed: int
    impl: str
    corpus: str
    lr_scale: float
    config: dict[str, Any]
    meta: dict[str, Any]
    result: dict[str, Any]
    metrics: list[dict[str, Any]]
    plans: list[dict[str, Any]]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def header_of(folder: Path) -> dict[str, Any]:
    """The run's checkpoint header (config.json: {"format", "config", "meta"})."""
    return json.loads((folder / "ckpt" / "config.json").read_text())


def pack_suite(out: str | Path, dest: str | Path, summary: dict[str, Any] | None = None,
               rows: Iterable[str] | None = None, every: int = 1) -> int:
    """Write the finished runs of suite folder `out` (those of `rows` only, when given; their training histories
    thinned to `every`, see thin_history) and its suite.json header, when present, to `dest`; returns the number
    of runs packed."""
    out = Path(out)
    report = json.loads((out / "suite.json").read_text()) if (out / "suite.json").is_file() else {}
    header = {"kind": "suite", **{k: v for k, v in report.items() if k != "rows"}, "summary": summary or {},
              **({"history_every": every} if every > 1 else {})}
    runs = folder_runs(out, rows, every)
    write_pack(dest, header, runs)
    return len(runs)


def folder_runs(out: str | Path, rows: Iterable[str] | None = None, every: int = 1) -> list[dict[str, Any]]:
    """The pack lines ({"kind": "run", ...}) of the finished runs in suite folder `out` (of `rows` only, when
    given; histories thinned to `every`), in folder order."""
    out = Path(out)
    wanted = None if rows is None else set(rows)
    lines = []
    for folder in sorted(p.parent for p in [*out.glob("*/result.json"), *out.glob("*/*/result.json")]):
        match = RUN_FOLDER.match(folder.name)
        if match is None or wanted is not None and match["row"] not in wanted:
            continue
        ckpt = header_of(folder)
        corpus = ckpt.get("config", {}).get("data", {}).get("corpus", "default")
        lines.append({"kind": "run", "row": match["row"], "seed": int(match["seed"]),
                      "impl": match["impl"] or "faithful", "corpus": CORPUS_NAMES.get(corpus, corpus),
                      "lr_scale": float(match["lr"] or 1), "config": ckpt.get("config", {}),
                      "meta": ckpt.get("meta", {}), "result": json.loads((folder / "result.json").read_text()),
                      "metrics": thin_history(_jsonl(folder / "ckpt.metrics.jsonl"), every),
                      "plans": thin_plans(_jsonl(folder / "ckpt.plans.jsonl"), every)})
    return lines


def write_pack(dest: str | Path, header: dict[str, Any], runs: Iterable[dict[str, Any]]) -> None:
    """Write `header` and the run lines to `dest`, deterministically (sorted keys, gzip mtime 0)."""
    dest = Path(dest)
    lines = [json.dumps(header, sort_keys=True), *(json.dumps(run, sort_keys=True) for run in runs)]
    dest.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode())
    tmp = dest.with_name(dest.name + ".tmp")  # a reader never sees half a pack
    tmp.write_bytes(buffer.getvalue())
    tmp.replace(dest)


def run_line(run: PackedRun) -> dict[str, Any]:
    """A packed run as the line it was read from."""
    return {"kind": "run", **dataclasses.asdict(run)}


def read_pack(path: str | Path) -> tuple[dict[str, Any], Iterator[PackedRun]]:
    """(header, runs) of a packed suite; raises AAHError on a file that is not one."""
    path = Path(path)
    try:
        with gzip.open(path, "rt") as f:
            first = f.readline(MAX_LINE_BYTES)
        header = json.loads(first)
    except (OSError, EOFError, ValueError) as exc:
        raise AAHError(f"{path}: not a packed suite ({exc})") from exc
    if not isinstance(header, dict) or header.get("kind") != "suite":
        raise AAHError(f"{path}: the first line is not a suite header")
    return header, _runs(path)


def _runs(path: Path) -> Iterator[PackedRun]:
    with gzip.open(path, "rt") as f:
        f.readline(MAX_LINE_BYTES)
        for n, line in enumerate(f, 2):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                yield PackedRun(row=str(doc["row"]), seed=int(doc["seed"]), impl=str(doc.get("impl", "faithful")),
                                corpus=str(doc.get("corpus", "code")), lr_scale=float(doc.get("lr_scale", 1.0)),
                                config=dict(doc["config"]), meta=dict(doc.get("meta", {})),
                                result=dict(doc["result"]),
                                metrics=list(doc["metrics"]), plans=list(doc["plans"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise AAHError(f"{path}:{n}: not a packed run ({exc})") from exc
