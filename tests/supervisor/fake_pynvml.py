"""A stand-in for nvidia-ml-py (`pynvml`) with one configurable GPU, for machines without one.

Build it with `FakeNvml()`, change `values`, make a function raise with `fail`, remove one
with `delattr(fake.module, name)`, and install `fake.module` as `sys.modules["pynvml"]`.
Error classes mirror the real ones: `NVMLError(value)` with one subclass per code.
"""

from __future__ import annotations

from collections import Counter
from types import ModuleType, SimpleNamespace
from typing import Any

ERROR_CODES = {
    "Uninitialized": 1,
    "InvalidArgument": 2,
    "NotSupported": 3,
    "NoPermission": 4,
    "DriverNotLoaded": 9,
    "LibraryNotFound": 12,
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
)


class FakeNvml:
    """One fake RTX 4090 behind a module object that quacks like pynvml."""

    def __init__(self, device_count: int = 1) -> None:
        self.device_count = device_count
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
        for cls in ERRORS.values():
            setattr(self.module, cls.__name__, cls)
        for name in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetHandleByIndex", *DEVICE_FUNCTIONS):
            setattr(self.module, name, self._function(name))

    def error(self, name: str) -> NVMLError:
        """An instance of NVMLError_<name>, e.g. error("NotSupported")."""
        return ERRORS[name]()

    def _function(self, name: str) -> Any:
        answer = getattr(self, "_" + name)

        def function(*args: Any) -> Any:
            self.calls[name] += 1
            if name in self.fail:
                raise self.fail[name]
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
        return int(self.values["reasons"])

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return int(self.values["reasons"])

    def _nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0), "uncorrected, volatile"
        return int(self.values["ecc"])
