"""Training loop: AdamW, warmup + cosine, clipping, seeds, periodic eval, callbacks, checkpoints, DDP.

Every metric flows through callbacks (a JSONL sink here, SQLite in the service, a tqdm bar
in the terminal). Run multi-process with ``torchrun --nproc_per_node N -m aah_core.cli train ...``:
gloo on CPU, nccl on GPU; rank 0 evaluates, reports and writes checkpoints.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aah_core.checkpoint import load_checkpoint, save_checkpoint
from aah_core.config import RunConfig
from aah_core.controller import Controller, build_controller
from aah_core.data import DataStream, copy_chance
from aah_core.evaluate import evaluate_loss, model_device
from aah_core.model import WindowedGPT
from aah_core.windows import coverage_metrics, plan_to_json, window_fractions


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
    precision (an fp32 evaluation of a bf16 run would pick, and compile, other kernels)."""
    n = max(1, cfg.train.eval_batches * cfg.train.batch_size // 2)
    model.eval()
    with autocast_for(model_device(model)):
        text = evaluate_loss(model, data.eval_batch("text", n), backend=cfg.train.backend)
        out = {"val_text_loss": text, "val_loss": text}
        if data.cfg.synthetic != "none":
            syn = evaluate_loss(model, data.eval_batch("copy", n), backend=cfg.train.backend)
            out.update(val_copy_loss=syn, val_loss=(text + syn) / 2)
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


def _plan_metrics(model: WindowedGPT, cfg: RunConfig) -> dict[str, float]:
    T = cfg.model.seq_len
    metrics = coverage_metrics(model.plan, T)
    fractions = window_fractions(model.plan, cfg.model.bucket_windows, T)
    metrics.update({f"window_frac/{k}": v for k, v in fractions.items()})
    return metrics


def train(
    config: RunConfig, out_dir: str | Path, callbacks: list[Callback] | tuple = (), resume: str | Path | None = None
) -> TrainResult:
    """Train a model from `config`, writing checkpoints to `out_dir`. Resumes weights and step from `resume`."""
    out_dir = Path(out_dir)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device, dist_backend = device_and_backend()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before NCCL opens a context, or every rank opens one on GPU 0
    if distributed and not dist.is_initialized():
        dist.init_process_group(dist_backend)
    rank = dist.get_rank() if distributed else 0
    tcfg = config.train
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    torch.manual_seed(tcfg.seed)
    callbacks = list(callbacks) if rank == 0 else []

    model, controller, start_step = model_and_controller(config, device, resume)
    model.train()
    data = DataStream(config.data, config.model.seq_len, seed=tcfg.seed, rank=rank)
    for _ in range(start_step):  # keep the data order of an uninterrupted run
        data.train_batch(tcfg.batch_size)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if controller.parameters():
        groups.append({"params": controller.parameters(), "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2))
    autocast = autocast_for(device)
    meta = {"data_hash": data.data_hash, "git_rev": _git_rev(), "preset": config.preset, "n_params": model.num_params()}
    info = {"total_steps": tcfg.max_steps, "start_step": start_step, **meta}
    for cb in callbacks:
        cb.on_start(info)

    def checkpoint(step: int) -> Path:
        path = save_checkpoint(out_dir, model, config, controller_state=controller.state_dict(), meta={**meta, "step": step})
        for cb in callbacks:
            cb.on_checkpoint(step, path)
        return path

    status, error, step, last = "FINISHED", None, start_step, {}
    good_evals = 0
    reported: torch.Tensor | None = None  # the last plan passed to on_plan
    try:
        for step in range(start_step, tcfg.max_steps):
            controller.on_step_start(step)
            if distributed:
                dist.broadcast(model.plan, src=0)  # every rank trains under rank 0's plan
            lr = lr_at(step, config)
            for g in optimizer.param_groups:
                g["lr"] = lr
            t0 = time.perf_counter()
            x, y = (t.to(device) for t in data.train_batch(tcfg.batch_size))
            with autocast:
                _, loss = ddp(x, y, backend=tcfg.backend)
                extra = controller.extra_loss()
                total = loss if extra is None else loss + extra
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            if tcfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # kernels run asynchronously: time their end, not their launch
            elapsed = time.perf_counter() - t0
            done = step + 1
            last = {"train_loss": float(loss.detach()), "lr": lr, "tokens_per_s": x.numel() / elapsed, **controller.metrics()}
            evaluating = done % tcfg.eval_every == 0 or done == tcfg.max_steps
            if rank == 0 and (evaluating or reported is None or not torch.equal(reported, model.plan)):
                # the plan this step trained under, at every eval and whenever the controller changed it
                reported = model.plan.clone()
                last.update(_plan_metrics(model, config))
                for cb in callbacks:
                    cb.on_plan(done, reported.clone())
            if evaluating and rank == 0:
                last.update(evaluate_run(model, data, config))
                good_evals = good_evals + 1 if _copy_solved(last, tcfg.stop_copy_below_chance) else 0
            for cb in callbacks:
                cb.on_metrics(done, last)
            if tcfg.checkpoint_every and done % tcfg.checkpoint_every == 0 and rank == 0:
                checkpoint(done)
            stop = torch.tensor(
                [good_evals >= 2 or any(cb.should_stop() for cb in callbacks)], dtype=torch.int, device=device
            )  # on the model's device: NCCL broadcasts CUDA tensors only
            if distributed:
                dist.broadcast(stop, src=0)
            if stop.item():
                status = "KILLED" if good_evals < 2 else "FINISHED"
                break
        step = done if tcfg.max_steps > start_step else start_step
        path = checkpoint(step) if rank == 0 else out_dir
    except BaseException as exc:
        error = f"{exc.__class__.__name__}: {exc}"
        for cb in callbacks:
            cb.on_end("FAILED", error)
        raise
    for cb in callbacks:
        cb.on_end(status, None)
    return TrainResult(status=status, step=step, checkpoint=path, metrics=last)


def _copy_solved(metrics: dict[str, float], below_chance: float) -> bool:
    """The early-stop rule of the demo recipe: copy-answer loss at least `below_chance` nats under chance."""
    return below_chance > 0 and metrics.get("val_copy_loss", math.inf) <= copy_chance() - below_chance
