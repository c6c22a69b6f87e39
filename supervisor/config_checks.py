"""The checks of the config's values that load_config runs once their types are right: each
number in its range (finite, no count past 2^31 - 1, no time past 10^7 s), the run's
name, the divergence and alert settings, the in-place checkpoint's settings, and
`[metrics] listen`.

Each error names the file, the key, the bad value and what would be valid, with an
example where one helps. What a path may name on disk is config_paths'; the trainer's
command, config_trainer's.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
import signal
from pathlib import Path
from typing import Any

from trainwarden.supervisor.config_schema import TABLES, Config
from trainwarden.supervisor.config_toml import nearest
from trainwarden.supervisor.contract import SUPPORTS
from trainwarden.supervisor.core.alerts import EVENTS as ALERT_EVENTS
from trainwarden.supervisor.errors import ConfigError

RUN_NAME_MAX = 200
"""Longest run.name accepted, in characters: it heads every status line and TUI screen."""
MAX_COUNT = 2**31 - 1
"""The largest integer a key may hold (a step's bound, contract.MAX_STEP), but for BIG_KEYS."""
BIG_KEYS = {"telemetry.n_params": 2**53, "telemetry.tokens_per_step": 2**53}
MAX_SECONDS = 1e7
"""The longest time a `*_s` key may give (about 115 days)."""


def invalid(path: Path, key: str, value: Any, expected: str) -> ConfigError:
    """The error for a key whose value is not what it should be: the file, the key, the
    value and what would be valid."""
    return ConfigError(f"{path}: '{key}' = {value!r} is invalid: expected {expected}")


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


def check_ranges(path: Path, cfg: Config) -> None:
    """The trainer's command not empty, each setting in its range and each path well
    formed (no NUL; the run log and the checkpoint folder inside the run directory, the
    mirror outside it): the first of load_config's checks once the types are right."""

    def bad(key: str, value: Any, expected: str) -> ConfigError:
        return invalid(path, key, value, expected)

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


def check_divergence(path: Path, cfg: Config) -> None:
    """[divergence]'s spike settings, and the contract items [trainer] supports names."""
    unknown = [item for item in cfg.trainer.supports if item not in SUPPORTS]
    if unknown:
        raise invalid(
            path,
            "trainer.supports",
            cfg.trainer.supports,
            f"a list of {', '.join(repr(s) for s in SUPPORTS)}; {unknown[0]!r} is none of them",
        )
    div = cfg.divergence
    if not div.spike_factor > 1:
        raise invalid(path, "divergence.spike_factor", div.spike_factor, "a number > 1, like 2.0")
    if div.grad_norm_factor is not None and not div.grad_norm_factor > 1:
        raise invalid(
            path, "divergence.grad_norm_factor", div.grad_norm_factor, "a number > 1, or unset"
        )
    if not 0 < div.lr_scale <= 1:
        raise invalid(path, "divergence.lr_scale", div.lr_scale, "a number in (0, 1], like 0.9")
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
            raise invalid(path, f"divergence.{key}", value, f"an integer >= {low}")


def check_alerts(path: Path, cfg: Config) -> None:
    """[alerts]: URLs are checked for shape only and never shown (they hold tokens)."""
    alerts = cfg.alerts
    for i, url in enumerate(alerts.urls):
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://\S+", url):
            raise ConfigError(
                f"{path}: 'alerts.urls' item {i + 1} (hidden) is not an apprise URL: "
                'expected scheme://..., for example "ntfy://my-topic" or "json://host:port/path"'
            )
    if alerts.command and not alerts.command[0]:
        raise invalid(path, "alerts.command", alerts.command, 'a program first, e.g. ["notify.sh"]')
    for name in alerts.on:
        if name not in ALERT_EVENTS:
            raise ConfigError(
                f"{path}: 'alerts.on' names {name!r}{nearest(name, list(ALERT_EVENTS))}; "
                f"known events: {', '.join(ALERT_EVENTS)}"
            )
    if not alerts.min_interval_s >= 0:
        raise invalid(path, "alerts.min_interval_s", alerts.min_interval_s, "a number >= 0")
    if alerts.restarts_per_hour < 1:
        raise invalid(path, "alerts.restarts_per_hour", alerts.restarts_per_hour, "an integer >= 1")
    if not alerts.timeout_s > 0:
        raise invalid(path, "alerts.timeout_s", alerts.timeout_s, "a number of seconds > 0")
    if not 0 <= alerts.retries <= 10:
        raise invalid(path, "alerts.retries", alerts.retries, "an integer from 0 to 10")


def check_numbers(path: Path, cfg: Config) -> None:
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
                    raise invalid(path, key, number, "a finite number")
                limit = BIG_KEYS.get(key, MAX_COUNT)
                if isinstance(number, int) and abs(number) > limit:
                    raise invalid(path, key, _shown(number), f"an integer of at most {limit:,}")
                if f.name.endswith("_s") and abs(number) > MAX_SECONDS:
                    expected = f"a number of seconds up to {MAX_SECONDS:,.0f} (about 115 days)"
                    raise invalid(path, key, number, expected)


def _shown(number: int) -> int | str:
    """A number as an error shows it: a long one by its length."""
    text = str(number)
    return number if len(text) <= 30 else f"{text[:12]}... ({len(text)} digits)"


def check_counts(path: Path, cfg: Config) -> None:
    """Sizes and counts that a run cannot have zero or fewer of, and the run's name."""
    name = cfg.run.name
    if not name.strip() or len(name) > RUN_NAME_MAX:
        shown = name if len(name) <= 60 else f"{name[:40]}... ({len(name)} characters)"
        raise invalid(path, "run.name", shown, f"a name of 1 to {RUN_NAME_MAX} characters")
    telemetry = cfg.telemetry
    counts = {
        "telemetry.tokens_per_step": telemetry.tokens_per_step,
        "telemetry.n_params": telemetry.n_params,
        "telemetry.vocab_size": telemetry.vocab_size,
    }
    for key, value in counts.items():
        if isinstance(value, int) and value < 1:
            also = ' (or "auto" to read it from the checkpoint header)' if "n_params" in key else ""
            raise invalid(path, key, value, f"an integer >= 1{also}, or leave it unset")
    for key, value in telemetry.attention.items():
        if value < 1:
            raise invalid(path, f"telemetry.attention.{key}", value, "an integer >= 1")
    if not telemetry.resume_tolerance >= 0:
        raise invalid(
            path, "telemetry.resume_tolerance", telemetry.resume_tolerance, "a number >= 0"
        )
    negative = [step for step in cfg.checkpoints.pinned if step < 0]
    if negative:
        raise invalid(path, "checkpoints.pinned", cfg.checkpoints.pinned, "a list of steps >= 0")
    _check_fixed(path, cfg)


def _check_fixed(path: Path, cfg: Config) -> None:
    """[checkpoints] fixed names one plain file in the checkpoint directory, and exactly
    one of step_key and step_regex says where its step is."""
    ckpts = cfg.checkpoints
    if ckpts.fixed is None:
        for key in ("step_key", "step_regex", "fixed_commit_file"):
            if getattr(ckpts, key) is not None:
                raise invalid(
                    path,
                    f"checkpoints.{key}",
                    getattr(ckpts, key),
                    'nothing unless [checkpoints] fixed is set, for example fixed = "ckpt.pt"',
                )
        return
    name = ckpts.fixed
    if not name or "/" in name or name in (".", "..") or "\x00" in name or name == "quarantine":
        raise invalid(
            path,
            "checkpoints.fixed",
            name,
            'the name of one file directly in the checkpoint directory, for example fixed = "ckpt.pt"',
        )
    commit = ckpts.fixed_commit_file
    if commit is not None and (
        not commit or "/" in commit or commit in (".", "..") or "\x00" in commit
    ):
        raise invalid(
            path,
            "checkpoints.fixed_commit_file",
            commit,
            "the name of the file directly in the fixed folder that the trainer writes last, "
            'for example fixed_commit_file = "trainer_state.json"',
        )
    if (ckpts.step_key is None) == (ckpts.step_regex is None):
        raise invalid(
            path,
            "checkpoints.fixed",
            name,
            'one of step_key (torch-pt, for example step_key = "iter_num") or step_regex '
            "(a pattern on the file's contents) beside it",
        )
    if ckpts.step_key is not None and not ckpts.step_key:
        raise invalid(path, "checkpoints.step_key", ckpts.step_key, 'a key, for example "iter_num"')
    if ckpts.step_regex is not None:
        try:
            groups = re.compile(ckpts.step_regex.encode()).groups
        except re.error:
            groups = -1
        if groups != 1:
            raise invalid(
                path,
                "checkpoints.step_regex",
                ckpts.step_regex,
                r"a regular expression with exactly one group for the step, for example "
                r"'step=(\d+)'",
            )


RESERVED_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGKILL", "SIGSTOP", "SIGCHLD", "SIGCONT"})
"""Signals [slurm] signal may not name: TERM and INT already mean stop without a requeue
(what scancel and the time limit send), and the others cannot be caught or are the
daemon's own business."""


def slurm_signal(name: str) -> signal.Signals | None:
    """[slurm] signal as a signal: "USR1", "SIGUSR1" or "usr1" (None: not one allowed)."""
    text = name.strip().upper()
    text = text if text.startswith("SIG") else f"SIG{text}"
    try:
        sig = signal.Signals[text]
    except KeyError:
        return None
    return None if sig.name in RESERVED_SIGNALS else sig


def check_slurm(path: Path, cfg: Config) -> None:
    """[slurm]: a signal the daemon can catch and that means nothing else to it; a lead >= 0."""
    if slurm_signal(cfg.slurm.signal) is None:
        raise invalid(
            path,
            "slurm.signal",
            cfg.slurm.signal,
            "a signal name such as USR1 or USR2 (not TERM, INT, KILL, STOP, CHLD or CONT)",
        )
    if not cfg.slurm.act_before_end_s >= 0:
        raise invalid(
            path,
            "slurm.act_before_end_s",
            cfg.slurm.act_before_end_s,
            "a number of seconds >= 0 (0: only on the signal)",
        )
