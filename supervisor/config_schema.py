"""The config's schema: one frozen dataclass per table of `RUN/trainwarden.toml`, and `Config`,
the whole of it.

Every field carries a one-line docstring that says what it means and its unit
(`field_docs` reads them back). What a value may be beyond its type is config_checks'
(the ranges), config_paths' (what a path may name) and config_trainer's (the trainer's
command); reading and writing TOML by these types is config_toml's; config.load_config
puts them together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trainwarden.supervisor.core.alerts import EVENTS as ALERT_EVENTS


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
class SlurmConfig:
    signal: str = "USR1"
    """The signal Slurm sends the daemon before the job's time limit (sbatch
    --signal=B:USR1@SECONDS): the trainer saves, the job is requeued, the daemon exits 75."""
    act_before_end_s: float = 120.0
    """When no such signal comes: seconds before the job's end time (read from scontrol) at
    which the daemon does the same on its own (0: only on the signal)."""
    requeue: bool = True
    """Requeue the job (scontrol requeue) once the save is verified; false: exit 75 and
    leave the requeue to the batch script."""
    exit_when_ended: bool = True
    """Inside a job, exit when the run finishes (0) or halts (3), giving the allocation back,
    instead of waiting for the operator until the time limit."""


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
    slurm: SlurmConfig = field(default_factory=SlurmConfig)

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
    "slurm": SlurmConfig,
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
