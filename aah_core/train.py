"""Training loop: AdamW, warmup + cosine, clipping, seeds, periodic eval, callbacks, checkpoints, DDP.

Every metric flows through callbacks (a JSONL sink here, SQLite in the service, a tqdm bar
in the terminal). Run multi-process with ``torchrun --nproc_per_node N -m aah_core.cli train ...``:
gloo on CPU, nccl on GPU; rank 0 evaluates, reports and writes checkpoints.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aah_core.analysis.evaluate import evaluate_loss, model_device
from aah_core.analysis.retrieval import evaluate_retrieval, logged_set
from aah_core.checkpoint import load_checkpoint, read_train_state, save_checkpoint
from aah_core.config import RunConfig
from aah_core.controller import Controller, build_controller
from aah_core.data import DataStream, copy_chance
from aah_core.model import WindowedGPT
from aah_core.optim import AdamW
from aah_core.train_state import capture_train_state, restore_train_state
from aah_core.windows import coverage_metrics, plan_to_json, window_fractions

logger = logging.getLogger(__name__)
FINAL_RETRY_WAITS_S = (1.0, 4.0)  # a final checkpoint that failed is tried again after these waits


class Callback:
    """Receives a run's lifecycle and metrics. Override what you need."""

    def on_start(self, info: dict[str, Any]) -> None: ...

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def on_plan(self, step: int, plan: torch.Tensor) -> None: ...

    def on_checkpoint(self, step: int, path: Path) -> None: ...

    def on_end(self, status: str, error: str | None) -> None: ...

    def should_stop(self) -> bool:
        return False


class JsonlSink(Callback):
    """Appends one JSON object per metrics event: {"step", "time", <key>: <value>, ...}."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, "time": time.time(), **{k: _json_number(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


class PlanJsonlSink(Callback):
    """Appends one JSON object per reported plan: {"step", "time", "windows": [[w or null, ...], ...]}."""

    def __init__(self, path: str | Path, seq_len: int) -> None:
        self.path = Path(path)
        self.seq_len = seq_len
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def on_plan(self, step: int, plan: torch.Tensor) -> None:
        row = {"step": step, "time": time.time(), "windows": plan_to_json(plan, self.seq_len)}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


class ProgressBar(Callback):
    def on_start(self, info: dict[str, Any]) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=info["total_steps"], initial=info["start_step"], unit="step", dynamic_ncols=True)

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if "train_loss" in metrics:
            self.bar.update(step - self.bar.n)
            shown = {k: f"{metrics[k]:.3f}" for k in ("train_loss", "val_loss", "val_copy_loss") if k in metrics}
            self.bar.set_postfix(shown, refresh=False)
        elif "val_loss" in metrics:
            self.bar.set_postfix({k: f"{v:.3f}" for k, v in metrics.items() if k.startswith("val_")}, refresh=False)

    def on_end(self, status: str, error: str | None) -> None:
        self.bar.close()


@dataclass
class TrainResult:
    status: str  # FINISHED | KILLED
    step: int
    checkpoint: Path
    metrics: dict[str, float]


def lr_at(step: int, cfg: RunConfig) -> float:
    """Linear warmup, then cosine from lr down to lr * min_lr_ratio at max_steps."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    progress = min(1.0, (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps))
    return t.lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _git_rev() -> str | None:
    head = Path(__file__).resolve().parents[1] / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (head.parent / ref[5:]).read_text().strip()[:12]
        return ref[:12]
    except OSError:
        return None


def evaluate_run(model: WindowedGPT, data: DataStream, cfg: RunConfig) -> dict[str, float]:
    """Validation losses on the fixed eval sets under the model's current plan, in the training
    precision (an fp32 evaluation of a bf16 run would pick, and compile, other kernels); with a
    synthetic task in training, passkey retrieval accuracy per distance (`retrieval@<d>`) too."""
    n = max(1, cfg.train.eval_batches * cfg.train.batch_size // 2)
    model.eval()
    with autocast_for(model_device(model)):
        text = evaluate_loss(model, data.eval_batch("text", n), backend=cfg.train.backend)
        out = {"val_text_loss": text, "val_loss": text}
        if data.cfg.synthetic != "none":
            syn = evaluate_loss(model, data.eval_batch("copy", n), backend=cfg.train.backend)
            out.update(val_copy_loss=syn, val_loss=(text + syn) / 2)
            rset = logged_set(data.tokenizer, cfg.model.seq_len, cfg.train.retrieval_anchor)
            out.update(evaluate_retrieval(model, rset, backend=cfg.train.backend))
    model.train()
    return out


def autocast_for(device: torch.device) -> torch.autocast:
    """bf16 autocast on CUDA; full precision elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def device_and_backend() -> tuple[torch.device, str]:
    """This process's device and the process-group backend: one GPU per local rank over NCCL when
    the machine has a GPU for every local rank, else every rank on the CPU over gloo (two ranks
    on a one-GPU machine would otherwise share GPU 0, or ask NCCL for a GPU that is not there)."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def model_and_controller(
    config: RunConfig, device: torch.device, resume: str | Path | None = None
) -> tuple[WindowedGPT, Controller, int]:
    """The model on `device` (resumed weights and plan when asked), then its controller, built
    after the move so that its parameters and masks live on the model's device; and the step."""
    model = WindowedGPT(config.model).to(device)
    controller = build_controller(config, model)
    if resume is None:
        return model, controller, 0
    ckpt = load_checkpoint(resume)
    model.load_state_dict(ckpt.model.state_dict())
    model.set_plan(ckpt.plan)
    controller.load_state_dict(ckpt.controller_state)
    return model, controller, int(ckpt.meta.get("step", 0))


def start_process(config: RunConfig) -> tuple[torch.device, int, bool]:
    """Device, process group and seed of this process: (device, rank, distributed)."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device, dist_backend = device_and_backend()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before NCCL opens a context, or every rank opens one on GPU 0
    if distributed and not dist.is_initialized():
        dist.init_process_group(dist_backend)
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    torch.manual_seed(config.train.seed)
    return device, dist.get_rank() if distributed else 0, distributed


def training_data(config: RunConfig, rank: int, start_step: int) -> DataStream:
    """This rank's data stream, advanced past the batches of steps before `start_step`, so that a
    resumed run sees the batches of an uninterrupted one."""
    data = DataStream(config.data, config.model.seq_len, seed=config.train.seed, rank=rank)
    for _ in range(start_step):
        data.train_batch(config.train.batch_size)
    return data


def build_optimizer(model: WindowedGPT, controller: Controller, config: RunConfig) -> AdamW:
    """AdamW with weight decay on matrices only; the controller's own parameters, if any, undecayed
    (`aah_core.optim.AdamW`: torch's arithmetic without importing torch._dynamo)."""
    t = config.train
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if controller.parameters():
        groups.append({"params": controller.parameters(), "weight_decay": 0.0})
    return AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2))


@dataclass
class _Run:
    """One training process's pieces, passed between the steps of `train`."""

    config: RunConfig
    out_dir: Path
    device: torch.device
    rank: int
    distributed: bool
    model: WindowedGPT
    controller: Controller
    data: DataStream
    optimizer: AdamW
    callbacks: list[Callback]
    meta: dict[str, Any]
    good_evals: int = 0  # consecutive evaluations that met the early-stop rule
    completed: int = 0  # the last step whose update reached the weights
    reported: torch.Tensor | None = None  # the last plan passed to on_plan
    fallbacks: tuple[Path, ...] = ()  # where the final checkpoint goes when out_dir cannot take it

    def checkpoint(self, step: int, path: Path | None = None) -> Path:
        """Weights, plan, controller and trainer state after `step` (rank 0 only), at `path` (out_dir)."""
        state = capture_train_state(self.optimizer, self.device, self.good_evals)
        path = save_checkpoint(path or self.out_dir, self.model, self.config,
                               controller_state=self.controller.state_dict(), meta={**self.meta, "step": step},
                               train_state=state)
        for cb in self.callbacks:
            cb.on_checkpoint(step, path)
        return path


def optimize_step(run: _Run, ddp: torch.nn.Module, step: int) -> dict[str, float]:
    """One optimizer step under the controller's plan for `step`: its loss, lr, speed and controller metrics."""
    tcfg = run.config.train
    run.controller.on_step_start(step)
    if run.distributed:
        dist.broadcast(run.model.plan, src=0)  # every rank trains under rank 0's plan
    lr = lr_at(step, run.config)
    for g in run.optimizer.param_groups:
        g["lr"] = lr
    t0 = time.perf_counter()
    x, y = (t.to(run.device) for t in run.data.train_batch(tcfg.batch_size))
    with autocast_for(run.device):
        _, loss = ddp(x, y, backend=tcfg.backend)
        extra = run.controller.extra_loss()
        total = loss if extra is None else loss + extra
    run.optimizer.zero_grad()
    total.backward()
    if tcfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), tcfg.grad_clip)
    run.optimizer.step()
    run.completed = step + 1
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)  # kernels run asynchronously: time their end, not their launch
    elapsed = time.perf_counter() - t0
    return {"train_loss": float(loss.detach()), "lr": lr, "tokens_per_s": x.numel() / elapsed, **run.controller.metrics()}


def _plan_metrics(model: WindowedGPT, cfg: RunConfig) -> dict[str, float]:
    T = cfg.model.seq_len
    metrics = coverage_metrics(model.plan, T, cfg.model.sinks)
    fractions = window_fractions(model.plan, cfg.model.bucket_windows, T)
    metrics.update({f"window_frac/{k}": v for k, v in fractions.items()})
    return metrics


def report(run: _Run, done: int, metrics: dict[str, float]) -> None:
    """On rank 0: the plan this step trained under (at every eval and whenever the controller changed it),
    validation losses at eval steps, then `metrics` to every callback and a periodic checkpoint."""
    tcfg = run.config.train
    evaluating = done % tcfg.eval_every == 0 or done == tcfg.max_steps
    if run.rank == 0 and (evaluating or run.reported is None or not torch.equal(run.reported, run.model.plan)):
        run.reported = run.model.plan.clone()
        metrics.update(_plan_metrics(run.model, run.config))
        for cb in run.callbacks:
            cb.on_plan(done, run.reported.clone())
    if evaluating and run.rank == 0:
        metrics.update(evaluate_run(run.model, run.data, run.config))
        run.good_evals = run.good_evals + 1 if _copy_solved(metrics, tcfg.stop_copy_below_chance) else 0
    for cb in run.callbacks:
        cb.on_metrics(done, metrics)
    if tcfg.checkpoint_every and done % tcfg.checkpoint_every == 0 and run.rank == 0:
        try:
            run.checkpoint(done)
        except Exception as exc:  # noqa: BLE001 - e.g. a full disk: keep training; the final checkpoint tries again
            logger.warning("step %d: checkpoint not written (%s)", done, exc)


def spool_checkpoint(name: str) -> Path:
    """A last-resort place for a final checkpoint: under the system temp dir (often another disk), unique."""
    return Path(tempfile.gettempdir()) / "aah-spool" / f"{name}-{uuid.uuid4().hex[:8]}"


def save_final_checkpoint(run: _Run, step: int) -> Path:
    """The checkpoint that ends a run (rank 0): at out_dir, tried again after each FINAL_RETRY_WAITS_S wait
    (space may have been freed), then at each fallback path in turn, as metrics go to the spool when the
    store fails: a run that trained keeps its weights while any of those disks has room."""
    *tries, (last, last_wait) = [(run.out_dir, w) for w in (0.0, *FINAL_RETRY_WAITS_S)] + [(p, 0.0) for p in run.fallbacks]
    for path, wait in tries:
        time.sleep(wait)
        try:
            return run.checkpoint(step, path)
        except Exception as exc:  # noqa: BLE001 - a full disk, a quota, an I/O error: the next try may work
            logger.warning("step %d: final checkpoint not written to %s (%s); trying again", step, path, exc)
    time.sleep(last_wait)
    return run.checkpoint(step, last)


def stop_reason(run: _Run) -> str | None:
    """FINISHED when the early-stop rule held twice in a row, KILLED when a callback asks, else None;
    rank 0 decides for every rank."""
    solved = run.good_evals >= 2
    stop = torch.tensor([solved or any(cb.should_stop() for cb in run.callbacks)], dtype=torch.int, device=run.device)
    if run.distributed:  # on the model's device: NCCL broadcasts CUDA tensors only
        dist.broadcast(stop, src=0)
    if not stop.item():
        return None
    return "FINISHED" if solved else "KILLED"


def train(
    config: RunConfig, out_dir: str | Path, callbacks: list[Callback] | tuple = (), resume: str | Path | None = None,
    fallbacks: Sequence[str | Path] = (),
) -> TrainResult:
    """Train a model from `config`, writing checkpoints to `out_dir` (the final one, when `out_dir` cannot
    take it, to the first of `fallbacks` that can: see `save_final_checkpoint`). A run resumed from `resume`
    continues with its weights, plan, controller, optimizer moments, generators and data order: it computes
    the losses the uninterrupted run would have."""
    device, rank, distributed = start_process(config)
    model, controller, start_step = model_and_controller(config, device, resume)
    model.train()
    data = training_data(config, rank, start_step)
    optimizer = build_optimizer(model, controller, config)
    meta = {"data_hash": data.data_hash, "git_rev": _git_rev(), "preset": config.preset, "n_params": model.num_params()}
    run = _Run(config, Path(out_dir), device, rank, distributed, model, controller, data, optimizer,
               list(callbacks) if rank == 0 else [], meta, completed=start_step,
               fallbacks=tuple(Path(p) for p in fallbacks))
    saved = read_train_state(resume) if resume is not None else None
    if saved is not None:
        run.good_evals = restore_train_state(saved, optimizer, device)
    for cb in run.callbacks:
        cb.on_start({"total_steps": config.train.max_steps, "start_step": start_step, **meta})
    ddp = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    status, step, last, saving = "FINISHED", start_step, {}, False
    try:
        for step in range(start_step, config.train.max_steps):
            last = optimize_step(run, ddp, step)
            report(run, step + 1, last)
            if (reason := stop_reason(run)) is not None:
                status = reason
                break
        step = step + 1 if config.train.max_steps > start_step else start_step
        saving = True
        path = save_final_checkpoint(run, step) if rank == 0 else run.out_dir
    except BaseException as exc:
        if rank == 0 and run.completed > start_step and not saving:  # every exit keeps the weights trained so far
            try:
                save_final_checkpoint(run, run.completed)
            except Exception as ckpt_exc:  # noqa: BLE001 - the original error is the one to report
                logger.error("step %d: no checkpoint after the error (%s)", run.completed, ckpt_exc)
        for cb in run.callbacks:
            cb.on_end("FAILED", f"{exc.__class__.__name__}: {exc}")
        raise
    for cb in run.callbacks:
        cb.on_end(status, None)
    return TrainResult(status=status, step=step, checkpoint=path, metrics=last)


def _copy_solved(metrics: dict[str, float], below_chance: float) -> bool:
    """The early-stop rule of the demo recipe: copy-answer loss at least `below_chance` nats under chance."""
    return below_chance > 0 and metrics.get("val_copy_loss", math.inf) <= copy_chance() - below_chance
