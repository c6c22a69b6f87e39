"""The trainer contract for hand-written (nanoGPT-style) training loops, torchrun included.

    from trainwarden.integrations.loop import Signals, atomic_torch_save, resume_path

    signals = Signals()                      # before the first iteration
    ...
    if signals.save_requested or signals.stop_requested or iter_num % save_every == 0:
        atomic_torch_save(checkpoint, f"{out_dir}/ckpt_{iter_num:06d}.pt")
        signals.saved()
    if signals.stop_requested:
        break

- `Signals()` installs SIGUSR1 (save) and SIGTERM (stop) handlers that only count what
  arrived; the loop asks between iterations. It does so only under the daemon
  (`TRAINWARDEN_RUN_DIR` set): outside it no handler is installed, both flags stay False,
  and the script behaves as it did before.
- `save_requested` stays True until `saved()` is called; a request that arrives after the
  read that reported it (during the save, say) asks for another save. `stop_requested`
  never goes back to False.
- `Signals(sync=True)` under torchrun: every read of `save_requested` or `stop_requested` is
  one all-reduce (MAX over the ranks) of both flags and of `saved()`, so every rank gets the
  same answer at the same read, including ranks that got no signal. Every rank must
  therefore read the flags at the same points of the loop, the same number of times: never
  inside `if master_process:`. `saved()` may be called on rank 0 alone (where the file is
  written) or on every rank: a `saved()` on any rank clears the request on all of them at
  the next read. The collective runs on the group's device: CPU tensors for gloo, the
  rank's current CUDA device for nccl. Before `init_process_group` (or without
  torch.distributed) a read is local.
- `atomic_torch_save(obj, path)` writes `path + ".tmp"` (what the `torch-pt` format treats
  as a write in flight), flushes and fsyncs it, renames it over `path` and fsyncs the
  folder: a kill at any instant leaves the old file or the new one under `path`, never a
  torn one.
- `resume_path()` is the checkpoint the daemon chose (`TRAINWARDEN_RESUME`), or None.

torch is imported only by `atomic_torch_save` and by synchronised reads.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import FrameType
from typing import Any

from trainwarden.supervisor.contract import ENV_RESUME, ENV_RUN_DIR, TMP_SUFFIX


def under_daemon() -> bool:
    """Whether this process was started by the trainwarden daemon."""
    return bool(os.environ.get(ENV_RUN_DIR))


def resume_path() -> str | None:
    """The checkpoint to resume from (`TRAINWARDEN_RESUME`), or None for a fresh start."""
    return os.environ.get(ENV_RESUME) or None


class Signals:
    """Save and stop requests from the daemon, as flags a loop reads between iterations."""

    def __init__(self, sync: bool = False, group: Any = None) -> None:
        self.sync = sync
        self.group = group
        """The torch.distributed process group to agree over (None: the default group)."""
        self.installed = under_daemon()
        """Whether the handlers are installed (only under the daemon)."""
        self._saves_received = 0  # written by the handler only
        self._stop_received = False  # written by the handler only
        self._saves_taken = 0  # requests already turned into the flag below
        self._save = False
        self._stop = False
        self._saved_mark = False  # saved() since the last synchronised read
        if self.installed:
            signal.signal(signal.SIGUSR1, self._on_signal)
            signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only counting here: the loop acts between iterations, never inside a step.
        if signum == signal.SIGTERM:
            self._stop_received = True
        else:
            self._saves_received += 1

    @property
    def save_requested(self) -> bool:
        """A save was asked for (SIGUSR1) and `saved()` not called since."""
        self._refresh()
        return self._save

    @property
    def stop_requested(self) -> bool:
        """A stop was asked for (SIGTERM): save, then leave the loop and exit 0."""
        self._refresh()
        return self._stop

    def saved(self) -> None:
        """The requested save is done: clears `save_requested` (on every rank with sync)."""
        self._save = False
        self._saved_mark = True

    def _refresh(self) -> None:
        received = self._saves_received
        new_save = received > self._saves_taken
        self._saves_taken = received
        stop = self._stop_received
        saved_mark, self._saved_mark = self._saved_mark, False
        if self.sync and self.installed:
            new_save, stop, saved_mark = self._agree(new_save, stop, saved_mark)
        if saved_mark:
            self._save = False
        self._save = self._save or new_save
        self._stop = self._stop or stop

    def _agree(self, new_save: bool, stop: bool, saved_mark: bool) -> tuple[bool, bool, bool]:
        """The three flags, each True when it is True on any rank (one all-reduce)."""
        agreed = any_rank([new_save, stop, saved_mark], self.group)
        return agreed[0], agreed[1], agreed[2]


def any_rank(flags: list[bool], group: Any = None) -> list[bool]:
    """Each flag True when it is True on any rank of `group` (one all-reduce, MAX); the flags
    as they are without an initialised torch.distributed. Every rank must call it at the
    same point, the same number of times."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return list(flags)
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor(flags, dtype=torch.int32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return [bool(value) for value in tensor.tolist()]


class Requests:
    """Save and stop flags for the framework callbacks: the signal handlers set them, the
    callback takes them at a step end."""

    def __init__(self) -> None:
        self.save = False
        self.stop = False

    def on_sigusr1(self, signum: int, frame: FrameType | None) -> None:
        self.save = True

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a rename is durable once its folder is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """torch.save `obj` to `path` so that `path` only ever holds a complete file: write
    `path.tmp`, flush, fsync, rename over `path`, fsync the folder. Returns `path`."""
    import torch

    final = Path(path)
    tmp = final.with_name(final.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # The rename is not durable until the folder holding it is.
    fsync_path(final.parent)
    return final
