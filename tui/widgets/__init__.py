"""The main screen's panels, each small and named for what it shows.

- `header`: one line: the run, its state, the trainer, restarts, the resume audit
- `caption`: one line under the header: the newest incident and what the daemon did
- `telemetry`: step, loss, validation loss, throughput, MFU, ETA, checkpoint cadence
- `loss_chart`: the loss curve, over the range and scale the operator picked
- `gpu`: utilisation and memory bars, sparklines, throttling; or why there is no sample
- `bandit`: the data-mixing bandit: one row per arm, with its newest sample
- `checkpoints`: verified checkpoints, retention's next victim, quarantined ones apart
- `events`: the journal, newest first
- `table`: keyed table updates: rows change in place, never rebuilt
"""
