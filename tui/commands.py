"""The operator's commands to the run: save, stop, start, pin, pivot.

Each sends one command over its own connection and tells the outcome, success or the
daemon's error; a command that costs something (a kill without a save, a start over from
step 0, an unpin that lets retention delete) is confirmed first.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from trainwarden.supervisor.protocol import HALTED, Phase
from trainwarden.tui.host import AppHost
from trainwarden.tui.sanitize import clean
from trainwarden.tui.screens.confirm import ConfirmScreen
from trainwarden.tui.screens.pivot import PivotRequest, PivotScreen
from trainwarden.tui.widgets.checkpoints import CheckpointsPanel


class RunCommands:
    """The app's operator keys that act on the run (the app's `action_*` call these)."""

    def __init__(self, app: AppHost) -> None:
        self.app = app

    def refused_read_only(self, what: str) -> bool:
        if self.app.read_only:
            self.app.tell(
                f"read-only: {what} is disabled (this TUI was started with --read-only)", "warning"
            )
        return self.app.read_only

    async def send(self, what: str, cmd: str, **args: Any) -> dict[str, Any] | None:
        """One operator command; its result, or None after telling why it failed."""
        try:
            result = await self.app.source.request(cmd, timeout=None, **args)
        except Exception as exc:  # whatever went wrong, say so; never take the TUI down
            self.app.tell_failure(what, exc)
            return None
        return result if isinstance(result, dict) else {}

    def save(self) -> None:
        if self.refused_read_only("save"):
            return
        if self.app.model.saving:
            self.app.tell("a save is already in progress", "warning")
            return
        self.app.model.saving = True
        self.app.model.touch("telemetry")
        self.app.request_render()
        self.app.tell("saving…", timeout=3)
        self.app.run_worker(self._save(), group="actions")

    async def _save(self) -> None:
        try:
            result = await self.send("save", "save", wait=True)
        finally:
            self.app.model.saving = False
            self.app.model.touch("telemetry")
            self.app.request_render()
        if result is not None:
            name = result.get("name")
            suffix = f" ({clean(name, 80)})" if name else ""
            self.app.tell(f"checkpoint saved at step {result.get('step')}{suffix}")

    def stop(self) -> None:
        if self.refused_read_only("stop"):
            return
        handles = self.app.model.handles
        force = handles is not None and "SIGTERM" not in handles
        title, yes_label = "Stop the trainer?", "Stop"
        body = Text(
            "The trainer finishes its step, saves a checkpoint and exits. The daemon keeps "
            "running; press r to start the trainer again."
        )
        if force:
            lost = self.app.model.unsaved_steps()
            losing = f", losing the {lost} steps since the newest checkpoint" if lost else ""
            title, yes_label = "Kill the trainer without saving?", "Kill"
            body = Text(
                "The trainer does not handle SIGTERM: stopping kills it without a save"
                f"{losing}. The daemon keeps running; press r to start the trainer again "
                "from the newest checkpoint."
            )

        def answered(yes: bool | None) -> None:
            if yes:
                self.app.tell("stopping the trainer…", timeout=3)
                self.app.run_worker(self._stop(force), group="actions")

        self.app.push_screen(ConfirmScreen(title, body, yes_label=yes_label), answered)

    async def _stop(self, force: bool = False) -> None:
        result = await (
            self.send("stop", "stop", force=True) if force else self.send("stop", "stop")
        )
        if result is None:
            return
        message = result.get("message")
        if isinstance(message, str):
            lost = result.get("outcome") not in ("saved", "not_running")
            self.app.tell(
                f"trainer stopped: {clean(message, 160)}", "warning" if lost else "information"
            )
            return
        ckpt = result.get("checkpoint")
        if isinstance(ckpt, dict):
            name = clean(ckpt.get("name") or "", 80)
            self.app.tell(
                f"trainer stopped; final checkpoint: step {ckpt.get('step')} {name}".rstrip()
            )
        else:
            self.app.tell("trainer stopped; there is no checkpoint yet")

    def start(self) -> None:
        if self.refused_read_only("start"):
            return
        phase = self.app.model.phase
        if phase is not None and phase not in HALTED and self.app.model.connected:
            self.app.tell(f"the run is {phase}: start works after a stop or a halt", "warning")
            return
        if phase == Phase.NO_CHECKPOINT:
            self._confirm_start_over()
            return
        self.app.run_worker(self._start(), group="actions")

    def _confirm_start_over(self) -> None:
        """No verified checkpoint is left: starting over at step 0 is asked, never assumed."""
        reason = clean(
            str((self.app.model.state.value or {}).get("detail", {}).get("reason") or ""), 300
        )
        body = (
            f"{reason}\n\nStarting over trains from step 0 with fresh weights: everything the"
            " run has learnt so far is not used. Put a verified checkpoint back in the"
            " checkpoint folder instead to resume from it (then press r)."
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self.app.run_worker(self._start(from_scratch=True), group="actions")
            else:
                self.app.tell("not started: the run waits for a checkpoint or your choice")

        self.app.push_screen(
            ConfirmScreen("Start over from step 0?", body, yes_label="Start over"), answered
        )

    async def _start(self, from_scratch: bool = False) -> None:
        args = {"from_scratch": True} if from_scratch else {}
        result = await self.send("start", "start", **args)
        if result is not None:
            resume = result.get("resume_step")
            where = f"step {resume}" if resume is not None else "scratch"
            self.app.tell(f"trainer starting from {where}")

    def pin(self) -> None:
        if self.refused_read_only("pin"):
            return
        ckpt = self.app.main_screen.query_one(CheckpointsPanel).selected_checkpoint(self.app.model)
        if ckpt is None:
            self.app.tell("no checkpoint selected", "warning")
            return
        if ckpt.get("pinned"):
            self.app.run_worker(self._unpin(ckpt["step"]), group="actions")
        else:
            self.app.run_worker(self._pin("pin", ckpt["step"]), group="actions")

    async def _pin(self, cmd: str, step: int) -> None:
        result = await self.send(cmd, cmd, step=step)
        if result is not None:
            state = "pinned" if result.get("pinned") else "unpinned"
            self.app.tell(f"checkpoint at step {result.get('step')} {state}")

    async def _unpin(self, step: int) -> None:
        """Unpin, asking first when the daemon says retention would then delete it."""
        preview = await self.send("unpin", "unpin", step=step, dry_run=True)
        if preview is None:
            return
        if not preview.get("dry_run"):  # a daemon that cannot preview has unpinned already
            self.app.tell(f"checkpoint at step {preview.get('step')} unpinned")
            return
        doomed = [s for s in preview.get("would_delete") or [] if isinstance(s, int)]
        if step not in doomed:
            await self._pin("unpin", step)
            return
        name = next(
            (
                clean(c.get("name") or "", 80)
                for c in (self.app.model.checkpoints or {}).get("checkpoints") or []
                if isinstance(c, dict) and c.get("step") == step
            ),
            "",
        )
        others = [s for s in doomed if s != step]
        also = f" (and step {', '.join(f'{s:,}' for s in others)})" if others else ""
        body = Text(
            f"Retention keeps only the newest unpinned checkpoints: unpinned, "
            f"{name or 'the checkpoint'} (step {step:,}) is deleted at once{also}. "
            "This cannot be undone."
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self.app.run_worker(self._pin("unpin", step), group="actions")
            else:
                self.app.tell(f"checkpoint at step {step:,} stays pinned")

        self.app.push_screen(
            ConfirmScreen(f"Unpin step {step:,} and delete it?", body, yes_label="Unpin"),
            answered,
        )

    def pivot(self) -> None:
        if self.refused_read_only("pivot"):  # not a kind: the command
            return
        arms = (self.app.model.bandit or {}).get("arms")
        if not isinstance(arms, dict) or not arms:
            self.app.tell(
                "no bandit state yet: the trainer has not reported its data arms", "warning"
            )
            return
        self.app.push_screen(
            PivotScreen({str(k): v if isinstance(v, dict) else {} for k, v in arms.items()}),
            self._pivot_chosen,
        )

    def _pivot_chosen(self, request: PivotRequest | None) -> None:
        if request is not None:
            self.app.tell("pivoting…", timeout=3)
            self.app.run_worker(self._pivot(request), group="actions")

    async def _pivot(self, request: PivotRequest) -> None:
        # not a kind: the pivot command
        result = await self.send("pivot", "pivot", caps=request.caps, floors=request.floors)
        if result is not None:
            archive = clean(result.get("archive") or "-", 200)
            zombies = result.get("zombies")
            gone = f"; zombie arms: {', '.join(map(str, zombies))}" if zombies else ""
            self.app.tell(f"pivot done at step {result.get('step')}; archive: {archive}{gone}")
