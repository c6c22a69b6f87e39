"""trainwarden.supervisor: the daemon that keeps a training run alive, in layers.

    core/    the pure policy: decide(state, event) -> (state, actions); stdlib only, no I/O
    shell/   the event loop and the executor that carries out the actions
    inputs/  inotify (log and checkpoints), NVML, host sampling, the process tree
    store/   run directory, journal, loss history, checkpoint registry, mirror
    serve/   control socket, metrics, sd_notify
    cli/     the `trainwarden` command

Beside them: `protocol` (typed wire messages, shared with the CLI and the TUI), `wire`,
`client`, `contract` (the trainer contract, no torch), `config`, `registry`, `errors`.
No import cycles, and the core imports nothing outside itself (tests/test_layers.py).
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
