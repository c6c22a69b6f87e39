"""Checkpoints as the policy hears of them, and the registry of what each was at its commit.

Each committed checkpoint is verified (the format's check) and digested (store.digest) once,
in a worker thread, and reported once: as the start-up scan's verdicts, or as
CheckpointSeen followed by exactly one outcome event. The registry (`known`) holds, per
committed name, its files' stat signature and its digest; the executor drops a name once
it deletes or quarantines it (`forget`).

A name the watcher reports again (a second event for the same commit, a write to a
committed file, a file renamed over it) is looked at again: the same signature is the
same commit and reports nothing; otherwise it is digested again, and reads either as it
did (CheckpointUnchanged) or not (CheckpointChanged: never counted as a new commit).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.shell.hub import TelemetryHub
from trainwarden.supervisor.store.checkpoints import CheckpointStore, Verdict
from trainwarden.supervisor.store.digest import Digest, Signature, digest_checkpoint, signature_of


@dataclass
class Commit:
    """What a committed checkpoint was when it was verified."""

    signature: Signature
    digest: Digest


@dataclass(frozen=True)
class Checked:
    """A verification and digest of one checkpoint, done in a worker thread."""

    verdict: Verdict
    signature: Signature = ()
    digest: Digest | None = None
    error: str = ""
    """Why it could not be read for its digest (a vanished file: empty, see verdict)."""


RECOMMITS_PER_CHECK = 3
"""Files renamed over one name while it is read, checked in turn before it is refused."""
STILL_S = 0.3
"""A checkpoint written to while it was read is read again once its files have stood still
this long (another rank's file in a folder its first rank has committed, say)."""
STILL_WITHIN_S = 30.0
"""How long such a checkpoint may go on being written before it is refused."""


class CheckpointReports:
    def __init__(
        self, store: CheckpointStore, hub: TelemetryHub, report: Callable[[core.Event], None]
    ) -> None:
        self.store = store
        self.hub = hub
        self.report = report
        self.known: dict[str, Commit] = {}
        self.changed: set[str] = set()
        """Names found changed since their commit, until their files are quarantined: what
        the watcher says of them meanwhile (the rewrite's own close) is no new commit."""
        self._checking: set[str] = set()
        self._again: dict[str, Verdict | None] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- reading, in worker threads ---------------------------------------------------

    def check(self, name: str, verdict: Verdict | None = None) -> Checked:
        """Verify (unless `verdict` is given) and digest one committed checkpoint.

        A new file renamed over the name while it was read (a trainer saving the same step
        again, as on a SIGTERM right after a periodic save) is a new commit: checked afresh,
        a few times at most. One written to while it was read (under torchrun, rank 1 may
        still write its own file into the folder rank 0 has committed) is read again, and
        verified again, once its files have stood still for STILL_S; it is refused only if
        the writing goes on past STILL_WITHIN_S."""
        recommits = 0
        deadline = time.monotonic() + STILL_WITHIN_S
        while True:
            checked, how = self._check_once(name, verdict)
            if how == "renamed over" and recommits < RECOMMITS_PER_CHECK - 1:
                recommits += 1
            elif how != "written to" or not self._stands_still(name, deadline):
                return checked
            verdict = None  # what is read again is verified again

    def _stands_still(self, name: str, deadline: float) -> bool:
        """Whether `name`'s files stop changing for STILL_S before `deadline` (polled)."""
        last = self.signature(name)
        still_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(STILL_S / 3)
            now = self.signature(name)
            if now != last:
                last, still_since = now, time.monotonic()
            elif time.monotonic() - still_since >= STILL_S:
                return True
        return False

    def _check_once(self, name: str, verdict: Verdict | None) -> tuple[Checked, str | None]:
        """The check, and whether it was "renamed over" (another file took the name) or
        "written to" while it was read."""
        if verdict is None:
            verdict = self.store.verify(name)
        if verdict.info is None:
            return Checked(verdict), None
        paths = self.store.files_of(name)
        try:
            signature = signature_of(paths)
            digest = digest_checkpoint(paths)
            after = signature_of(paths)
        except FileNotFoundError:
            vanished = Verdict(
                name, verdict.step, core.Outcome.VANISHED, reason="vanished while it was read"
            )
            return Checked(vanished), None
        except OSError as exc:
            reason = f"cannot read it for its digest: {exc.strerror or exc}"
            return Checked(Verdict(name, verdict.step, core.Outcome.INVALID, reason=reason)), None
        if after != signature:
            # Written to while it was read: the digest would describe neither version.
            reason = "written to while its digest was taken"
            invalid = Checked(Verdict(name, verdict.step, core.Outcome.INVALID, reason=reason))
            # Another inode under the name: renamed over it.
            return invalid, "renamed over" if after[:1] != signature[:1] else "written to"
        return Checked(verdict, signature, digest), None

    def signature(self, name: str) -> Signature:
        try:
            return signature_of(self.store.files_of(name))
        except OSError:
            return ()

    # -- the start-up scan --------------------------------------------------------------

    async def scan(self) -> tuple[core.Scanned, ...]:
        """Every committed checkpoint in the directory, verified and digested, oldest first."""
        names, _ = self.store.scan()
        checked = await asyncio.to_thread(lambda: [self.check(n) for n in names])
        scanned = []
        for result in checked:
            verdict, info = result.verdict, result.verdict.info
            if info is None or result.digest is None:
                scanned.append(
                    core.Scanned(verdict.name, verdict.step, verdict.outcome, verdict.reason)
                )
                continue
            self.known[verdict.name] = Commit(result.signature, result.digest)
            scanned.append(
                core.Scanned(
                    verdict.name,
                    info.step,
                    verdict.outcome,
                    bytes=info.bytes,
                    mtime=_mtime(result.signature),
                    digest=result.digest.hex,
                )
            )
            self.hub.checkpoint_seen(info, _mtime(result.signature), scanned=True)
        return tuple(scanned)

    # -- what the watcher reports, on the loop -------------------------------------------

    def committed(self, name: str) -> None:
        """The watcher saw `name` committed (renamed into place, closed after a write)."""
        self._look(name, None)

    def verified(self, name: str, verdict: Verdict) -> None:
        """As committed, with the verdict the watcher already had to take."""
        self._look(name, verdict)

    def touched(self, name: str) -> None:
        """A committed-looking name was written to: only a known commit is looked at (an
        unknown one is still being written, and its commit is reported on its own)."""
        if name in self.known or name in self._checking:
            self._look(name, None)

    def forget(self, name: str) -> None:
        """`name` was deleted or quarantined: a checkpoint saved under it later is new."""
        self.known.pop(name, None)
        self.changed.discard(name)

    def _look(self, name: str, verdict: Verdict | None) -> None:
        if name in self.changed:
            return
        if name in self._checking:
            self._again.setdefault(name, verdict)
            return
        step = self.store.fmt.step_of(self.store.dir / name)
        if step is None:
            return
        seen = name not in self.known
        if seen:
            # Now, not from the task: the policy must hear of a commit before any event
            # queued after the watcher saw it (a trainer's exit, an operator's request).
            self.report(core.CheckpointSeen(time.monotonic(), name, step))
        self._checking.add(name)
        task = asyncio.get_running_loop().create_task(
            self._check_until_quiet(name, step, verdict, seen)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check_until_quiet(
        self, name: str, step: int, verdict: Verdict | None, seen: bool
    ) -> None:
        try:
            while True:
                await self._check_and_report(name, step, verdict, seen)
                if name not in self._again:
                    return
                verdict, seen = self._again.pop(name), False
                if name in self.changed:
                    return  # what else was written to it changes nothing
        finally:
            self._checking.discard(name)

    async def _check_and_report(
        self, name: str, step: int, verdict: Verdict | None, seen: bool
    ) -> None:
        known = self.known.get(name)
        if not seen:
            if known is not None:
                signature = await asyncio.to_thread(self.signature, name)
                if signature == known.signature:
                    return  # the watcher's second word on a commit already reported
            self.report(core.CheckpointSeen(time.monotonic(), name, step))
        result = await asyncio.to_thread(self.check, name, verdict)
        now = time.monotonic()
        known = self.known.get(name)  # the executor may have deleted it meanwhile
        verdict = result.verdict
        info = verdict.info
        if known is not None:
            if result.digest is not None and result.digest.hex == known.digest.hex:
                known.signature = result.signature
                self.report(core.CheckpointUnchanged(now, name))
                return
            del self.known[name]
            self.changed.add(name)
            self.report(core.CheckpointChanged(now, step, name, _change(known, result)))
            return
        if info is not None and result.digest is not None:
            self.known[name] = Commit(result.signature, result.digest)
            self.hub.checkpoint_seen(info, _mtime(result.signature))
            self.report(
                core.CheckpointCommitted(
                    now,
                    info.step,
                    name,
                    info.bytes,
                    _mtime(result.signature),
                    result.digest.hex,
                )
            )
            return
        self.report(core.checkpoint_event(now, name, verdict.step, verdict.outcome, verdict.reason))

    async def wait_idle(self) -> None:
        """Until every verification started so far has been reported (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _mtime(signature: Signature) -> float:
    """The main path's mtime in seconds (the signature's third figure is its st_mtime_ns)."""
    return signature[2] / 1e9 if len(signature) > 2 else 0.0


def _change(known: Commit, result: Checked) -> str:
    """What differs from the commit, for the journal."""
    if result.verdict.info is None:
        return result.verdict.reason or str(result.verdict.outcome)
    if result.digest is None:
        return "unreadable"
    before = {name: (size, hex) for name, size, hex in known.digest.files}
    after = {name: (size, hex) for name, size, hex in result.digest.files}
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is None:
            return f"{name} appeared"
        if new is None:
            return f"{name} disappeared"
        if old[0] != new[0]:
            return f"{name} is {new[0]} bytes, {old[0]} at commit"
        return f"{name} reads as xxh3_128 {new[1]}, {old[1]} at commit"
    return "its digest differs"
