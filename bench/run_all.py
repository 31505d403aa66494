"""Run every benchmark in bench/ that defines main(): `python -m bench.run_all`."""

import importlib
import pkgutil
import sys
from pathlib import Path


def main() -> None:
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if info.name == "run_all":
            continue
        module = importlib.import_module(f"bench.{info.name}")
        if callable(getattr(module, "main", None)):
            print(f"== bench.{info.name}", flush=True)
            sys.argv = [f"bench.{info.name}"]  # each bench parses its own (default) arguments
            module.main()


if __name__ == "__main__":
    main()
