"""The `torch-pt` checkpoint format: one `torch.save` file per checkpoint.

Names like `ckpt_000100.pt` or `step-100.pt` (option `pattern`: a regular expression
whose one group is the step); a write in flight carries a `.tmp` suffix (option
`tmp_suffix`) until it is renamed into place.

Verification loads the file with `torch.load(path, weights_only=True, mmap=True)` in a
short-lived subprocess (`python -I`, killed after `verify_timeout_s`), so neither a
malicious pickle nor a huge or hanging file can reach the daemon: the daemon itself never
imports torch and never unpickles anything. The file must hold a dict with the keys in
`required_keys` (default model and optimizer); a `step` (or `iter_num`, `global_step`)
value, when present, must match the step in the name. Files written by the legacy
(non-zip) serializer cannot be memory-mapped and are loaded without mmap, still with
weights_only.

Options (`[checkpoints] options = {...}`): pattern, tmp_suffix, required_keys, step_keys,
verify_timeout_s, python (the interpreter that runs the probe; default: the daemon's own).

torch is an optional dependency (the `trainer` extra): when the format is set up, the
probe interpreter is asked whether it can find torch, so a run configured for torch-pt
without it fails at start with a ConfigError naming the extra, instead of quarantining
every checkpoint it cannot check.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainwarden.plugins.api import CheckpointInfo
from trainwarden.supervisor.errors import CheckpointInvalid, ConfigError

DEFAULT_PATTERN = r"^(?:ckpt|step)[_-](\d+)\.pt$"
DEFAULT_REQUIRED_KEYS = ("model", "optimizer")
DEFAULT_STEP_KEYS = ("step", "iter_num", "global_step")
PROBE_MARK = "TRAINWARDEN_PROBE "
REMEMBERED = 64
INSTALL_TORCH = "pip install 'trainwarden[trainer]'"
TORCH_CHECK_TIMEOUT_S = 20.0
TORCH_MISSING = 3
"""Exit status of TORCH_CHECK when the interpreter cannot find torch."""

# Finds torch without importing it (an import costs seconds): `python -I -c`, as the probe.
TORCH_CHECK = (
    "import importlib.util, sys; "
    f"sys.exit(0 if importlib.util.find_spec('torch') else {TORCH_MISSING})"
)

# Runs in `python -I -c`: no site-packages of the user, no current directory on the path.
PROBE = r"""
import json, sys
path, step_keys = sys.argv[1], json.loads(sys.argv[2])
MARK = "TRAINWARDEN_PROBE "

def say(**fields):
    sys.stdout.write(MARK + json.dumps(fields) + "\n")
    sys.stdout.flush()

def reason(exc):
    lines = [l.strip() for l in str(exc).splitlines() if l.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].startswith("Weights only load failed") and len(lines) > 1:
        return "weights_only refused it: " + lines[1]
    return lines[0]

try:
    import torch
except Exception as exc:
    say(error="cannot import torch in the probe interpreter " + sys.executable + " ("
        + reason(exc) + "): install it with pip install 'trainwarden[trainer]'")
    sys.exit(0)
try:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap can only be used" not in str(exc):
            raise
        obj = torch.load(path, map_location="cpu", weights_only=True)
except Exception as exc:
    say(error=reason(exc))
    sys.exit(0)
if not isinstance(obj, dict):
    say(error="top-level object is a " + type(obj).__name__ + ", expected a dict")
    sys.exit(0)
step = None
for key in step_keys:
    if key in obj:
        value = obj[key]
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int):
            say(error=key + " is " + repr(value)[:60] + ", expected an integer")
            sys.exit(0)
        step = value
        break
n_params = None
model = obj.get("model")
if isinstance(model, dict):
    tensors = [v for v in model.values() if isinstance(v, torch.Tensor)]
    if tensors:
        n_params = sum(t.numel() for t in tensors)
say(keys=sorted(str(k) for k in obj), step=step, n_params=n_params)
"""


def _option(options: Mapping[str, Any], key: str, default: Any, check: Any, expected: str) -> Any:
    value = options.get(key, default)
    if not check(value):
        raise ConfigError(
            f"'checkpoints.options.{key}' = {value!r} is invalid for torch-pt: expected {expected}"
        )
    return value


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)


def _compile_pattern(value: Any) -> re.Pattern[str]:
    expected = (
        "a regular expression with exactly one group for the step, "
        r"for example '^ckpt_(\d+)\.pt$'"
    )
    try:
        compiled = re.compile(value) if isinstance(value, str) else None
    except re.error:
        compiled = None
    if compiled is None or compiled.groups != 1:
        raise ConfigError(
            f"'checkpoints.options.pattern' = {value!r} is invalid for torch-pt: expected {expected}"
        )
    return compiled


class TorchPt:
    """A `torch.save` file per checkpoint, verified with weights_only in a subprocess."""

    name = "torch-pt"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        options.update(options.pop("options", None) or {})
        self.pattern = _compile_pattern(options.get("pattern", DEFAULT_PATTERN))
        self.tmp_suffix: str = _option(
            options, "tmp_suffix", ".tmp", lambda v: isinstance(v, str) and v, "a non-empty string"
        )
        self.required_keys: list[str] = list(
            _option(
                options, "required_keys", DEFAULT_REQUIRED_KEYS, _is_str_list, "a list of strings"
            )
        )
        self.step_keys: list[str] = list(
            _option(options, "step_keys", DEFAULT_STEP_KEYS, _is_str_list, "a list of strings")
        )
        self.verify_timeout_s: float = float(
            _option(
                options,
                "verify_timeout_s",
                120.0,
                lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0,
                "a number of seconds > 0",
            )
        )
        # A probe costs a torch import: remember files that passed, keyed by what a write changes.
        self._passed: dict[Path, tuple[tuple[int, ...], CheckpointInfo]] = {}
        self.python: str = _option(
            options,
            "python",
            sys.executable,
            lambda v: isinstance(v, str) and v,
            "an interpreter path",
        )
        self._require_torch()

    def _require_torch(self) -> None:
        """Raise ConfigError when the probe interpreter has no torch to check files with.

        Only a definite "not found" counts: an interpreter that cannot be started or does
        not answer in time is reported by verify, file by file, as before.
        """
        try:
            done = subprocess.run(
                [self.python, "-I", "-c", TORCH_CHECK],
                capture_output=True,
                timeout=min(self.verify_timeout_s, TORCH_CHECK_TIMEOUT_S),
                cwd="/",
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired):
            return
        if done.returncode == TORCH_MISSING:
            raise ConfigError(
                f"'checkpoints.format' = 'torch-pt' needs torch, which the probe interpreter "
                f"{self.python} cannot import: install it with `{INSTALL_TORCH}` "
                "(or set checkpoints.options.python to an interpreter that has torch)"
            )

    def step_of(self, path: Path) -> int | None:
        match = self.pattern.match(path.name)
        return int(match.group(1)) if match else None

    def is_in_flight(self, path: Path) -> bool:
        name = path.name
        return (
            name.endswith(self.tmp_suffix)
            and self.pattern.match(name[: -len(self.tmp_suffix)]) is not None
        )

    def companions(self, path: Path) -> list[Path]:
        return []

    def verify(self, path: Path) -> CheckpointInfo:
        name_step = self.step_of(path)
        if name_step is None:
            raise CheckpointInvalid(
                f"{path.name}: not a torch-pt checkpoint name ({self.pattern.pattern})"
            )
        try:
            st = path.stat()
        except OSError as exc:
            raise CheckpointInvalid(f"{path.name}: cannot read: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointInvalid(f"{path.name}: not a regular file")
        if st.st_size == 0:
            raise CheckpointInvalid(f"{path.name}: empty file")
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        remembered = self._passed.get(path)
        if remembered is not None and remembered[0] == identity:
            return remembered[1]
        report = self._probe(path)
        if "error" in report:
            raise CheckpointInvalid(f"{path.name}: torch.load failed: {_one_line(report['error'])}")
        missing = [k for k in self.required_keys if k not in report.get("keys", [])]
        if missing:
            raise CheckpointInvalid(
                f"{path.name}: missing required key(s) {', '.join(missing)}; "
                f"it holds {', '.join(report.get('keys', [])) or 'nothing'}"
            )
        step = report.get("step")
        if step is not None and step != name_step:
            raise CheckpointInvalid(
                f"{path.name}: its step value {step} does not match the step {name_step} in the name"
            )
        info = CheckpointInfo(
            step=name_step, path=path, bytes=st.st_size, n_params=report.get("n_params")
        )
        if len(self._passed) >= REMEMBERED:
            self._passed.pop(next(iter(self._passed)))
        self._passed[path] = (identity, info)
        return info

    def _probe(self, path: Path) -> dict[str, Any]:
        argv = [self.python, "-I", "-c", PROBE, str(path), json.dumps(self.step_keys)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                timeout=self.verify_timeout_s,
                cwd="/",
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            # subprocess.run has killed the probe already.
            return {
                "error": f"the probe did not finish within {self.verify_timeout_s:g} s (killed)"
            }
        except OSError as exc:
            return {"error": f"cannot start the probe interpreter {self.python}: {exc.strerror}"}
        for line in reversed(done.stdout.decode(errors="replace").splitlines()):
            if line.startswith(PROBE_MARK):
                try:
                    report = json.loads(line[len(PROBE_MARK) :])
                except ValueError:
                    break
                if isinstance(report, dict):
                    return report
                break
        if done.returncode < 0:
            return {"error": f"the probe died of signal {-done.returncode}"}
        stderr = done.stderr.decode(errors="replace").strip().splitlines()
        return {
            "error": f"the probe exited {done.returncode}: {stderr[-1] if stderr else 'no output'}"
        }


def _one_line(text: Any, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
