"""The imperative shell: the one asyncio loop that owns the state, and what carries out
the policy's actions.

- `daemon`: the loop: events in, `core.decide`, actions out; nothing else assigns state
- `executor`: performs exactly what an action says and reports what came of it as events
- `starts`: a trainer start: spawned after its checks and intent, awaited to its exit, contained
- `spawning`: the trainer's argv and environment (the contract's names)
- `process`: the trainer as a child process: spawn, signal, leftovers
- `containment`: a start's processes found by marker and subreaper; none outlives the start
- `cgroups`: a cgroup v2 of its own for each trainer start, where one can be made
- `spare`: the next start's process, made ahead inside its cgroup, which becomes the trainer
- `boot`: start-up reads: the rules from the config, the journal's last state, metrics
- `config_watch`: whether the config file still holds what the daemon read at its start
- `verdicts`: each commit verified and digested once; the registry of what each was
- `snapshots`: an in-place trainer's fixed file or folder, snapshotted and restored
- `pivot_files`: the pivot's file work (archive, policy.json)
- `views`: the status, state and checkpoint views the socket serves
- `hub`: the followed log's lines (steps to the queue, then figures), the telemetry frame, topics
- `start_audit`: each start's resume audit, journaled and shown
- `checkpoint_view`: the newest verified commit and the names the format does not read
- `log_offset`: `.log_offset`, where the run log has been read to
- `stray`: lines the log gains while no start runs, counted and journaled
- `line_count`: a parser that counts lines: each start's count, a restarted daemon's
- `run_history`: the loss history: `.loss.json`, its cache rebuilt in a thread, clients' queries
- `samplers`: GPU and host samples, the bandit and samples files, throttle and low disk
- `slurm`: the Slurm job the daemon runs in: its segment, its limit, the pre-timeout signal and end time
- `job_signal`: [slurm] signal: the job's pre-timeout signal, or one ignored outside a job
- `gpu_watch`: NVML's XID events and a lost GPU as the policy's events
- `ticks`: the policy's clock: one timer that queues a Tick by the next deadline
- `telemetry`: tokens/s, MFU, loss averages, ETA from step lines
- `save_cadence`: the trainer's own checkpoint cadence and its next save
- `validation`: the held-out evaluations: `.eval.json`, the newest, the history
- `parser_watch`: notices when the configured parser matches none of the trainer's lines
- `hangdump`: a hung trainer's stack dump, to a file and a journal record
- `gpu_recovery`: after a GPU fault, wait until the GPU is free and reset it when allowed
- `alerts`: the journal observed, alerts sent from a thread per target
- `alert_send`: one alert to one apprise URL, in a process of its own
- `helpers`: helper programs: own process group, total deadline, output cut to its tail
- `other_runs`: other runs' histories for clients: own thread, bounded, cached

May import every layer below it (core, inputs, store, serve); takes no decision itself.
"""
