"""The reference trainer: a small GPT trained on Python's own standard library.

`python -m trainwarden.trainer` speaks the trainer contract (step lines, atomic andrea-bin
checkpoints, SIGTERM/SIGUSR1, TRAINWARDEN_RESUME) so trainwarden can supervise it on a
CPU out of the box and on a GPU at GPT-2 small scale. This package's top level stays
free of torch: the daemon and TUI import `trainer.policy` and must start fast.
"""
