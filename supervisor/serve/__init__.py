"""How the daemon talks: the control socket, Prometheus metrics and sd_notify.

- `control`: the control socket's server: admission, turns, replies, acting commands to the policy
- `reads`: the read commands' answers (hello, status, events, history, subscribe, ...)
- `supervised`: what the server needs from the daemon (a protocol class it satisfies)
- `connection`: one client: its reader and writer, deadlines, admission, peer
- `queues`: a connection's outbox and inbox, bounded
- `turns`: time slices for answering requests, so busy clients cannot starve the loop
- `memory`: freed memory handed back to the system after a flood of clients
- `metrics`: Prometheus metrics from a snapshot of the daemon's view
- `notify`: sd_notify without libsystemd: readiness, status, watchdog pings

May import the core's types, the store, config, the socket's place and the wire protocol;
never the shell.
"""
