"""Step 1 of the GPU check: what this machine can run, written before anything is timed.

Prints and writes (to --out) the torch and Python versions, the device and its compute
capability, every attention backend's status on it (flex's status on CUDA includes one tiny
compiled call, see aah_core.attention.flex) and how long that probe took.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from aah_core.attention import backend_status


def report(device: torch.device) -> dict:
    info: dict = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["capability"] = "sm%d%d" % torch.cuda.get_device_capability(device)
        info["cuda"] = torch.version.cuda
    t0 = time.perf_counter()
    status = backend_status(device)
    info["backend_status_s"] = round(time.perf_counter() - t0, 2)  # includes flex's compile probe on CUDA
    info["backends"] = {name: reason or "ok" for name, reason in status.items()}
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device visible to torch {torch.__version__}", file=sys.stderr)
        return 1
    info = report(device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(info, indent=1) + "\n")
    for key, value in info.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
