"""The one module that talks to NVML: cheap GPU figures every 2 s, never an exception.

NVML is initialised lazily and once per process, device handles are cached, and every
call goes through `Nvml.call`, which turns a missing function, an unsupported query or a
driver error into the sentinel `NA` and logs it once per function. A machine without an
NVIDIA driver gets a `GpuSampler` whose `available` is False and whose `reason` says why;
everything else in trainwarden keeps working.

Only cheap queries are made (no process lists). `GpuSampler.sample()` blocks for a few
milliseconds, so the daemon calls it in a worker thread.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from types import ModuleType
from typing import Any, NamedTuple

log = logging.getLogger(__name__)


class NaType(enum.Enum):
    """The type of `NA`: a figure this GPU, driver or nvidia-ml-py cannot give."""

    NA = "N/A"

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return "N/A"

    def __repr__(self) -> str:
        return "NA"


NA = NaType.NA

# Values of NVML's C enums (nvml.h); stable ABI, so a stub module need not define them.
_TEMPERATURE_GPU = 0
_CLOCK_SM = 1
_MEMORY_ERROR_TYPE_UNCORRECTED = 1
_VOLATILE_ECC = 0

# Bits of nvmlClocksEventReason* (formerly nvmlClocksThrottleReason*), with short names.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "idle"),
    (0x002, "app_clocks"),
    (0x004, "power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clocks"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)
# Running into the power cap is how a busy GPU normally runs; these mean heat or a
# hardware protection is slowing training down.
ALARMING_REASONS = frozenset({"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})

# Newest API first; the deprecated names remain for drivers older than the new symbols.
_CLOCK_EVENT_FUNCTIONS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)
_TEMPERATURE_FUNCTIONS = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")


def decode_clock_event_reasons(mask: int) -> tuple[str, ...]:
    """The short names of the bits set in an NVML clock-event (throttle) reason mask."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    unknown = mask & ~known
    bit = 1
    while unknown >= bit:
        if unknown & bit:
            names.append(f"0x{bit:x}")
        bit <<= 1
    return tuple(names)


def is_alarming(reasons: tuple[str, ...] | NaType) -> bool:
    """True when clocks are held down by heat or a hardware slowdown (power cap alone is not)."""
    return reasons is not NA and not ALARMING_REASONS.isdisjoint(reasons)


class GpuSample(NamedTuple):
    """One reading of one GPU; any figure may be `NA`."""

    name: str | NaType
    index: int  # type: ignore[assignment]  # shadows tuple.index(), as NVML names it
    util_percent: int | NaType
    mem_used_bytes: int | NaType
    mem_total_bytes: int | NaType
    temperature_c: int | NaType
    power_w: float | NaType
    power_limit_w: float | NaType
    sm_clock_mhz: int | NaType
    throttle_reasons: tuple[str, ...] | NaType
    ecc_volatile_errors: int | NaType
    """Uncorrected ECC errors since the driver loaded (NA where ECC is off or unsupported)."""
    alarming: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly: NA becomes None, the reason tuple a list."""
        out: dict[str, Any] = {}
        for key, value in self._asdict().items():
            if value is NA:
                value = None
            elif isinstance(value, tuple):
                value = list(value)
            out[key] = value
        return out


def _message(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # an NVMLError's __str__ calls back into the library
        return type(exc).__name__


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_message(exc)}"


def _error_class(module: ModuleType | None, name: str) -> type[BaseException] | tuple[()]:
    cls = getattr(module, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else ()


class Nvml:
    """One NVML session: lazy single init, cached handles, calls that return NA, not raise."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._module: ModuleType | None = None
        self._tried = False
        self._reason: str | None = None
        self._handles: dict[int, Any] = {}
        self._unsupported: set[str] = set()
        self._logged: set[str] = set()

    def init(self) -> str | None:
        """Initialise NVML on first use; None when it works, else why it cannot be used."""
        with self._lock:
            if not self._tried:
                self._tried = True
                self._reason = self._init_locked()
            return self._reason

    def _init_locked(self) -> str | None:
        try:
            import pynvml
        except ImportError:
            return "no NVIDIA GPU (nvidia-ml-py is not installed)"
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            return _init_failure(pynvml, exc)
        self._module = pynvml
        return None

    def module(self) -> ModuleType | None:
        """The initialised pynvml module (None: NVML unusable), for callers whose error
        matters (the GPU event watcher tells a lost GPU from an unsupported query)."""
        self.init()
        return self._module

    def handle(self, index: int) -> tuple[Any, str | None]:
        """The cached handle of GPU `index`, or (None, why not)."""
        if self.init() is not None or self._module is None:
            return None, self._reason
        with self._lock:
            if index in self._handles:
                return self._handles[index], None
            try:
                handle = self._module.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:
                return None, _describe(exc)
            self._handles[index] = handle
            return handle, None

    def call(self, name: str, *args: Any) -> Any:
        """`pynvml.<name>(*args)`, or NA (logged once per function) if it cannot answer."""
        if name in self._unsupported or self._module is None:
            return NA
        function = getattr(self._module, name, None)
        if function is None:
            self._unsupported.add(name)
            self._log_once(name, logging.INFO, "NVML %s is not in this nvidia-ml-py: N/A", name)
            return NA
        try:
            return function(*args)
        except Exception as exc:
            self._log_failure(name, exc)
            return NA

    def first(self, names: tuple[str, ...], *args: Any) -> Any:
        """The answer of the first function in `names` that gives one, else NA."""
        for name in names:
            value = self.call(name, *args)
            if value is not NA:
                return value
        return NA

    def retry(self) -> None:
        """Forget a failed initialisation so that the next use tries again."""
        with self._lock:
            if self._module is None:
                self._tried = False

    def shutdown(self) -> None:
        """Release NVML; samplers built before hold stale handles, so build new ones."""
        with self._lock:
            module, self._module = self._module, None
            self._tried = False
            self._reason = None
            self._handles.clear()
        if module is not None:
            try:
                module.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown failed: %s", _describe(exc))

    def _log_failure(self, name: str, exc: Exception) -> None:
        module = self._module
        if isinstance(exc, (AttributeError, _error_class(module, "NVMLError_FunctionNotFound"))):
            # The driver or the bindings lack this call: asking again cannot help.
            self._unsupported.add(name)
            self._log_once(name, logging.INFO, "NVML %s is missing: shown as N/A", name)
        elif isinstance(exc, _error_class(module, "NVMLError_NotSupported")):
            self._log_once(name, logging.INFO, "NVML %s is not supported: shown as N/A", name)
        elif isinstance(exc, _error_class(module, "NVMLError")):
            self._log_once(name, logging.WARNING, "NVML %s: %s: shown as N/A", name, _describe(exc))
        else:
            # Not an NVML answer but a mismatch with these bindings: never call it again.
            self._unsupported.add(name)
            self._log_once(name, logging.ERROR, "NVML %s raised: shown as N/A", name, exc_info=exc)

    def _log_once(self, key: str, level: int, msg: str, *args: Any, exc_info: Any = None) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, *args, exc_info=exc_info)


def _init_failure(module: ModuleType, exc: Exception) -> str:
    if isinstance(exc, _error_class(module, "NVMLError_LibraryNotFound")):
        return "no NVIDIA GPU (the NVML library libnvidia-ml.so.1 is not installed)"
    if isinstance(exc, _error_class(module, "NVMLError_DriverNotLoaded")):
        return f"NVIDIA driver not loaded: {_message(exc)}"
    if isinstance(exc, _error_class(module, "NVMLError_LibRmVersionMismatch")):
        return f"NVIDIA driver and NVML differ in version (reboot after an update): {_message(exc)}"
    if isinstance(exc, _error_class(module, "NVMLError_NoPermission")):
        return f"no permission to use NVML: {_message(exc)}"
    return f"NVML failed to initialise: {_describe(exc)}"


_shared: Nvml | None = None
_shared_lock = threading.Lock()


def shared_nvml() -> Nvml:
    """The process-wide NVML session (created, not initialised, on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Nvml()
        return _shared


class GpuSampler:
    """Reads GPU `index` through NVML; `sample()` is None where there is no usable GPU.

    Construction initialises NVML (once per process) and fetches the handle and name, so
    it blocks like `sample()` does: build it in a worker thread too. Without a usable GPU
    the sampler looks again at most every `retry_s` seconds, so a daemon started before
    the driver finished loading picks the GPU up later.
    """

    def __init__(self, index: int = 0, nvml: Nvml | None = None, retry_s: float = 60.0) -> None:
        self.index = index
        self.retry_s = retry_s
        self._nvml = nvml
        self._lock = threading.Lock()
        self._probed_at: float | None = None
        self._handle: Any = None
        self._name: str | NaType = NA
        self._reason: str | None = None
        self._probe()

    @property
    def available(self) -> bool:
        """Whether NVML works and GPU `index` exists (initialises NVML on first use)."""
        self._probe()
        return self._handle is not None

    @property
    def reason(self) -> str | None:
        """Why there are no GPU figures ("no NVIDIA GPU ..."); None when available."""
        self._probe()
        return self._reason

    def name(self) -> str | None:
        """The GPU's name as NVML reports it ("NVIDIA GeForce RTX 4090"); None if unknown."""
        self._probe()
        return None if self._name is NA else self._name

    def _probe(self) -> None:
        with self._lock:
            now = time.monotonic()
            if self._handle is not None or (
                self._probed_at is not None and now - self._probed_at < self.retry_s
            ):
                return
            if self._nvml is None:
                self._nvml = shared_nvml()
            if self._probed_at is not None:
                self._nvml.retry()
            self._probed_at = now
            handle, error = self._nvml.handle(self.index)
            if handle is None:
                reason = self._nvml.init() or f"no NVIDIA GPU at index {self.index}: {error}"
                if reason != self._reason:
                    log.info("GPU telemetry off: %s", reason)
                self._reason = reason
                return
            self._handle, self._reason = handle, None
            name = self._nvml.call("nvmlDeviceGetName", handle)
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace")
            self._name = name if isinstance(name, str) else NA
            log.info("GPU %d: %s", self.index, self._name)

    def sample(self) -> GpuSample | None:
        """Read the cheap figures now (blocking, a few ms); None without a usable GPU."""
        if not self.available or self._nvml is None:
            return None
        call, handle = self._nvml.call, self._handle

        util = call("nvmlDeviceGetUtilizationRates", handle)
        memory = call("nvmlDeviceGetMemoryInfo", handle)
        temperature = self._nvml.first(_TEMPERATURE_FUNCTIONS, handle, _TEMPERATURE_GPU)
        power_mw = call("nvmlDeviceGetPowerUsage", handle)
        limit_mw = call("nvmlDeviceGetEnforcedPowerLimit", handle)
        sm_clock = call("nvmlDeviceGetClockInfo", handle, _CLOCK_SM)
        mask = self._nvml.first(_CLOCK_EVENT_FUNCTIONS, handle)
        ecc = call(
            "nvmlDeviceGetTotalEccErrors", handle, _MEMORY_ERROR_TYPE_UNCORRECTED, _VOLATILE_ECC
        )

        reasons = NA if mask is NA else decode_clock_event_reasons(int(mask))
        return GpuSample(
            name=self._name,
            index=self.index,
            util_percent=NA if util is NA else int(util.gpu),
            mem_used_bytes=NA if memory is NA else int(memory.used),
            mem_total_bytes=NA if memory is NA else int(memory.total),
            temperature_c=_int_or_na(temperature),
            power_w=NA if power_mw is NA else power_mw / 1000.0,
            power_limit_w=NA if limit_mw is NA else limit_mw / 1000.0,
            sm_clock_mhz=_int_or_na(sm_clock),
            throttle_reasons=reasons,
            ecc_volatile_errors=_int_or_na(ecc),
            alarming=is_alarming(reasons),
        )


def _int_or_na(value: Any) -> int | NaType:
    return NA if value is NA else int(value)
