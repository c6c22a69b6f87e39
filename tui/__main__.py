"""`python -m tui [RUN_DIR | --socket PATH] [--read-only]`: what `trainwarden tui` runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tui.app import main as run_tui

DEFAULT_SOCKET = Path(".trainwarden") / "control.sock"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="trainwarden tui", description="Watch and steer a run.")
    parser.add_argument("run_dir", nargs="?", default=".", help="run directory (default: .)")
    parser.add_argument("--socket", type=Path, help="control socket (e.g. forwarded over SSH)")
    parser.add_argument("--read-only", action="store_true", help="watch only: refuse acting keys")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.socket is not None:
        return run_tui(args.socket.expanduser(), read_only=args.read_only)
    run_dir = Path(args.run_dir).expanduser().resolve()
    return run_tui(
        run_dir / DEFAULT_SOCKET, read_only=args.read_only, log_path=run_dir / "training.log"
    )


if __name__ == "__main__":
    sys.exit(main())
