"""A fake `ApiClient` answering like docs/api.md, recording every call (for AppTest page tests)."""

from __future__ import annotations

import copy
import math
import statistics

from aah_client import ApiError
from aah_core.inference.cost import ModelShape, plan_cost
from aah_core.inference.serving import round_plan as engine_round_plan
from aah_core.suite import paired
from aah_core.windows import coverage_metrics, decode_window, plan_to_json, validate_plan

N_LAYER, N_HEAD, T = 2, 4, 32
BUCKETS = [4, 8, 16, None]
OWN = [[4, 8, None, 16], [8, None, 4, 4]]


def _coverage(plan):
    """The engine's own metrics (the fake runs in the test process, where the engine is importable)."""
    return coverage_metrics(validate_plan(plan, len(plan), len(plan[0]), T), T)


SHAPE = ModelShape(n_layer=N_LAYER, n_head=N_HEAD, n_kv_head=N_HEAD, head_dim=8, seq_len=T)


def _cost(plan, context=T):
    """The engine's exact cost fields of a plan at a context."""
    c = plan_cost(validate_plan(plan, N_LAYER, N_HEAD, T), context, SHAPE)
    return {"context": context, "kv_bytes": c.kv_bytes, "kv_bytes_full": c.kv_bytes_full,
            "attention_pairs": c.attention_pairs, "attention_pairs_full": c.attention_pairs_full,
            "n_kv_head": c.n_kv_head}


def _loss(plan):
    return 2.0 + 0.5 * (1 - _coverage(plan)["causal_coverage"])


def _attn(window):
    n = 6
    full = [[(1.0 / (i + 1) if j <= i else None) for j in range(n)] for i in range(n)]
    w = window or n
    win = [[(1.0 / min(i + 1, w) if i - w < j <= i else (0.0 if j <= i else None)) for j in range(n)] for i in range(n)]
    cut = [sum(full[i][j] for j in range(i + 1) if j <= i - w) for i in range(n)]
    return full, win, cut


class FakeApi:
    def __init__(self, fail: dict[str, ApiError] | None = None):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.fail = fail or {}
        self.views_store: list[dict] = []
        self.unavailable_store: list[dict] = []
        shape = {"model.n_layer": str(N_LAYER), "model.n_head": str(N_HEAD), "model.d_model": "64",
                 "model.seq_len": str(T)}
        suite = {"controller.mode": "aah", "suite.scale": "mini", "train.max_steps": "400"}
        self.runs_store = [self._run(1, "aah-demo", "FINISHED", {"lr": "0.001", "seed": "0", **shape, **suite}, 2.3, 0.4,
                                     source="suite", group="full_adaptive", seed=0),
                           self._run(2, "uniform-16", "RUNNING", {"lr": "0.001", "seed": "1", **shape, **suite}, 2.5, 0.5,
                                     source="suite", group="full_adaptive", seed=1),
                           self._run(3, "paper AAH-v3", "FINISHED", {"lr": "0.0006", "seed": "0", "table": "Table 1 (x)"},
                                     3.1, 0.3, experiment="paper (reported)", read_only=True, source="paper",
                                     group="full_adaptive", seed=0)]

    def _run(self, i, name, status, params, loss, cov, experiment="demo", read_only=False, source="job", group=None,
             seed=None):
        return {"id": i, "name": name, "experiment": experiment, "status": status, "preset": "demo",
                "params": params,
                "summary": {"val_loss": loss, "causal_coverage": cov, "acr": None if cov is None else cov + 0.1},
                "created_at": "2026-01-01T00:00:00", "started_at": None, "ended_at": None,
                "progress": {"step": 10, "total_steps": 50} if status == "RUNNING" else None,
                "error": None, "read_only": read_only, "checkpoint": None, "data_hash": None, "git_rev": None,
                "source": source, "group": group, "seed": seed, "description": None, "notes": None, "tags": [],
                "target": "local", "engine_job_id": None, "engine_state": None, "pending_reason": None}

    def _rec(self, _method, *args, **kwargs):
        self.calls.append((_method, args, kwargs))
        if _method in self.fail:
            raise self.fail[_method]

    def called(self, name):
        return [c for c in self.calls if c[0] == name]

    # endpoints (tests/frontend/test_fake_api.py keeps every ApiClient method here, with its signature)
    def close(self):
        self._rec("close")

    def health(self):
        self._rec("health")
        return {"status": "ok", "version": "test", "models": 1, "runs": len(self.runs_store)}

    def models(self):
        self._rec("models")
        return [{"id": "demo", "name": "demo", "n_layer": N_LAYER, "n_head": N_HEAD, "seq_len": T,
                 "preset": "demo", "buckets": BUCKETS, "n_params": 1000, "run_id": 1, "family": "aah", "dtype": "float32",
                 "eval_seqs": 4, "eval_tokens": 4 * T, "sinks": 0}]

    def unavailable_models(self):
        self._rec("unavailable_models")
        return list(self.unavailable_store)

    def model(self, model_id):
        self._rec("model", model_id)
        for m in self.models():
            if m["id"] == model_id:
                return m
        raise ApiError(404, f"model {model_id!r} not found")

    def register_model(self, path, name=None, seq_len=None):
        self._rec("register_model", path, name=name, seq_len=seq_len)
        return {**self.models()[0], "id": name or path.rstrip("/").rsplit("/", 1)[-1], "name": name or path,
                "seq_len": seq_len or T, "family": "llama", "run_id": None}

    def model_windows(self, model_id):
        self._rec("model_windows", model_id)
        return {"model_id": model_id, "seq_len": T, "windows": copy.deepcopy(OWN), **_coverage(OWN), **_cost(OWN)}

    def model_texts(self, model_id):
        self._rec("model_texts", model_id)
        return [{"id": "t1", "name": "text one", "kind": "text", "n_tokens": 6, "preview": "a b c"},
                {"id": "c1", "name": "copy task", "kind": "copy", "n_tokens": 6, "preview": "x y"}]

    def presets(self):
        self._rec("presets")
        return [{"name": "demo", "description": "the demo", "group": "demo"},
                {"name": "aah-v3", "description": "paper", "group": "paper"}]

    def evaluate(self, model_id, windows, eval_set="mixed", per_token=False, sinks=None):
        self._rec("evaluate", model_id, windows, eval_set=eval_set, per_token=per_token,
                  **({} if sinks is None else {"sinks": sinks}))
        loss, base = _loss(windows) - 0.01 * (sinks or 0), _loss(OWN)
        pt = None
        if per_token:
            pt = {"tokens": ["a", "b", "c", "d"], "loss": [loss] * 4, "baseline": [base] * 4,
                  "delta": [loss - base, 0.0, None, 0.1]}
        return {"loss": loss, "baseline_loss": base, "delta": loss - base, "delta_pct": 100 * (loss - base) / base,
                "perplexity": math.exp(loss), **_coverage(windows), **_cost(windows), "windows": windows,
                "eval_set": eval_set,
                "elapsed_ms": 12.0, "cached": False, "per_token": pt, "sinks": sinks or 0}

    def attention(self, model_id, layer, head, text_id=None, window="own", text=None, offset=0):
        self._rec("attention", model_id, layer, head, text_id=text_id, window=window,
                  **({"text": text, "offset": offset} if text is not None else {}))
        w = OWN[layer][head] if window == "own" else (None if window is None or window >= T else window)
        full, win, cut = _attn(w)
        n = len(text) if text is not None else 6  # a posted text: one token per character, T=6 shown
        start = max(0, min(offset, n - 6))
        return {"layer": layer, "head": head, "window": w, "seq_len": T, "tokens": list("abcdef"),
                "full": full, "windowed": win, "cut_mass": cut, "pool": 1, "n_tokens": 6,
                "offset": start, "text_tokens": max(n, 6)}

    def retained_mass(self, model_id, text_id=None):
        self._rec("retained_mass", model_id, text_id=text_id)
        return {"buckets": BUCKETS, "mass": [[[0.5, 0.7, 0.9, 1.0]] * N_HEAD] * N_LAYER}

    def retained_mass_of_text(self, model_id, text, offset=0):
        """A posted text's curves: this fake's heads keep less mass on it than on the bundled texts."""
        self._rec("retained_mass_of_text", model_id, text, offset)
        return {"buckets": BUCKETS, "mass": [[[0.1, 0.2, 0.6, 1.0]] * N_HEAD] * N_LAYER}

    def sensitivity(self, model_id, eval_set="mixed"):
        self._rec("sensitivity", model_id, eval_set=eval_set)
        # the smallest window hurts L1H2 most and L0H0 least
        delta = [[[0.3 if (layer, head) == (1, 2) else 0.01 * (layer * N_HEAD + head), 0.2, 0.1, 0.0]
                  for head in range(N_HEAD)] for layer in range(N_LAYER)]
        held = "text" if eval_set == "english" else "english"
        return {"buckets": BUCKETS, "baseline_loss": 2.0, "delta": delta, "eval_set": eval_set, "held_out": held,
                "pick": {"layer": 1, "head": 2, "window": BUCKETS[0], "delta": 0.3, "held_out_delta": 0.125,
                         "held_out_loss": 2.125, "held_out_baseline_loss": 2.0}}

    def allocate(self, model_id, budget, metric="causal_coverage", eval_set="mixed", held_out=None):
        self._rec("allocate", model_id, budget, metric=metric, eval_set=eval_set, held_out=held_out)
        plan = [[8] * N_HEAD for _ in range(N_LAYER)]
        return {"windows": plan, "eval_set": eval_set, "loss": _loss(plan), "baseline_loss": _loss(OWN),
                "held_out": held_out or ("text" if eval_set == "english" else "english"),
                "held_out_loss": _loss(plan) + 0.5, "held_out_baseline_loss": _loss(OWN) + 0.25, **_coverage(plan),
                "curve": [{"acr": 1.0, "causal_coverage": 1.0, "kv_bytes": _cost([[None] * N_HEAD] * N_LAYER)["kv_bytes"],
                           "loss": 2.0},
                          {**_coverage(plan), "kv_bytes": _cost(plan)["kv_bytes"], "loss": _loss(plan)}]}

    def cost(self, model_id, windows, context, measure=False):
        self._rec("cost", model_id, windows, context, measure=measure)
        return {**_cost(windows, context), "windows": windows, "measured": None}

    def round_plan(self, model_id, windows, granularity="transformers", mode="up", eval_set="mixed"):
        """The engine's own rounding, with this fake's loss."""
        self._rec("round_plan", model_id, windows, granularity=granularity, mode=mode, eval_set=eval_set)
        plan = validate_plan(windows, N_LAYER, N_HEAD, T)
        buckets = [decode_window(b, T) for b in BUCKETS]
        r = engine_round_plan(plan, SHAPE, granularity, mode, buckets, lambda p: _loss(plan_to_json(p, T)))
        rounded = plan_to_json(r.plan, T)
        loss, base = _loss(rounded), _loss(windows)
        return {**_cost(rounded), **_coverage(rounded), "windows": rounded, "granularity": granularity, "mode": mode,
                "loss": loss, "plan_loss": base, "delta": loss - base, "kv_bytes_plan": r.kv_bytes_plan,
                "window": r.chosen.window, "candidates": len(r.candidates), "note": r.note}

    def export(self, model_id, windows, granularity="transformers", mode="up", eval_set="mixed", name=None):
        self._rec("export", model_id, windows, granularity=granularity, mode=mode, eval_set=eval_set, name=name)
        return b"PK\x05\x06" + bytes(18)  # an empty zip archive

    def generate(self, model_id, prompt, windows=None, max_new_tokens=64, temperature=0.0, top_k=0, top_p=1.0,
                 seed=0):
        self._rec("generate", model_id, prompt, windows=windows, max_new_tokens=max_new_tokens)
        plan = OWN if windows is None else windows
        n = min(max_new_tokens, T - len(prompt))
        contexts = range(len(prompt), len(prompt) + n)
        return {"windows": plan, "prompt_tokens": len(prompt), "text": ("o" if windows is None else "e") * n,
                "tokens": ["o" if windows is None else "e"] * n,
                "stop_reason": "max_new_tokens" if n == max_new_tokens else "context",
                "cache_bytes": [_cost(plan, c)["kv_bytes"] for c in contexts],
                "kv_bytes_full": _cost(plan, contexts[-1])["kv_bytes_full"], "elapsed_ms": 5.0}

    def retrieval(self, model_id, windows=None, per_cell=16):
        self._rec("retrieval", model_id, windows=windows, per_cell=per_cell)
        plan = OWN if windows is None else windows
        reach = max(T if w is None else w for row in plan for w in row)  # the farthest any head sees
        distances, starts = [8, 16, 24, 25], [0, 8, 16, 24]  # the engine's at T = 32

        def acc(d):
            return 0.9 if d < reach else 0.02

        return {"windows": plan, "distances": distances, "starts": starts, "end": [acc(d) for d in distances],
                "by_start": [[acc(d) if s + d + 8 <= T + 1 else None for d in distances] for s in starts],
                "chance": 1 / 62, "key_chars_per_cell": 4 * per_cell, "elapsed_ms": 30.0, "cached": False}

    def runs(self, experiment=None, preset=None, status=None, limit=100, offset=0, source=None, group=None, tag=None):
        self._rec("runs", experiment=experiment, preset=preset, status=status, limit=limit,
                  **{k: v for k, v in (("source", source), ("group", group), ("tag", tag)) if v})
        return [r for r in self.runs_store if (not experiment or r["experiment"] == experiment)
                and (not status or r["status"] == status) and (not source or r["source"] == source)
                and (not group or r["group"] == group) and (not tag or tag in r["tags"])][:limit]

    def update_run(self, run_id, **fields):
        self._rec("update_run", run_id, **fields)
        run = self.run(run_id)
        run.update(fields)
        return run

    def _groups(self, experiment=None, group=None, source=None, tag=None):
        out = {}
        for r in self.runs(experiment=experiment, source=source, group=group, tag=tag, limit=1000):
            if r["group"]:
                out.setdefault((r["experiment"], r["group"]), []).append(r)
        return out

    def run_groups(self, keys=None, agg="last", experiment=None, group=None, source=None, tag=None):
        self._rec("run_groups", keys=keys, agg=agg, experiment=experiment, group=group, source=source, tag=tag)
        out = []
        for (exp, grp), runs in self._groups(experiment, group, source, tag).items():
            stats = {}
            for k in keys or sorted({k for r in runs for k in r["summary"]}):  # as the server: every summary key
                xs = [r["summary"][k] for r in runs if r["summary"].get(k) is not None]
                stats[k] = {"n": len(xs), "mean": statistics.fmean(xs), "min": min(xs), "max": max(xs),
                            "std": statistics.stdev(xs) if len(xs) > 1 else None} if xs else None
            out.append({"experiment": exp, "group": grp, "run_ids": [r["id"] for r in runs],
                        "seeds": [r["seed"] for r in runs], "sources": sorted({r["source"] for r in runs}),
                        "stats": stats})
        return out

    def group_paired(self, experiment, base, keys, agg="last"):
        self._rec("group_paired", experiment, base, keys, agg=agg)
        groups = self._groups(experiment)
        if (experiment, base) not in groups:
            raise ApiError(404, f"no runs in group {base!r} of experiment {experiment!r}")
        ref = {r["seed"]: r["summary"] for r in groups[(experiment, base)]}
        out = []
        for (_, grp), runs in groups.items():
            for k in keys if grp != base else []:
                pairs = [(r["seed"], r["summary"][k] - ref[r["seed"]][k]) for r in runs
                         if r["seed"] in ref and r["summary"].get(k) is not None and ref[r["seed"]].get(k) is not None]
                deltas = [d for _, d in pairs]
                stat = paired(deltas) if len(deltas) > 1 else None  # the engine's rule, as the server uses it
                out.append({"group": grp, "base": base, "key": k, "seeds": [s for s, _ in pairs], "deltas": deltas,
                            "n": len(deltas), "mean": statistics.fmean(deltas) if deltas else None,
                            "std": stat and stat["std"], "ci95": stat and stat["ci95"],
                            "resolved": bool(stat and not stat["within_noise"])})
        return out

    def group_series(self, experiment, group, keys=None, max_points=None):
        self._rec("group_series", experiment, group, keys=keys, max_points=max_points)
        runs = self._groups(experiment, group)[(experiment, group)]
        series = {}
        for k in keys or ["val_loss"]:
            base = self.run_metrics(runs[0]["id"])["series"][k]  # run j: the same curve times 1 + j/10
            idx = [i for i, v in enumerate(base["value"]) if isinstance(v, float)]
            cols = [[base["value"][i] * (1 + 0.1 * j) for j in range(len(runs))] for i in idx]
            series[k] = {"step": [base["step"][i] for i in idx], "mean": [statistics.fmean(c) for c in cols],
                         "std": [statistics.stdev(c) if len(c) > 1 else None for c in cols],
                         "min": [min(c) for c in cols], "max": [max(c) for c in cols], "n": [len(c) for c in cols],
                         "run_ids": [r["id"] for r in runs], "steps_dropped": 0,
                         "nonfinite": {str(r["id"]): base["nonfinite"] for r in runs if base["nonfinite"]["total"]}}
        return {"experiment": experiment, "group": group, "run_ids": [r["id"] for r in runs],
                "seeds": [r["seed"] for r in runs], "series": series}

    def run(self, run_id):
        self._rec("run", run_id)
        for r in self.runs_store:
            if r["id"] == run_id:
                return r
        raise ApiError(404, f"run {run_id} not found")

    def run_metrics(self, run_id, keys=None, min_step=None, max_step=None, max_points=None, cursor=None):
        self._rec("run_metrics", run_id, keys=keys, min_step=min_step, max_step=max_step, max_points=max_points,
                  cursor=cursor)
        steps = [0, 10, 20, 30]
        # train_loss diverged once, at step 20: its value comes as its kind, and it is listed apart
        series = {"val_loss": [3.0, 2.6, 2.4, 2.3], "train_loss": [3.1, 2.7, "nan", 2.2],
                  "acr": [1.0, 0.8, 0.6, 0.5], "causal_coverage": [1.0, 0.7, 0.5, 0.4],
                  "window_frac/4": [0.0, 0.2, 0.3, 0.4], "window_frac/full": [1.0, 0.8, 0.7, 0.6]}
        out = {k: {"step": steps, "value": v, "timestamp": [0.0] * 4,
                   "nonfinite": {"step": [s for s, x in zip(steps, v) if isinstance(x, str)],
                                 "kind": [x for x in v if isinstance(x, str)],
                                 "total": sum(isinstance(x, str) for x in v)}}
               for k, v in series.items() if keys is None or k in keys}
        return {"run_id": run_id, "series": out, "downsampled": [], "next_cursor": None}

    def metric_history(self, run_id, keys=None, page_size=50_000):
        self._rec("metric_history", run_id, keys=keys, page_size=page_size)
        return {k: {f: v[f] for f in ("step", "value", "timestamp")}
                for k, v in self.run_metrics(run_id, keys)["series"].items()}

    def run_windows(self, run_id, step=None):
        self._rec("run_windows", run_id, step=step)
        return {"run_id": run_id, "steps": [0, 10, 20, 30], "step": 30 if step is None else step, "seq_len": T,
                "windows": copy.deepcopy(OWN)}

    def create_run(self, preset, overrides=None, name=None, experiment=None, target="local", resources=None):
        self._rec("create_run", preset, overrides=overrides, name=name, experiment=experiment, target=target,
                  resources=resources)
        run = self._run(len(self.runs_store) + 1, name or preset, "SCHEDULED", {}, None, None)
        run.update(target=target, engine_job_id=None if target == "local" else f"{target}-job-1")
        self.runs_store.append(run)
        return run

    def targets(self):
        self._rec("targets")
        return [{"name": "local", "kind": "local", "available": True, "detail": "worker processes of this server",
                 "free_cpus": None, "free_gpus": 0},
                {"name": "ray", "kind": "ray", "available": True, "detail": "Ray: 4 of 4 CPUs free, 1 of 1 GPUs free",
                 "free_cpus": 4.0, "free_gpus": 1.0}]

    def run_logs(self, run_id, tail=100):
        self._rec("run_logs", run_id, tail=tail)
        run = self.run(run_id)
        return {"run_id": run_id, "target": run.get("target", "local"), "engine_job_id": run.get("engine_job_id"),
                "lines": [f"step {i}" for i in range(1, 4)][-tail:]}

    def cancel_run(self, run_id):
        self._rec("cancel_run", run_id)
        return {**self.run(run_id), "status": "KILLED"}

    def compare_runs(self, run_ids, keys=None, agg="last", step=None, max_points=None):
        self._rec("compare_runs", run_ids, keys=keys, agg=agg, step=step, max_points=max_points)
        keys = keys or ["val_loss"]
        runs = [self.run(i) for i in run_ids]
        series = {str(i): {k: self.run_metrics(i)["series"][k] for k in keys} for i in run_ids}
        steps = {k: step for k in keys} if agg == "at_step" else None
        return {"keys": keys, "runs": runs, "series": series,
                "table": [{"run_id": i, "values": {k: 2.0 + i for k in keys}, "steps": steps} for i in run_ids]}

    def windows_diff(self, a, b):
        self._rec("windows_diff", a, b)
        pb = copy.deepcopy(OWN)
        pb[0][0] = None
        return {"a": copy.deepcopy(OWN), "b": pb,
                "changed": [[l == 0 and h == 0 for h in range(N_HEAD)] for l in range(N_LAYER)], "n_changed": 1}

    def views(self):
        self._rec("views")
        return list(self.views_store)

    def view(self, view_id):
        self._rec("view", view_id)
        return next(v for v in self.views_store if v["id"] == view_id)

    def create_view(self, name, page, state):
        self._rec("create_view", name, page, state)
        v = {"id": len(self.views_store) + 1, "name": name, "page": page, "state": state,
             "created_at": "2026-01-01T00:00:00"}
        self.views_store.append(v)
        return v

    def delete_view(self, view_id):
        self._rec("delete_view", view_id)
        self.views_store = [v for v in self.views_store if v["id"] != view_id]

    def rename_view(self, view_id, name):
        self._rec("rename_view", view_id, name)
        view = self.view(view_id)
        view["name"] = name
        return view

    def order_views(self, ids):
        self._rec("order_views", ids)
        self.views_store = [self.view(i) for i in ids]
        return list(self.views_store)
