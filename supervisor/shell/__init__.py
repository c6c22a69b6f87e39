"""The imperative shell: the one asyncio loop that owns the state, and what carries out
the policy's actions.

    daemon      the loop: events in, `core.decide`, actions out; nothing else assigns state
    executor    performs exactly what an action says and reports what came of it as events
    spawning    the trainer's argv and environment (the contract's names)
    process     the trainer as a child process: spawn, signal, leftovers
    boot        start-up reads: the rules from the config, the journal's last state, metrics
    verdicts    checkpoint verification off the loop, reported as events
    pivot_files the pivot's file work (archive, policy.json)
    views       the status, state and checkpoint views the socket serves
    hub         telemetry: the log follower, loss history, samplers, subscribers
    telemetry   tokens/s, MFU, loss averages, ETA from step lines

May import every layer below it (core, inputs, store, serve); takes no decision itself.
"""
