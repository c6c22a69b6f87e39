"""The `torch-pt` checkpoint format: one `torch.save` file per checkpoint.

Names like `ckpt_000100.pt` or `step-100.pt` (option `pattern`: a regular expression
whose one group is the step); a write in flight carries a `.tmp` suffix (option
`tmp_suffix`) until it is renamed into place.

Verification loads the file with `torch.load(path, map_location="cpu", weights_only=True,
mmap=True)` in one long-lived worker process per format (`python -I`, its own session, cwd
/, one CPU thread, no GPU), so neither a malicious pickle nor a huge or hanging file can
reach the daemon: the daemon itself never imports torch and never unpickles anything. The
worker is started by the first verification, imports torch once (the second and later
checks cost the load, not the import), and takes one path at a time on its stdin. A check
that outlives `verify_timeout_s` fails ("did not finish ... (killed)") and the worker is
killed; a worker that dies on a file fails that file with its signal or exit status; the
next check starts a fresh one either way. A worker found dead between checks (killed from
outside) costs nothing: the check runs in a fresh one. `close()` ends it; so does the
format being collected, interpreter exit, or the daemon's death (its stdin closes).

The file must hold a dict with the keys in `required_keys` (default model and optimizer);
a `step` (or `iter_num`, `global_step`) value, when present, must match the step in the
name. Files written by the legacy (non-zip) serializer cannot be memory-mapped and are
loaded without mmap, still with weights_only.

Options (`[checkpoints] options = {...}`): pattern, tmp_suffix, required_keys, step_keys,
verify_timeout_s, python (the interpreter that runs the worker; default: the daemon's own),
and preset: "lightning" sets pattern, tmp_suffix, required_keys and step_keys for PyTorch
Lightning's `.ckpt` files (`step=000100.ckpt`, `epoch=0-step=100.ckpt`; `state_dict`,
`optimizer_states`, `loops`; `global_step`), each of them still overridable.

torch is an optional dependency (the `trainer` extra): when the format is set up, the
probe interpreter is asked whether it can find torch, so a run configured for torch-pt
without it fails at start with a ConfigError naming the extra, instead of quarantining
every checkpoint it cannot check.
"""

from __future__ import annotations

import re
import re._constants as sre_constants  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
import stat
import subprocess
import sys
import threading
import weakref
from collections.abc import Mapping
from math import inf
from pathlib import Path
from typing import Any

from trainwarden.plugins.api import CheckpointInfo
from trainwarden.plugins.formats.torch_probe import ProbeWorker
from trainwarden.supervisor.contract import (
    LIGHTNING_CHECKPOINT_PATTERN,
    LIGHTNING_REQUIRED_KEYS,
    LIGHTNING_STEP_KEYS,
    TMP_SUFFIX,
)
from trainwarden.supervisor.errors import CheckpointInvalid, ConfigError

DEFAULT_PATTERN = r"^(?:ckpt|step)[_-](\d+)\.pt$"
DEFAULT_REQUIRED_KEYS = ("model", "optimizer")
DEFAULT_STEP_KEYS = ("step", "iter_num", "global_step")
PRESETS: dict[str, dict[str, Any]] = {
    # What trainwarden.integrations.lightning writes, and ModelCheckpoint's default names.
    "lightning": {
        "pattern": LIGHTNING_CHECKPOINT_PATTERN,
        "tmp_suffix": TMP_SUFFIX,
        "required_keys": list(LIGHTNING_REQUIRED_KEYS),
        "step_keys": list(LIGHTNING_STEP_KEYS),
    },
}
"""Option sets for trainers whose names and keys are known (`options = { preset = "..." }`);
an option given beside the preset wins over the preset's."""
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


def _option(options: Mapping[str, Any], key: str, default: Any, check: Any, expected: str) -> Any:
    value = options.get(key, default)
    if not check(value):
        raise ConfigError(
            f"'checkpoints.options.{key}' = {value!r} is invalid for torch-pt: expected {expected}"
        )
    return value


def _preset(name: Any) -> dict[str, Any]:
    if name is None:
        return {}
    if not isinstance(name, str) or name not in PRESETS:
        known = ", ".join(repr(n) for n in PRESETS)
        raise ConfigError(
            f"'checkpoints.options.preset' = {name!r} is invalid for torch-pt: expected one of "
            f'{known}, for example options = {{ preset = "lightning" }}'
        )
    return PRESETS[name]


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
    if not _step_group_is_digits(sre_parse.parse(compiled.pattern)):
        raise ConfigError(
            f"'checkpoints.options.pattern' = {value!r} is invalid for torch-pt: its group can "
            r"match something other than digits (or nothing), expected a group such as (\d+) "
            rf"or ([0-9]{{6}}), for example '^ckpt_(\d+)\.pt$'"
        )
    return compiled


_DIGIT_ITEMS = {sre_constants.CATEGORY_DIGIT}


def _digit_set(items: list[Any]) -> bool:
    """An [...] set that holds only ASCII digits (or \\d)."""
    for op, arg in items:
        if op is sre_constants.LITERAL and chr(arg).isdigit():
            continue
        if op is sre_constants.RANGE and chr(arg[0]).isdigit() and chr(arg[1]).isdigit():
            continue
        if op is sre_constants.CATEGORY and arg in _DIGIT_ITEMS:
            continue
        return False
    return True


def _step_group_is_digits(items: Any) -> bool:
    """Whether the step group (group 1) of a parsed pattern matches one or more digits and
    nothing else; outside the group anything goes."""
    for op, arg in items:
        if op is sre_constants.SUBPATTERN:
            ok = _digits_only(arg[3]) if arg[0] == 1 else _step_group_is_digits(arg[3])
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            ok = _step_group_is_digits(arg[2])
        elif op is sre_constants.BRANCH:
            ok = all(_step_group_is_digits(branch) for branch in arg[1])
        else:
            ok = True
        if not ok:
            return False
    return True


def _digits_only(items: Any) -> bool:
    """Every string `items` matches is a non-empty run of digits."""
    if not items:
        return False
    for op, arg in items:
        if op is sre_constants.LITERAL:
            ok = chr(arg).isdigit()
        elif op is sre_constants.IN:
            ok = _digit_set(arg)
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            ok = arg[0] >= 1 and _digits_only(arg[2])
        elif op is sre_constants.SUBPATTERN:
            ok = _digits_only(arg[3])
        elif op is sre_constants.BRANCH:
            ok = all(_digits_only(branch) for branch in arg[1])
        else:
            ok = False
        if not ok:
            return False
    return True


class TorchPt:
    """A `torch.save` file per checkpoint, verified with weights_only in a worker process."""

    name = "torch-pt"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        options.update(options.pop("options", None) or {})
        options = {**_preset(options.pop("preset", None)), **options}
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
                lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < inf,
                "a finite number of seconds > 0",
            )
        )
        # A check costs a load: remember files that passed, keyed by what a write changes.
        self._passed: dict[Path, tuple[tuple[int, ...], CheckpointInfo]] = {}
        self.python: str = _option(
            options,
            "python",
            sys.executable,
            lambda v: isinstance(v, str) and v,
            "an interpreter path",
        )
        self._require_torch()
        self._cache_lock = threading.Lock()
        self._verifier = ProbeWorker()
        # Ends the worker when this format is collected, or at interpreter exit.
        weakref.finalize(self, self._verifier.close)

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
        digits = match.group(1) if match else None
        # The pattern's group was checked to match digits only; an ASCII check still keeps
        # an odd name (a group that matched nothing) from raising in int().
        return int(digits) if digits and digits.isascii() and digits.isdigit() else None

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
        with self._cache_lock:
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
        with self._cache_lock:
            if len(self._passed) >= REMEMBERED:
                self._passed.pop(next(iter(self._passed)))
            self._passed[path] = (identity, info)
        return info

    def step_in(self, path: Path, key: str) -> int:
        """The step a checkpoint holds under `key` (its name aside), read by the worker:
        what `[checkpoints] step_key` asks of a file written under a fixed name."""
        report = self._verifier.check(
            path, python=self.python, step_keys=[key], timeout_s=self.verify_timeout_s
        )
        if "error" in report:
            raise CheckpointInvalid(f"torch.load failed: {_one_line(report['error'])}")
        if report.get("step") is None:
            raise CheckpointInvalid(
                f"no {key} in it; it holds {', '.join(report.get('keys', [])) or 'nothing'}"
            )
        return int(report["step"])

    def _probe(self, path: Path) -> dict[str, Any]:
        return self._verifier.check(
            path, python=self.python, step_keys=self.step_keys, timeout_s=self.verify_timeout_s
        )

    @property
    def worker_pid(self) -> int | None:
        """The pid of the running verifier worker, None before the first verify or after close."""
        return self._verifier.pid

    def close(self) -> None:
        """End the verifier worker (a later verify starts a new one)."""
        self._verifier.close()


def _one_line(text: Any, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
