"""The installed `aah` command: the engine's commands (aah_core.cli) plus `aah serve` from here."""

from __future__ import annotations

import argparse
import sys

from aah_core import cli as core_cli


def cmd_serve(args: argparse.Namespace) -> int:
    from aah_launcher.serve import serve

    return serve(host=args.host, api_port=args.api_port, ui_port=args.ui_port, data_dir=args.data_dir,
                 timeout=args.timeout, verbose=args.verbose)


def add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `aah serve` on the engine's parser."""
    p = sub.add_parser("serve", help="start the API and the dashboard; Ctrl-C stops both")
    p.add_argument("--host", default="127.0.0.1", help="bind address of both servers (default 127.0.0.1)")
    p.add_argument("--api-port", type=int, help="API port (default $AAH_API_PORT or 8000)")
    p.add_argument("--ui-port", type=int, help="dashboard port (default $AAH_UI_PORT or 8501)")
    p.add_argument("--data-dir", help="store, checkpoints and logs (default $AAH_DATA_DIR or ./data)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for both health checks")
    p.add_argument("--verbose", action="store_true", help="server logs on this terminal, not <data-dir>/logs")
    p.set_defaults(func=cmd_serve)


def main(argv: list[str] | None = None) -> int:
    return core_cli.main(argv, extra=(add_serve,))


if __name__ == "__main__":
    sys.exit(main())
