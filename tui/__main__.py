"""`python -m trainwarden.tui [RUN_DIR | --socket PATH] [--read-only]`: the same as `trainwarden tui`."""

from __future__ import annotations

import sys

from trainwarden.supervisor.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["tui", *sys.argv[1:]]))
