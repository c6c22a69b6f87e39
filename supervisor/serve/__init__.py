"""How the daemon talks: the control socket (`control`, reaching the daemon only through
the `supervised` protocol class), Prometheus metrics (`metrics`) and sd_notify (`notify`).

May import the core's types, the store and the wire protocol; never the shell.
"""
