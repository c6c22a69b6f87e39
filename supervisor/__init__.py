"""trainwarden.supervisor: the daemon that keeps a training run alive, in layers.

- `core/`: the pure policy: decide(state, event) -> (state, actions); stdlib only, no I/O
- `shell/`: the event loop and the executor that carries out the actions
- `inputs/`: inotify (log and checkpoints), NVML, host sampling, the process tree, stacks
- `store/`: run directory, journal, loss history, checkpoint directory, mirror
- `serve/`: control socket, metrics, sd_notify
- `cli/`: the `trainwarden` command

Beside them:

- `protocol`: typed wire messages, topics, error codes and phases, shared with the CLI and TUI
- `wire`: the framing: one JSON object per line, and the socket's address
- `client`: the control socket's clients, blocking (CLI) and asyncio (TUI)
- `contract`: the trainer contract: environment names, policy.json, andrea-bin; no torch
- `config`: the run's `trainwarden.toml`: `load_config`, the one way to a validated `Config`
- `config_schema`: the config's schema: one frozen dataclass per table, and `Config`
- `config_toml`: the config's TOML read into the schema's tables (unknown keys, types), and
  values written as TOML
- `config_checks`: the config's values in their ranges, and `[metrics] listen`
- `config_paths`: what the config's run log and checkpoint folder may name on disk
- `config_trainer`: the trainer's command, working directory, program and script checked
- `registry`: checkpoint-format and log-parser plugins found by entry point
- `journal_text`: a journal record as one line of text, and the figures (loss, counts, rates,
  durations), written once for the CLI and the TUI
- `errors`: the exceptions trainwarden raises, each with a one-line message
- `socket_place`: where the control socket may be bound, and which group may reach it
- `run_layout`: the names of the daemon's own files in a run directory; standard library only
- `checkpoint_hints`: the `[checkpoints]` setting that would match unrecognised names
- `__main__`: `python -m trainwarden.supervisor`, the same as `trainwarden`

No import cycles, and the core imports only the standard library and itself
(tests/test_layers.py).
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
