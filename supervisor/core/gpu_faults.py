"""GPU faults by class: which XIDs a restart can survive, which need a reset or a reboot.

The classes follow the "Resolution Bucket (Immediate Action)" column of NVIDIA's Xid
catalogue (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and its
page-retirement / row-remapping notes
(https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html):

- RESTART_APP (13 graphics engine exception, 31 MMU fault, 32 corrupted push buffer,
  43 GPU stopped processing, 45 preemptive cleanup, 94 contained ECC error): the
  application's own fault; the trainer dies and the normal crash path restarts it.
- RESET_GPU (46, 62, 74, 95, 109, 119, 120 and kin): the GPU is unusable until reset, so
  a restart would loop into a broken GPU: stop, wait for the GPU to be free, halt in
  `gpu_fault` (or reset it when `[gpu] reset = true`).
- 79, GPU has fallen off the bus: only a reboot brings it back.
- 48 (double-bit ECC), 63 and 64 (page retirement / row remapping recorded or failed):
  memory errors; one restart is allowed, a second within the run halts.

The driver's own recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), where it gives
one, can only make the class more severe.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from trainwarden.supervisor.core import pivot
from trainwarden.supervisor.core.actions import Action, AwaitGpuIdle, Record, ResetGpu
from trainwarden.supervisor.core.events import GpuFault, GpuIdle, GpuLost, GpuResetDone
from trainwarden.supervisor.core.phases import HALTED, Phase
from trainwarden.supervisor.core.state import GpuFaultInfo, Rules, State
from trainwarden.supervisor.core.transitions import (
    fail_waiters,
    finish_stop,
    spawn,
    stop_trainer,
)

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import GpuFaultFacts, ThrottleFacts


class XidClass(StrEnum):
    APPLICATION = "application"
    MEMORY = "memory"
    RESET = "reset"
    REBOOT = "reboot"
    LOST = "lost"
    """NVML stopped answering for a GPU that answered before."""
    UNKNOWN = "unknown"


APPLICATION_XIDS = frozenset({13, 31, 32, 43, 45, 68, 69, 94})
MEMORY_XIDS = frozenset({48, 63, 64})
RESET_XIDS = frozenset({46, 54, 56, 57, 61, 62, 74, 92, 95, 109, 110, 119, 120, 136, 140, 143})
REBOOT_XIDS = frozenset({79})

XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    46: "GPU stopped processing",
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""Short descriptions for the journal, from the catalogue's descriptions."""

_RESET_ACTIONS = frozenset({"gpu_reset", "drain_and_reset", "bus_reset"})
_REBOOT_ACTIONS = frozenset({"node_reboot", "system_reboot"})
_SEVERITY = [
    XidClass.UNKNOWN,
    XidClass.APPLICATION,
    XidClass.MEMORY,
    XidClass.RESET,
    XidClass.REBOOT,
    XidClass.LOST,
]


def classify(xid: int, recovery: str | None = None) -> XidClass:
    """The class of an XID, made more severe (never less) by the driver's recovery action."""
    if xid in REBOOT_XIDS:
        cls = XidClass.REBOOT
    elif xid in MEMORY_XIDS:
        cls = XidClass.MEMORY
    elif xid in RESET_XIDS:
        cls = XidClass.RESET
    elif xid in APPLICATION_XIDS:
        cls = XidClass.APPLICATION
    else:
        cls = XidClass.UNKNOWN
    if recovery in _REBOOT_ACTIONS:
        return max(cls, XidClass.REBOOT, key=_SEVERITY.index)
    if recovery in _RESET_ACTIONS:
        return max(cls, XidClass.RESET, key=_SEVERITY.index)
    return cls


def instruction(fault: GpuFaultInfo) -> str:
    """The halt reason: what broke and what the operator must do before `start`."""
    gpu, xid = fault.gpu, fault.xid
    if fault.cls == XidClass.LOST:
        return (
            f"GPU {gpu} stopped answering NVML ({fault.message}): check `nvidia-smi`,"
            f" reset the GPU (`sudo nvidia-smi -r -i {gpu}`) or reboot, then `trainwarden start`"
        )
    if fault.cls == XidClass.REBOOT:
        return (
            f"GPU {gpu}: Xid {xid}, the GPU has fallen off the bus: reboot the machine,"
            " then `trainwarden start`"
        )
    return (
        f"GPU {gpu}: Xid {xid} needs a GPU reset: stop every process on it, run"
        f" `sudo nvidia-smi -r -i {gpu}`, then `trainwarden start`"
    )


def on_fault(state: State, ev: GpuFault, rules: Rules, actions: list[Action]) -> State:
    cls = classify(ev.xid, ev.recovery)
    fields: GpuFaultFacts = {
        "gpu": ev.gpu,
        "xid": ev.xid,
        "class": str(cls),
        "recovery": ev.recovery,
        "message": ev.message or XID_NAMES.get(ev.xid, f"Xid {ev.xid}"),
    }
    if not _ours(ev.gpu, rules):
        actions.append(
            Record({"kind": "gpu_fault", **fields, "action": "none: not a GPU of this run"})
        )
        return state
    if state.phase in HALTED:
        actions.append(Record({"kind": "gpu_fault", **fields, "action": "none: already halted"}))
        return state
    handled = state.gpu_fault
    if handled is not None and _SEVERITY.index(cls) <= _SEVERITY.index(XidClass(handled.cls)):
        actions.append(
            Record({"kind": "gpu_fault", **fields, "action": "none: already handling a GPU fault"})
        )
        return state
    if cls in (XidClass.APPLICATION, XidClass.UNKNOWN):
        # The trainer dies of it (or not); its crash, if any, is the usual restart.
        actions.append(Record({"kind": "gpu_fault", **fields, "action": "crash_path"}))
        return replace(state, gpu_xid=ev.xid)
    if cls == XidClass.MEMORY and state.memory_faults == 0:
        actions.append(Record({"kind": "gpu_fault", **fields, "action": "restart_allowed_once"}))
        return replace(state, gpu_xid=ev.xid, memory_faults=1)
    if cls == XidClass.MEMORY:
        # A second memory error in the run: the memory is failing, a reset retires the rows.
        cls = XidClass.RESET
        fields["message"] += " (the second memory error in this run)"
    fault = GpuFaultInfo(ev.gpu, ev.xid, cls, fields["message"])
    reset = rules.gpu_reset and cls == XidClass.RESET
    actions.append(
        Record({"kind": "gpu_fault", **fields, "action": "stop_and_reset" if reset else "halt"})
    )
    return _stop_for(state, fault, ev.t, rules, actions)


def on_lost(state: State, ev: GpuLost, rules: Rules, actions: list[Action]) -> State:
    fields: GpuFaultFacts = {
        "gpu": ev.gpu,
        "xid": None,
        "class": "lost",
        "recovery": None,
        "message": ev.error,
    }
    if not _ours(ev.gpu, rules):
        actions.append(
            Record({"kind": "gpu_fault", **fields, "action": "none: not a GPU of this run"})
        )
        return state
    if state.phase in HALTED or (state.gpu_fault is not None and state.gpu_fault.cls == "lost"):
        actions.append(Record({"kind": "gpu_fault", **fields, "action": "none: already halted"}))
        return state
    actions.append(Record({"kind": "gpu_fault", **fields, "action": "halt"}))
    fault = GpuFaultInfo(ev.gpu, None, XidClass.LOST, ev.error)
    return _stop_for(state, fault, ev.t, rules, actions)


def _ours(gpu: int, rules: Rules) -> bool:
    return rules.gpu_devices is None or gpu in rules.gpu_devices


def _stop_for(
    state: State, fault: GpuFaultInfo, t: float, rules: Rules, actions: list[Action]
) -> State:
    """Stop the trainer (or cancel its restart) for a fault it cannot run through."""
    state = pivot.abort(state, actions, f"a GPU fault on GPU {fault.gpu}")
    fault = replace(fault, reason=instruction(fault))
    state = replace(state, gpu_fault=fault, backoff_until=None, spawn_due=False)
    if not state.trainer_alive:
        return after_trainer_gone(state, t, rules, actions)
    if state.stop_reason is None:
        return stop_trainer(state, t, rules, "gpu_fault", actions)
    if state.stop_reason in ("stall", "divergence", "spike", "pivot"):
        # Already on its way down: it is not to be restarted when it is gone.
        return replace(state, stop_reason="gpu_fault")
    return state  # an operator stop or a shutdown ends it anyway


def after_trainer_gone(state: State, t: float, rules: Rules, actions: list[Action]) -> State:
    """The trainer is gone: wait for the GPU to be free, or halt at once if it is gone too."""
    fault = state.gpu_fault
    assert fault is not None
    if fault.cls in (XidClass.REBOOT, XidClass.LOST) or fault.stop_asked:
        return halt(state, fault, actions)
    actions.append(AwaitGpuIdle(fault.gpu, rules.gpu_idle_timeout_s))
    return replace(state, phase=Phase.STOPPING, trainer_pid=None, stop_reason=None, kill_at=None)


def on_idle(state: State, ev: GpuIdle, rules: Rules, actions: list[Action]) -> State:
    fault = state.gpu_fault
    if fault is None or fault.gpu != ev.gpu or state.trainer_alive:
        return state
    if ev.holders:
        actions.append(
            Record(
                {
                    "kind": "gpu_busy",
                    "gpu": ev.gpu,
                    "pids": list(ev.holders),
                    "waited_s": ev.waited_s,
                }
            )
        )
    if rules.gpu_reset and fault.cls == XidClass.RESET and not ev.holders:
        actions.append(ResetGpu(fault.gpu))
        return state
    return halt(state, fault, actions)


def on_reset_done(state: State, ev: GpuResetDone, rules: Rules, actions: list[Action]) -> State:
    fault = state.gpu_fault
    actions.append(Record({"kind": "gpu_reset", "gpu": ev.gpu, "ok": ev.ok, "error": ev.error}))
    if fault is None or fault.gpu != ev.gpu:
        return state  # no longer waited for (a stop halted the run meanwhile)
    if not ev.ok:
        return halt(state, fault, actions, f"the automatic reset failed ({ev.error}); ")
    return spawn(replace(state, gpu_fault=None), ev.t, actions, "gpu_fault")


def halt(state: State, fault: GpuFaultInfo, actions: list[Action], before: str = "") -> State:
    """Halt in gpu_fault; the reason is `before` and the instruction."""
    reason = before + instruction(fault)
    actions.append(
        Record(
            {
                "kind": "halt",
                "state": "gpu_fault",
                "gpu": fault.gpu,
                "xid": fault.xid,
                "class": str(fault.cls),
                "reason": reason,
            },
        )
    )
    state = replace(
        state,
        phase=Phase.GPU_FAULT,
        gpu_fault=None,
        trainer_pid=None,
        stop_reason=None,
        kill_at=None,
        halt_reason=reason,
    )
    if any(w.kind == "stop" for w in state.waiters):
        # A stop asked while the daemon handled the fault: the trainer is stopped, the run
        # halted, and the reply says so (naming its last checkpoint once verified).
        if state.pending or state.containing:
            return replace(state, stop_due=True)
        return finish_stop(state, actions, {})
    return fail_waiters(state, actions, "wrong_state", f"the run halted: {reason}")


# ----------------------------------------------------------------------------- throttling


@dataclass(frozen=True)
class Throttle:
    """One GPU's throttle episode: since when clocks are held down, and the MFU before."""

    since: float | None = None
    reasons: tuple[str, ...] = ()
    mfu_before: float | None = None
    """The last MFU seen before the episode began."""
    last_mfu: float | None = None
    reported: bool = False


def throttle_step(
    watch: Throttle,
    t: float,
    reasons: tuple[str, ...],
    mfu: float | None,
    after_s: float,
) -> tuple[Throttle, ThrottleFacts | None]:
    """Feed one sample (the alarming reasons only); the `gpu_throttle` record's fields once
    an episode has lasted `after_s`, once per episode."""
    if not reasons:
        return Throttle(last_mfu=mfu if mfu is not None else watch.last_mfu), None
    if watch.since is None:
        watch = Throttle(since=t, reasons=reasons, mfu_before=watch.last_mfu, last_mfu=mfu)
    else:
        merged = tuple(dict.fromkeys((*watch.reasons, *reasons)))
        watch = replace(watch, reasons=merged, last_mfu=mfu)
    since = watch.since if watch.since is not None else t
    if watch.reported or t - since < after_s:
        return watch, None
    drop = None
    if watch.mfu_before is not None and mfu is not None:
        drop = round(watch.mfu_before - mfu, 6)
    record: ThrottleFacts = {
        "reasons": list(watch.reasons),
        "seconds": round(t - since, 1),
        "mfu_before": watch.mfu_before,
        "mfu": mfu,
        "mfu_drop": drop,
    }
    return replace(watch, reported=True), record
