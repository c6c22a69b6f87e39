"""The run's configuration: `RUN/trainwarden.toml`, one frozen dataclass per table.

Every field carries a one-line docstring (read by `trainwarden init` and the README's
config reference). Loading validates types and ranges and names the file, the key,
the bad value and what would be valid; a typo gets the nearest known key suggested.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import math
import os
import re
import shutil
import stat
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomli_w

from trainwarden.supervisor.contract import (
    BANDIT_STATE_FILE,
    POLICY_FILE,
    SAMPLES_FILE,
    SUPPORTS,
)
from trainwarden.supervisor.core.alerts import EVENTS as ALERT_EVENTS
from trainwarden.supervisor.errors import ConfigError
from trainwarden.supervisor.registry import check_installed
from trainwarden.supervisor.run_layout import EVAL_HISTORY, LOSS_HISTORY, STATE_DIR

CONFIG_NAME = "trainwarden.toml"

RUN_NAME_MAX = 200
"""Longest run.name accepted, in characters: it heads every status line and TUI screen."""
MAX_COUNT = 2**31 - 1
"""The largest integer a key may hold (a step's bound, contract.MAX_STEP), but for BIG_KEYS."""
BIG_KEYS = {"telemetry.n_params": 2**53, "telemetry.tokens_per_step": 2**53}
MAX_SECONDS = 1e7
"""The longest time a `*_s` key may give (about 115 days)."""


@dataclass(frozen=True)
class RunConfig:
    name: str = "run"
    """Display name of the run (TUI header, journal)."""
    log: str = "training.log"
    """Trainer stdout+stderr, relative to the run directory; appended, never truncated."""


@dataclass(frozen=True)
class TrainerConfig:
    command: list[str] = field(default_factory=list)
    """The trainer's argv, run in [trainer] cwd (required)."""
    cwd: str = "."
    """The trainer's working directory; a relative path is relative to the run directory."""
    resume_args: list[str] = field(default_factory=list)
    """Appended to command when resuming; {checkpoint} and {step} are substituted."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the trainer."""
    stop_timeout_s: float = 120.0
    """Seconds a stopping trainer gets to save and exit before SIGKILL."""
    save_wait_timeout_s: float = 600.0
    """Seconds a waiting save (save --wait, a pivot's save) waits for its checkpoint at
    most; a request's timeout_s may not exceed it."""
    total_steps: int | None = None
    """Planned number of steps (ETA and progress); optional."""
    signal_target: Literal["group", "main", "children"] = "group"
    """Who gets SIGUSR1/SIGTERM: the whole process group, the main process, or its children."""
    supports: list[str] = field(default_factory=list)
    """Optional contract items the trainer honours: "skip_data", "lr_scale" (spike rollbacks)."""


@dataclass(frozen=True)
class CheckpointsConfig:
    dir: str = "checkpoints"
    """Checkpoint directory, relative to the run directory."""
    format: str = "andrea-bin"
    """Checkpoint format plugin (entry point group trainwarden.formats)."""
    keep_last: int = 3
    """How many newest verified, unpinned checkpoints retention keeps (>= 1)."""
    pinned: list[int] = field(default_factory=list)
    """Steps whose checkpoints retention never deletes."""
    options: dict[str, str | int | float | bool | list[str]] = field(default_factory=dict)
    """Options for the format plugin (docs/formats.md, "Other checkpoint formats")."""
    max_step_jump: int | None = None
    """Steps a commit may lie beyond the newest logged step (unset: 10 x the largest gap)."""
    fixed: str | None = None
    """A file the trainer overwrites in place (nanoGPT's "ckpt.pt"), inside the checkpoint
    directory: each verified version is copied to a step-named snapshot the daemon owns."""
    fixed_commit_file: str | None = None
    """Set when fixed is a FOLDER written in place: the file in it the trainer writes last
    ("trainer_state.json"), whose close commits a version of the folder."""
    step_key: str | None = None
    """With fixed: the key in the checkpoint that holds its step ("iter_num"; torch-pt), or
    with fixed_commit_file, the top-level key of that JSON file ("global_step")."""
    step_regex: str | None = None
    """With fixed: a regular expression whose one group of digits is the step, searched in
    the file's (with fixed_commit_file: that file's) first MiB."""


@dataclass(frozen=True)
class RestartConfig:
    backoff_initial_s: float = 5.0
    """First delay before restarting a crashed trainer, seconds (0 restarts at once)."""
    backoff_max_s: float = 300.0
    """Upper bound of the doubling restart delay, seconds."""
    max_restarts_without_progress: int = 5
    """Restarts in a row without a new checkpoint before halting in crash_loop."""
    stall_timeout_s: float = 600.0
    """Seconds without a step line (and no checkpoint being written) that count as a hang."""
    dump_timeout_s: float = 10.0
    """Seconds a hang's stack dump (py-spy) may take before the trainer is stopped (0: no
    dump, the stop comes at once)."""
    py_spy: str | None = None
    """The py-spy binary for stack dumps (unset: the one beside the daemon's Python, else
    the one on PATH)."""
    divergence_retries: int = 1
    """Rollbacks allowed for a recurring divergence before halting in diverged."""
    suspect_window_steps: int = 10
    """Steps after resuming from a checkpoint within which a divergence makes it suspect."""
    max_fallbacks: int = 3
    """Suspect checkpoints abandoned in a row for older ones before halting in diverged."""


@dataclass(frozen=True)
class DivergenceConfig:
    spikes: bool = True
    """Handle loss spikes: roll back before one, skip its data, at most max_rollbacks times."""
    spike_factor: float = 2.0
    """A loss above this many times the loss EMA is above the spike threshold (> 1)."""
    spike_window: int = 200
    """Steps the loss EMA spans; also the steps a rollback's loss must stay below the
    threshold, past the spike, to count as cured."""
    spike_patience: int = 5
    """Consecutive steps above the threshold that make a spike; fewer are an outlier, noted."""
    spike_warmup: int = 50
    """Steps at the start of each trainer start in which no spike is detected."""
    grad_norm_factor: float | None = None
    """A `grad_norm` extra above this many times its EMA is above the threshold too (unset: off)."""
    rollback_steps: int = 100
    """A rollback resumes from the newest verified checkpoint at least this many steps
    before the spike's first step."""
    skip_extra: int = 200
    """Steps of data skipped beyond the spike's last step (trainers that support skip_data)."""
    lr_scale: float = 1.0
    """Factor on the learning rate at each rollback (trainers that support lr_scale)."""
    max_rollbacks: int = 3
    """Rollbacks allowed within rollback_horizon steps; one more spike halts in diverged."""
    rollback_horizon: int = 5000
    """Steps over which rollbacks are counted against max_rollbacks."""


@dataclass(frozen=True)
class TelemetryConfig:
    parser: str = "step-line"
    """Log parser plugin (entry point group trainwarden.parsers)."""
    max_loss: float = 20.0
    """A loss above this counts as a divergence, like a non-finite one."""
    window: int = 20
    """Steps in the rolling window for tokens/s and the loss moving average."""
    tokens_per_step: int | None = None
    """Tokens processed per optimisation step (batch x sequence length x accumulation)."""
    n_params: int | Literal["auto"] | None = None
    """Model parameters N for MFU; "auto" reads it from the newest checkpoint header."""
    peak_tflops: float | Literal["auto"] = "auto"
    """Accelerator peak dense TFLOP/s; "auto" looks up the GPU's NVML name."""
    attention: dict[str, int] = field(default_factory=dict)
    """{n_layer, seq_len, d_model} to add the attention FLOPs to 6N."""
    vocab_size: int | None = None
    """Vocabulary size V; ln(V) is shown as the collapse reference."""
    resume_tolerance: float = 0.0
    """Largest |difference| of replayed losses that still counts as an exact resume."""
    logging_steps: int = 1
    """For the hf-trainer parser: steps between logged lines without a step."""
    ema_beta: float = 0.98
    """Smoothing of the loss EMA."""
    sample_interval_s: float = 2.0
    """Seconds between GPU and host samples (and reads of .state.json and .samples.json)."""


@dataclass(frozen=True)
class ControlConfig:
    socket: str = ".trainwarden/control.sock"
    """Control socket path, relative to the run directory."""
    allow_uids: list[int] = field(default_factory=list)
    """Other user ids allowed to connect (the daemon's own uid always is); needs group."""
    group: str | int | None = None
    """Group (name or gid) given the socket and its folder so that allow_uids can reach them."""
    max_clients: int = 64
    """Connections the other allowed uids may hold together; the daemon's own uid has as many
    again of its own, so others can never lock it out (over either limit: a `busy` reply)."""
    slow_client_s: float = 10.0
    """Seconds a client may leave its replies and pushes unread before it is dropped."""
    daemon_user: str | int | None = None
    """For clients of another user: the user (name or uid) the daemon runs as. A client
    trusts a socket served by itself or root, and by this user only when named here or
    with --daemon-user."""


@dataclass(frozen=True)
class MirrorConfig:
    path: str | None = None
    """Absolute folder, on another disk, keeping a verified copy of each checkpoint (unset: off)."""
    keep_last: int = 3
    """Mirrored checkpoints the mirror keeps (>= 1); the one its latest.json names always stays."""


@dataclass(frozen=True)
class MetricsConfig:
    listen: str | None = None
    """HOST:PORT serving Prometheus metrics at /metrics, e.g. "127.0.0.1:9108" (unset: off)."""
    allow_remote: bool = False
    """Allow a listen address other than loopback (the figures are then open to the network)."""


@dataclass(frozen=True)
class AlertsConfig:
    urls: list[str] = field(default_factory=list)
    """Apprise URLs alerts are sent to ("ntfy://topic", "mailto://...", "json://host/path");
    secrets: shown masked everywhere."""
    command: list[str] = field(default_factory=list)
    """argv run for each alert with the alert as JSON on stdin (unset: none)."""
    on: list[str] = field(default_factory=lambda: list(ALERT_EVENTS))
    """Events alerted: halted, finished, disk, gpu_fault, gpu_throttle, restarts, rollback,
    resume_drift, hang, unclean_start (default: all)."""
    min_interval_s: float = 600.0
    """Seconds within which the same alert is not sent again."""
    restarts_per_hour: int = 5
    """Crashes within an hour beyond which a `restarts` alert is sent."""
    timeout_s: float = 10.0
    """Seconds one send (one URL, or the command) may take."""
    retries: int = 2
    """Further tries of a failed send, a few seconds apart."""


@dataclass(frozen=True)
class GpuConfig:
    devices: list[int] | None = None
    """NVML indices of the GPUs this run trains on: faults on others are journaled only
    (unset: all)."""
    reset: bool = False
    """After a reset-class XID, reset the GPU (nvidia-smi -r, needs root) and resume, instead
    of halting in gpu_fault."""
    idle_timeout_s: float = 60.0
    """Seconds a GPU fault waits for every process to let go of the GPU before halting or
    resetting."""
    throttle_after_s: float = 60.0
    """Seconds of thermal, power-brake or hardware slowdown before it is journaled as
    gpu_throttle."""


@dataclass(frozen=True)
class Config:
    run_dir: Path
    path: Path
    run: RunConfig = field(default_factory=RunConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)
    restart: RestartConfig = field(default_factory=RestartConfig)
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    mirror: MirrorConfig = field(default_factory=MirrorConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)

    @property
    def log_path(self) -> Path:
        return self.run_dir / self.run.log

    @property
    def trainer_cwd(self) -> Path:
        """The folder the trainer starts in ([trainer] cwd, resolved against the run dir)."""
        return self.run_dir / Path(self.trainer.cwd).expanduser()

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / self.checkpoints.dir

    @property
    def socket_path(self) -> Path:
        return self.run_dir / self.control.socket


TABLES: dict[str, type] = {
    "run": RunConfig,
    "trainer": TrainerConfig,
    "checkpoints": CheckpointsConfig,
    "restart": RestartConfig,
    "divergence": DivergenceConfig,
    "telemetry": TelemetryConfig,
    "control": ControlConfig,
    "mirror": MirrorConfig,
    "metrics": MetricsConfig,
    "alerts": AlertsConfig,
    "gpu": GpuConfig,
}

SECRET_KEYS = frozenset({"alerts.urls"})
"""Keys whose values an error never shows."""


def field_docs(cls: type) -> dict[str, str]:
    """The one-line docstrings under each field, read from the source."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, following in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
        ):
            docs[node.target.id] = str(following.value.value)
    return docs


def _nearest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"a table of {_describe(typing.get_args(tp)[1])}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, str(tp)
    )


def _matches(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        _, item = typing.get_args(tp)
        return isinstance(value, dict) and all(_matches(v, item) for v in value.values())
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _build_table(path: Path, table: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: [{table}] must be a table, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError(
                f"{path}: unknown key '{table}.{key}'{_nearest(key, names)}; "
                f"known keys in [{table}]: {', '.join(names)}"
            )
        if not _matches(value, hints[key]):
            shown = "(hidden)" if f"{table}.{key}" in SECRET_KEYS else repr(value)
            raise ConfigError(
                f"{path}: '{table}.{key}' = {shown} is invalid: expected {_describe(hints[key])}"
            )
        values[key] = float(value) if hints[key] is float else value
    return cls(**values)


def toml_value(value: Any) -> str:
    """`value` as TOML on one line, arrays and tables inline, for a file laid out by hand
    or a setting quoted in a message: every string, number and date as tomli_w writes it."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return tomli_w.dumps({"v": value}).removeprefix("v = ").removesuffix("\n")


def toml_key(name: str) -> str:
    """`name` as a TOML key: bare when it can be, else a string as tomli_w writes it."""
    return tomli_w.dumps({name: 0}).removesuffix(" = 0\n")


RENAMED_MODULES = {"trainer": "trainwarden.trainer"}
"""Old module names of the reference trainer that a config may still run with `-m`."""


def _renamed_module(cwd: Path, command: list[str]) -> tuple[int, str, str] | None:
    """(index, old, new) of the first `-m OLD` argument that names a renamed module, unless
    the trainer's working directory holds a module of that name of its own (`-m` would find
    it there)."""
    for i, arg in enumerate(command):
        if arg == "-m" and i + 1 < len(command):
            index, module = i + 1, command[i + 1]
        elif arg.startswith("-m") and len(arg) > 2 and not arg.startswith("--"):
            index, module = i, arg[2:]
        else:
            continue
        top, _, rest = module.partition(".")
        if top not in RENAMED_MODULES:
            continue
        if (cwd / f"{top}.py").exists() or (cwd / top).is_dir():
            return None
        new = RENAMED_MODULES[top] + (f".{rest}" if rest else "")
        return index, module, new
    return None


def check_trainer_command(cfg: Config) -> None:
    """Raise ConfigError if the trainer command runs `-m` a module that has been renamed
    (RENAMED_MODULES), suggesting the command with its new name."""
    path = cfg.path
    command = cfg.trainer.command
    renamed = _renamed_module(cfg.trainer_cwd, command)
    if renamed is None:
        return
    index, old, new = renamed
    fixed = [*command]
    fixed[index] = new if command[index] == old else f"-m{new}"
    raise ConfigError(
        f"{path}: 'trainer.command' runs `-m {old}`, a module that is now called {new}: "
        f"write command = {toml_value(fixed)} (or run the `trainwarden-trainer` script)"
    )


LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
"""Host names that are loopback without a lookup (`[metrics] listen`)."""


def parse_listen(listen: str, *, allow_remote: bool = False, source: str = "") -> tuple[str, int]:
    """(host, port) from "HOST:PORT" or "[V6]:PORT"; ConfigError naming the key if invalid
    or if it is not a loopback address and remote access was not allowed."""
    where = f"{source}: " if source else ""
    example = 'for example listen = "127.0.0.1:9108"'
    host, sep, port_text = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(
            f"{where}'metrics.listen' = {listen!r} is invalid: expected HOST:PORT, {example}"
        )
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host.lower() in LOCAL_NAMES
    if not loopback and not allow_remote:
        raise ConfigError(
            f"{where}'metrics.listen' = {listen!r} serves beyond this machine: set "
            f"'metrics.allow_remote' = true to allow that, or listen on 127.0.0.1:{port_text}"
        )
    return host, int(port_text)


def _check_ranges(path: Path, cfg: Config) -> None:
    def bad(key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{path}: '{key}' = {value!r} is invalid: expected {expected}")

    if not cfg.trainer.command:
        raise ConfigError(
            f"{path}: '[trainer] command' is missing: give the trainer's argv, for example "
            'command = ["python", "-m", "trainwarden.trainer", "--run-dir", "."]'
        )
    if not cfg.trainer.command[0]:
        raise bad(
            "trainer.command",
            cfg.trainer.command,
            'a program as its first item, for example command = ["python", "train.py"]',
        )
    if cfg.control.max_clients < 1:
        raise bad("control.max_clients", cfg.control.max_clients, "an integer >= 1")
    if not 0 < cfg.control.slow_client_s < float("inf"):
        raise bad("control.slow_client_s", cfg.control.slow_client_s, "a finite number > 0")
    if cfg.checkpoints.keep_last < 1:
        raise bad("checkpoints.keep_last", cfg.checkpoints.keep_last, "an integer >= 1")
    # Comparisons written so that nan fails them too: a nan deadline never comes due and
    # never expires, and the daemon's loop would spin on it.
    for key in ("backoff_initial_s", "backoff_max_s"):
        if not getattr(cfg.restart, key) >= 0:
            raise bad(f"restart.{key}", getattr(cfg.restart, key), "a number >= 0")
    if cfg.restart.backoff_max_s < cfg.restart.backoff_initial_s:
        raise bad(
            "restart.backoff_max_s",
            cfg.restart.backoff_max_s,
            f"a number >= restart.backoff_initial_s ({cfg.restart.backoff_initial_s})",
        )
    if cfg.restart.max_restarts_without_progress < 1:
        raise bad(
            "restart.max_restarts_without_progress",
            cfg.restart.max_restarts_without_progress,
            "an integer >= 1",
        )
    if not cfg.restart.stall_timeout_s > 0:
        raise bad("restart.stall_timeout_s", cfg.restart.stall_timeout_s, "a number > 0")
    if not cfg.restart.dump_timeout_s >= 0:
        raise bad(
            "restart.dump_timeout_s", cfg.restart.dump_timeout_s, "a number >= 0 (0: no dump)"
        )
    for key in ("idle_timeout_s", "throttle_after_s"):
        if not getattr(cfg.gpu, key) > 0:
            raise bad(f"gpu.{key}", getattr(cfg.gpu, key), "a number > 0")
    if cfg.restart.divergence_retries < 0:
        raise bad("restart.divergence_retries", cfg.restart.divergence_retries, "an integer >= 0")
    if cfg.restart.suspect_window_steps < 1:
        raise bad(
            "restart.suspect_window_steps", cfg.restart.suspect_window_steps, "an integer >= 1"
        )
    if cfg.restart.max_fallbacks < 0:
        raise bad("restart.max_fallbacks", cfg.restart.max_fallbacks, "an integer >= 0")
    if cfg.checkpoints.max_step_jump is not None and cfg.checkpoints.max_step_jump < 1:
        raise bad(
            "checkpoints.max_step_jump",
            cfg.checkpoints.max_step_jump,
            "an integer >= 1 (or leave it unset for 10 x the largest gap between commits)",
        )
    if not cfg.trainer.stop_timeout_s > 0:
        raise bad("trainer.stop_timeout_s", cfg.trainer.stop_timeout_s, "a number > 0")
    if not cfg.trainer.save_wait_timeout_s > 0:
        raise bad("trainer.save_wait_timeout_s", cfg.trainer.save_wait_timeout_s, "a number > 0")
    if cfg.trainer.total_steps is not None and cfg.trainer.total_steps < 1:
        raise bad("trainer.total_steps", cfg.trainer.total_steps, "an integer >= 1")
    if not cfg.telemetry.max_loss > 0:
        raise bad("telemetry.max_loss", cfg.telemetry.max_loss, "a number > 0")
    peak = cfg.telemetry.peak_tflops
    if not isinstance(peak, str) and not peak > 0:
        raise bad("telemetry.peak_tflops", peak, 'a number > 0 (TFLOP/s) or "auto"')
    if cfg.telemetry.window < 1:
        raise bad("telemetry.window", cfg.telemetry.window, "an integer >= 1")
    if not 0 < cfg.telemetry.ema_beta < 1:
        raise bad("telemetry.ema_beta", cfg.telemetry.ema_beta, "a number between 0 and 1")
    if not 0 < cfg.telemetry.sample_interval_s < float("inf"):
        raise bad(
            "telemetry.sample_interval_s", cfg.telemetry.sample_interval_s, "a finite number > 0"
        )
    if cfg.telemetry.logging_steps < 1:
        raise bad("telemetry.logging_steps", cfg.telemetry.logging_steps, "an integer >= 1")
    attention_keys = {"n_layer", "seq_len", "d_model"}
    if cfg.telemetry.attention and set(cfg.telemetry.attention) != attention_keys:
        raise bad(
            "telemetry.attention",
            cfg.telemetry.attention,
            "a table with exactly n_layer, seq_len and d_model, "
            "for example { n_layer = 12, seq_len = 1024, d_model = 768 }",
        )
    if cfg.mirror.path is not None:
        mirror = Path(cfg.mirror.path).expanduser()
        if not mirror.is_absolute():
            raise bad(
                "mirror.path",
                cfg.mirror.path,
                'an absolute path, for example path = "/mnt/backup/run"',
            )
        if mirror.resolve() == cfg.run_dir or cfg.run_dir in mirror.resolve().parents:
            raise bad(
                "mirror.path",
                cfg.mirror.path,
                "a folder outside the run directory, on another disk",
            )
    if cfg.mirror.keep_last < 1:
        raise bad("mirror.keep_last", cfg.mirror.keep_last, "an integer >= 1")
    if cfg.metrics.listen is not None:
        parse_listen(cfg.metrics.listen, allow_remote=cfg.metrics.allow_remote, source=str(path))
    named = {
        "run.log": cfg.run.log,
        "checkpoints.dir": cfg.checkpoints.dir,
        "control.socket": cfg.control.socket,
        "mirror.path": cfg.mirror.path or "",
        "trainer.cwd": cfg.trainer.cwd,
    }
    for key, value in named.items():
        if "\0" in value:
            raise bad(key, value, "a path; it contains a NUL byte, which no path can hold")
    for rel, key in ((cfg.run.log, "run.log"), (cfg.checkpoints.dir, "checkpoints.dir")):
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise bad(key, rel, "a path inside the run directory")
    _check_counts(path, cfg)
    _check_paths(path, cfg)
    _check_numbers(path, cfg)
    _check_divergence(path, cfg)
    _check_alerts(path, cfg)


def _check_divergence(path: Path, cfg: Config) -> None:
    """[divergence]'s spike settings, and the contract items [trainer] supports names."""
    unknown = [item for item in cfg.trainer.supports if item not in SUPPORTS]
    if unknown:
        raise _bad(
            path,
            "trainer.supports",
            cfg.trainer.supports,
            f"a list of {', '.join(repr(s) for s in SUPPORTS)}; {unknown[0]!r} is none of them",
        )
    div = cfg.divergence
    if not div.spike_factor > 1:
        raise _bad(path, "divergence.spike_factor", div.spike_factor, "a number > 1, like 2.0")
    if div.grad_norm_factor is not None and not div.grad_norm_factor > 1:
        raise _bad(
            path, "divergence.grad_norm_factor", div.grad_norm_factor, "a number > 1, or unset"
        )
    if not 0 < div.lr_scale <= 1:
        raise _bad(path, "divergence.lr_scale", div.lr_scale, "a number in (0, 1], like 0.9")
    at_least = {
        "spike_window": (div.spike_window, 1),
        "spike_patience": (div.spike_patience, 1),
        "spike_warmup": (div.spike_warmup, 0),
        "rollback_steps": (div.rollback_steps, 1),
        "skip_extra": (div.skip_extra, 0),
        "max_rollbacks": (div.max_rollbacks, 0),
        "rollback_horizon": (div.rollback_horizon, 1),
    }
    for key, (value, low) in at_least.items():
        if value < low:
            raise _bad(path, f"divergence.{key}", value, f"an integer >= {low}")


def _check_alerts(path: Path, cfg: Config) -> None:
    """[alerts]: URLs are checked for shape only and never shown (they hold tokens)."""
    alerts = cfg.alerts
    for i, url in enumerate(alerts.urls):
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://\S+", url):
            raise ConfigError(
                f"{path}: 'alerts.urls' item {i + 1} (hidden) is not an apprise URL: "
                'expected scheme://..., for example "ntfy://my-topic" or "json://host:port/path"'
            )
    if alerts.command and not alerts.command[0]:
        raise _bad(path, "alerts.command", alerts.command, 'a program first, e.g. ["notify.sh"]')
    for name in alerts.on:
        if name not in ALERT_EVENTS:
            raise ConfigError(
                f"{path}: 'alerts.on' names {name!r}{_nearest(name, list(ALERT_EVENTS))}; "
                f"known events: {', '.join(ALERT_EVENTS)}"
            )
    if not alerts.min_interval_s >= 0:
        raise _bad(path, "alerts.min_interval_s", alerts.min_interval_s, "a number >= 0")
    if alerts.restarts_per_hour < 1:
        raise _bad(path, "alerts.restarts_per_hour", alerts.restarts_per_hour, "an integer >= 1")
    if not alerts.timeout_s > 0:
        raise _bad(path, "alerts.timeout_s", alerts.timeout_s, "a number of seconds > 0")
    if not 0 <= alerts.retries <= 10:
        raise _bad(path, "alerts.retries", alerts.retries, "an integer from 0 to 10")


def _check_numbers(path: Path, cfg: Config) -> None:
    """Any number the checks above let through (in a list or table too) must still be
    finite, no count beyond MAX_COUNT and no time beyond MAX_SECONDS: inf and nan are TOML
    numbers but no deadline, bound or rate (an infinite timeout never expires, a nan one
    neither expires nor comes due), no step or window reaches 2^31, and a bound of 1e308 s
    would overflow every deadline computed from it."""
    for table in TABLES:
        values = getattr(cfg, table)
        for f in dataclasses.fields(values):
            key, value = f"{table}.{f.name}", getattr(values, f.name)
            if key == "checkpoints.options":
                continue  # the format plugin's own, checked by it (check_installed)
            held = list(value.values()) if isinstance(value, dict) else value
            for number in held if isinstance(held, list) else [held]:
                if isinstance(number, bool) or not isinstance(number, int | float):
                    continue
                if isinstance(number, float) and not math.isfinite(number):
                    raise _bad(path, key, number, "a finite number")
                limit = BIG_KEYS.get(key, MAX_COUNT)
                if isinstance(number, int) and abs(number) > limit:
                    raise _bad(path, key, _shown(number), f"an integer of at most {limit:,}")
                if f.name.endswith("_s") and abs(number) > MAX_SECONDS:
                    expected = f"a number of seconds up to {MAX_SECONDS:,.0f} (about 115 days)"
                    raise _bad(path, key, number, expected)


def _shown(number: int) -> int | str:
    """A number as an error shows it: a long one by its length."""
    text = str(number)
    return number if len(text) <= 30 else f"{text[:12]}... ({len(text)} digits)"


def too_long(exc: ValueError) -> str:
    """The one line for a TOML number Python refuses to convert (past 4,300 digits)."""
    if "digits" in str(exc):
        return (
            "not valid TOML: an integer of more than 4,300 digits; give a value in the key's range"
        )
    return f"not valid TOML: {exc}"


def _bad(path: Path, key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{path}: '{key}' = {value!r} is invalid: expected {expected}")


def _check_counts(path: Path, cfg: Config) -> None:
    """Sizes and counts that a run cannot have zero or fewer of, and the run's name."""
    name = cfg.run.name
    if not name.strip() or len(name) > RUN_NAME_MAX:
        shown = name if len(name) <= 60 else f"{name[:40]}... ({len(name)} characters)"
        raise _bad(path, "run.name", shown, f"a name of 1 to {RUN_NAME_MAX} characters")
    telemetry = cfg.telemetry
    counts = {
        "telemetry.tokens_per_step": telemetry.tokens_per_step,
        "telemetry.n_params": telemetry.n_params,
        "telemetry.vocab_size": telemetry.vocab_size,
    }
    for key, value in counts.items():
        if isinstance(value, int) and value < 1:
            also = ' (or "auto" to read it from the checkpoint header)' if "n_params" in key else ""
            raise _bad(path, key, value, f"an integer >= 1{also}, or leave it unset")
    for key, value in telemetry.attention.items():
        if value < 1:
            raise _bad(path, f"telemetry.attention.{key}", value, "an integer >= 1")
    if not telemetry.resume_tolerance >= 0:
        raise _bad(path, "telemetry.resume_tolerance", telemetry.resume_tolerance, "a number >= 0")
    negative = [step for step in cfg.checkpoints.pinned if step < 0]
    if negative:
        raise _bad(path, "checkpoints.pinned", cfg.checkpoints.pinned, "a list of steps >= 0")
    _check_fixed(path, cfg)


def _check_fixed(path: Path, cfg: Config) -> None:
    """[checkpoints] fixed names one plain file in the checkpoint directory, and exactly
    one of step_key and step_regex says where its step is."""
    ckpts = cfg.checkpoints
    if ckpts.fixed is None:
        for key in ("step_key", "step_regex", "fixed_commit_file"):
            if getattr(ckpts, key) is not None:
                raise _bad(
                    path,
                    f"checkpoints.{key}",
                    getattr(ckpts, key),
                    'nothing unless [checkpoints] fixed is set, for example fixed = "ckpt.pt"',
                )
        return
    name = ckpts.fixed
    if not name or "/" in name or name in (".", "..") or "\x00" in name or name == "quarantine":
        raise _bad(
            path,
            "checkpoints.fixed",
            name,
            'the name of one file directly in the checkpoint directory, for example fixed = "ckpt.pt"',
        )
    commit = ckpts.fixed_commit_file
    if commit is not None and (
        not commit or "/" in commit or commit in (".", "..") or "\x00" in commit
    ):
        raise _bad(
            path,
            "checkpoints.fixed_commit_file",
            commit,
            "the name of the file directly in the fixed folder that the trainer writes last, "
            'for example fixed_commit_file = "trainer_state.json"',
        )
    if (ckpts.step_key is None) == (ckpts.step_regex is None):
        raise _bad(
            path,
            "checkpoints.fixed",
            name,
            'one of step_key (torch-pt, for example step_key = "iter_num") or step_regex '
            "(a pattern on the file's contents) beside it",
        )
    if ckpts.step_key is not None and not ckpts.step_key:
        raise _bad(path, "checkpoints.step_key", ckpts.step_key, 'a key, for example "iter_num"')
    if ckpts.step_regex is not None:
        try:
            groups = re.compile(ckpts.step_regex.encode()).groups
        except re.error:
            groups = -1
        if groups != 1:
            raise _bad(
                path,
                "checkpoints.step_regex",
                ckpts.step_regex,
                r"a regular expression with exactly one group for the step, for example "
                r"'step=(\d+)'",
            )


FOLDERS_OWNED = frozenset(
    {"the daemon's own folder", "the pivot archive", "the mirror", "the checkpoint folder"}
)


def _owned_by_the_daemon(cfg: Config) -> dict[Path, str]:
    """The paths the daemon (or the trainer, for its sidecars) writes, resolved, and what
    each is: the run log may name none of them (nor anything inside the folders among
    them, FOLDERS_OWNED)."""
    run_dir = cfg.run_dir
    owned = {
        cfg.path: "the config file",
        run_dir / STATE_DIR: "the daemon's own folder",
        run_dir / LOSS_HISTORY: "the loss history",
        run_dir / EVAL_HISTORY: "the validation history",
        run_dir / BANDIT_STATE_FILE: "the trainer's bandit state",
        run_dir / SAMPLES_FILE: "the trainer's samples",
        run_dir / POLICY_FILE: "the data policy",
        run_dir / "archive": "the pivot archive",
        cfg.socket_path: "the control socket",
        cfg.checkpoint_dir: "the checkpoint folder",
    }
    if cfg.mirror.path is not None:
        owned[Path(cfg.mirror.path).expanduser()] = "the mirror"
    return {Path(os.path.realpath(p)): what for p, what in owned.items()}


def _check_checkpoint_place(path: Path, cfg: Config) -> None:
    """The checkpoint folder holds checkpoints only: never the run directory itself, nor
    the daemon's folder, the pivot archive or the mirror, nor a
    folder inside one of them (quarantine and deletion act on what it holds)."""
    ckpt = Path(os.path.realpath(cfg.checkpoint_dir))
    run_dir = Path(os.path.realpath(cfg.run_dir))
    example = 'for example dir = "checkpoints"'
    if ckpt == run_dir:
        raise _bad(
            path,
            "checkpoints.dir",
            cfg.checkpoints.dir,
            f"a folder of checkpoints only, but it names the run directory: {example}",
        )
    owned = {
        cfg.run_dir / STATE_DIR: "the daemon's own folder",
        cfg.run_dir / "archive": "the pivot archive",
    }
    if cfg.mirror.path is not None:
        owned[Path(cfg.mirror.path).expanduser()] = "the mirror"
    for folder, what in owned.items():
        folder = Path(os.path.realpath(folder))
        if ckpt == folder or folder in ckpt.parents or ckpt in folder.parents:
            raise _bad(
                path,
                "checkpoints.dir",
                cfg.checkpoints.dir,
                f"a folder of checkpoints only, but it is or shares a folder with {what}"
                f" ({folder}): {example}",
            )


def _check_paths(path: Path, cfg: Config) -> None:
    """What already sits at the configured paths: the checkpoint directory must be a
    folder (or not exist yet), the run log a file that belongs to no one else."""
    ckpt_dir = cfg.checkpoint_dir
    if ckpt_dir.exists() and not ckpt_dir.is_dir():
        raise _bad(
            path,
            "checkpoints.dir",
            cfg.checkpoints.dir,
            f"a folder, but {ckpt_dir} is a file: name a folder (or a name not yet taken)",
        )
    _check_checkpoint_place(path, cfg)
    log = cfg.log_path
    if log.is_dir():
        raise _bad(
            path,
            "run.log",
            cfg.run.log,
            f'a file, but {log} is a folder: name a file, for example log = "training.log"',
        )
    resolved = Path(os.path.realpath(log))
    for owned, what in _owned_by_the_daemon(cfg).items():
        if resolved == owned or (what in FOLDERS_OWNED and owned in resolved.parents):
            via = "" if resolved == log else f" (it resolves to {resolved})"
            raise _bad(
                path,
                "run.log",
                cfg.run.log,
                f'a file of the trainer\'s own, but it names {what}{via}: use log = "training.log"',
            )


def _check_trainer_cwd(path: Path, cfg: Config) -> None:
    """[trainer] cwd must be a folder the trainer can start in."""
    cwd = cfg.trainer_cwd
    if not cwd.exists():
        raise _bad(
            path,
            "trainer.cwd",
            cfg.trainer.cwd,
            f"an existing folder, but {cwd} does not exist: create it, or name the folder the "
            'trainer expects to start in, for example cwd = "." (the run directory)',
        )
    if not cwd.is_dir():
        raise _bad(
            path,
            "trainer.cwd",
            cfg.trainer.cwd,
            f'a folder, but {cwd} is not one: name a folder, for example cwd = "."',
        )
    if not os.access(cwd, os.X_OK):
        raise _bad(
            path,
            "trainer.cwd",
            cfg.trainer.cwd,
            f"a folder the daemon's user may enter, but {cwd} is not searchable (chmod u+x it)",
        )


def trainer_program_problem(program: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Why `program` (a trainer argv[0], run in cwd with env's PATH) cannot be executed;
    "" if it can."""
    if not program:
        return "its first item, the program, is empty"
    if "/" in program:
        candidate = Path(program) if Path(program).is_absolute() else cwd / program
        found: str | None = str(candidate) if os.path.lexists(candidate) else None
        if found is None:
            return f"the program {program} does not exist"
    else:
        search = (env or {}).get("PATH", os.environ.get("PATH", os.defpath))
        found = shutil.which(program, path=search)
        if found is None:
            # which() skips folders and files without x: name what is there instead.
            for folder in search.split(os.pathsep):
                if (Path(folder or ".") / program).exists():
                    found = str(Path(folder or ".") / program)
                    break
            else:
                return f"the program {program} is not found on PATH"
    try:
        mode = os.stat(found).st_mode
    except OSError as exc:
        return f"the program {found} cannot be read: {exc.strerror or exc}"
    if stat.S_ISDIR(mode):
        return f"the program {found} is a folder, not an executable file"
    if not stat.S_ISREG(mode) or not os.access(found, os.X_OK):
        return (
            f"the program {found} is not executable (chmod +x it, or run it with its interpreter)"
        )
    return ""


PYTHON_PROGRAM = re.compile(r"^python[0-9.]*$")
SHELL_PROGRAMS = frozenset({"sh", "bash", "dash", "zsh"})
PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X"})
"""python's options that take the next item as their value."""


def trainer_script(command: list[str]) -> str | None:
    """The script an interpreter command runs (`python -u train.py ...`: "train.py"), or
    None: not a python or shell interpreter, or it runs no file (-m, -c, stdin)."""
    if not command:
        return None
    program = Path(command[0]).name
    python = bool(PYTHON_PROGRAM.match(program))
    if not python and program not in SHELL_PROGRAMS:
        return None
    items = iter(command[1:])
    for item in items:
        if item == "-" or item.startswith("-c") or (python and item.startswith("-m")):
            return None
        if item == "--":
            return next(items, None)
        if item.startswith("-"):
            if (python and item in PYTHON_VALUE_OPTIONS) or (not python and item in ("-o", "+o")):
                next(items, None)
            continue
        return item
    return None


def trainer_script_problem(command: list[str], cwd: Path) -> str:
    """Why the script an interpreter command names cannot be run from cwd; "" if it can
    (or the command names none)."""
    script = trainer_script(command)
    if script is None:
        return ""
    candidate = Path(script).expanduser()
    candidate = candidate if candidate.is_absolute() else cwd / candidate
    if not candidate.exists():
        where = "" if Path(script).is_absolute() else f" in {cwd}"
        return f"the script {script} does not exist{where}"
    if candidate.is_dir() and not (candidate / "__main__.py").is_file():
        return f"the script {script} is a folder"
    return ""


def check_trainer_program(cfg: Config) -> None:
    """Raise ConfigError unless the trainer's working directory is a folder and its program
    can be executed there, here and now.

    Checked by a starting daemon only: `init` and `install-unit` may write a config for a
    trainer that is installed later, or on another machine.
    """
    _check_trainer_cwd(cfg.path, cfg)
    command = cfg.trainer.command
    env = {**os.environ, **cfg.trainer.env}
    problem = trainer_program_problem(command[0], cfg.trainer_cwd, env)
    problem = problem or trainer_script_problem(command, cfg.trainer_cwd)
    if problem:
        raise ConfigError(
            f"{cfg.path}: 'trainer.command' = {json.dumps(command)} is invalid: {problem}; "
            'expected the trainer\'s argv, for example command = ["python", "train.py"]'
        )


def load_config(run_dir: Path | str, *, check_plugins: bool = True) -> Config:
    """Read and validate RUN/trainwarden.toml. Raises ConfigError with a one-line message.

    check_plugins also checks what only starting a daemon needs: the configured plugins
    are installed and the trainer command does not run a renamed module. Commands that
    only talk to a daemon (status, stop, tui) skip it, so an operator can still reach a
    running daemon whose config needs fixing before its next start. The rest of a start's
    checks need the store or the socket's rules, above this module: the command line
    makes them (cli.start_checks).
    """
    run_dir = Path(run_dir).resolve()
    path = run_dir / CONFIG_NAME
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read for ever
            raise ConfigError(
                f"{path}: cannot read the config: not a regular file; it must be a TOML file"
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no config file; create one with `trainwarden init {run_dir}`"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except ValueError as exc:  # an integer past Python's 4,300-digit conversion limit
        raise ConfigError(f"{path}: {too_long(exc)}") from None
    tables: dict[str, Any] = {}
    for table, value in raw.items():
        if table not in TABLES:
            raise ConfigError(
                f"{path}: unknown table [{table}]{_nearest(table, list(TABLES))}; "
                f"known tables: {', '.join(TABLES)}"
            )
        tables[table] = _build_table(path, table, TABLES[table], value)
    cfg = Config(run_dir=run_dir, path=path, **tables)
    _check_ranges(path, cfg)
    if check_plugins:
        check_trainer_command(cfg)
        check_plugins_installed(cfg)
    return cfg


def check_plugins_installed(cfg: Config) -> None:
    """Raise ConfigError, naming the config file, unless its format and parser are installed."""
    check_installed(cfg.path, format_name=cfg.checkpoints.format, parser_name=cfg.telemetry.parser)
