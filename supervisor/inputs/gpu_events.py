"""NVML's critical XID events and a lost GPU, watched in a thread and handed to the loop.

NVML delivers XIDs through an event set: probe `nvmlDeviceGetSupportedEventTypes`,
register `nvmlEventTypeXidCriticalError` on each GPU that supports it, then block in
`nvmlEventSetWait_v2(set, timeout_ms)`, whose data carries the XID in `eventData` and
the device handle in `device`. The wait times out every `wait_ms` so the thread can stop
and probe each GPU: a GPU whose NVML calls fail after they worked (GpuIsLost, or the same
driver error `lost_after` times in a row) is reported lost, once.

Nothing here raises into the daemon: every failure is logged and the watcher carries on
(or ends, when NVML itself is unusable).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainwarden.supervisor.inputs.gpu import Nvml, _describe, _error_class

log = logging.getLogger(__name__)

XID_CRITICAL_ERROR = 0x8
"""nvmlEventTypeXidCriticalError, for bindings too old to name it."""
FI_DEV_GET_GPU_RECOVERY_ACTION = 230
"""NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (drivers 550+): what the driver says to do."""
_NOT_LOSS = ("NotSupported", "NoPermission", "FunctionNotFound", "Timeout")
"""Errors that say nothing about the GPU being gone."""
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}
"""nvmlGpuRecoveryAction_t values (NVML_GPU_RECOVERY_ACTION_*), by the journal's names."""


def _errors(module: ModuleType, names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    classes = (_error_class(module, f"NVMLError_{name}") for name in names)
    return tuple(c for c in classes if isinstance(c, type))


class GpuEventWatcher:
    """One thread: XID events and lost GPUs of every GPU NVML sees, handed to
    `on_xid(gpu, xid, recovery_action)` and `on_lost(gpu, error)` (called in the thread)."""

    def __init__(
        self,
        nvml: Nvml,
        on_xid: Callable[[int, int, str | None], None],
        on_lost: Callable[[int, str], None],
        *,
        wait_ms: int = 1000,
        lost_after: int = 3,
    ) -> None:
        self.nvml = nvml
        self.on_xid = on_xid
        self.on_lost = on_lost
        self.wait_ms = wait_ms
        self.lost_after = lost_after
        self.watching: list[int] = []
        """GPUs whose XID events are registered."""
        self.without_events: dict[int, str] = {}
        """GPUs without XID events, and why (still probed for loss)."""
        self.ready = threading.Event()
        """Set once registration is done (or NVML turned out unusable)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost: set[int] = set()
        self._failures: dict[int, int] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpu-events", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread; it notices within one wait (wait_ms)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:  # a watcher bug must never take supervision down
            log.exception("the GPU event watcher failed; XIDs are no longer watched")
        finally:
            self.ready.set()

    def _watch(self) -> None:
        module = self.nvml.module()
        if module is None:
            return
        try:
            count = int(module.nvmlDeviceGetCount())
        except Exception as exc:
            log.info("GPU events off: nvmlDeviceGetCount: %s", _describe(exc))
            return
        handles: dict[int, Any] = {}
        for index in range(count):
            handle, error = self.nvml.handle(index)
            if handle is not None:
                handles[index] = handle
            else:
                log.info("GPU %d: no handle, not watched: %s", index, error)
        event_set = self._register(module, handles)
        self.ready.set()
        try:
            while not self._stop.is_set():
                if event_set is not None:
                    self._wait_once(module, event_set, handles)
                else:
                    self._stop.wait(self.wait_ms / 1000)
                for index, handle in handles.items():
                    self._probe(module, index, handle)
        finally:
            if event_set is not None:
                try:
                    module.nvmlEventSetFree(event_set)
                except Exception as exc:
                    log.debug("nvmlEventSetFree: %s", _describe(exc))

    def _register(self, module: ModuleType, handles: dict[int, Any]) -> Any:
        """The event set with XID events registered on each GPU that offers them."""
        bit = int(getattr(module, "nvmlEventTypeXidCriticalError", XID_CRITICAL_ERROR))
        try:
            event_set = module.nvmlEventSetCreate()
        except Exception as exc:
            self.without_events = {i: _describe(exc) for i in handles}
            return None
        for index, handle in handles.items():
            try:
                if not int(module.nvmlDeviceGetSupportedEventTypes(handle)) & bit:
                    self.without_events[index] = "XID events are not supported on this GPU"
                    continue
                module.nvmlDeviceRegisterEvents(handle, bit, event_set)
            except Exception as exc:
                self.without_events[index] = _describe(exc)
                continue
            self.watching.append(index)
        if not self.watching:
            try:
                module.nvmlEventSetFree(event_set)
            except Exception as exc:
                log.debug("nvmlEventSetFree: %s", _describe(exc))
            return None
        return event_set

    def _wait_once(self, module: ModuleType, event_set: Any, handles: dict[int, Any]) -> None:
        try:
            data = module.nvmlEventSetWait_v2(event_set, self.wait_ms)
        except Exception as exc:
            if isinstance(exc, _errors(module, ("Timeout",))):
                return
            # A lost GPU also fails the wait: the probes below say which one.
            log.debug("nvmlEventSetWait_v2: %s", _describe(exc))
            self._stop.wait(min(self.wait_ms / 1000, 1.0))
            return
        if not int(data.eventType) & XID_CRITICAL_ERROR:
            return
        index = self._index_of(module, data.device, handles)
        xid = int(data.eventData)
        recovery = self._recovery_action(module, handles.get(index))
        log.warning("GPU %s: Xid %d (recovery action: %s)", index, xid, recovery)
        self.on_xid(index, xid, recovery)

    def _index_of(self, module: ModuleType, device: Any, handles: dict[int, Any]) -> int:
        try:
            return int(module.nvmlDeviceGetIndex(device))
        except Exception:
            for index, handle in handles.items():
                if handle == device:
                    return index
            return 0 if len(handles) == 1 else -1

    def _recovery_action(self, module: ModuleType, handle: Any) -> str | None:
        """The driver's recovery action for the GPU, where the driver offers one."""
        if handle is None:
            return None
        field_id = int(
            getattr(module, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", FI_DEV_GET_GPU_RECOVERY_ACTION)
        )
        try:
            (value,) = module.nvmlDeviceGetFieldValues(handle, [field_id])
        except Exception as exc:
            log.debug("recovery action: %s", _describe(exc))
            return None
        if int(value.nvmlReturn) != 0:
            return None
        code = int(value.value.uiVal)
        return RECOVERY_ACTIONS.get(code, f"action {code}")

    def _probe(self, module: ModuleType, index: int, handle: Any) -> None:
        if index in self._lost:
            return
        try:
            module.nvmlDeviceGetMemoryInfo(handle)
        except Exception as exc:
            if isinstance(exc, _errors(module, _NOT_LOSS)):
                self._failures[index] = 0
                return
            count = self._failures.get(index, 0) + 1
            self._failures[index] = count
            if isinstance(exc, _errors(module, ("GpuIsLost",))) or count >= self.lost_after:
                self._lost.add(index)
                log.error("GPU %d is lost to NVML: %s", index, _describe(exc))
                self.on_lost(index, _describe(exc))
            return
        self._failures[index] = 0
