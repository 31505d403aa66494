"""What resuming a run needs beside the weights, the plan and the controller's state.

The optimizer's moments and step counts, the random-number generators (dropout draws from them)
and the early-stop count, as flat tensors that a checkpoint stores in trainer.safetensors (never
a pickle). The learning rate needs nothing: `lr_at` is a function of the step. A checkpoint
without this state (an export, a seeded model) resumes with a fresh optimizer.
"""

from __future__ import annotations

import torch

from aah_core.errors import CheckpointError
from aah_core.optim import AdamW

OPTIMIZER = "optimizer."  # optimizer.<parameter index>.<state key>, e.g. optimizer.3.exp_avg
CPU_RNG, CUDA_RNG, GOOD_EVALS = "rng.cpu", "rng.cuda", "early_stop.good_evals"


def capture_train_state(optimizer: AdamW, device: torch.device, good_evals: int) -> dict[str, torch.Tensor]:
    """The resumable state of a run at a step boundary, as CPU tensors keyed by name."""
    state = {
        f"{OPTIMIZER}{index}.{key}": (value if isinstance(value, torch.Tensor) else torch.tensor(value)).detach().cpu()
        for index, moments in optimizer.state_dict()["state"].items()
        for key, value in moments.items()
    }
    state[CPU_RNG] = torch.get_rng_state()
    if device.type == "cuda":
        state[CUDA_RNG] = torch.cuda.get_rng_state(device)
    state[GOOD_EVALS] = torch.tensor(good_evals)
    return state


def restore_train_state(state: dict[str, torch.Tensor], optimizer: AdamW, device: torch.device) -> int:
    """Load `state` into a freshly built `optimizer` and the generators; returns the early-stop count.
    Raises CheckpointError when the saved moments do not fit the optimizer's parameters."""
    missing = [name for name in (CPU_RNG, GOOD_EVALS) if name not in state]
    if missing:
        raise CheckpointError(f"trainer.safetensors: missing {missing}; the file is not a trainer state")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    moments: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in state.items():
        if name.startswith(OPTIMIZER):
            param, key = name[len(OPTIMIZER):].split(".", 1)
            moments.setdefault(int(param), {})[key] = value
    for index, saved in moments.items():
        shapes = {tuple(v.shape) for k, v in saved.items() if k != "step"}
        if index >= len(params) or shapes - {tuple(params[index].shape)}:
            raise CheckpointError(
                f"trainer.safetensors: optimizer state for parameter {index} does not fit this run's "
                f"{len(params)} parameters; resume with the configuration the run was trained with"
            )
    optimizer.load_state_dict({"state": moments, "param_groups": optimizer.state_dict()["param_groups"]})
    torch.set_rng_state(state[CPU_RNG])
    if device.type == "cuda" and CUDA_RNG in state:
        torch.cuda.set_rng_state(state[CUDA_RNG], device)
    return int(state[GOOD_EVALS])
