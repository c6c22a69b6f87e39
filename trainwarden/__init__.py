"""trainwarden: a supervisor for multi-week single-GPU training runs.

The installed package is made of the repository's top-level folders, each of them
installed as `trainwarden.<folder>`:

- `supervisor/`: the daemon, its command line and the wire protocol
- `tui/`: the terminal UI, a client of the daemon's control socket
- `plugins/`: the plugin API and the built-in checkpoint formats and log parsers
- `trainer/`: the reference trainer (torch, the `trainer` extra)
- `integrations/`: callbacks and helpers run inside other trainers (Hugging Face,
  Lightning, hand-written loops)

and of the modules beside this file:

- `libc`: the project's calls into the C library (ctypes); standard library only

In a checkout, the links beside this file lay the same tree out for tools that read
sources (mypy, a bare `python -c`).
"""
