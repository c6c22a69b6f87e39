"""After a GPU fault: wait until no process holds the GPU, and reset it when allowed.

Both block (NVML process lists, nvidia-smi), so the executor runs them in a thread and
reports the outcome as an event (core.GpuIdle, core.GpuResetDone).
"""

from __future__ import annotations

import logging
import subprocess
import time

from trainwarden.supervisor.inputs.gpu import Nvml, _describe

log = logging.getLogger(__name__)

POLL_S = 0.5
RESET_TIMEOUT_S = 120.0
"""nvidia-smi -r takes seconds; a reset that hangs longer has failed."""


def wait_until_free(nvml: Nvml, gpu: int, timeout_s: float) -> tuple[tuple[int, ...], float]:
    """Poll the GPU's compute processes until there are none or `timeout_s` passed: the
    pids still holding it (empty: free, or NVML cannot list them) and the seconds waited."""
    started = time.monotonic()
    module = nvml.module()
    handle, error = nvml.handle(gpu)
    if module is None or handle is None:
        log.warning("GPU %d: cannot list its processes: %s", gpu, error)
        return (), 0.0
    while True:
        try:
            pids = tuple(int(p.pid) for p in module.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception as exc:
            log.warning("GPU %d: cannot list its processes: %s", gpu, _describe(exc))
            pids = ()
        waited = time.monotonic() - started
        if not pids or waited >= timeout_s:
            return pids, round(waited, 1)
        time.sleep(POLL_S)


def reset_gpu(gpu: int) -> str | None:
    """`nvidia-smi -r -i GPU` (NVML's Python bindings offer no reset); None when it worked,
    else what went wrong."""
    argv = ["nvidia-smi", "-r", "-i", str(gpu)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RESET_TIMEOUT_S)
    except FileNotFoundError:
        return "nvidia-smi is not installed"
    except subprocess.TimeoutExpired:
        return f"nvidia-smi -r did not finish within {RESET_TIMEOUT_S:g} s"
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return f"nvidia-smi -r exited {done.returncode}: {said[-1] if said else 'no output'}"
    return None
