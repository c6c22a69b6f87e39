"""A stand-in for nvidia-ml-py (`pynvml`) with one configurable GPU, for machines without one.

Build it with `FakeNvml()`, change `values`, make a function raise with `fail`, remove one
with `delattr(fake.module, name)`, and install `fake.module` as `sys.modules["pynvml"]`.
Error classes mirror the real ones: `NVMLError(value)` with one subclass per code.

Events: `push_xid(xid)` has the next `nvmlEventSetWait_v2` return a critical XID event,
`lose()` makes every call raise NVMLError_GpuIsLost from then on. A daemon in another
process is driven through `control_dir`: each line "GPU XID [RECOVERY]" appended to its
`xids` file is one event, a `lost` file there loses the GPU, and a `reasons` file holds
the clock-event (throttle) reason mask, e.g. 0x40.
"""

from __future__ import annotations

import queue
import time
from collections import Counter
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

ERROR_CODES = {
    "Uninitialized": 1,
    "InvalidArgument": 2,
    "NotSupported": 3,
    "NoPermission": 4,
    "DriverNotLoaded": 9,
    "LibraryNotFound": 12,
    "Timeout": 10,
    "FunctionNotFound": 13,
    "GpuIsLost": 15,
    "LibRmVersionMismatch": 18,
    "Unknown": 999,
}


class NVMLError(Exception):
    code = ERROR_CODES["Unknown"]

    def __init__(self, value: int | None = None) -> None:
        self.value = self.code if value is None else value
        super().__init__(self.value)

    def __str__(self) -> str:
        names = {code: name for name, code in ERROR_CODES.items()}
        return names.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, code: int) -> type[NVMLError]:
    return type(f"NVMLError_{name}", (NVMLError,), {"code": code})


ERRORS: dict[str, type[NVMLError]] = {
    name: _error_class(name, code) for name, code in ERROR_CODES.items()
}

DEVICE_FUNCTIONS = (
    "nvmlDeviceGetName",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetFieldValues",
)
XID_CRITICAL_ERROR = 0x8
"""nvmlEventTypeXidCriticalError."""
FI_DEV_GET_GPU_RECOVERY_ACTION = 230


class FakeNvml:
    """One fake RTX 4090 behind a module object that quacks like pynvml."""

    def __init__(self, device_count: int = 1, control_dir: Path | None = None) -> None:
        self.device_count = device_count
        self.control_dir = control_dir
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.recovery: dict[int, int] = {}
        """GPU index -> its NVML_FI_DEV_GET_GPU_RECOVERY_ACTION value (absent: not supported)."""
        self.processes: list[int] = []
        """Pids nvmlDeviceGetComputeRunningProcesses reports on every GPU."""
        self.lost = False
        self.supported_events = XID_CRITICAL_ERROR
        self._xid_lines_read = 0
        self.calls: Counter[str] = Counter()
        self.fail: dict[str, BaseException] = {}
        self.values: dict[str, Any] = {
            "name": "NVIDIA GeForce RTX 4090",
            "util_gpu": 97,
            "mem_used": 20 * 1024**3,
            "mem_total": 24 * 1024**3,
            "temperature": 71,
            "power_mw": 412_345,
            "power_limit_mw": 450_000,
            "sm_clock": 2520,
            "reasons": 0x004,
            "ecc": 0,
        }
        self.module = ModuleType("pynvml")
        self.module.NVMLError = NVMLError  # type: ignore[attr-defined]
        self.module.nvmlEventTypeXidCriticalError = XID_CRITICAL_ERROR  # type: ignore[attr-defined]
        self.module.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = FI_DEV_GET_GPU_RECOVERY_ACTION  # type: ignore[attr-defined]
        for cls in ERRORS.values():
            setattr(self.module, cls.__name__, cls)
        for name in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetHandleByIndex", *DEVICE_FUNCTIONS):
            setattr(self.module, name, self._function(name))

    def error(self, name: str) -> NVMLError:
        """An instance of NVMLError_<name>, e.g. error("NotSupported")."""
        return ERRORS[name]()

    def push_xid(self, xid: int, gpu: int = 0, recovery: int | None = None) -> None:
        """The next event wait returns a critical XID `xid` on GPU `gpu`."""
        if recovery is not None:
            self.recovery[gpu] = recovery
        self.events.put((gpu, xid))

    def lose(self) -> None:
        """The GPU falls off the bus: every call raises NVMLError_GpuIsLost from now on."""
        self.lost = True

    def _is_lost(self) -> bool:
        if not self.lost and self.control_dir is not None:
            self.lost = (self.control_dir / "lost").exists()
        return self.lost

    def _read_control(self) -> None:
        if self.control_dir is None:
            return
        try:
            lines = (self.control_dir / "xids").read_text().splitlines()
        except FileNotFoundError:
            return
        for line in lines[self._xid_lines_read :]:
            words = line.split()
            if len(words) >= 2:
                self.push_xid(int(words[1]), int(words[0]), int(words[2]) if words[2:] else None)
        self._xid_lines_read = len(lines)

    def _function(self, name: str) -> Any:
        answer = getattr(self, "_" + name)

        def function(*args: Any) -> Any:
            self.calls[name] += 1
            if name in self.fail:
                raise self.fail[name]
            if name not in ("nvmlInit", "nvmlShutdown") and self._is_lost():
                raise ERRORS["GpuIsLost"]()
            return answer(*args)

        function.__name__ = name
        return function

    def _nvmlInit(self) -> None:
        return None

    def _nvmlShutdown(self) -> None:
        return None

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < self.device_count:
            raise ERRORS["InvalidArgument"]()
        return SimpleNamespace(index=index)

    def _nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self.values["name"])

    def _nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=self.values["util_gpu"], memory=40)

    def _nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        used, total = self.values["mem_used"], self.values["mem_total"]
        return SimpleNamespace(used=used, total=total, free=total - used)

    def _nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int) -> int:
        assert sensor == 0, "NVML_TEMPERATURE_GPU"
        return int(self.values["temperature"])

    def _nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == 0, "NVML_TEMPERATURE_GPU"
        return int(self.values["temperature"])

    def _nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self.values["power_mw"])

    def _nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(self.values["power_limit_mw"])

    def _nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        assert clock_type == 1, "NVML_CLOCK_SM"
        return int(self.values["sm_clock"])

    def _nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        if self.control_dir is not None and (self.control_dir / "reasons").exists():
            self.values["reasons"] = int((self.control_dir / "reasons").read_text(), 0)
        return int(self.values["reasons"])

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return int(self.values["reasons"])

    def _nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0), "uncorrected, volatile"
        return int(self.values["ecc"])

    def _nvmlDeviceGetCount(self) -> int:
        return self.device_count

    def _nvmlDeviceGetIndex(self, handle: Any) -> int:
        return int(handle.index)

    def _nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self.supported_events

    def _nvmlEventSetCreate(self) -> Any:
        return SimpleNamespace(handles=[])

    def _nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        if not event_types & self.supported_events:
            raise ERRORS["NotSupported"]()
        event_set.handles.append(handle)

    def _nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._read_control()
            try:
                gpu, xid = self.events.get(timeout=min(0.05, max(deadline - time.monotonic(), 0)))
            except queue.Empty:
                if self._is_lost():
                    raise ERRORS["GpuIsLost"]() from None
                if time.monotonic() >= deadline:
                    raise ERRORS["Timeout"]() from None
                continue
            return SimpleNamespace(
                device=SimpleNamespace(index=gpu),
                eventType=XID_CRITICAL_ERROR,
                eventData=xid,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )

    def _nvmlEventSetFree(self, event_set: Any) -> None:
        return None

    def _nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in self.processes]

    def _nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> list[Any]:
        assert field_ids == [FI_DEV_GET_GPU_RECOVERY_ACTION]
        action = self.recovery.get(int(handle.index))
        if action is None:
            return [SimpleNamespace(nvmlReturn=ERROR_CODES["NotSupported"], valueType=1)]
        return [SimpleNamespace(nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=action))]
