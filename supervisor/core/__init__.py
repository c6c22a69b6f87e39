"""The pure policy: every decision the daemon makes, as decide(state, event) -> (state, actions).

No clocks, files, processes or signals in here: time arrives as `event.t`, the outside
world arrives as events, and what should happen leaves as actions for the executor.
That is what lets the retention and restart rules be checked by property tests. This
package imports only the standard library and itself. Importing it (or `phases`, which
the protocol and the TUI use) loads nothing else: the rest comes with `core.policy`.

    phases      the run's phases and their transition diagram
    state       Rules, State and what of it survives a daemon restart
    requests    the operator's commands, typed, and their parser
    events      what the policy is told
    actions     what it asks for
    transitions spawning, stopping, answering waiters (shared by the handlers below)
    retention   which checkpoints go, locally and in the mirror
    lifecycle   start-up, spawn and exit, crash and backoff, ticks, shutdown
    progress    checkpoints, step lines, divergence
    plausible   which committed steps are believable (max_step_jump)
    suspects    checkpoints a trainer fails on right after resuming: suspicion, fallback
    commands    the operator's commands
    pivot       the pivot transaction
    decide      the dispatch, and the next deadline
    policy      all of the above that the shell and the tests use, in one namespace
"""
