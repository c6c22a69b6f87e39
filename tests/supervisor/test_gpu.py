"""GPU sampling through NVML: a fake pynvml for the GPU paths, the real one for "no GPU"."""

from __future__ import annotations

import logging
import sys

import orjson
import pytest

from tests.supervisor.fake_pynvml import FakeNvml
from trainwarden.supervisor.inputs import gpu
from trainwarden.supervisor.inputs.gpu import (
    NA,
    GpuSampler,
    Nvml,
    decode_clock_event_reasons,
    is_alarming,
)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    monkeypatch.setattr(gpu, "_shared", None)
    return fake


def records_about(caplog: pytest.LogCaptureFixture, function: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "trainwarden.supervisor.inputs.gpu" and function in r.getMessage()
    ]


def test_sample_reports_figures_in_the_units_its_fields_name(fake: FakeNvml) -> None:
    sampler = GpuSampler()

    sample = sampler.sample()

    assert sampler.available and sampler.reason is None
    assert sampler.name() == "NVIDIA GeForce RTX 4090"
    assert sample is not None
    assert sample.name == "NVIDIA GeForce RTX 4090"
    assert sample.index == 0
    assert sample.util_percent == 97
    assert sample.mem_used_bytes == 20 * 1024**3
    assert sample.mem_total_bytes == 24 * 1024**3
    assert sample.temperature_c == 71
    assert sample.power_w == pytest.approx(412.345)
    assert sample.power_limit_w == pytest.approx(450.0)
    assert sample.sm_clock_mhz == 2520
    assert sample.throttle_reasons == ("power_cap",)
    assert sample.ecc_volatile_errors == 0
    assert sample.alarming is False


def test_construction_initialises_nvml_so_it_can_happen_off_the_event_loop(
    fake: FakeNvml,
) -> None:
    GpuSampler()

    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetName"] == 1


def test_name_unknown_to_nvml_is_none(fake: FakeNvml) -> None:
    fake.fail["nvmlDeviceGetName"] = fake.error("Unknown")
    sampler = GpuSampler()

    sample = sampler.sample()

    assert sampler.name() is None
    assert sample is not None and sample.name is NA and sample.to_dict()["name"] is None


def test_init_handle_and_name_are_fetched_once(fake: FakeNvml) -> None:
    first, second = GpuSampler(), GpuSampler()

    for _ in range(5):
        first.sample()
        second.sample()

    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 1
    assert fake.calls["nvmlDeviceGetName"] == 2  # once per sampler, not per sample
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 10


def test_device_index_is_configurable(fake: FakeNvml) -> None:
    fake.device_count = 2

    sample = GpuSampler(index=1).sample()

    assert sample is not None and sample.index == 1


def test_missing_device_index_is_unavailable_with_a_reason(fake: FakeNvml) -> None:
    sampler = GpuSampler(index=3)

    assert sampler.available is False
    assert sampler.sample() is None
    assert sampler.name() is None
    assert sampler.reason is not None and "no NVIDIA GPU at index 3" in sampler.reason


def test_to_dict_is_json_and_turns_na_into_none(fake: FakeNvml) -> None:
    fake.fail["nvmlDeviceGetTotalEccErrors"] = fake.error("NotSupported")
    fake.values["reasons"] = 0x001 | 0x040

    sample = GpuSampler().sample()
    assert sample is not None
    data = orjson.loads(orjson.dumps(sample.to_dict()))

    assert data["ecc_volatile_errors"] is None
    assert data["throttle_reasons"] == ["idle", "hw_thermal"]
    assert data["power_w"] == pytest.approx(412.345)
    assert data["alarming"] is True
    assert set(data) == set(gpu.GpuSample._fields)


@pytest.mark.parametrize(
    ("error", "reason_start"),
    [("LibraryNotFound", "no NVIDIA GPU"), ("DriverNotLoaded", "NVIDIA driver not loaded: ")],
)
def test_init_failure_means_unavailable_and_no_sample(
    fake: FakeNvml, error: str, reason_start: str
) -> None:
    fake.fail["nvmlInit"] = fake.error(error)
    sampler = GpuSampler()

    assert sampler.available is False
    assert sampler.reason is not None and sampler.reason.startswith(reason_start)
    assert sampler.sample() is None
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 0


def test_missing_nvidia_ml_py_means_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail

    sampler = GpuSampler(nvml=Nvml())

    assert sampler.available is False
    assert sampler.reason is not None and sampler.reason.startswith("no NVIDIA GPU")
    assert sampler.sample() is None


def test_unavailable_gpu_is_looked_for_again_after_retry_s(fake: FakeNvml) -> None:
    fake.fail["nvmlInit"] = fake.error("DriverNotLoaded")
    patient, hasty = GpuSampler(nvml=Nvml(), retry_s=3600), GpuSampler(nvml=Nvml(), retry_s=0)
    assert patient.sample() is None and hasty.sample() is None

    del fake.fail["nvmlInit"]  # the driver has finished loading

    assert patient.sample() is None
    sample = hasty.sample()
    assert sample is not None and sample.util_percent == 97
    assert hasty.reason is None


def test_unsupported_query_is_na_and_logged_once(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail["nvmlDeviceGetPowerUsage"] = fake.error("NotSupported")
    sampler = GpuSampler()

    with caplog.at_level(logging.DEBUG, logger="trainwarden.supervisor.inputs.gpu"):
        samples = [sampler.sample() for _ in range(10)]

    assert all(s is not None and s.power_w is NA for s in samples)
    assert all(s is not None and s.temperature_c == 71 for s in samples)
    assert len(records_about(caplog, "nvmlDeviceGetPowerUsage")) == 1


def test_driver_error_mid_run_is_na_logged_once_as_warning(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    sampler = GpuSampler()
    assert sampler.sample() is not None
    fake.fail["nvmlDeviceGetMemoryInfo"] = fake.error("GpuIsLost")

    with caplog.at_level(logging.DEBUG, logger="trainwarden.supervisor.inputs.gpu"):
        samples = [sampler.sample() for _ in range(3)]

    assert all(
        s is not None and s.mem_used_bytes is NA and s.mem_total_bytes is NA for s in samples
    )
    (record,) = records_about(caplog, "nvmlDeviceGetMemoryInfo")
    assert record.levelno == logging.WARNING
    # A driver error may clear up, so the query is still made each time.
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 4


def test_function_missing_from_the_module_is_na_and_logged_once(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    del fake.module.nvmlDeviceGetTotalEccErrors
    sampler = GpuSampler()

    with caplog.at_level(logging.DEBUG, logger="trainwarden.supervisor.inputs.gpu"):
        samples = [sampler.sample() for _ in range(4)]

    assert all(s is not None and s.ecc_volatile_errors is NA for s in samples)
    assert len(records_about(caplog, "nvmlDeviceGetTotalEccErrors")) == 1


def test_function_the_driver_lacks_is_not_called_again(fake: FakeNvml) -> None:
    fake.fail["nvmlDeviceGetClockInfo"] = fake.error("FunctionNotFound")
    sampler = GpuSampler()

    for _ in range(5):
        sample = sampler.sample()
        assert sample is not None and sample.sm_clock_mhz is NA

    assert fake.calls["nvmlDeviceGetClockInfo"] == 1


def test_unexpected_exception_is_na_logged_once_as_error(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail["nvmlDeviceGetEnforcedPowerLimit"] = ValueError("bindings changed")
    sampler = GpuSampler()

    with caplog.at_level(logging.DEBUG, logger="trainwarden.supervisor.inputs.gpu"):
        samples = [sampler.sample() for _ in range(3)]

    assert all(s is not None and s.power_limit_w is NA for s in samples)
    (record,) = records_about(caplog, "nvmlDeviceGetEnforcedPowerLimit")
    assert record.levelno == logging.ERROR


def test_old_bindings_fall_back_to_throttle_reasons_and_temperature(fake: FakeNvml) -> None:
    del fake.module.nvmlDeviceGetCurrentClocksEventReasons
    del fake.module.nvmlDeviceGetTemperatureV
    fake.values["reasons"] = 0x020

    sample = GpuSampler().sample()

    assert sample is not None
    assert sample.throttle_reasons == ("sw_thermal",)
    assert sample.temperature_c == 71
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1


def test_old_driver_falls_back_from_the_new_symbol_once(fake: FakeNvml) -> None:
    fake.fail["nvmlDeviceGetCurrentClocksEventReasons"] = fake.error("FunctionNotFound")
    fake.values["reasons"] = 0x008
    sampler = GpuSampler()

    samples = [sampler.sample() for _ in range(3)]

    assert all(s is not None and s.throttle_reasons == ("hw_slowdown",) for s in samples)
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3


def test_no_reason_query_at_all_is_na_and_not_alarming(fake: FakeNvml) -> None:
    fake.fail["nvmlDeviceGetCurrentClocksEventReasons"] = fake.error("NotSupported")
    fake.fail["nvmlDeviceGetCurrentClocksThrottleReasons"] = fake.error("NotSupported")

    sample = GpuSampler().sample()

    assert sample is not None and sample.throttle_reasons is NA and sample.alarming is False


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0x000, ()),
        (0x001, ("idle",)),
        (0x004, ("power_cap",)),
        (0x008 | 0x040, ("hw_slowdown", "hw_thermal")),
        (0x010 | 0x020, ("sync_boost", "sw_thermal")),
        (0x002 | 0x080 | 0x100, ("app_clocks", "hw_power_brake", "display_clocks")),
        (0x004 | 0x1000, ("power_cap", "0x1000")),
    ],
)
def test_decode_clock_event_reasons(mask: int, names: tuple[str, ...]) -> None:
    assert decode_clock_event_reasons(mask) == names


@pytest.mark.parametrize(
    ("reasons", "alarming"),
    [
        (("power_cap",), False),
        (("idle",), False),
        (("power_cap", "sync_boost"), False),
        ((), False),
        (NA, False),
        (("sw_thermal",), True),
        (("hw_thermal", "hw_slowdown"), True),
        (("hw_slowdown",), True),
        (("power_cap", "hw_power_brake"), True),
    ],
)
def test_alarming_means_heat_or_hardware_slowdown_not_the_power_cap(
    reasons: tuple[str, ...], alarming: bool
) -> None:
    assert is_alarming(reasons) is alarming


def test_sample_is_alarming_when_thermally_throttled(fake: FakeNvml) -> None:
    fake.values["reasons"] = 0x004 | 0x020

    sample = GpuSampler().sample()

    assert sample is not None and sample.alarming is True


def test_real_nvml_on_a_machine_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    sampler = GpuSampler(nvml=Nvml())
    if sampler.available:
        pytest.skip("this machine has a usable NVIDIA GPU")

    assert sampler.sample() is None
    assert sampler.reason is not None and "no NVIDIA GPU" in sampler.reason


def test_real_nvml_on_a_machine_with_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    sampler = GpuSampler(nvml=Nvml())
    if not sampler.available:
        pytest.skip(f"no usable GPU here: {sampler.reason}")

    first, second = sampler.sample(), sampler.sample()

    assert sampler.name()
    for sample in (first, second):
        assert sample is not None
        assert isinstance(sample.name, str) and sample.name
        assert isinstance(sample.mem_total_bytes, int) and sample.mem_total_bytes > 2**30
        assert isinstance(sample.mem_used_bytes, int)
        assert 0 <= sample.mem_used_bytes <= sample.mem_total_bytes
        assert isinstance(sample.util_percent, int) and 0 <= sample.util_percent <= 100
        assert isinstance(sample.temperature_c, int) and 0 < sample.temperature_c < 120
        assert isinstance(sample.power_w, float) and 0 < sample.power_w < 2000
        assert isinstance(sample.sm_clock_mhz, int) and sample.sm_clock_mhz >= 0
        assert isinstance(sample.throttle_reasons, tuple)
        orjson.dumps(sample.to_dict())
