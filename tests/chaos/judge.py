"""Judging a chaos soak: the ten invariants and the summary, from the outside.

Everything here reads what the run left behind: the daemon's journal, the watcher
process's records, the files in the run directory and the reference runs (the straight,
uninterrupted run, and for a pivot the continuation from the pinned pivot checkpoint).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tests.chaos.harness import (
    ACCEPTED_REFUSALS,
    NEW_POLICY,
    Fault,
    Soak,
    StraightRun,
    percentile,
    verify_bytes,
)

ROLLBACK_RUNGS = 2
"""Checkpoints retention may keep beyond keep_last so a spike can roll back (the soak's
run has spike handling on, as by default)."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                out.append(orjson.loads(line))
    return out


def newest_segment_losses(path: Path) -> dict[int, float]:
    """step -> loss of the newest segment that logged it (what readers of .loss.json keep)."""
    best: dict[int, tuple[int, float]] = {}
    for row in read_jsonl(path):
        step, seg, loss = row.get("step"), row.get("seg", 0), row.get("loss")
        if not isinstance(step, int):
            continue
        value = float(loss) if loss is not None else math.nan
        if step not in best or seg >= best[step][0]:
            best[step] = (seg, value)
    return {step: loss for step, (_, loss) in best.items()}


@dataclass
class Verdict:
    name: str
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


def old_starts_verdict(
    watch: list[dict[str, Any]], records: list[dict[str, Any]], *, wrapped: bool
) -> Verdict:
    """No process of an old start is alive when a new start begins: at each journal
    `spawn`/`trainer_started` the watcher read, no process carried another start's marker,
    and no sample ever found processes of two starts alive at once. With the forking
    wrapper, the daemon must also have journaled the helpers it stopped (else the check
    saw nothing worth seeing)."""
    problems = []
    checks = [w for w in watch if w["kind"] == "at_spawn"]
    for w in checks:
        if w["older"]:
            problems.append(
                f"at {w['record']} of seg {w['seg']} ({w['marker']}): alive from older"
                f" starts: {w['older'][:4]}"
            )
    overlaps = [w for w in watch if w["kind"] == "two_starts"]
    for w in overlaps[:5]:
        problems.append(f"processes of two starts alive at once at {w['t']}: {w['markers']}")
    starts = [r for r in records if r.get("kind") == "spawn" and r.get("marker")]
    if not checks and starts:
        problems.append(f"{len(starts)} spawns journaled but the watcher checked none")
    stopped = [
        p
        for r in records
        if r.get("kind") in ("leftover_processes", "leftover_trainer_stopped")
        for p in r.get("processes") or []
    ]
    if wrapped and not stopped:
        problems.append("the wrapper's helpers were never journaled as stopped")
    stats = next((w for w in watch if w["kind"] == "stats"), {})
    return Verdict(
        "8 no process of an old start alive when a new start begins",
        not problems,
        {
            "spawn_checks": len(checks),
            "spawns_journaled": len(starts),
            "starts_seen_by_watcher": stats.get("starts_seen"),
            "other_processes_seen": stats.get("other_processes_seen"),
            "leftovers_stopped": len(stopped),
            "leftovers_killed": sum(1 for p in stopped if p.get("signal") == "SIGKILL"),
            "problems": problems,
        },
    )


def two_trainers_verdict(watch: list[dict[str, Any]]) -> Verdict:
    """Never two trainers: no sample found two reference trainers of the run alive at
    once, by working directory (`two_trainers`) or by start marker (`two_run_trainers`)."""
    problems = []
    for w in (w for w in watch if w["kind"] == "two_trainers"):
        problems.append(f"two trainers in the run directory at {w['t']}: {w['pids']}")
    for w in (w for w in watch if w["kind"] == "two_run_trainers"):
        problems.append(f"two trainers of the run's starts at {w['t']}: {w['procs']}")
    stats = next((w for w in watch if w["kind"] == "stats"), {})
    return Verdict(
        "9 never two trainers",
        not problems,
        {
            "process_scans": stats.get("proc_scans"),
            "max_trainers": stats.get("max_trainers"),
            "problems": problems[:8],
        },
    )


def nothing_left_verdict(
    left: list[dict[str, Any]] | None, later: list[dict[str, Any]] | None
) -> Verdict:
    """No process with one of the run's start markers alive once the daemon has exited."""
    problems = []
    if left is None:
        problems.append("the run's processes were not looked for after the daemon exited")
    elif left:
        problems.append(f"alive after the daemon exited: {left[:6]}")
    return Verdict(
        "10 nothing of the run left after the daemon exits",
        not problems,
        {"left": left, "still_there_2s_later": later, "problems": problems},
    )


class Judge:
    """Checks the invariants after the run, from the journal, the watcher and the files."""

    def __init__(self, soak: Soak, straight: StraightRun, continuation: StraightRun | None):
        self.soak = soak
        self.straight = straight
        self.continuation = continuation
        self.records = soak.journal.read()
        self.watch = read_jsonl(soak.watch_out)
        self.verdicts: list[Verdict] = []

    # ------------------------------------------------------------------ helpers

    def after(self, kind: str, t: float, **match: Any) -> dict[str, Any] | None:
        for record in self.records:
            if (
                record.get("kind") == kind
                and record.get("t", 0) >= t
                and all(record.get(k) == v for k, v in match.items())
            ):
                return record
        return None

    def first_log(self, pattern: str, after_t: float = 0.0) -> dict[str, Any] | None:
        for row in self.watch:
            if row["kind"] == "log" and row["t"] >= after_t and re.search(pattern, row["text"]):
                return row
        return None

    # ------------------------------------------------------------------ reactions

    def reactions(self) -> None:
        for fault in list(self.soak.faults):
            if fault.kind.startswith("trainer_kill"):
                self.react_trainer_kill(fault)
            elif fault.kind == "daemon_kill":
                self.react_daemon_kill(fault)
            elif fault.kind == "corrupt_committed":
                self.react_corrupt_committed(fault)
            elif fault.kind == "plant_future":
                self.react_plant_future(fault)
            elif fault.kind.startswith("plant_"):
                self.react_plant(fault)
            elif fault.kind == "enospc":
                self.react_enospc(fault)
            elif fault.kind == "broken_script":
                self.react_broken_script(fault)
        self.react_builtin()

    def react_trainer_kill(self, fault: Fault) -> None:
        crash = self.after("crash", fault.t - 0.01, pid=fault.detail["pid"])
        if crash is None:
            self.react_kill_of_an_ending_trainer(fault)
            return
        spawn = self.after("spawn", crash["t"])
        fault.reaction = {"crash": crash["cause"], "crash_after_s": round(crash["t"] - fault.t, 4)}
        if spawn is None:
            fault.problem = "no spawn after the crash"
            return
        fault.reaction["spawn_resume"] = (spawn.get("resume") or {}).get("step")
        fault.latency_s = spawn["t"] - fault.t
        fault.survived = "SIGKILL" in crash["cause"]
        if not fault.survived:
            fault.problem = f"crash cause {crash['cause']!r} does not name SIGKILL"

    def react_broken_script(self, fault: Fault) -> None:
        """Starts that died on the broken script before reading a checkpoint: none is
        quarantined for them, none starts from scratch, and the run resumes once repaired."""
        repaired = fault.detail.get("repaired_t", math.inf)
        failed = [
            r for r in self.records
            if r.get("kind") == "crash" and fault.t <= r.get("t", 0) <= repaired
            and "SyntaxError" in str(r.get("last_line"))
        ]  # fmt: skip
        blamed = [
            r for r in self.records
            if r.get("kind") in ("quarantine", "fallback") and fault.t <= r.get("t", 0)
            and "died" in str(r.get("reason"))
        ]  # fmt: skip
        fresh = [
            r for r in self.records
            if r.get("kind") == "spawn" and r.get("t", 0) >= fault.t and r.get("resume") is None
        ]  # fmt: skip
        resumed = self.after("spawn", repaired)
        fault.reaction = {
            "failed_starts": len(failed),
            "halted": bool(fault.detail.get("halted")),
            "spawn_resume_after_repair": ((resumed or {}).get("resume") or {}).get("step"),
        }
        if not failed:
            fault.problem = "no start failed on the broken script with its SyntaxError"
        elif blamed:
            fault.problem = f"a checkpoint was blamed for the script: {blamed[0].get('reason')}"
        elif fresh:
            fault.problem = "a start after the break went from scratch"
        elif resumed is None or resumed.get("resume") is None:
            fault.problem = "the repaired run did not resume from a checkpoint"
        else:
            fault.latency_s = resumed["t"] - fault.t
            fault.survived = True

    def react_kill_of_an_ending_trainer(self, fault: Fault) -> None:
        """Our SIGKILL met a trainer the daemon was already ending (a divergence or a spike
        it had just killed it for, a stop): its exit is journaled as what the daemon did,
        not as a crash. Accepted when the daemon's own signal to that trainer came first."""
        pid = fault.detail["pid"]
        ended = next(
            (
                r
                for r in self.records
                if r.get("kind") in ("trainer_killed", "trainer_stopped")
                and r.get("pid") == pid
                and r.get("t", 0) >= fault.t - 5.0
            ),
            None,
        )
        signalled = [
            r for r in self.records
            if r.get("kind") == "signal" and r.get("pid") == pid and r.get("t", 0) <= fault.t
        ]  # fmt: skip
        if ended is None or not signalled:
            fault.problem = "no crash record for the killed trainer"
            return
        spawn = self.after("spawn", ended["t"])
        fault.reaction = {"already_ending": ended["kind"], "cause": ended.get("cause")}
        if spawn is None and ended.get("cause") != "pivot":
            fault.problem = f"no spawn after the {ended['kind']} of the killed trainer"
            return
        fault.survived = True

    def react_daemon_kill(self, fault: Fault) -> None:
        relaunch = fault.detail.get("relaunch_t", fault.t)
        start = self.after("daemon_start", relaunch)
        spawn = self.after("spawn", relaunch)
        if start is None or spawn is None:
            fault.problem = "no daemon_start/spawn after the restart"
            return
        fault.reaction = {
            "previous_exit_clean": start.get("previous_exit_clean"),
            "leftover_stopped": self.after("leftover_trainer_stopped", relaunch) is not None,
            "boot_recovery": (self.after("boot_recovery", relaunch) or {}).get("steps_lost"),
            "spawn_resume": (spawn.get("resume") or {}).get("step"),
        }
        fault.latency_s = spawn["t"] - relaunch
        fault.survived = start.get("previous_exit_clean") is False
        if not fault.survived:
            fault.problem = "the restarted daemon did not see an unclean exit"

    def react_plant(self, fault: Fault) -> None:
        name = fault.detail["name"]
        record = self.after("quarantine", fault.t, name=name)
        if record is None:
            fault.problem = f"planted {name} was never quarantined"
            return
        # From the start of the daemon that found it (a daemon killed straight after its
        # start may already have quarantined it).
        started = [
            r["t"] for r in self.records if r["kind"] == "daemon_start" and r["t"] <= record["t"]
        ]
        relaunch = started[-1] if started else fault.t
        fault.reaction = {"quarantine": record["reason"]}
        fault.latency_s = record["t"] - relaunch
        in_quarantine = any(
            q == name or q.startswith(name + ".") for q in self.quarantine_listing()
        )
        fault.survived = in_quarantine
        if not in_quarantine:
            fault.problem = f"{name} is not in quarantine/"
        spawn = self.after("spawn", record["t"])
        if spawn is not None and (spawn.get("resume") or {}).get("name") == name:
            fault.problem = f"resumed from the planted {name}"
            fault.survived = False

    def resumed_from_after(self, name: str, t: float) -> dict[str, Any] | None:
        """The first spawn after `t` that resumes from `name` before a new commit of that
        name (a replay may write the same step again, and resuming from that is fine)."""
        for record in self.records:
            if record.get("t", 0) < t:
                continue
            if record["kind"] == "checkpoint" and record.get("name") == name:
                return None
            if record["kind"] == "spawn" and (record.get("resume") or {}).get("name") == name:
                return record
        return None

    def react_corrupt_committed(self, fault: Fault) -> None:
        name = fault.detail["name"]
        record = self.after("quarantine", fault.t - 0.01, name=name)
        if record is None:
            fault.problem = f"{name}, rewritten in place after its commit, was never quarantined"
            return
        changed = self.after("checkpoint_changed", fault.t - 0.01, name=name)
        fault.reaction = {
            "quarantine": record["reason"],
            "checkpoint_changed": (changed or {}).get("reason"),
        }
        fault.latency_s = record["t"] - fault.t
        fault.survived = True
        if not record["reason"].startswith("content changed since commit"):
            fault.problem = f"{name} quarantined for another reason: {record['reason']!r}"
        elif self.resumed_from_after(name, fault.t) is not None:
            fault.problem = f"resumed from {name} after it was rewritten"
        elif not self.in_quarantine(name):
            fault.problem = f"{name} is not in quarantine/"
        fault.survived = fault.problem is None

    def react_plant_future(self, fault: Fault) -> None:
        name = fault.detail["name"]
        record = self.after("quarantine", fault.t - 0.01, name=name)
        if record is None:
            fault.problem = f"planted far-future {name} was never quarantined"
            return
        fault.reaction = {"quarantine": record["reason"]}
        started = [
            r["t"] for r in self.records if r["kind"] == "daemon_start" and r["t"] <= record["t"]
        ]
        since = fault.t if fault.detail["during"] == "running" else (started or [fault.t])[-1]
        fault.latency_s = record["t"] - since
        counted = self.after("checkpoint", fault.t - 0.01, name=name)
        if "max_step_jump" not in record["reason"]:
            fault.problem = f"{name} quarantined for another reason: {record['reason']!r}"
        elif counted is not None:
            fault.problem = f"{name} was counted as a commit: {counted}"
        elif self.resumed_from_after(name, fault.t) is not None:
            fault.problem = f"resumed from the planted {name}"
        elif not self.in_quarantine(name):
            fault.problem = f"{name} is not in quarantine/"
        fault.survived = fault.problem is None

    def in_quarantine(self, name: str) -> bool:
        return any(q == name or q.startswith(name + ".") for q in self.quarantine_listing())

    def react_enospc(self, fault: Fault) -> None:
        crash = self.after("crash", fault.t)
        if crash is None:
            fault.problem = fault.problem or "no crash after the disk filled"
            return
        cleared = fault.detail.get("cleared_t", crash["t"])
        commit = self.after("checkpoint", cleared)
        fault.reaction = {
            "crash": crash["cause"],
            "trainer_said": (self.first_log("No space left|OSError", fault.t) or {}).get("text"),
            "disk_low_event": self.after("disk_low", fault.t - 10) is not None,
            "checkpoint_after_clear": (commit or {}).get("step"),
        }
        fault.latency_s = crash["t"] - fault.t
        fault.survived = commit is not None

    def react_builtin(self) -> None:
        soak = self.soak
        nan_line = self.first_log(rf"^step: {soak.nan_step}, loss: (?:-?nan|-?inf)")
        divergence = self.after("divergence", 0, step=soak.nan_step)
        if nan_line is not None or divergence is not None:
            fault = Fault("nan", (nan_line or divergence or {}).get("t", 0), soak.nan_step)
            loss_rows = [
                r
                for r in read_jsonl(soak.run_dir / ".loss.json")
                if r.get("step") == soak.nan_step and r.get("loss") in ("nan", "inf", "-inf")
            ]
            if loss_rows:
                fault.t = min(fault.t, loss_rows[0]["t"])
            kill = None
            if divergence is not None and divergence.get("caught_up"):
                # Logged while no daemon ran: the next daemon stopped that trainer as a
                # leftover and read the line at its start; no kill of its own to make.
                kill = divergence
            elif divergence is not None:
                kill = next(
                    (
                        r
                        for r in self.records
                        if r["kind"] == "signal"
                        and r["t"] >= divergence["t"] - 1
                        and r.get("signal") == "SIGKILL"
                        and "divergence" in r.get("reason", "")
                    ),
                    None,
                )
            if divergence is None or kill is None:
                fault.problem = "no divergence record with a SIGKILL"
            else:
                # The start that rolls back from this divergence says so in its spawn record
                # (unless the daemon was killed before it: then the next daemon's first start).
                spawn = self.after("spawn", kill["t"], rollback_from=soak.nan_step) or self.after(
                    "spawn", kill["t"]
                )
                resumed = ((spawn or {}).get("resume") or {}).get("step")
                fault.reaction = {
                    "quarantined": divergence.get("quarantined"),
                    "rollback_to": divergence.get("rollback_to"),
                    "awaiting_verification": divergence.get("awaiting_verification"),
                    "spawn_resume": resumed,
                }
                fault.latency_s = max(0.0, kill["t"] - fault.t)
                # A rollback target the divergence names is the one resumed from (it names
                # none while a checkpoint before the NaN is still being verified).
                fault.survived = (
                    spawn is not None
                    and (resumed is None or resumed < soak.nan_step)
                    and divergence.get("rollback_to", resumed) == resumed
                )
            soak.faults.append(fault)
        hang_line = self.first_log(rf"injected hang at step {soak.hang_step}\b")
        if hang_line is not None:
            fault = Fault("hang", hang_line["t"], soak.hang_step)
            stall = self.after("stall", hang_line["t"])
            if stall is None:
                fault.problem = "no stall record"
            else:
                term = self.after("signal", stall["t"], signal="SIGTERM")
                kill = self.after("signal", stall["t"], signal="SIGKILL")
                crash = self.after("crash", stall["t"])
                spawn = self.after("spawn", stall["t"])
                fault.reaction = {
                    "silent_s": stall.get("silent_s"),
                    "sigterm": term is not None,
                    "sigkill_after_s": round(kill["t"] - stall["t"], 3) if kill else None,
                    "crash": (crash or {}).get("cause"),
                }
                fault.latency_s = stall["t"] - hang_line["t"]
                fault.survived = spawn is not None and crash is not None
                if not fault.survived:
                    fault.problem = "no crash/spawn after the stall"
            soak.faults.append(fault)

    def quarantine_listing(self) -> list[str]:
        with contextlib.suppress(OSError):
            return os.listdir(self.soak.ckpt / "quarantine")
        return []

    # ------------------------------------------------------------------ invariants

    def check_final(self) -> Verdict:
        soak = self.soak
        steps = soak.plan.steps
        final = soak.ckpt / f"step_{steps:06d}.bin"
        detail: dict[str, Any] = {
            "state": soak.final_status["state"],
            "step": soak.final_status.get("step"),
        }
        ok = soak.final_status["state"] == "finished" and final.exists()
        if soak.pivot_result is None:
            same = ok and final.read_bytes() == self.straight.final_bytes()
            detail["bit_exact_vs_straight_run"] = same
            return Verdict("1 final state", ok and same, detail)
        p = soak.pivot_result["step"]
        state = orjson.loads((soak.run_dir / ".state.json").read_bytes())
        arms = state.get("policy", state).get("arms", {})
        detail["pivot_step"] = p
        detail["policy_in_state_json"] = (
            arms.get("docs", {}).get("cap") == NEW_POLICY["caps"]["docs"]
            and arms.get("tests", {}).get("floor") == NEW_POLICY["floors"]["tests"]
        )
        archive = soak.run_dir / soak.pivot_result["archive"]
        detail["archive"] = sorted(x.name for x in archive.iterdir()) if archive.is_dir() else None
        detail["archive_complete"] = bool(detail["archive"]) and {
            ".state.json",
            "policy.json",
            "pivot.json",
        } <= set(detail["archive"])
        pinned = [c["step"] for c in soak.final_checkpoints["checkpoints"] if c["pinned"]]
        detail["pinned"] = pinned
        detail["pivot_checkpoint_pinned_on_disk"] = (
            p in pinned and (soak.ckpt / f"step_{p:06d}.bin").exists()
        )
        assert self.continuation is not None
        detail["bit_exact_vs_continuation_from_pivot"] = ok and (
            final.read_bytes() == self.continuation.final_bytes()
        )
        good = all(
            detail[k]
            for k in (
                "policy_in_state_json",
                "archive_complete",
                "pivot_checkpoint_pinned_on_disk",
                "bit_exact_vs_continuation_from_pivot",
            )
        )
        return Verdict("1 final state", ok and good, detail)

    def pinned_at(self, t: float) -> int:
        pin = next(
            (r for r in self.records if r["kind"] == "pivot_stage" and r.get("stage") == "pin"),
            None,
        )
        return 1 if pin is not None and t >= pin["t"] else 0

    def check_on_disk(self) -> Verdict:
        keep = self.soak.plan.keep_last
        detail: dict[str, Any] = {}
        problems = []
        first = next((w for w in self.watch if w["kind"] == "first_commit"), None)
        detail["watcher_first_commit"] = first is not None
        empties = [w for w in self.watch if w["kind"] == "no_verified"]
        if empties:
            problems.append(f"{len(empties)} moment(s) with no verified checkpoint: {empties[:3]}")
        stats = next((w for w in self.watch if w["kind"] == "stats"), {})
        detail["watcher_samples"] = stats.get("samples")
        detail["max_committed"] = stats.get("max_committed")
        detail["min_verified_after_first_commit"] = stats.get("min_verified_after_first_commit")
        exempt = 0
        for w in (w for w in self.watch if w["kind"] == "over"):
            t = w["t"]
            if any(a <= t <= b for a, b in self.soak.downtimes):
                exempt += 1
                continue
            # One commit before retention acts; the two rollback rungs retention may keep
            # while spike handling is on (core.retention.rollback_rungs).
            allowed = keep + 1 + ROLLBACK_RUNGS + self.pinned_at(t)
            # A planted far-future file is there until the daemon moves it: not a commit.
            steps = sorted(int(n[5:-4]) for n in w["names"] if n not in self.planted_names())
            if len(steps) > allowed:
                problems.append(
                    f"{len(steps)} committed files > {allowed} allowed at {t}: {w['names']}"
                )
        detail["samples_over_the_bound_while_daemon_down"] = exempt
        if not first:
            problems.append("the watcher never saw a verified checkpoint")
        detail["problems"] = problems
        return Verdict("2 always a verified checkpoint, bounded count", not problems, detail)

    def check_deletions(self) -> Verdict:
        problems = []
        gone = [w for w in self.watch if w["kind"] == "gone"]
        deleted = [w for w in gone if not w["quarantined"]]
        for w in deleted:
            if not w["verified"]:
                problems.append(f"unverified {w['name']} deleted instead of quarantined")
            elif not w["newer_verified"]:
                problems.append(f"{w['name']} deleted with no newer verified checkpoint")
        quarantine = self.quarantine_listing()
        for r in (r for r in self.records if r["kind"] == "quarantine"):
            name = r.get("name", "")
            if not any(q == name or q.startswith(name + ".") for q in quarantine):
                problems.append(f"journal quarantined {name} but it is not in quarantine/")
        leftovers = [p.name for p in self.soak.committed() if not verify_bytes(p)]
        if leftovers:
            problems.append(f"unverified files left among committed ones: {leftovers}")
        detail = {
            "deleted": len(deleted),
            "deleted_with_fewer_than_keep_last_newer": sum(
                1 for w in deleted if len(w["newer_verified"]) < self.soak.plan.keep_last
            ),
            "quarantined_moves": len(gone) - len(deleted),
            "quarantine_dir": sorted(quarantine),
            "problems": problems,
        }
        return Verdict(
            "3 deletions only behind a newer verified one; bad ones quarantined",
            not problems,
            detail,
        )

    def check_losses(self) -> Verdict:
        soak = self.soak
        losses = newest_segment_losses(soak.run_dir / ".loss.json")
        steps = soak.plan.steps
        missing = [s for s in range(1, steps + 1) if s not in losses]
        expected = self.straight.losses()
        pivot = soak.pivot_result["step"] if soak.pivot_result else None
        if pivot is not None:
            assert self.continuation is not None
            after = self.continuation.losses()
            expected = {
                s: (v if s <= pivot else after.get(s, math.nan)) for s, v in expected.items()
            }
        differ = [s for s in range(1, steps + 1) if s in losses and losses[s] != expected.get(s)]
        detail = {
            "steps_present": len(losses),
            "missing": missing[:20],
            "differing": [(s, losses[s], expected.get(s)) for s in differ[:10]],
            "compared_against": "straight run"
            if pivot is None
            else f"straight run to step {pivot}, continuation from the pivot checkpoint after",
        }
        return Verdict(
            "4 .loss.json complete and equal to the reference", not missing and not differ, detail
        )

    def check_reactions(self) -> Verdict:
        problems = [f"{f.kind}@{f.step}: {f.problem}" for f in self.soak.faults if f.problem]
        for c in self.soak.commands:
            if c.outcome != "ok" and c.outcome not in ACCEPTED_REFUSALS:
                problems.append(f"command {c.cmd} from {c.client}: {c.outcome} {c.result}")
        if self.soak.plan.pivot and self.soak.pivot_result is None:
            problems.append("the pivot never succeeded")
        for halt in self.soak.halts:
            problems.append(f"the run halted without a cause the test injected: {halt}")
        for r in self.records:
            if r.get("kind") == "crash" and "SIGUSR1" in str(r.get("cause")):
                problems.append(f"a save killed the trainer: {r}")
        return Verdict(
            "5 every fault journaled with the daemon's reaction",
            not problems,
            {"problems": problems, "unexplained_exits": self.unexplained_exits()},
        )

    def unexplained_exits(self) -> list[dict[str, Any]]:
        """Trainer crashes by an exit status that no fault explains (only a full disk and a
        broken script make the trainer exit 1). Reported, not judged: a start resumed from a step older than a
        checkpoint its predecessor's orphan committed during containment replays that step
        and rewrites the committed name, which the daemon quarantines mid-save."""
        disks = [
            (f.t - 1.0, f.detail.get("cleared_t", f.detail.get("repaired_t", math.inf)) + 5.0)
            for f in self.soak.faults
            if f.kind in ("enospc", "broken_script")
        ]
        return [
            {k: r.get(k) for k in ("t", "pid", "cause", "last_step")}
            for r in self.records
            if r.get("kind") == "crash"
            and str(r.get("cause", "")).startswith("exit status")
            and not any(a <= r["t"] <= b for a, b in disks)
        ]

    def check_daemon_and_trainers(self) -> Verdict:
        problems = []
        for exit_ in self.soak.daemon_exits:
            caused = exit_["cause"].startswith("test") or exit_["cause"] == "cleanup"
            if caused and exit_["code"] == -signal.SIGKILL:
                continue
            if exit_["cause"] == "shutdown" and exit_["code"] == 0:
                continue
            problems.append(f"daemon pid {exit_['pid']} exited {exit_['code']} ({exit_['cause']})")
        stderr = ""
        with contextlib.suppress(OSError):
            stderr = self.soak.stderr_path.read_text(errors="replace")
        if "Traceback" in stderr:
            problems.append(
                "a traceback in the daemon's stderr: " + stderr[stderr.index("Traceback") :][:800]
            )
        doubles = [w for w in self.watch if w["kind"] == "two_trainers"]
        if doubles:
            problems.append(f"two trainers alive at once: {doubles[:3]}")
        stats = next((w for w in self.watch if w["kind"] == "stats"), {})
        return Verdict(
            "6 the daemon never crashed on its own; never two trainers",
            not problems,
            {
                "daemon_exits": self.soak.daemon_exits,
                "process_scans": stats.get("proc_scans"),
                "problems": problems,
            },
        )

    def planted_names(self) -> set[str]:
        return {f.detail["name"] for f in self.soak.faults if f.kind == "plant_future"}

    def bad_windows(self) -> list[tuple[str, int, float, float]]:
        """(name, step, from, until) for each checkpoint the test made bad while the
        daemon ran or before it started: from the fault to the daemon's quarantine of it."""
        windows = []
        for f in self.soak.faults:
            if f.kind not in ("corrupt_committed", "plant_future") and not f.kind.startswith(
                "plant_"
            ):
                continue
            name = f.detail["name"]
            quarantine = self.after("quarantine", f.t - 0.01, name=name)
            until = quarantine["t"] if quarantine is not None else math.inf
            windows.append((name, int(name[5:-4]), f.t, until))
        return windows

    def check_bad_checkpoints(self) -> Verdict:
        """Quarantined checkpoints are never resumed from; a checkpoint rewritten in place
        is quarantined as changed, a far-future one as implausible; neither is ever
        counted as a commit, deleted, or counted by retention as a newer good one."""
        problems = []
        for r in (r for r in self.records if r["kind"] == "quarantine"):
            spawn = self.resumed_from_after(r.get("name", ""), r["t"])
            if spawn is not None:
                problems.append(
                    f"spawn at {spawn['t']} resumed from {r.get('name')}, quarantined at"
                    f" {r['t']} ({r.get('reason')})"
                )
        expected = {
            "corrupt_committed": "content changed since commit",
            "plant_double_weights": "content changed since commit",
            "plant_future": "max_step_jump",
        }
        checked: dict[str, int] = defaultdict(int)
        for f in self.soak.faults:
            if f.kind not in expected:
                continue
            name = f.detail["name"]
            checked[f.kind] += 1
            quarantine = self.after("quarantine", f.t - 0.01, name=name)
            if quarantine is None:
                problems.append(f"{f.kind} {name}: never quarantined")
                continue
            if expected[f.kind] not in quarantine["reason"]:
                problems.append(
                    f"{f.kind} {name}: quarantined as {quarantine['reason']!r}, expected a"
                    f" reason naming {expected[f.kind]!r}"
                )
            spawn = self.resumed_from_after(name, f.t)
            if spawn is not None:
                problems.append(f"{f.kind} {name}: resumed from at {spawn['t']}")
            if f.kind == "plant_future" and self.after("checkpoint", f.t - 0.01, name=name):
                problems.append(f"{f.kind} {name}: counted as a commit")
            deleted = self.after("delete", f.t - 0.01, name=name)
            if deleted is not None and deleted["t"] <= quarantine["t"]:
                problems.append(f"{f.kind} {name}: deleted instead of quarantined")
        plan = self.soak.plan
        for kind, planned in (
            ("corrupt_committed", plan.corruptions),
            ("plant_future", plan.future_plants),
        ):
            if planned and not checked[kind]:
                problems.append(f"no {kind} fault was injected (see the notes for why)")
        windows = self.bad_windows()
        for w in (w for w in self.watch if w["kind"] == "gone" and not w["quarantined"]):
            bad = {step for _, step, a, b in windows if a <= w["t"] <= b}
            newer_good = [s for s in w["newer_verified"] if s not in bad]
            if bad & set(w["newer_verified"]) and not newer_good:
                problems.append(
                    f"{w['name']} deleted with only bad checkpoints newer: {w['newer_verified']}"
                )
        return Verdict(
            "7 bad checkpoints quarantined, never resumed from, never counted",
            not problems,
            {
                "checked": dict(checked),
                "quarantine_records": sum(1 for r in self.records if r["kind"] == "quarantine"),
                "deleted_while_a_bad_one_was_newer": sum(
                    1
                    for w in self.watch
                    if w["kind"] == "gone"
                    and not w["quarantined"]
                    and any(a <= w["t"] <= b and s in w["newer_verified"] for _, s, a, b in windows)
                ),
                "problems": problems,
            },
        )

    def judge(self) -> list[Verdict]:
        self.reactions()
        self.verdicts = [
            self.check_final(),
            self.check_on_disk(),
            self.check_deletions(),
            self.check_losses(),
            self.check_reactions(),
            self.check_daemon_and_trainers(),
            self.check_bad_checkpoints(),
            old_starts_verdict(
                self.watch, self.records, wrapped=self.soak.plan.wrapper is not None
            ),
            two_trainers_verdict(self.watch),
            nothing_left_verdict(self.soak.left_after_exit, self.soak.left_later),
        ]
        return self.verdicts

    # ------------------------------------------------------------------ summary

    def resume_audit(self) -> dict[str, Any]:
        """The daemon's own resume audit: verified restarts, and each drift with what
        explains it (a replay over a diverged step, or over a pivot's policy change)."""
        pivot = (self.soak.pivot_result or {}).get("step")
        drifts = []
        for r in self.records:
            if r["kind"] != "resume_drift":
                continue
            why = None
            if r.get("old_loss") in ("nan", "inf", "-inf") or r.get("step") == self.soak.nan_step:
                why = "replay of the diverged step"
            elif pivot is not None and r.get("checkpoint_step") == pivot:
                why = "replay after the pivot (new policy, new data)"
            drifts.append(
                {k: r.get(k) for k in ("step", "checkpoint_step", "old_loss", "new_loss")}
                | {"explained_by": why}
            )
        return {
            "verified": sum(1 for r in self.records if r["kind"] == "resume_verified"),
            "drift": drifts,
        }

    def summary(self, variant: str) -> dict[str, Any]:
        soak = self.soak
        by_kind: dict[str, dict[str, Any]] = defaultdict(lambda: {"injected": 0, "survived": 0})
        latencies: dict[str, list[float]] = defaultdict(list)
        for f in soak.faults:
            entry = by_kind[f.kind]
            entry["injected"] += 1
            entry["survived"] += int(f.survived)
            if f.latency_s is not None:
                latencies[f.kind].append(f.latency_s * 1000.0)
        for kind, values in latencies.items():
            by_kind[kind]["latency_ms"] = {
                "p50": round(percentile(values, 50) or 0, 1),
                "p99": round(percentile(values, 99) or 0, 1),
                "n": len(values),
            }
        by_kind_meaning = {
            "trainer_kill": "SIGKILL -> next spawn",
            "trainer_kill_in_write": "SIGKILL during a checkpoint write -> next spawn",
            "daemon_kill": "daemon relaunch -> trainer spawned",
            "plant_truncate": "daemon start -> quarantine record",
            "plant_flip_step": "daemon start -> quarantine record",
            "plant_flip_n_params": "daemon start -> quarantine record",
            "plant_nan_weight": "daemon start -> quarantine record",
            "plant_double_weights": "daemon start -> quarantine record (digest)",
            "plant_future": "rename into place (or daemon start) -> quarantine record",
            "corrupt_committed": "rewrite in place -> quarantine record (digest)",
            "nan": "NaN step line -> SIGKILL",
            "hang": "injected-hang line -> stall record (about stall_timeout_s)",
            "enospc": "disk full -> crash record (includes waiting for the next save)",
        }
        commands: dict[str, dict[str, Any]] = defaultdict(lambda: defaultdict(int))
        command_ms: dict[str, list[float]] = defaultdict(list)
        for c in soak.commands:
            commands[c.cmd][
                c.outcome if not c.outcome.startswith("transport") else "transport"
            ] += 1
            if c.outcome == "ok":
                command_ms[c.cmd].append((c.t1 - c.t0) * 1000.0)
        for cmd, values in command_ms.items():
            commands[cmd]["latency_ms"] = {  # type: ignore[assignment]
                "p50": round(percentile(values, 50) or 0, 1),
                "p99": round(percentile(values, 99) or 0, 1),
            }
        return {
            "resume_audit": self.resume_audit(),
            "variant": variant,
            "plan": asdict(soak.plan),
            "nan_step": soak.nan_step,
            "hang_step": soak.hang_step,
            "namespace": soak.holder is not None,
            "namespace_reason": soak.namespace_reason or None,
            "wall_s": round(soak.finished_t - soak.started_t, 1),
            "faults": {k: dict(v) for k, v in sorted(by_kind.items())},
            "latency_meaning": by_kind_meaning,
            "faults_total": len(soak.faults),
            "survived_total": sum(int(f.survived) for f in soak.faults),
            "commands": {k: dict(v) for k, v in sorted(commands.items())},
            "pivot": soak.pivot_result,
            "invariants": {v.name: {"ok": v.ok, **v.detail} for v in self.verdicts},
            "fault_log": [
                {
                    "kind": f.kind,
                    "step": f.step,
                    "survived": f.survived,
                    "latency_ms": None if f.latency_s is None else round(f.latency_s * 1000.0, 1),
                    "reaction": f.reaction,
                    "detail": f.detail,
                    "problem": f.problem,
                }
                for f in soak.faults
            ],
            "skipped": soak.skipped,
            "notes": soak.notes,
        }


def write_summary(summary: dict[str, Any], tmp_path: Path) -> Path:
    data = orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    path = tmp_path / "chaos-summary.json"
    path.write_bytes(data)
    extra = os.environ.get("TRAINWARDEN_CHAOS_REPORT")
    if extra:
        Path(extra).parent.mkdir(parents=True, exist_ok=True)
        Path(extra).write_bytes(data)
    return path


def describe(summary: dict[str, Any]) -> str:
    lines = [
        f"chaos soak ({summary['variant']}): {summary['faults_total']} faults, "
        f"{summary['survived_total']} survived, {summary['wall_s']} s"
    ]
    for kind, entry in summary["faults"].items():
        lat = entry.get("latency_ms") or {}
        lines.append(
            f"  {kind:<24} {entry['injected']:>3} injected {entry['survived']:>3} survived"
            f"  p50 {lat.get('p50')} ms  p99 {lat.get('p99')} ms"
        )
    for cmd, entry in summary["commands"].items():
        lines.append(
            f"  command {cmd:<16} {dict((k, v) for k, v in entry.items() if k != 'latency_ms')}"
            f"  {entry.get('latency_ms', '')}"
        )
    for name, verdict in summary["invariants"].items():
        lines.append(f"  [{'ok' if verdict['ok'] else 'VIOLATED'}] {name}")
        if not verdict["ok"]:
            lines.append(f"      {verdict}")
    for note in summary["skipped"] + summary["notes"]:
        lines.append(f"  note: {note}")
    return "\n".join(lines)
