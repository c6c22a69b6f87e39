"""What the daemon observes: one event-loop-driven inotify watcher (`inotify`) used by the
log follower (`logfollow`) and the checkpoint watcher (`checkpoint_watch`), NVML (`gpu`),
host and trainer-process sampling (`host`), and the trainer's process tree (`proctree`).

Each reports into the loop; none decides anything. May import `store` (the checkpoint
registry the watcher reads), never the shell or the core's decisions.
"""
