"""The trainwarden terminal UI: a Textual client of the daemon's control socket.

    app.py        the App: keys, outcomes, the render tick
    source.py     the daemon as a data source (one subscribed connection, with backoff)
    messages.py   what the source posts to the app
    model.py      what the TUI knows about the run (plain data, no widgets, no I/O)
    screens/      the main screen and the modals (pivot form, confirm, help, log)
    widgets/      one small widget per panel; fmt.py, chart.py, sanitize.py draw text

What it may import from the rest of trainwarden: the protocol
(trainwarden.supervisor.protocol: messages, topics, phases, error codes and the clients
it re-exports), the trainer contract (trainwarden.supervisor.contract: the pivot form's
policy rules) and the errors (trainwarden.supervisor.errors). Never daemon internals
(core, shell, store, serve, inputs, config), never the trainer, never torch; and it
declares no topic, phase or protocol field of its own. `python -m trainwarden.tui` is
the one exception: an alias of `trainwarden tui`, it hands over to the command line.
"""
