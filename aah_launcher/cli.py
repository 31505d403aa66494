"""The installed `aah` command: the engine's commands (aah_core.cli), `aah serve`, `aah models` and `aah submit`
(aah_launcher.submit) from here, and tracking (`train --tracking-uri`, `aah sync`, `aah import`) from aah_tracking."""

from __future__ import annotations

import argparse
import sys

from aah_core import cli as core_cli
from aah_launcher.submit import add_submit
from aah_tracking.cli import add_sync_and_import, add_train_tracking


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


def cmd_models(args: argparse.Namespace) -> int:
    """`aah models add PATH`: register a model folder in the store of --data-dir / $AAH_DATA_DIR."""
    from backend.schemas.errors import ServiceError
    from backend.services.model_folders import register_model_folder
    from backend.settings import Settings
    from backend.store import migrate
    from backend.store.db import make_engine, make_session_factory, transaction

    settings = Settings(**({"data_dir": args.data_dir} if args.data_dir else {}))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_path)
    try:
        migrate.upgrade(engine)
        with transaction(make_session_factory(engine)) as s:
            model_id, d = register_model_folder(s, args.path, args.name, args.seq_len, settings, args.eval_tokens)
    except ServiceError as exc:
        print(f"aah models add: error: {exc.detail}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    print(f"registered {model_id!r}: {d.family}, {d.n_layer} layers x {d.n_head} heads, {d.n_params:,} parameters, "
          f"evaluated at seq_len {d.seq_len} in the dtype measured faster here. "
          "`make demo` (or `aah serve`) shows it in the model picker.")
    return 0


def add_models(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `aah models add` on the engine's parser."""
    p = sub.add_parser("models", help="register local model folders (Hugging Face causal LMs) with the service")
    models = p.add_subparsers(dest="models_command", required=True)
    add = models.add_parser("add", help="register a folder under AAH_MODEL_DIRS (default: <data dir>/models "
                            "and the local Hugging Face cache)")
    add.add_argument("path", help="the model folder: config.json, *.safetensors, tokenizer.json")
    add.add_argument("--name", help="display name (default: the folder's name)")
    add.add_argument("--seq-len", type=int, help="evaluation context (default min(model maximum, 1024))")
    add.add_argument("--eval-tokens", type=int, help="tokens per evaluation set: whole sequences of seq_len "
                     "(default 4 sequences)")
    add.add_argument("--data-dir", help="the service's data dir (default $AAH_DATA_DIR or ./data)")
    add.set_defaults(func=cmd_models)


def main(argv: list[str] | None = None) -> int:
    return core_cli.main(argv, extra=(add_serve, add_models, add_submit, add_train_tracking, add_sync_and_import))


if __name__ == "__main__":
    sys.exit(main())
