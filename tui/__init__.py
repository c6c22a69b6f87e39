"""The trainwarden terminal UI: a Textual client of the daemon's control socket.

- `app`: the App: keys, outcomes, the render tick
- `commands`: the operator's commands to the run (save, stop, start, pin, pivot), confirmed where they cost
- `chart_feed`: what the loss chart asks the daemon for: its history, catching up, the overlaid run
- `host`: what the app's helpers use of the app (a protocol class, so they need not import it)
- `launch`: `main`: the TUI started on a daemon's socket, after checking that it answers
- `source`: the daemon as a data source (one subscribed connection, with backoff)
- `messages`: what the source posts to the app
- `model`: what the TUI knows about the run (plain data, no widgets, no I/O)
- `chart`: the loss chart as braille text, pure functions
- `fmt`: numbers as an operator reads them: short, fixed width, "-" for unknown
- `sanitize`: untrusted text from the daemon made safe for a terminal
- `screens/`: the main screen and the modals (pivot form, confirm, help, log, ...)
- `widgets/`: one small widget per panel
- `__main__`: `python -m trainwarden.tui`, the same as `trainwarden tui`
- `trainwarden.tcss`: the one stylesheet

What it may import from the rest of trainwarden: the protocol
(trainwarden.supervisor.protocol: messages, topics, phases, error codes, journal and
marker kinds and the clients it re-exports), the trainer contract (trainwarden.supervisor.contract: the pivot form's
policy rules) and the errors (trainwarden.supervisor.errors). Never daemon internals
(core, shell, store, serve, inputs, config), never the trainer, never torch; and it
declares no topic, phase or protocol field of its own, and spells no journal kind, marker
kind or error code (tests/test_kinds.py). `python -m trainwarden.tui` is
the one exception: an alias of `trainwarden tui`, it hands over to the command line.
"""
