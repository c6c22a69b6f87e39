"""What the daemon observes. Each reports into the loop; none decides anything.

- `inotify`: one event-loop-driven inotify watcher; its calls are `libc`'s
- `logfollow`: follows the run log as `tail -F` does, without polling
- `checkpoint_watch`: commits and writes in flight in the checkpoint directory
- `checkpoint_commit`: the commit rule: which checkpoint an event in the checkpoint directory stands for
- `checkpoint_folders`: the inotify watches on the checkpoint directory and its checkpoint folders
- `checkpoint_fixed`: which events of an in-place trainer's fixed file or folder are a new version
- `checkpoint_unrecognised`: names in the checkpoint directory the format does not read, reported once
- `checkpoint_poll`: the checkpoint directory and the fixed file watched by scanning, without inotify
- `gpu`: the one module that talks to NVML: cheap GPU figures, never an exception
- `gpu_events`: NVML's critical XID events and a lost GPU, watched in a thread
- `host`: host and trainer-process figures from psutil: CPU, memory, disk, load
- `proctree`: the process tree below a pid
- `signals`: which of the daemon's signals a trainer catches (/proc/PID/status)
- `stacks`: a trainer's stacks read from outside: py-spy and the kernel's
- `resume_read`: whether a start opened the checkpoint it was given (a watch made before the fork)
- `slurm_job`: the Slurm job the daemon runs in (its environment) and its time limit (`scontrol`)

May import `store` (the checkpoint directory, digests and snapshots the checkpoint watcher
uses), never the shell or the core's decisions.
"""
