"""The pure policy: every decision the daemon makes, as decide(state, event) -> (state, actions).

No clocks, files, processes or signals in here: time arrives as `event.t`, the outside
world arrives as events, and what should happen leaves as actions for the executor.
That is what lets the retention and restart rules be checked by property tests. This
package imports only the standard library and itself. Importing it (or `phases`, `kinds`
and `shapes`, which the protocol and the TUI use) loads nothing else: the rest comes
with `core.policy`.

- `phases`: the run's phases and their transition diagram
- `kinds`: the vocabularies: journal record kinds, loss chart marker kinds, error codes
- `records`: each journal record kind's fields, one TypedDict per kind (the journal's schema)
- `shapes`: the shapes the store or the shell builds and a reply or a record carries
- `state`: Rules and State
- `persist`: what of the state survives a daemon restart: written, and restored
- `requests`: the operator's commands, typed, and their parser
- `events`: what the policy is told
- `actions`: what it asks for
- `transitions`: spawning, stopping, answering waiters (shared by the handlers below)
- `barrier`: no decision names a checkpoint while an older commit is still being verified
- `retention`: which checkpoints go, locally and in the mirror
- `startup`: the daemon's start: the state restored, the checkpoints on disk judged, the first spawn
- `lifecycle`: spawn and exit, a start refused or failed, ticks, stack dumps, shutdown
- `crashes`: a trainer that died unasked: its suspect checkpoint, then backoff or the crash-loop halt
- `progress`: checkpoints, step lines, divergence, the mirror's copies
- `plausible`: which committed steps are believable (max_step_jump)
- `suspects`: checkpoints a trainer fails on right after resuming: suspicion, fallback
- `spikes`: loss spikes detected against the loss's EMA
- `rollback`: the response to a loss spike: kill, roll back, skip its data
- `gpu_faults`: XIDs by class: which a restart survives, which need a reset or a reboot
- `commands`: the operator's commands, given the run's phase
- `pivot`: the pivot transaction
- `requeue`: leaving a Slurm job before its limit (save, requeue, exit 75); a run that ends ends the job
- `decide`: the dispatch, and the next deadline
- `decision_table`: the policy on one page: each event, its handler, the actions it may produce
- `exit_codes`: the daemon's exit status, a contract with whatever started it
- `policy`: all of the above that the shell and the tests use, in one namespace
- `alerts`: which journal records become alerts, and when (used by shell.alerts)
"""
