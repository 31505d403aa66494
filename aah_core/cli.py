"""The engine's commands: train, eval, generate, export, presets, bench, suite.

The installed `aah` command is aah_launcher.cli, which adds `aah serve` (a process supervisor, kept out
of the engine) to the parser built here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aah_core.errors import AAHError
from aah_core.process import set_up as set_up_process

if TYPE_CHECKING:
    import torch


def _parse_sets(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise AAHError(f"--set expects key=value (e.g. train.lr=1e-3); got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def cmd_train(args: argparse.Namespace) -> int:
    from aah_core.config import apply_overrides
    from aah_core.presets import get_preset
    from aah_core.resources import check_fits
    from aah_core.train import JsonlSink, PlanJsonlSink, ProgressBar, spool_checkpoint, train

    config = apply_overrides(get_preset(args.preset), _parse_sets(args.set))
    check_fits(config)  # a run that cannot fit this machine is refused before it starts
    out = Path(args.out or f"runs/{config.preset}")
    metrics, plans = (out.parent / f"{out.name}.{kind}.jsonl" for kind in ("metrics", "plans"))
    if args.resume is None:
        for history in (metrics, plans):
            history.unlink(missing_ok=True)  # a new run starts a new history; a resumed one appends
    callbacks = [JsonlSink(metrics), PlanJsonlSink(plans, config.model.seq_len)]
    if not args.quiet:
        callbacks.append(ProgressBar())
    for make in getattr(args, "train_callbacks", ()):  # added from outside the engine (aah_tracking)
        extra = make(args, config, out)
        if extra is not None:
            callbacks.append(extra)
    result = train(config, out, callbacks, resume=args.resume, fallbacks=(spool_checkpoint(out.name),))
    print(f"{result.status} at step {result.step}: checkpoint {result.checkpoint}")
    return 0


def _read_plan(path: str | None, ckpt: Any) -> torch.Tensor:
    """The plan of a --windows JSON file ([[w, ...], ...] or {"windows": ...}), else the checkpoint's own."""
    from aah_core.windows import validate_plan

    if not path:
        return ckpt.plan
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AAHError(f"--windows {path}: cannot read a JSON plan ({exc.__class__.__name__}: {exc})") from None
    raw = raw.get("windows", raw) if isinstance(raw, dict) else raw
    m = ckpt.config.model
    return validate_plan(raw, m.n_layer, m.n_head, m.seq_len)


def cmd_eval(args: argparse.Namespace) -> int:
    from aah_core.analysis.evaluate import evaluate_loss, make_eval_batch
    from aah_core.checkpoint import load_checkpoint
    from aah_core.windows import coverage_metrics

    ckpt = load_checkpoint(args.checkpoint)
    m = ckpt.config.model
    plan = _read_plan(args.windows, ckpt)
    batch = make_eval_batch(ckpt.config, args.eval_set, args.n_seq)
    loss = evaluate_loss(ckpt.model, batch, plan)
    cov = coverage_metrics(plan, m.seq_len, m.sinks)
    print(f"loss {loss:.6f}  acr {cov['acr']:.4f}  causal_coverage {cov['causal_coverage']:.4f}  "
          f"tile_coverage {cov['tile_coverage']:.4f}  ({args.eval_set}, {args.n_seq} sequences)")
    if args.retrieval:
        _print_retrieval(ckpt.model, plan)
    return 0


def _print_retrieval(model: Any, plan: Any) -> None:
    """Passkey accuracy per distance (rows) with the repeat at the sequence's end, as training logs it, and
    with the planted key at fixed starts (columns): a model that retrieves only near the start shows here."""
    from aah_core.analysis.retrieval import retrieval_chance, retrieval_table

    table = retrieval_table(model, plan)
    print(f"retrieval: key characters right (chance {retrieval_chance():.3f}); columns: where the planted key starts")
    print("distance " + f"{'end':>10}" + "".join(f"{f'start {s}':>10}" for s in table.starts))
    for j, distance in enumerate(table.distances):
        cells = (f"{'-':>10}" if column[j] is None else f"{column[j]:10.3f}" for column in table.by_start)
        print(f"{distance:>8} {table.end[j]:10.3f}" + "".join(cells))


def cmd_generate(args: argparse.Namespace) -> int:
    import time

    import torch

    from aah_core.checkpoint import load_checkpoint
    from aah_core.inference.cost import ModelShape, plan_cost
    from aah_core.inference.generate import Sampling, generate

    ckpt = load_checkpoint(args.checkpoint)
    model, plan = ckpt.model, _read_plan(args.windows, ckpt)
    ids = model.tokenizer.encode(args.prompt)
    if not ids:
        raise AAHError("--prompt is empty after tokenization; give at least one character")
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    t0 = time.perf_counter()
    result = generate(model, torch.tensor([ids]), plan, args.max_new_tokens, sampling)
    seconds = time.perf_counter() - t0
    new = result.tokens[0].tolist()
    print(args.prompt + model.tokenizer.decode(new))
    print("---")
    why = (f"max_new_tokens ({args.max_new_tokens})" if result.stop_reason == "max_new_tokens"
           else f"the model's context ({model.seq_len} tokens)")
    print(f"stopped at {why}: {len(new)} new tokens after a {len(ids)}-token prompt, "
          f"{len(new) / seconds:.1f} tokens/s (prompt included)")
    context = len(ids) + max(len(new) - 1, 0)  # positions cached when the last token was predicted
    cost = plan_cost(plan, context, ModelShape.of(model))
    print(f"at context {context}: KV cache {cost.kv_bytes:,} bytes = {100 * cost.kv_ratio:.1f} % of full "
          f"({cost.kv_bytes_full:,}) · attention pairs {cost.attention_pairs:,} = "
          f"{100 * cost.pairs_ratio:.1f} % of full ({cost.attention_pairs_full:,})")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from aah_core.inference.export import export_plan

    try:
        raw = json.loads(Path(args.plan).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AAHError(f"--plan {args.plan}: cannot read a JSON plan ({exc.__class__.__name__}: {exc})") from None
    raw = raw.get("windows", raw) if isinstance(raw, dict) else raw
    how = f"aah export --granularity {args.granularity} --mode {args.mode}"
    out = export_plan(args.model, raw, args.granularity, args.mode, args.out, args.eval_set, args.seq_len, how)
    print((out / "README.md").read_text())
    print(f"wrote {out}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from aah_core.presets import PRESETS

    width = max(map(len, PRESETS))
    for name, preset in sorted(PRESETS.items(), key=lambda kv: (kv[1].group, kv[0])):
        print(f"{name:<{width}}  [{preset.group}] {preset.description}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import runpy

    bench = Path(__file__).resolve().parents[1] / "bench"
    if not bench.is_dir():
        raise AAHError("the bench/ folder is not available (run from a source checkout)")
    sys.path.insert(0, str(bench.parent))
    runpy.run_module("bench.run_all", run_name="__main__")
    return 0


def cmd_suite(args: argparse.Namespace) -> int:
    from aah_core.suite import machine, run_suite, summarize
    from aah_core.suite_merge import add_to_pack, study_from_pack, write_report
    from aah_core.suite_pack import pack_suite, read_pack
    from aah_core.suite_study import run_study, summarize_study

    if args.pack_every < 1:
        raise ValueError(f"--pack-every must be >= 1; got {args.pack_every}")
    rows = [r.strip() for r in args.rows.split(",") if r.strip()] if args.rows else None
    corpora = [c.strip() for c in args.corpus.split(",") if c.strip()]
    command = f"aah suite {args.name} --scale {args.scale} --seeds {args.seeds}"
    command += f" --impl {args.impl}" * (args.impl != "faithful") + f" --rows {args.rows}" * bool(args.rows)
    command += f" --corpus {','.join(corpora)}" + " --lr-sweep" * args.lr_sweep
    command += f" --threads {args.threads}" * bool(args.threads)
    if args.from_pack:  # the report of a shipped pack, training nothing
        header, runs = read_pack(args.from_pack)
        if args.doc:
            write_report(args.doc, study_from_pack(header, runs))
        print(f"wrote {args.doc}" if args.doc else "no --doc: nothing written")
        return 0
    suite = {"impl": args.impl, "rows": rows, "overrides": {"train.threads": args.threads} if args.threads else None}
    log = lambda line: print(line, flush=True)  # noqa: E731
    doc = None if args.add_to_pack else args.doc or None  # with --add-to-pack, the report is the merged pack's
    if len(corpora) > 1 or args.lr_sweep:
        study = run_study(args.scale, args.seeds, args.out, corpora, args.lr_sweep, doc, log=log,
                          command=command, name=args.name, **suite)
        report, summary = study["corpora"][corpora[0]], {"study": summarize_study(study)}
    else:
        report = run_suite(args.name, scale=args.scale, seeds=args.seeds, out=args.out, doc=doc,
                           log=log, command=command, corpus=corpora[0], **suite)
        summary = {}
    if args.add_to_pack:
        n, merged = add_to_pack(args.out, args.add_to_pack, list(report["rows"]), command, machine())
        print(f"added {n} runs to {args.add_to_pack} ({Path(args.add_to_pack).stat().st_size / 1e6:.2f} MB)")
        if args.doc:
            write_report(args.doc, merged)
    print(f"wrote {args.doc}" if args.doc else f"results in {args.out}")
    if args.pack:
        n = pack_suite(args.out, args.pack, {**summarize(report), **summary}, rows=list(report["rows"]),
                       every=args.pack_every)
        print(f"packed {n} runs into {args.pack} ({Path(args.pack).stat().st_size / 1e6:.2f} MB)")
    return 0


AddCommand = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def build_parser(extra: Sequence[AddCommand] = ()) -> argparse.ArgumentParser:
    """The `aah` parser; each of ``extra`` adds subcommands from outside the engine (e.g. `serve`)."""
    parser = argparse.ArgumentParser(prog="aah", description="AAH Studio: per-head attention windows.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a model from a preset")
    p.add_argument("--preset", required=True, help="preset name (see `aah presets`)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. train.lr=1e-3")
    p.add_argument("--out", help="checkpoint directory (default runs/<preset>)")
    p.add_argument("--resume", help="checkpoint directory to resume from")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("eval", help="print the loss and coverage of a checkpoint under a window plan")
    p.add_argument("checkpoint")
    p.add_argument("--windows", help="JSON plan file: [[w, ...], ...] or {\"windows\": ...}; null = full")
    p.add_argument("--eval-set", default="mixed", choices=["mixed", "text", "english", "copy"])
    p.add_argument("--n-seq", type=int, default=4, help="evaluation sequences (default 4)")
    p.add_argument("--retrieval", action="store_true",
                   help="also print passkey accuracy per distance, with the key planted at the end and at fixed starts")
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("generate", help="continue a prompt under a window plan (per-head KV caches); print the cost")
    p.add_argument("checkpoint")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--windows", help="JSON plan file (as for eval); default: the checkpoint's own plan")
    p.add_argument("--max-new-tokens", type=int, default=64, help="stop after this many tokens (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_generate)
    p = sub.add_parser("export", help="round a plan to a serving grain and write a folder engines load")
    p.add_argument("--model", required=True, metavar="FOLDER",
                   help="the model folder: an AAH Studio checkpoint or a local Hugging Face causal LM")
    p.add_argument("--plan", required=True, help="JSON plan file (as for eval): [[w, ...], ...] or {\"windows\": ...}")
    p.add_argument("--granularity", default="transformers", choices=["head", "kv_group", "layer", "transformers"],
                   help="transformers: a Hugging Face folder (layer_types + sliding_window); for a checkpoint, "
                        "any grain (layer and transformers add serving.json)")
    p.add_argument("--mode", default="up", choices=["up", "budget"],
                   help="up: no head shrinks (default); budget: KV bytes <= the plan's, lowest loss")
    p.add_argument("--out", required=True, help="the new folder to write")
    p.add_argument("--eval-set", default="mixed", choices=["mixed", "text", "english", "copy"])
    p.add_argument("--seq-len", type=int, help="evaluation context of a Hugging Face model (default min(max, 1024))")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("presets", help="list the presets")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("bench", help="run the benchmarks in bench/ (writes bench/results/)")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("suite", help="train the paper's Table 1 rows at a small scale over seeds; write a report")
    p.add_argument("name", choices=["paper"], help="the suite to run")
    p.add_argument("--scale", default="tiny", choices=["tiny", "mini", "long"],
                   help="model/data scale (default tiny: < 1 h on 2 cores; mini: the same model, half the steps; "
                   "long: 5,000 steps, long enough to learn retrieval, ~10 min a run on one core)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per row (default 3)")
    p.add_argument("--impl", default="faithful", choices=["faithful", "fixed"], help="controller implementation")
    p.add_argument("--rows", help="comma-separated subset of rows (default: all)")
    p.add_argument("--corpus", default="code", help="bundled corpora, comma-separated: code (Python source, the "
                   "default) and english (prose: the Python docs); with two, each goes to OUT/<corpus>/")
    p.add_argument("--lr-sweep", action="store_true", help="also train baseline, full_adaptive and fixed_window at "
                   "seed 0 with the learning rate x0.5 and x2 on the first corpus (OUT/<corpus>-lr<scale>/)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per run (default: the scale's)")
    p.add_argument("--out", default="runs/suite-paper", help="run folder (finished runs are reused)")
    p.add_argument("--doc", default="docs/reproduction.md", help="markdown report to write ('' = none)")
    packs = p.add_mutually_exclusive_group()
    packs.add_argument("--pack", help="also write the runs' histories and plans to this .jsonl.gz (as data/suite/)")
    p.add_argument("--pack-every", type=int, default=1, metavar="K", help="with --pack: keep every K-th training "
                   "step of each history, with every evaluation, non-finite value and each K-step window's lowest "
                   "and highest train_loss, and the first window plan of each K steps (default 1: every step and plan)")
    packs.add_argument("--add-to-pack", metavar="PACK", help="merge the runs of --rows into this existing pack "
                       "(refused if it holds one already or its settings differ) and write --doc from the merged pack")
    packs.add_argument("--from-pack", metavar="PACK", help="train nothing: write --doc from this pack alone")
    p.set_defaults(func=cmd_suite)
    for add in extra:
        add(sub)
    return parser


def main(argv: list[str] | None = None, extra: Sequence[AddCommand] = ()) -> int:
    # OpenMP threads sleep at barriers, freed memory is kept for reuse (aah_core/process.py); before torch loads
    set_up_process()
    parser = build_parser(extra)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (AAHError, ValueError) as exc:
        print(f"aah {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aah {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
