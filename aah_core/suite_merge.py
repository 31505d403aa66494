"""A shipped suite pack as the source of truth: its report regenerated from the pack alone, and rows added to it.

The run folders a pack was written from need not outlive it (the shipped mini suite was trained on another
machine), so `study_from_pack` rebuilds the study (aah_core/suite_study.py) from the packed results, and
`add_to_pack` merges the finished runs of a new suite folder into an existing pack: by run identity (row, seed,
impl, corpus, lr scale), refusing a run the pack already holds and one whose settings differ from the pack's
runs of the same seed, corpus and learning rate in anything but the row's own keys (ROW_KEYS), so that a seed
still fixes the init and the data order of every row and the paired differences stay paired.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aah_core.errors import AAHError
from aah_core.paper import PAPER_ROWS
from aah_core.suite import CORPORA, MATCHED_ROWS, flat_config, render, summarize
from aah_core.suite_pack import PackedRun, folder_runs, read_pack, run_line, write_pack
from aah_core.suite_study import folder, render_study, summarize_study

# the config keys a suite row sets itself (its preset, its controller, sink_window's sinks): every other key is
# the suite's and must be the same in every row of a seed
ROW_KEYS = ("preset", "controller.", "model.sinks")
ORDER = (*PAPER_ROWS, *MATCHED_ROWS)
HAND = re.compile(r"^## .*\(added by hand\)", re.M)  # a report's hand-written sections start so


def suite_keys(config: dict[str, Any]) -> dict[str, Any]:
    """A run's resolved config without the keys its row sets (flattened)."""
    return {k: v for k, v in flat_config(config).items() if not k.startswith(ROW_KEYS)}


def identity(run: dict[str, Any]) -> tuple[str, int, str, str, float]:
    return run["row"], run["seed"], run["impl"], run["corpus"], run["lr_scale"]


def _name(run: dict[str, Any]) -> str:
    return f"{run['row']} seed {run['seed']} ({run['corpus']} corpus, lr x{run['lr_scale']:g}, {run['impl']})"


def check_addition(header: dict[str, Any], packed: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
    """Raise AAHError unless every run of `new` is absent from the pack and trained with the pack's settings."""
    held = {identity(r) for r in packed}
    for run in new:
        if identity(run) in held:
            raise AAHError(f"{_name(run)} is already in the pack: refusing a duplicate")
        if run["impl"] != header.get("impl", "faithful"):
            raise AAHError(f"{_name(run)}: controller impl {run['impl']!r}, the pack's is {header.get('impl')!r}")
        refs = [r for r in packed if (r["corpus"], r["lr_scale"], r["seed"]) == (run["corpus"], run["lr_scale"], run["seed"])]
        if not refs:
            raise AAHError(f"{_name(run)}: the pack has no run of that seed, corpus and learning rate (a row added to a "
                           "pack uses the pack's seeds, corpora and learning rates)")
        ref = next((r for r in refs if r["row"] == "baseline"), refs[0])
        mine, theirs = suite_keys(run["config"]), suite_keys(ref["config"])
        diff = [f"{k} {mine.get(k)!r} (pack: {theirs.get(k)!r})" for k in sorted(mine.keys() | theirs.keys())
                if mine.get(k) != theirs.get(k)]
        if run["meta"].get("data_hash") != ref["meta"].get("data_hash"):
            diff.append(f"data hash {run['meta'].get('data_hash')!r} (pack: {ref['meta'].get('data_hash')!r})")
        controller = run["config"].get("controller", {})
        if controller.get("mode") == "aah":  # the suite's controller warmup and interval
            diff += [f"{k} {controller.get(k.split('.', 1)[1])!r} (pack: {v!r})" for k, v in header.get("control", {}).items()
                     if controller.get(k.split(".", 1)[1]) != v]
        if diff:
            raise AAHError(f"{_name(run)}: settings differ from the pack's {ref['row']} seed {ref['seed']}: "
                           + "; ".join(diff))
        held.add(identity(run))


def pack_order(run: dict[str, Any]) -> tuple[str, str]:
    """The order pack_suite writes a study's runs in: by folder (corpus, then corpus-lr<scale>), then run folder."""
    impl = f"-{run['impl']}" if run["impl"] != "faithful" else ""
    lr = f"-lr{run['lr_scale']:g}" if run["lr_scale"] != 1 else ""
    return folder(Path(), run["corpus"], run["lr_scale"]).name, f"{run['row']}{impl}{lr}-s{run['seed']}"


def _row_order(row: str) -> tuple[int, str]:
    return (ORDER.index(row) if row in ORDER else len(ORDER), row)


def study_from_pack(header: dict[str, Any], runs: Iterable[PackedRun]) -> dict[str, Any]:
    """The study (as run_study returns it) of a pack's header and runs: one report per corpus at x1, one per
    swept learning rate on the first corpus, rows in the suite's order, each row's runs by seed."""
    runs = list(runs)
    corpora = list(header.get("corpora") or [header.get("corpus", "code")])
    settings = dict(header.get("settings", {}))

    def report(corpus: str, lr_scale: float) -> dict[str, Any]:
        chosen = sorted((r for r in runs if (r.corpus, r.lr_scale) == (corpus, lr_scale)),
                        key=lambda r: (*_row_order(r.row), r.seed))
        rows: dict[str, list[dict[str, Any]]] = {}
        for r in chosen:
            rows.setdefault(r.row if r.impl == header.get("impl", r.impl) else f"{r.row}-{r.impl}", []).append(r.result)
        lr = {"train.lr": settings["train.lr"] * lr_scale} if lr_scale != 1 and "train.lr" in settings else {}
        meta = {k: v for k, v in header.items() if k not in ("kind", "summary", "corpora", "lr_scales")}
        seeds = {"seeds": max(map(len, rows.values()), default=1)} if lr_scale != 1 else {}  # the sweep: one seed
        return {**meta, "corpus": corpus, "lr_scale": lr_scale, "rows": rows, **seeds,
                "settings": {**settings, "data.corpus": CORPORA.get(corpus, corpus), **lr}}

    scales = sorted({r.lr_scale for r in runs if r.lr_scale != 1 and r.corpus == corpora[0]})
    return {"corpora": {c: report(c, 1.0) for c in corpora}, "lr": {f"{s:g}": report(corpora[0], s) for s in scales}}


def study_text(study: dict[str, Any]) -> str:
    """The markdown report of a study: the suite's alone for one corpus without a sweep."""
    if len(study["corpora"]) == 1 and not study["lr"]:
        return render(next(iter(study["corpora"].values())))
    return render_study(study)


def pack_summary(study: dict[str, Any]) -> dict[str, Any]:
    """A pack header's summary: the first corpus' per-row summary, and the study's."""
    return {**summarize(next(iter(study["corpora"].values()))), "study": summarize_study(study)}


def write_report(doc: str | Path, study: dict[str, Any]) -> None:
    """Write the study's report to `doc` and its .json beside it, keeping the sections of the old `doc` written
    by hand (from the first heading that says "(added by hand)" on)."""
    doc = Path(doc)
    text = study_text(study)
    old = doc.read_text() if doc.is_file() else ""
    hand = HAND.search(old)
    if hand:
        text = text.rstrip("\n") + "\n\n" + old[hand.start():]
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    if len(study["corpora"]) == 1 and not study["lr"]:  # as run_suite writes it
        report = next(iter(study["corpora"].values()))
        saved = {**report, "summary": summarize(report)}
    else:  # as run_study writes it
        saved = {**study, "summary": summarize_study(study)}
    doc.with_suffix(".json").write_text(json.dumps(saved, indent=1))


def with_rows(command: str, rows: list[str]) -> str:
    """`command` with its --rows replaced by `rows` (unchanged when it trains every row)."""
    return re.sub(r"--rows \S+", f"--rows {','.join(rows)}", command)


def add_to_pack(out: str | Path, pack: str | Path, rows: Iterable[str] | None = None, command: str = "",
                machine: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """Merge the finished runs of suite folder `out` (of `rows` only, when given) into `pack`, refreshing its
    header's rows, command and summary and noting the addition (command, machine, date); returns the number of
    runs added and the merged study. Raises AAHError (and writes nothing) on a duplicate or a settings mismatch."""
    header, packed_runs = read_pack(pack)
    packed = [run_line(r) for r in packed_runs]
    new = folder_runs(out, rows, header.get("history_every", 1))  # thinned as the pack's own runs
    if not new:
        raise AAHError(f"no finished runs{' of ' + ', '.join(rows) if rows else ''} in {out}")
    check_addition(header, packed, new)
    merged = sorted(packed + new, key=pack_order)
    names = sorted({r["row"] for r in merged if r["lr_scale"] == 1}, key=_row_order)
    added = {"command": command, "rows": sorted({r["row"] for r in new}, key=_row_order), "runs": len(new),
             "wall_s": sum(r["result"].get("wall_s", 0.0) for r in new), "machine": machine or {},
             "date": time.strftime("%Y-%m-%d", time.gmtime())}
    header = {**header, "command": with_rows(str(header.get("command", "")), names),
              "additions": [*header.get("additions", []), added]}
    study = study_from_pack(header, (PackedRun(**{k: v for k, v in r.items() if k != "kind"}) for r in merged))
    write_pack(pack, {**header, "summary": pack_summary(study)}, merged)
    return len(new), study
