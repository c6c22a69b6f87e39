"""A spare start: a process already inside the next start's cgroup, which becomes the trainer.

Joining a cgroup waits for an RCU grace period in the kernel (about 9 ms here), and the
forked child that joins before its exec makes Python fork() the daemon where it would
vfork() (4 ms more): together most of a crash -> restart. While a start runs, the daemon
prepares the next one's process ahead of time: a small interpreter spawned (vfork, no
preexec) into a session of its own, which writes itself into the next start's cgroup and
then waits on a socket. At the restart the daemon sends it the run log's descriptor, the
argv, the environment and the working directory; it puts the log on its stdout and stderr,
/dev/null on its stdin, restores the signals Python ignores, changes directory and
executes the trainer. Its pid, session and cgroup are the trainer's, as after a spawn.

The socket answers as `subprocess` does: the spare's end closes on exec (close-on-exec),
so end-of-file after "x" is the trainer running; "x" then "e<errno>" is an exec that
failed (the start fails as a spawn's would); nothing at all is a spare that died first,
and the start is spawned the usual way instead. A spare that loses its daemon reads
end-of-file, leaves its cgroup, removes it and exits; one found after a daemon died is no leftover of a start
(`is_spare`). Only where the daemon makes cgroups: elsewhere a spawn is already a vfork.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
import os
import socket
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainwarden.supervisor.shell.cgroups import StartCgroups

log = logging.getLogger("trainwarden.daemon")

TAG = "trainwarden-spare"
"""The spare's first argument: how a daemon tells a spare from a start's leftover."""

DELAY_S = 0.2
"""A start's age before its spare is made: a start that dies at once (a crash loop, whose
restarts wait out a backoff anyway) costs no second process."""

# The spare's program: run with `-I -S` (nothing from the user's site or environment), it
# imports only built-in modules (_socket, _signal, marshal: socket.py, signal.py and json
# would double its start-up), so it costs 9 ms of CPU per start. The order comes as
# marshal data: the daemon and the spare are the same interpreter (sys.executable).
PROGRAM = r"""
import _signal, _socket, errno, marshal, os, sys
_, sock_fd, procs, base_procs = sys.argv[1:5]
s = _socket.socket(fileno=int(sock_fd))
os.set_inheritable(s.fileno(), False)


def leave():
    # The daemon is gone (or sent it away): out of the cgroup, which is removed, then exit.
    try:
        fd = os.open(base_procs, os.O_WRONLY | os.O_CLOEXEC)
        os.write(fd, b"0\n")
        os.close(fd)
        os.rmdir(os.path.dirname(procs))
    except OSError:
        pass
    os._exit(0)


try:
    fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
    os.write(fd, b"0\n")
    os.close(fd)
except OSError as exc:
    s.sendall(b"j%d" % exc.errno)
    os._exit(1)
s.sendall(b"r")
try:
    _, ancillary, _, _ = s.recvmsg(1, _socket.CMSG_SPACE(4))
except OSError:
    leave()
fds = [
    int.from_bytes(data[:4], sys.byteorder)
    for level, kind, data in ancillary
    if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
]
if not fds:
    leave()
parts = []
while part := s.recv(1 << 16):
    parts.append(part)
order = marshal.loads(b"".join(parts))
os.dup2(fds[0], 1)
os.dup2(fds[0], 2)
os.close(fds[0])
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
    if hasattr(_signal, name):
        _signal.signal(getattr(_signal, name), _signal.SIG_DFL)
s.sendall(b"x")
try:
    os.chdir(order["cwd"])
    os.execvpe(order["argv"][0], order["argv"], order["env"])
except OSError as exc:
    s.sendall(b"e%d" % (exc.errno or errno.EIO))
os._exit(127)
"""


class SpareGone(Exception):
    """The spare ended before it executed the trainer: spawn the start the usual way."""


@dataclass
class Spare:
    """One spare process for the start of segment `seg`, whose marker it already carries
    as its cgroup's name."""

    seg: int
    marker: str
    proc: asyncio.subprocess.Process
    sock: socket.socket
    cgroups: StartCgroups
    ready: bool = False
    waiting: asyncio.Task[None] | None = field(default=None, repr=False)

    async def launch(
        self, argv: list[str], cwd: Path, env: dict[str, str], log_fd: int
    ) -> asyncio.subprocess.Process:
        """Execute the trainer in this spare; its process, as `spawn` returns one. OSError
        as a spawn's when the exec fails; SpareGone when the spare died before it."""
        loop = asyncio.get_running_loop()
        order = marshal.dumps({"argv": argv, "env": env, "cwd": str(cwd)})
        try:
            socket.send_fds(self.sock, [b"o"], [log_fd])
            await loop.sock_sendall(self.sock, order)
            self.sock.shutdown(socket.SHUT_WR)
            answer = b""
            while part := await loop.sock_recv(self.sock, 64):
                answer += part
        except OSError as exc:
            raise SpareGone(f"the spare's socket: {exc.strerror or exc}") from None
        finally:
            self.sock.close()
        if answer == b"x":
            return self.proc
        await self.proc.wait()
        if answer.startswith(b"xe"):
            code = int(answer[2:])
            raise OSError(code, os.strerror(code))
        raise SpareGone(f"the spare exited ({self.proc.returncode}) before the trainer's exec")

    async def end(self) -> None:
        """Send the spare away and remove its cgroup (the daemon exits, or the start it was
        made for will not come)."""
        if self.waiting is not None:
            self.waiting.cancel()
        self.sock.close()  # it reads end-of-file and exits
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()
        await asyncio.to_thread(self.cgroups.end, self.marker)


async def make(seg: int, marker: str, cgroups: StartCgroups) -> Spare:
    """A spare for the start of segment `seg` with `marker`: spawned now, ready once it
    has joined the cgroup (await `spare.waiting`). OSError when it cannot be spawned."""
    folder = cgroups.path(marker)
    folder.mkdir(exist_ok=True)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            "-c",
            PROGRAM,
            TAG,
            str(theirs.fileno()),
            str(folder / "cgroup.procs"),
            str(cgroups.base / "cgroup.procs"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=(theirs.fileno(),),
            env={},
        )
    except OSError:
        ours.close()
        with contextlib.suppress(OSError):
            folder.rmdir()
        raise
    finally:
        theirs.close()
    ours.setblocking(False)
    spare = Spare(seg, marker, proc, ours, cgroups)
    spare.waiting = asyncio.get_running_loop().create_task(_await_ready(spare))
    return spare


async def _await_ready(spare: Spare) -> None:
    """Mark the spare ready once it is in its cgroup; raise SpareGone (after it exited)
    with why when it could not join or died first."""
    try:
        answer = await asyncio.get_running_loop().sock_recv(spare.sock, 16)
    except OSError as exc:
        answer = f"socket: {exc.strerror}".encode()
    if answer == b"r":
        spare.ready = True
        return
    await spare.proc.wait()
    if answer.startswith(b"j"):
        why = f"cannot join its cgroup: {os.strerror(int(answer[1:]))}"
    else:
        why = f"it exited ({spare.proc.returncode}) before it was ready"
    raise SpareGone(why)


def is_spare(pid: int) -> bool:
    """Whether `pid` is a daemon's spare (still waiting; one that became a trainer is not)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return len(argv) > 5 and argv[3] == b"-c" and argv[5] == TAG.encode()


def spare_pids(pids: list[int]) -> set[int]:
    return {pid for pid in pids if is_spare(pid)}


class Spares:
    """The next start's spare, made once a start has run DELAY_S and kept until that start
    comes (`take`), another comes instead, or the run halts or the daemon exits (`end`).
    After a spare that could not be made, none is tried again: starts spawn as usual."""

    def __init__(self, cgroups: StartCgroups, new_marker: Callable[[int], str]) -> None:
        self.cgroups = cgroups
        self.new_marker = new_marker
        self.spare: Spare | None = None
        self.off: str | None = None
        """Why no spare is made any more (None: they are)."""
        self.generation = 0
        """Bumped by every take and end: a spare made for an earlier one is sent away."""
        self.tasks: set[asyncio.Task[None]] = set()
        self.timer: asyncio.TimerHandle | None = None
        """The spare's making, due once the start has run DELAY_S."""

    def plan(self, seg: int, proc: asyncio.subprocess.Process) -> None:
        """The start of segment `seg - 1` is spawned as `proc`: make the spare for `seg`."""
        if self.timer is not None:
            self.timer.cancel()
        if self.off is None:
            self.timer = asyncio.get_running_loop().call_later(
                DELAY_S, self._due, seg, proc, self.generation
            )

    def _due(self, seg: int, proc: asyncio.subprocess.Process, generation: int) -> None:
        self.timer = None
        if generation == self.generation and proc.returncode is None and self.off is None:
            self._background(self._make(seg, generation))

    def take(self, seg: int) -> Spare | None:
        """The spare for the start of segment `seg` if one is ready; any other is ended."""
        spare, self.spare = self.spare, None
        self.generation += 1
        if spare is None:
            return None
        if spare.ready and spare.seg == seg and spare.proc.returncode is None:
            return spare
        self._background(spare.end())
        return None

    def drop(self) -> None:
        """No start is coming soon (the run halted, a shutdown): the spare ends, in the
        background."""
        spare, self.spare = self.spare, None
        self.generation += 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if spare is not None:
            self._background(spare.end())

    async def end(self) -> None:
        """The daemon exits: the spare, and any being made or ended, gone before returning."""
        self.drop()
        while self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _make(self, seg: int, generation: int) -> None:
        try:
            spare = await make(seg, self.new_marker(seg), self.cgroups)
        except OSError as exc:
            self._give_up(f"cannot spawn one: {exc.strerror or exc}")
            return
        if generation != self.generation:  # a start came while it was spawned
            await spare.end()
            return
        self.spare = spare
        assert spare.waiting is not None
        try:
            await spare.waiting
        except SpareGone as gone:
            if self.spare is spare:
                self.spare = None
            await spare.end()
            self._give_up(str(gone))
        except asyncio.CancelledError:
            if not spare.waiting.cancelled():
                raise  # this task itself was cancelled, not the spare's wait (ended meanwhile)

    def _give_up(self, why: str) -> None:
        self.off = why
        log.warning("no spare starts for this daemon (%s): each start spawns the trainer", why)
