"""A catalogue of bad inputs on every surface the daemon has, each with the error it must give.

The table comes first so it can grow: one `Bad` row per input, naming its surface, the
input itself, and a substring of the specific error text expected. After every row the
test also checks that nothing was lost (checkpoints intact) and, for the surfaces a live
daemon owns, that it keeps supervising (status answers, the trainer is alive). One daemon
(supervising the scripted trainer, which starts in a fraction of a second) serves every
control, pivot, log, checkpoint and sidecar row.

Surfaces:
    config       RUN/trainwarden.toml given to `trainwarden daemon RUN`: exit 2, one stderr line
                 naming the file; nothing started, nothing touched
    cli          `trainwarden ARGS`: the exit status of the row, one stderr line

The config, cli and socket rows run the command line's main() in process (a config that
would start a daemon fails its row); a few rows of each also run the real command in a
subprocess, for the exit status and the one line a user sees.
    control      raw bytes over the live daemon's socket: the error reply ("code: message")
    pivot        the pivot command over the socket with bad caps/floors: refused, nothing
                 changes (no archive, no policy.json, same trainer)
    log          bytes appended to the live run's training.log: what the daemon made of them
                 (follower counters and the journal records that followed, as JSON)
    checkpoint   a bad file under a checkpoint name, renamed into checkpoints/ of the live run
                 ("live") or present when a daemon starts ("startup"): the quarantine reason
    sidecar      .state.json / .samples.json written as the trainer would: ignored; the
                 topics keep the last good document; a pivot says why it cannot go on
    policy_file  a corrupt RUN/policy.json given to the reference trainer: exit 2, one line
    print        text from the run (its name, a trainer's words) as the command line prints
                 it: shown, with every terminal escape and control character taken out
    socket       a file, folder, link or another user's socket planted where [control] socket
                 points (or its folder open to others): `daemon RUN` exits 2 with one line;
                 the planted thing is untouched
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import stat
import struct
import subprocess
import time
import unittest.mock
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support import (
    PYTHON,
    DaemonProcess,
    journal,
    pid_alive,
    running_daemon,
    scripted_run,
    wait_for,
)
from trainwarden.supervisor.cli import main
from trainwarden.supervisor.cli.output import describe_result, format_status, print_event
from trainwarden.supervisor.protocol import Client

pytestmark = pytest.mark.timeout(180)

N_PARAMS = 1000
"""Parameters of the scripted trainer's checkpoints (8 + 12 x 1000 bytes)."""


def ckpt(step: int, n_params: int = N_PARAMS) -> bytes:
    return struct.pack("<ii", step, n_params) + bytes(12 * n_params)


def request(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload) + b"\n"


@dataclass(frozen=True)
class Bad:
    surface: str
    name: str
    input: Any
    expect: str
    """A substring of the error text; "" for inputs that must be ignored without a word."""
    code: int = 2
    """cli: the expected exit status."""
    stage: str = "live"
    """checkpoint: "live" (renamed in while the daemon runs) or "startup"."""
    xfail: str | None = None
    """Set when the expected behaviour is not there yet: why, and where the bug is."""
    extra: dict[str, Any] = field(default_factory=dict)


TRAINER_OK = '[trainer]\ncommand = ["python", "train.py"]\n'

CATALOGUE: list[Bad] = [
    # ------------------------------------------------------------------ config
    Bad("config", "toml syntax", "[trainer\ncommand = ['x']\n", "not valid TOML"),
    Bad("config", "duplicate key", TRAINER_OK + 'command = ["y"]\n', "not valid TOML"),
    Bad("config", "empty file", "", "'[trainer] command' is missing"),
    Bad("config", "unknown table", "[trainr]\ncommand = ['x']\n", "did you mean 'trainer'"),
    Bad(
        "config",
        "unknown key",
        TRAINER_OK + "stop_timout_s = 3\n",
        "did you mean 'stop_timeout_s'",
    ),
    Bad("config", "table is a value", "trainer = 5\n", "[trainer] must be a table"),
    Bad(
        "config",
        "alert url not a list",
        TRAINER_OK + '[alerts]\nurls = "ntfy://tok9f8e7d6c5b4a"\n',
        "'alerts.urls' = (hidden) is invalid: expected a list of a string",
    ),
    Bad(
        "config",
        "alert url without scheme",
        TRAINER_OK + '[alerts]\nurls = ["tok9f8e7d6c5b4a"]\n',
        "'alerts.urls' item 1 (hidden) is not an apprise URL",
    ),
    Bad(
        "config",
        "alert event typo",
        TRAINER_OK + '[alerts]\non = ["halt"]\n',
        "'alerts.on' names 'halt' (did you mean 'halted'?)",
    ),
    Bad(
        "config",
        "alert restarts_per_hour 0",
        TRAINER_OK + "[alerts]\nrestarts_per_hour = 0\n",
        "'alerts.restarts_per_hour' = 0",
    ),
    Bad(
        "config",
        "alert timeout 0",
        TRAINER_OK + "[alerts]\ntimeout_s = 0\n",
        "'alerts.timeout_s' = 0.0",
    ),
    Bad(
        "config",
        "alert retries 11",
        TRAINER_OK + "[alerts]\nretries = 11\n",
        "'alerts.retries' = 11",
    ),
    Bad(
        "config",
        "command is a string",
        "[trainer]\ncommand = 'python x'\n",
        "'trainer.command'",
    ),
    Bad(
        "config",
        "command of numbers",
        "[trainer]\ncommand = [1, 2]\n",
        "'trainer.command'",
    ),
    Bad("config", "env of numbers", TRAINER_OK + "env = { A = 1 }\n", "'trainer.env'"),
    Bad("config", "bool for seconds", TRAINER_OK + "stop_timeout_s = true\n", "expected a number"),
    Bad(
        "config",
        "string for an integer",
        TRAINER_OK + "[checkpoints]\nkeep_last = '3'\n",
        "'checkpoints.keep_last' = '3' is invalid: expected an integer",
    ),
    Bad(
        "config",
        "float list for steps",
        TRAINER_OK + "[checkpoints]\npinned = [1.5]\n",
        "'checkpoints.pinned'",
    ),
    Bad(
        "config",
        "keep_last 0",
        TRAINER_OK + "[checkpoints]\nkeep_last = 0\n",
        "'checkpoints.keep_last' = 0",
    ),
    Bad(
        "config",
        "backoff max below initial",
        TRAINER_OK + "[restart]\nbackoff_initial_s = 10\nbackoff_max_s = 1\n",
        "'restart.backoff_max_s'",
    ),
    Bad(
        "config",
        "negative stall timeout",
        TRAINER_OK + "[restart]\nstall_timeout_s = -1\n",
        "'restart.stall_timeout_s'",
    ),
    Bad(
        "config",
        "nan stall timeout",
        TRAINER_OK + "[restart]\nstall_timeout_s = nan\n",
        "'restart.stall_timeout_s' = nan",
    ),
    Bad(
        "config",
        "nan stop timeout",
        TRAINER_OK + "stop_timeout_s = nan\n",
        "'trainer.stop_timeout_s' = nan",
    ),
    Bad(
        "config",
        "nan backoff",
        TRAINER_OK + "[restart]\nbackoff_initial_s = nan\n",
        "'restart.backoff_initial_s' = nan",
    ),
    Bad(
        "config",
        "ema_beta 1",
        TRAINER_OK + "[telemetry]\nema_beta = 1.0\n",
        "'telemetry.ema_beta'",
    ),
    Bad(
        "config",
        "peak_tflops 0",
        TRAINER_OK + "[telemetry]\npeak_tflops = 0\n",
        "'telemetry.peak_tflops' = 0",
    ),
    Bad(
        "config",
        "negative max_loss",
        TRAINER_OK + "[telemetry]\nmax_loss = -1\n",
        "'telemetry.max_loss' = -1",
    ),
    Bad(
        "config",
        "nan max_loss",
        TRAINER_OK + "[telemetry]\nmax_loss = nan\n",
        "'telemetry.max_loss' = nan",
    ),
    Bad(
        "config",
        "spike_factor 1",
        TRAINER_OK + "[divergence]\nspike_factor = 1.0\n",
        "'divergence.spike_factor' = 1.0 is invalid: expected a number > 1",
    ),
    Bad(
        "config",
        "spike_patience 0",
        TRAINER_OK + "[divergence]\nspike_patience = 0\n",
        "'divergence.spike_patience' = 0 is invalid: expected an integer >= 1",
    ),
    Bad(
        "config",
        "lr_scale above 1",
        TRAINER_OK + "[divergence]\nlr_scale = 1.5\n",
        "'divergence.lr_scale' = 1.5 is invalid: expected a number in (0, 1]",
    ),
    Bad(
        "config",
        "grad_norm_factor 0",
        TRAINER_OK + "[divergence]\ngrad_norm_factor = 0.5\n",
        "'divergence.grad_norm_factor' = 0.5",
    ),
    Bad(
        "config",
        "unknown supports item",
        '[trainer]\ncommand = ["python", "train.py"]\nsupports = ["skip_data", "lr"]\n',
        "'trainer.supports' = ['skip_data', 'lr'] is invalid: expected a list of 'skip_data',"
        " 'lr_scale'; 'lr' is none of them",
    ),
    Bad(
        "config",
        "divergence typo",
        TRAINER_OK + "[divergence]\nspike_factr = 2.0\n",
        "did you mean 'spike_factor'?",
    ),
    Bad(
        "config",
        "attention missing keys",
        TRAINER_OK + "[telemetry]\nattention = { n_layer = 12 }\n",
        "'telemetry.attention'",
    ),
    Bad(
        "config",
        "signal target",
        TRAINER_OK + "signal_target = 'everyone'\n",
        "'trainer.signal_target'",
    ),
    Bad(
        "config",
        "checkpoint dir outside",
        TRAINER_OK + "[checkpoints]\ndir = '../elsewhere'\n",
        "a path inside the run directory",
    ),
    Bad("config", "absolute log", '[run]\nlog = "/tmp/x.log"\n' + TRAINER_OK, "'run.log'"),
    Bad(
        "config",
        "log into a checkpoint",
        '[run]\nlog = "checkpoints/step_000010.bin"\n' + TRAINER_OK,
        "it names the checkpoint folder",
    ),
    Bad(
        "config",
        "log into quarantine",
        '[run]\nlog = "checkpoints/quarantine/x.log"\n' + TRAINER_OK,
        "it names the checkpoint folder",
    ),
    Bad(
        "config",
        "checkpoint dir the run",
        TRAINER_OK + "[checkpoints]\ndir = '.'\n",
        "'checkpoints.dir' = '.' is invalid: expected a folder of checkpoints only, but it names"
        " the run directory",
    ),
    Bad(
        "config",
        "checkpoint dir the daemon's",
        TRAINER_OK + "[checkpoints]\ndir = '.trainwarden'\n",
        "shares a folder with the daemon's own folder",
    ),
    Bad(
        "config",
        "checkpoint dir in the archive",
        TRAINER_OK + "[checkpoints]\ndir = 'archive/ckpts'\n",
        "shares a folder with the pivot archive",
    ),
    # [trainer] cwd: checked at load, relative to the run directory.
    Bad(
        "config",
        "cwd missing",
        TRAINER_OK + 'cwd = "nanogpt"\n',
        "'trainer.cwd' = 'nanogpt' is invalid: expected an existing folder",
    ),
    Bad(
        "config",
        "cwd is a file",
        TRAINER_OK + 'cwd = "trainwarden.toml"\n',
        "'trainer.cwd' = 'trainwarden.toml' is invalid: expected a folder",
    ),
    Bad(
        "config",
        "cwd a dangling link",
        TRAINER_OK + 'cwd = "code"\n',
        "'trainer.cwd' = 'code' is invalid: expected an existing folder",
        extra={"links": {"code": "{outside}/gone"}},
    ),
    Bad("config", "cwd a number", TRAINER_OK + "cwd = 3\n", "'trainer.cwd' = 3 is invalid"),
    Bad("config", "cwd with a NUL", TRAINER_OK + 'cwd = "a\\u0000b"\n', "contains a NUL byte"),
    # [checkpoints] fixed (in-place trainers): one name in the checkpoint directory, and
    # exactly one of step_key / step_regex saying where its step is.
    Bad(
        "config",
        "fixed with a slash",
        TRAINER_OK
        + "[checkpoints]\nformat = 'torch-pt'\nfixed = 'out/ckpt.pt'\nstep_key = 'iter_num'\n",
        "'checkpoints.fixed' = 'out/ckpt.pt' is invalid",
    ),
    Bad(
        "config",
        "fixed without a step",
        TRAINER_OK + "[checkpoints]\nformat = 'torch-pt'\nfixed = 'ckpt.pt'\n",
        "one of step_key",
    ),
    Bad(
        "config",
        "step_key without fixed",
        TRAINER_OK + "[checkpoints]\nformat = 'torch-pt'\nstep_key = 'iter_num'\n",
        "'checkpoints.step_key' = 'iter_num' is invalid",
    ),
    Bad(
        "config",
        "step_regex without a group",
        TRAINER_OK + "[checkpoints]\nfixed = 'ckpt.bin'\nstep_regex = 'step=\\d+'\n",
        "'checkpoints.step_regex'",
    ),
    Bad(
        "config",
        "fixed_commit_file with a slash",
        TRAINER_OK
        + "[checkpoints]\nformat = 'hf-trainer'\nfixed = 'latest'\n"
        + "fixed_commit_file = 'a/b.json'\nstep_key = 'global_step'\n",
        "'checkpoints.fixed_commit_file' = 'a/b.json' is invalid",
    ),
    Bad(
        "config",
        "unknown format plugin",
        TRAINER_OK + "[checkpoints]\nformat = 'nope'\n",
        "installed: andrea-bin",
    ),
    Bad(
        "config",
        "unknown parser plugin",
        TRAINER_OK + "[telemetry]\nparser = 'nope'\n",
        "'telemetry.parser' = 'nope' is not an installed plugin",
    ),
    Bad("config", "not utf-8", b"\xff\xfe[trainer]\n", "cannot read the config"),
    Bad("config", "a directory", "<directory>", "cannot read the config"),
    # Paths, programs, ranges and names checked at load (issue "Hostile inputs"). extra:
    # "links" {name: target} are made first ("{outside}" a folder beside the run, 0755);
    # "names_config" False for start-up errors about a file other than the config.
    Bad(
        "config",
        "checkpoint dir is a file",
        TRAINER_OK + "[checkpoints]\ndir = 'checkpoints/step_000010.bin'\n",
        "'checkpoints.dir' = 'checkpoints/step_000010.bin' is invalid: expected a folder",
    ),
    Bad(
        "config",
        "log is a folder",
        '[run]\nlog = "checkpoints"\n' + TRAINER_OK,
        "'run.log' = 'checkpoints' is invalid: expected a file, but",
    ),
    Bad(
        "config",
        "log is the config",
        '[run]\nlog = "trainwarden.toml"\n' + TRAINER_OK,
        "but it names the config file",
    ),
    Bad(
        "config",
        "log is the journal",
        '[run]\nlog = ".trainwarden/journal.jsonl"\n' + TRAINER_OK,
        "but it names the daemon's own folder",
    ),
    Bad(
        "config",
        "log is the loss history",
        '[run]\nlog = ".loss.json"\n' + TRAINER_OK,
        "but it names the loss history",
    ),
    Bad(
        "config",
        "log links to the config",
        '[run]\nlog = "train.log"\n' + TRAINER_OK,
        "but it names the config file (it resolves to",
        extra={"links": {"train.log": "trainwarden.toml"}},
    ),
    Bad(
        "config",
        "state folder links outside",
        TRAINER_OK,
        ".trainwarden is a symbolic link (to",
        extra={"links": {".trainwarden": "{outside}"}, "names_config": False},
    ),
    Bad(
        "config",
        "journal links outside",
        TRAINER_OK,
        "journal.jsonl is a symbolic link (to",
        extra={"links": {".trainwarden/journal.jsonl": "{outside}/journal"}, "names_config": False},
    ),
    Bad(
        "config",
        "torch-pt pattern matching no digits",
        TRAINER_OK
        + "[checkpoints]\nformat = 'torch-pt'\noptions = { pattern = '^ckpt(\\d*)\\.pt$' }\n",
        "its group can match something other than digits (or nothing)",
    ),
    Bad(
        "config",
        "torch-pt pattern matching anything",
        TRAINER_OK
        + "[checkpoints]\nformat = 'torch-pt'\noptions = { pattern = '^ckpt_(.+)\\.pt$' }\n",
        "expected a group such as (\\d+)",
    ),
    Bad(
        "config",
        "empty program",
        '[trainer]\ncommand = [""]\n',
        "'trainer.command' = [''] is invalid: expected a program as its first item",
    ),
    Bad(
        "config",
        "program is a folder",
        '[trainer]\ncommand = ["./checkpoints", "x"]\n',
        "/run/checkpoints is a folder, not an executable file",
    ),
    Bad(
        "config",
        "program not executable",
        '[trainer]\ncommand = ["./checkpoints/step_000010.bin"]\n',
        "is not executable",
    ),
    Bad(
        "config",
        "program not found",
        '[trainer]\ncommand = ["no-such-trainer-here", "--go"]\n',
        "the program no-such-trainer-here is not found on PATH",
    ),
    Bad(
        "config",
        "script not found",
        '[trainer]\ncommand = ["./train.sh"]\n',
        "the program ./train.sh does not exist",
    ),
    Bad(
        "config",
        "a mirror of another run",
        TRAINER_OK + '[mirror]\npath = "{mirror}"\n',
        "it is the mirror of run 'other' (/elsewhere/other)",
        extra={
            "mirror_owner": {"run_id": "0" * 32, "run_dir": "/elsewhere/other", "name": "other"}
        },
    ),
    Bad(
        "config",
        "python script not found",
        '[trainer]\ncommand = ["python3", "-u", "missing.py", "--steps", "9"]\n',
        "the script missing.py does not exist in ",
    ),
    Bad(
        "config",
        "shell script a folder",
        '[trainer]\ncommand = ["bash", "-e", "checkpoints"]\n',
        "the script checkpoints is a folder",
    ),
    Bad(
        "config",
        "negative n_params",
        TRAINER_OK + "[telemetry]\nn_params = -124000000\n",
        "'telemetry.n_params' = -124000000 is invalid: expected an integer >= 1",
    ),
    Bad(
        "config",
        "n_params 0",
        TRAINER_OK + "[telemetry]\nn_params = 0\n",
        "'telemetry.n_params' = 0",
    ),
    Bad(
        "config",
        "tokens_per_step 0",
        TRAINER_OK + "[telemetry]\ntokens_per_step = 0\n",
        "'telemetry.tokens_per_step' = 0 is invalid: expected an integer >= 1",
    ),
    Bad(
        "config",
        "vocab_size negative",
        TRAINER_OK + "[telemetry]\nvocab_size = -1\n",
        "'telemetry.vocab_size' = -1",
    ),
    Bad(
        "config",
        "attention layer 0",
        TRAINER_OK + "[telemetry]\nattention = { n_layer = 0, seq_len = 1024, d_model = 768 }\n",
        "'telemetry.attention.n_layer' = 0",
    ),
    Bad(
        "config",
        "negative resume tolerance",
        TRAINER_OK + "[telemetry]\nresume_tolerance = -0.5\n",
        "'telemetry.resume_tolerance' = -0.5 is invalid: expected a number >= 0",
    ),
    Bad(
        "config",
        "negative pinned step",
        TRAINER_OK + "[checkpoints]\npinned = [-20]\n",
        "'checkpoints.pinned' = [-20] is invalid: expected a list of steps >= 0",
    ),
    Bad(
        "config",
        "infinite stop timeout",
        TRAINER_OK + "stop_timeout_s = inf\n",
        "'trainer.stop_timeout_s' = inf is invalid: expected a finite number",
    ),
    Bad(
        "config",
        "infinite save wait",
        TRAINER_OK + "save_wait_timeout_s = inf\n",
        "'trainer.save_wait_timeout_s' = inf is invalid: expected a finite number",
    ),
    Bad(
        "config",
        "infinite stall timeout",
        TRAINER_OK + "[restart]\nstall_timeout_s = inf\n",
        "'restart.stall_timeout_s' = inf is invalid: expected a finite number",
    ),
    Bad(
        "config",
        "infinite backoff",
        TRAINER_OK + "[restart]\nbackoff_max_s = inf\n",
        "'restart.backoff_max_s' = inf is invalid: expected a finite number",
    ),
    Bad(
        "config",
        "integer of 5,000 digits",
        TRAINER_OK + "[checkpoints]\nkeep_last = " + "9" * 5000 + "\n",
        "not valid TOML: an integer of more than 4,300 digits",
    ),
    Bad(
        "config",
        "keep_last beyond int64",
        TRAINER_OK + "[checkpoints]\nkeep_last = 99999999999999999999\n",
        "'checkpoints.keep_last' = 99999999999999999999 is invalid: expected an integer of at"
        " most 2,147,483,647",
    ),
    Bad(
        "config",
        "spike_window 2^63-1",
        TRAINER_OK + "[divergence]\nspike_window = 9223372036854775807\n",
        "'divergence.spike_window' = 9223372036854775807 is invalid",
    ),
    Bad(
        "config",
        "backoff of 1e308 s",
        TRAINER_OK + "[restart]\nbackoff_initial_s = 1e308\nbackoff_max_s = 1e308\n",
        "'restart.backoff_initial_s' = 1e+308 is invalid: expected a number of seconds up to"
        " 10,000,000",
    ),
    Bad("config", "config a FIFO", "<fifo>", "not a regular file"),
    Bad(
        "config",
        "infinite max_loss",
        TRAINER_OK + "[telemetry]\nmax_loss = inf\n",
        "'telemetry.max_loss' = inf is invalid: expected a finite number",
    ),
    Bad(
        "config",
        "infinite peak",
        TRAINER_OK + "[telemetry]\npeak_tflops = inf\n",
        "'telemetry.peak_tflops' = inf is invalid: expected a finite number",
    ),
    Bad(
        "config",
        "torch-pt infinite verify timeout",
        TRAINER_OK + "[checkpoints]\nformat = 'torch-pt'\noptions = { verify_timeout_s = inf }\n",
        "'checkpoints.options.verify_timeout_s' = inf is invalid for torch-pt",
    ),
    Bad(
        "config",
        "run name of 5000 characters",
        '[run]\nname = "' + "n" * 5000 + '"\n' + TRAINER_OK,
        "characters)' is invalid: expected a name of 1 to 200 characters",
    ),
    Bad("config", "blank run name", '[run]\nname = "  "\n' + TRAINER_OK, "'run.name' = '  '"),
    # ------------------------------------------------------------------ control socket
    # config: [control] rows checked at load; socket: a thing planted at or around the
    # socket's path first (see test_socket_place), which must survive untouched.
    Bad(
        "config",
        "socket on a checkpoint",
        TRAINER_OK + "[control]\nsocket = 'checkpoints/step_000010.bin'\n",
        "'control.socket' = 'checkpoints/step_000010.bin' is invalid",
    ),
    Bad(
        "config",
        "socket is /",
        TRAINER_OK + "[control]\nsocket = '/'\n",
        "'control.socket' = '/' is invalid: it names a folder, not a socket",
    ),
    Bad(
        "config",
        "socket name too long",
        TRAINER_OK + f"[control]\nsocket = '.trainwarden/{'s' * 90}.sock'\n",
        "more than a Unix socket address can hold",
    ),
    Bad(
        "config",
        "socket with a NUL byte",
        TRAINER_OK + '[control]\nsocket = ".trainwarden/a\\u0000b.sock"\n',
        "it contains a NUL byte",
    ),
    Bad(
        "config",
        "socket folder missing",
        TRAINER_OK + "[control]\nsocket = 'nowhere/run.sock'\n",
        "'control.socket' = 'nowhere/run.sock' is invalid: its folder",
    ),
    Bad(
        "config",
        "allow_uids without group",
        TRAINER_OK + "[control]\nallow_uids = [12345]\n",
        "'control.allow_uids' = [12345] needs [control] group",
    ),
    Bad(
        "config",
        "group that does not exist",
        TRAINER_OK + "[control]\nallow_uids = [12345]\ngroup = 'tw-no-such-group'\n",
        "'control.group' = 'tw-no-such-group' is invalid: there is no such group",
    ),
    Bad(
        "socket",
        "a file outside the run",
        {"socket": "../outside.txt", "plant": ("file", "outside.txt")},
        "is a regular file, which the daemon never replaces",
    ),
    Bad(
        "socket",
        "another user's socket",
        {
            "socket": ".trainwarden/control.sock",
            "plant": ("foreign socket", "run/.trainwarden/control.sock"),
        },
        "is a socket of uid 65534, which the daemon never replaces",
    ),
    Bad(
        "socket",
        "another user's file",
        {
            "socket": ".trainwarden/control.sock",
            "plant": ("foreign file", "run/.trainwarden/control.sock"),
        },
        "is a regular file, which the daemon never replaces",
    ),
    Bad(
        "socket",
        "a folder at the path",
        {
            "socket": ".trainwarden/control.sock",
            "plant": ("folder", "run/.trainwarden/control.sock"),
        },
        "is a folder, which the daemon never replaces",
    ),
    Bad(
        "socket",
        "a link at the path",
        {"socket": ".trainwarden/control.sock", "plant": ("link", "run/.trainwarden/control.sock")},
        "is a symbolic link, which the daemon never replaces",
    ),
    Bad(
        "socket",
        "a folder open to all",
        {"socket": "../shared/run.sock", "plant": ("open folder", "shared")},
        "is open to others (mode 0777)",
    ),
    Bad(
        "socket",
        "another user's folder",
        {"socket": "../theirs/run.sock", "plant": ("foreign folder", "theirs")},
        "belongs to uid 65534, not the daemon's",
    ),
    # ------------------------------------------------------------------ cli
    Bad("cli", "no command", [], "the following arguments are required", code=2),
    Bad("cli", "unknown command", ["frobnicate"], "invalid choice: 'frobnicate'", code=2),
    Bad("cli", "unknown flag", ["status", "{empty}", "--bogus"], "unrecognized arguments", code=2),
    Bad("cli", "pin a word", ["pin", "{empty}", "ten"], "invalid int value: 'ten'", code=2),
    Bad("cli", "events -n word", ["events", "{empty}", "-n", "many"], "invalid int value", code=2),
    Bad("cli", "init bad preset", ["init", "{new}", "--preset", "huge"], "invalid choice", code=2),
    Bad("cli", "init negative steps", ["init", "{new}", "--steps", "-5"], "at least 1", code=2),
    Bad("cli", "status, no run", ["status", "{empty}"], "no run at", code=2),
    Bad("cli", "daemon, no config", ["daemon", "{empty}"], "no config file", code=2),
    Bad("cli", "pivot without =", ["pivot", "{live}", "--cap", "docs"], "expected ARM=NUMBER"),
    Bad("cli", "pivot word value", ["pivot", "{live}", "--cap", "docs=abc"], "ARM=NUMBER"),
    Bad("cli", "pivot nothing", ["pivot", "{live}"], "pivot needs at least one --cap", code=2),
    Bad(
        "cli",
        "pivot cap above 1",
        ["pivot", "{live}", "--cap", "docs=2"],
        "refused (bad_argument): arm 'docs': cap 2.0 is outside [0, 1]",
        code=1,
    ),
    Bad("cli", "unpin unknown", ["unpin", "{live}", "424242"], "step 424242 is not pinned", code=1),
    Bad(
        "cli",
        "branch --set smuggles a table",
        ["branch", "{live}", "{new}", "--set", 'run.name="x"\n[trainer]\ncommand = ["sh"]'],
        "--set run.name: the value must be one TOML value, not more lines or tables",
        code=2,
    ),
    Bad(
        "cli",
        "branch --set 5,000 digits",
        ["branch", "{live}", "{new}", "--set", "restart.stall_timeout_s=" + "9" * 5000],
        "an integer of more than 4,300 digits",
        code=2,
    ),
    # ------------------------------------------------------------------ control
    Bad("control", "not json", b"not json\n", "bad_request: invalid JSON"),
    Bad("control", "array", b"[1, 2]\n", "bad_request: expected a JSON object, got list"),
    Bad("control", "string", b'"hello"\n', "bad_request: expected a JSON object, got str"),
    Bad("control", "no cmd", request({"id": 1}), "bad_request: 'cmd' must be a string"),
    Bad("control", "cmd number", request({"id": 2, "cmd": 7}), "'cmd' must be a string"),
    Bad("control", "unknown cmd", request({"id": 3, "cmd": "frob"}), "unknown command 'frob'"),
    Bad("control", "private cmd", request({"id": 4, "cmd": "__init__"}), "unknown_command"),
    Bad("control", "id list", request({"id": [1], "cmd": "status"}), "'id' must be an integer"),
    Bad("control", "pin bool", request({"id": 5, "cmd": "pin", "step": True}), "bad_argument"),
    Bad(
        "control",
        "pin negative",
        request({"id": 6, "cmd": "pin", "step": -1}),
        "'step' must be an integer between 0 and 2147483647, got -1",
    ),
    Bad(
        "control",
        "pin beyond 2^31-1",
        request({"id": 6, "cmd": "pin", "step": 2**31}),
        "'step' must be an integer between 0 and 2147483647, got 2147483648",
    ),
    Bad("control", "pin word", request({"id": 7, "cmd": "pin", "step": "ten"}), "'step' must"),
    Bad("control", "pin no step", request({"id": 8, "cmd": "pin"}), "'pin' needs 'step'"),
    Bad(
        "control",
        "pin missing checkpoint",
        request({"id": 9, "cmd": "pin", "step": 999999}),
        "no verified checkpoint at step 999999",
    ),
    Bad(
        "control",
        "unpin not pinned",
        request({"id": 10, "cmd": "unpin", "step": 3}),
        "step 3 is not pinned",
    ),
    Bad(
        "control",
        "history points 0",
        request({"id": 11, "cmd": "history", "points": 0}),
        "'points' must be an integer between 1 and 100000",
    ),
    Bad(
        "control",
        "history float",
        request({"id": 12, "cmd": "history", "points": 1e9}),
        "'points' must be an integer",
    ),
    Bad(
        "control",
        "history start negative",
        request({"id": 13, "cmd": "history", "start": -1}),
        "'start' must be an integer between 0 and 2147483647",
    ),
    Bad(
        "control",
        "history end beyond 2^31-1",
        request({"id": 13, "cmd": "history", "end": 2**31}),
        "'end' must be an integer between 0 and 2147483647",
    ),
    Bad("control", "events n 0", request({"id": 14, "cmd": "events", "n": 0}), "'n' must be"),
    Bad(
        "control",
        "topics not a list",
        request({"id": 15, "cmd": "subscribe", "topics": "telemetry"}),
        "'topics' must be a list",
    ),
    Bad(
        "control",
        "unknown topic",
        request({"id": 16, "cmd": "subscribe", "topics": ["nope"]}),
        "unknown topic(s) nope",
    ),
    Bad(
        "control",
        "save wait word",
        request({"id": 17, "cmd": "save", "wait": "yes"}),
        "'wait' must be true or false",
    ),
    Bad(
        "control",
        "save negative timeout",
        request({"id": 18, "cmd": "save", "timeout_s": -1}),
        "'timeout_s' must be a positive number",
    ),
    Bad(
        "control",
        "start while running",
        request({"id": 19, "cmd": "start"}),
        "wrong_state: the run is running",
    ),
    Bad("control", "NaN literal", b'{"id": 20, "cmd": "status", "x": NaN}\n', "invalid JSON"),
    Bad("control", "not utf-8", b'{"id": 21, "cmd": "\xff\xfe"}\n', "invalid JSON"),
    Bad(
        "control",
        "nested 5000 deep",
        b'{"id": 22, "cmd": "status", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}\n",
        "invalid JSON",
    ),
    Bad(
        "control",
        "id beyond 64 bits",
        b'{"id": 1' + b"0" * 30 + b', "cmd": "status"}\n',
        "'id' must be an integer or a string",
    ),
    Bad("control", "no newline then EOF", b'{"id": 23, "cmd": "status"', "invalid JSON"),
    Bad(
        "control",
        "2 MiB line",
        b'{"id": 24, "cmd": "' + b"a" * (2 << 20) + b'"}\n',
        "too_large: line exceeds",
    ),
    Bad(
        "control",
        "1 MB arm name",
        request({"id": 25, "cmd": "pivot", "caps": {"x" * 1_000_000: 0.5}}),
        "unknown arm 'xxx",
        extra={"operator_record_under": 4096},
    ),
    Bad(
        "control",
        "start from_scratch not a bool",
        request({"id": 26, "cmd": "start", "from_scratch": "yes"}),
        "bad_argument: 'from_scratch' must be true or false",
    ),
    Bad(
        "control",
        "start from scratch while running",
        request({"id": 27, "cmd": "start", "from_scratch": True}),
        "wrong_state: the run is running",
    ),
    # ------------------------------------------------------------------ pivot
    Bad("pivot", "cap above 1", {"caps": {"docs": 1.5}}, "cap 1.5 is outside [0, 1]"),
    Bad("pivot", "negative floor", {"floors": {"docs": -0.1}}, "floor -0.1 is outside [0, 1]"),
    Bad(
        "pivot",
        "floor above cap",
        {"caps": {"docs": 0.1}, "floors": {"docs": 0.2}},
        "floor 0.2 is above cap 0.1",
    ),
    Bad(
        "pivot",
        "floors above 1",
        {"floors": {"docs": 0.5, "code": 0.4, "tests": 0.3}},
        "floors sum to 1.2",
    ),
    Bad(
        "pivot",
        "caps below 1",
        {"caps": {"docs": 0.3, "code": 0.3, "tests": 0.3}},
        "caps sum to 0.9",
    ),
    Bad("pivot", "unknown arm", {"caps": {"nosuch": 0.5}}, "unknown arm 'nosuch'"),
    Bad("pivot", "zombie arm", {"caps": {"legacy": 0.5}}, "no data source any more (zombie"),
    Bad("pivot", "word value", {"caps": {"docs": "half"}}, "'caps' must map arm names to numbers"),
    Bad("pivot", "bool value", {"floors": {"docs": True}}, "'floors' must map arm names"),
    Bad("pivot", "list of caps", {"caps": [0.5]}, "'caps' must map arm names to numbers"),
    Bad("pivot", "nothing to change", {}, "a pivot needs 'caps' or 'floors'"),
    Bad("pivot", "smuggled context", {"caps": {"docs": 0.5}, "_arms": ["x"]}, "unexpected"),
    # ------------------------------------------------------------------ print
    # What the command line prints of text that came from the run: (what, fields) -> the
    # text that must show, with no control character left around it.
    Bad(
        "print",
        "run name with a title escape",
        ("status", {"run": "a\x1b]0;owned\x07b"}),
        "run       ab",
    ),
    Bad(
        "print", "run name with colours", ("status", {"run": "\x1b[31mred\x1b[0m"}), "run       red"
    ),
    Bad("print", "run name with C1 CSI", ("status", {"run": "x\x9b2Jy"}), "run       xy"),
    Bad(
        "print",
        "run name with newlines",
        ("status", {"run": "a\nstate     fake"}),
        "run       a state",
    ),
    Bad("print", "bidi override", ("status", {"run": "abc\u202edef"}), "run       abcdef"),
    Bad(
        "print",
        "crash reason with escapes",
        ("status", {"detail": {"reason": "\x1b[2Jexit 1"}}),
        "(exit 1)",
    ),
    Bad(
        "print", "gpu name", ("status", {"gpu": {"name": "RTX\x1b[8m 4090"}}), "gpu       RTX 4090"
    ),
    Bad(
        "print",
        "stop message",
        ("stop", {"outcome": "saved", "message": "saved\x1b]8;;http://x\x07 at 10"}),
        "trainer stopped: saved at 10",
    ),
    Bad(
        "print",
        "event field",
        ("event", {"ts": "t", "kind": "crash", "cause": "\x9b31mboom"}),
        " boom\n",  # the crash's cause as its summary, the whole escape taken out
    ),
    # ------------------------------------------------------------------ log
    Bad("log", "garbage text", b"hello world, this is not a step\n", ""),
    Bad("log", "binary", b"\x00\xff\xfe\x80 step: 5 \x81\n", '"undecodable": 1'),
    Bad("log", "huge line", b"x" * 200_000 + b"\n", '"skipped_long": 1'),
    Bad("log", "step line, bad utf-8", b"step: 12, loss: 1.5, arm: \xff\xfe\n", '"undecodable": 1'),
    Bad("log", "negative step", b"step: -5, loss: 1.0, dt: 0.1\n", ""),
    Bad("log", "21-digit step", b"step: 999999999999999999999, loss: nan\n", ""),
    Bad("log", "nan dt", b"step: 13, loss: 4.9, dt: nan\n", ""),
    Bad("log", "nan", b"step: 900001, loss: nan, dt: 0.1\n", '"loss": "nan"'),
    Bad("log", "-nan", b"step: 900002, loss: -nan, dt: 0.1\n", '"loss": "nan"'),
    Bad("log", "NaN", b"step: 900003, loss: NaN, dt: 0.1\n", '"loss": "nan"'),
    Bad("log", "inf", b"step: 900004, loss: inf, dt: 0.1\n", '"loss": "inf"'),
    Bad("log", "overflowing number", b"step: 900005, loss: 1e999\n", '"loss": "inf"'),
    Bad("log", "above max_loss", b"step: 900006, loss: 1e30, dt: 0.1\n", '"loss": 1e+30'),
    # ------------------------------------------------------------------ checkpoint
    # Inputs are (kind, value) pairs made into bytes for the step in the file's name.
    Bad("checkpoint", "truncated", ("truncated to", 5000), "truncated or padded"),
    Bad("checkpoint", "padded", ("padded by", 3), "truncated or padded"),
    Bad("checkpoint", "wrong header step", ("header step", 1), "header step 1 does not match"),
    Bad("checkpoint", "n_params 0", ("header n_params", 0), "n_params = 0, expected > 0"),
    Bad("checkpoint", "n_params < 0", ("header n_params", -7), "n_params = -7"),
    Bad("checkpoint", "foreign file", ("bytes", b"\x89PNG\r\n\x1a\n" + bytes(100)), "header step"),
    Bad("checkpoint", "zero-length", ("bytes", b""), "0 bytes, shorter than the 8-byte header"),
    Bad("checkpoint", "5 bytes", ("bytes", b"\x01\x02\x03\x04\x05"), "5 bytes, shorter"),
    Bad("checkpoint", "directory", ("directory", None), "Is a directory"),
    Bad("checkpoint", "link to a valid file outside", ("link to", "valid"), "a symbolic link"),
    Bad("checkpoint", "dangling link", ("link to", "nothing"), "a symbolic link"),
    Bad("checkpoint", "fifo", ("fifo", None), "not a regular file or folder"),
    Bad("checkpoint", "step beyond 64 bits", ("named step", 10**20), "is beyond 2147483647"),
    Bad("checkpoint", "step 2^31", ("named step", 2**31), "step 2147483648 is beyond 2147483647"),
    Bad("checkpoint", "truncated", ("truncated to", 5000), "truncated", stage="startup"),
    Bad("checkpoint", "wrong header step", ("header step", 1), "does not match", stage="startup"),
    Bad("checkpoint", "zero-length", ("bytes", b""), "0 bytes", stage="startup"),
    Bad("checkpoint", "directory", ("directory", None), "Is a directory", stage="startup"),
    Bad(
        "checkpoint",
        "link to a valid file outside",
        ("link to", "valid"),
        "a symbolic link",
        stage="startup",
    ),
    Bad("checkpoint", "dangling link", ("link to", "nothing"), "a symbolic link", stage="startup"),
    Bad("checkpoint", "fifo", ("fifo", None), "not a regular file or folder", stage="startup"),
    Bad(
        "checkpoint",
        "step beyond 64 bits",
        ("named step", 10**20),
        "is beyond 2147483647 (2^31-1)",
        stage="startup",
    ),
    # ------------------------------------------------------------------ sidecar
    Bad(
        "sidecar",
        ".state.json not json",
        (".state.json", b"{not json"),
        "has not written its bandit state",
    ),
    Bad(
        "sidecar",
        ".state.json array",
        (".state.json", b"[1, 2, 3]"),
        "has not written its bandit state",
    ),
    Bad("sidecar", ".state.json empty", (".state.json", b""), "has not written its bandit state"),
    Bad(
        "sidecar",
        ".state.json binary",
        (".state.json", b"\x00\xff\xfe"),
        "has not written its bandit state",
    ),
    Bad(
        "sidecar",
        ".state.json NaN",
        (".state.json", b'{"arms": {"docs": NaN}}'),
        "has not written its bandit state",
    ),
    Bad("sidecar", ".samples.json not json", (".samples.json", b"{{{"), ""),
    Bad("sidecar", ".samples.json number", (".samples.json", b"42"), ""),
    Bad("sidecar", ".samples.json binary", (".samples.json", b"\xff" * 64), ""),
    # ------------------------------------------------------------------ policy file
    Bad("policy_file", "not json", b"not json", "policy.json: not valid JSON"),
    Bad("policy_file", "array", b"[1]", "a policy is a JSON object"),
    Bad("policy_file", "cap above 1", b'{"arms": {"docs": {"cap": 2}}}', "cap 2 is outside"),
    Bad("policy_file", "unknown arm", b'{"arms": {"nosuch": {}}}', "unknown arm 'nosuch'"),
    Bad(
        "policy_file",
        "floors above 1",
        b'{"arms": {"docs": {"floor": 0.6}, "code": {"floor": 0.6}}}',
        "floors sum to 1.2",
    ),
    Bad("policy_file", "NaN cap", b'{"arms": {"docs": {"cap": NaN}}}', "must be a number"),
    Bad("policy_file", "bool cap", b'{"arms": {"docs": {"cap": true}}}', "must be a number"),
    Bad("policy_file", "unknown key", b'{"policy": 1}', "unknown key 'policy'"),
    Bad("policy_file", "a directory", "<directory>", "policy.json: cannot read"),
    Bad(
        "policy_file",
        "not utf-8",
        b"\xff\xfe{}",
        "policy.json",
    ),
]


def rows(surface: str, stage: str | None = None) -> list[Any]:
    params = []
    for row in CATALOGUE:
        if row.surface != surface or (stage is not None and row.stage != stage):
            continue
        marks = [pytest.mark.xfail(strict=True, reason=row.xfail)] if row.xfail else []
        params.append(
            pytest.param(
                row,
                id=f"{row.stage}-{row.name}" if surface == "checkpoint" else row.name,
                marks=marks,
            )
        )
    return params


# ----------------------------------------------------------------------------- helpers


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """`trainwarden ARGS` run by the command line's own main() in this process, as cli()
    would report it. A config that got as far as starting a daemon fails the row instead
    (nothing is started here); the subprocess rows below keep the real command's exit
    status and output whole."""

    def started(*_: object, **__: object) -> None:
        raise AssertionError(f"trainwarden {' '.join(args)}: the daemon was about to start")

    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        unittest.mock.patch("asyncio.run", started),
        unittest.mock.patch("trainwarden.supervisor.cli.detach.start_detached", started),
    ):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}: {stderr[-2000:]}"
    return lines[0]


def verifies(path: Path) -> bool:
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return False
        data = path.read_bytes()
    except OSError:
        return False
    if len(data) < 8:
        return False
    step, n = struct.unpack("<ii", data[:8])
    return n > 0 and step == int(path.name[5:-4]) and len(data) == 8 + 12 * n


def shared_run(run_dir: Path) -> Path:
    """The shared run: an endless scripted trainer saving every 20 steps, restarted at once
    however often a row kills it or a divergence is reported."""
    return scripted_run(
        run_dir,
        *("--steps", "100000000", "--save-every", "20", "--dt", "0.02"),
        *("--n-params", str(N_PARAMS)),
        run={"name": "bad-inputs"},
        restart={
            "backoff_initial_s": 0.0,
            "backoff_max_s": 0.0,
            "stall_timeout_s": 60.0,
            "max_restarts_without_progress": 50,
            "divergence_retries": 1000,
        },
    )


GOOD_STATE = {
    "step": 1,
    "arms": {
        "docs": {"prob": 0.4, "cap": 1.0, "floor": 0.0},
        "code": {"prob": 0.3, "cap": 1.0, "floor": 0.0},
        "tests": {"prob": 0.3, "cap": 1.0, "floor": 0.0},
    },
    "zombies": ["legacy"],
}
GOOD_SAMPLES = {"step": 1, "samples": [{"arm": "docs", "text": "def f():"}]}


class Live:
    """The shared daemon and what every row checks after it."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.run_dir = daemon.run_dir
        self.ckpts = self.run_dir / "checkpoints"

    def status(self) -> dict[str, Any]:
        return self.daemon.status()

    def running(self, timeout: float = 30.0) -> dict[str, Any]:
        return self.daemon.wait_state("running", timeout=timeout)

    def newest_verified(self) -> int:
        listed = self.daemon.request("checkpoints")["checkpoints"]
        assert listed, "the daemon lists no verified checkpoint"
        for c in listed:
            if verifies(self.ckpts / c["name"]):
                continue
            # Retention may have removed it since the listing: then it is no longer listed.
            again = {d["name"] for d in self.daemon.request("checkpoints")["checkpoints"]}
            removed = any(
                r["kind"] in ("delete", "quarantine") and r.get("name") == c["name"]
                for r in journal(self.run_dir)
            )
            assert c["name"] not in again and removed, f"listed {c['name']} does not verify"
        return max(c["step"] for c in listed)

    def raw(self, payload: bytes, timeout: float = 20.0) -> list[dict[str, Any]]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(str(self.run_dir / ".trainwarden" / "control.sock"))
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        sock.close()
        return [orjson.loads(line) for line in data.splitlines() if line.strip()]

    def still_supervising(self, before_step: int, same_pid: int | None) -> None:
        """Status answers, a trainer runs (the same one unless the row killed it), and the
        newest verified checkpoint from before the row is still there or superseded."""
        status = self.running()
        if same_pid is not None:
            assert status["trainer_pid"] == same_pid, "the row cost the trainer its life"
        assert pid_alive(status["trainer_pid"])
        newest = self.newest_verified()
        assert newest >= before_step
        assert verifies(self.ckpts / f"step_{newest:06d}.bin")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    run_dir = shared_run(tmp_path_factory.mktemp("bad-inputs") / "run")
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running", timeout=60)
        shared = Live(daemon)
        (run_dir / ".state.json").write_bytes(orjson.dumps(GOOD_STATE))
        (run_dir / ".samples.json").write_bytes(orjson.dumps(GOOD_SAMPLES))
        wait_for(
            lambda: (
                (run_dir / "checkpoints").is_dir()
                and shared.daemon.request("checkpoints")["checkpoints"]
            ),
            30,
            0.1,
            what="the first checkpoint",
        )
        yield shared


# ----------------------------------------------------------------------------- config


REFUSED_WHEN_STARTING = ("state folder links outside", "journal links outside")
"""Rows the daemon refuses as it starts (it opens its state folder then), not while it
reads the config: they run only through the real command."""
REAL_COMMAND_ROWS = ("toml syntax", "unknown key", "alert url not a list", *REFUSED_WHEN_STARTING)
"""Rows also run through the real command: its exit status and one line as a user sees them."""


def config_rows(real_command: bool) -> list[Any]:
    if real_command:
        return [r for r in rows("config") if r.values[0].name in REAL_COMMAND_ROWS]
    return [r for r in rows("config") if r.values[0].name not in REFUSED_WHEN_STARTING]


@pytest.mark.parametrize("row", config_rows(real_command=False))
def test_config(row: Bad, tmp_path: Path):
    refused_config(row, tmp_path, in_process)


@pytest.mark.parametrize("row", config_rows(real_command=True))
def test_config_through_the_real_command(row: Bad, tmp_path: Path):
    refused_config(row, tmp_path, cli)


def refused_config(
    row: Bad, tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    keep = run_dir / "checkpoints" / "step_000010.bin"
    keep.write_bytes(ckpt(10))
    (run_dir / "train.py").write_text("")  # TRAINER_OK's script: rows are about the rest
    config = run_dir / "trainwarden.toml"
    if row.input == "<directory>":
        config.mkdir()
    elif row.input == "<fifo>":
        os.mkfifo(config)  # reading it would block for ever
    else:
        data = row.input if isinstance(row.input, bytes) else row.input.encode()
        config.write_bytes(data)
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o755)
    owner = row.extra.get("mirror_owner")
    if owner is not None:  # a mirror folder another run has claimed
        mirror = tmp_path / "mirror"
        mirror.mkdir()
        (mirror / "owner.json").write_text(json.dumps(owner))
        config.write_text(config.read_text().replace("{mirror}", str(mirror)))
    links = row.extra.get("links", {})
    for name, target in links.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).symlink_to(target.replace("{outside}", str(outside)))
    result = run("daemon", str(run_dir))
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert row.expect in line, line
    if row.extra.get("names_config", True):
        assert "trainwarden.toml" in line, line
    # Nothing started, nothing touched: not even what a link points at.
    assert not (run_dir / "training.log").exists()
    assert not (run_dir / ".trainwarden").exists() or links
    assert keep.read_bytes() == ckpt(10)
    assert list(outside.iterdir()) == [] and stat.S_IMODE(outside.stat().st_mode) == 0o755


# ----------------------------------------------------------------------------- cli


@pytest.mark.parametrize("row", rows("cli"))
def test_cli(row: Bad, tmp_path: Path, live: Live):
    bad_command_line(row, tmp_path, live, in_process)


@pytest.mark.parametrize(
    "row",
    [
        r
        for r in rows("cli")
        if r.values[0].name in ("no command", "status, no run", "pivot nothing")
    ],
)
def test_cli_through_the_real_command(row: Bad, tmp_path: Path, live: Live):
    bad_command_line(row, tmp_path, live, cli)


def bad_command_line(
    row: Bad, tmp_path: Path, live: Live, run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    places = {"{empty}": str(empty), "{new}": str(tmp_path / "new"), "{live}": str(live.run_dir)}
    before = live.newest_verified()
    pid = live.status()["trainer_pid"]
    result = run(*[places.get(a, a) for a in row.input])
    assert result.returncode == row.code, result.stderr
    line = one_line(result.stderr)
    assert row.expect in line, line
    assert not CONTROL.search(line), repr(line)
    assert not (tmp_path / "new" / "trainwarden.toml").exists()
    assert not (live.run_dir / "archive").exists() and not (live.run_dir / "policy.json").exists()
    live.still_supervising(before, same_pid=pid)


# ----------------------------------------------------------------------------- control


@pytest.mark.parametrize("row", rows("control"))
def test_control(row: Bad, live: Live):
    before = live.newest_verified()
    pid = live.status()["trainer_pid"]
    replies = live.raw(row.input)
    errors = [r for r in replies if not r.get("ok")]
    assert errors, f"no error reply: {replies}"
    text = " ".join(f"{e['error']['code']}: {e['error']['message']}" for e in errors)
    assert row.expect in text, text
    # The same connection's neighbours are unaffected: a fresh request is answered.
    assert live.daemon.request("hello")["protocol"] == 1
    if "operator_record_under" in row.extra:
        # Journaled, but bounded: junk sent to the socket does not grow the journal by its size.
        record = [r for r in journal(live.run_dir) if r["kind"] == "operator"][-1]
        size = len(orjson.dumps(record))
        assert size < row.extra["operator_record_under"] and "truncated" in str(record), size
    live.still_supervising(before, same_pid=pid)


# ----------------------------------------------------------------------------- print

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""Characters that steer a terminal (C0, C1 and bidi controls) rather than show."""


@pytest.mark.parametrize("row", rows("print"))
def test_print(row: Bad):
    what, fields = row.input
    if what == "status":
        text = format_status({"run": "run", "state": "running", **fields})  # type: ignore[typeddict-item]
    elif what == "stop":
        text = describe_result("stop", fields)
    else:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_event(fields, as_json=False)  # type: ignore[arg-type]
        text = out.getvalue()
    assert row.expect in text, text
    assert not CONTROL.search(text.replace("\n", "")), repr(text)


# ----------------------------------------------------------------------------- pivot


@pytest.mark.parametrize("row", rows("pivot"))
def test_pivot(row: Bad, live: Live):
    (live.run_dir / ".state.json").write_bytes(orjson.dumps(GOOD_STATE))
    before = live.newest_verified()
    pid = live.status()["trainer_pid"]
    kinds_before = len(journal(live.run_dir))
    replies = live.raw(request({"id": 1, "cmd": "pivot", **row.input}))
    assert len(replies) == 1 and not replies[0]["ok"], replies
    error = replies[0]["error"]
    assert row.expect in error["message"], error
    assert error["code"] == "bad_argument"
    # Refused before anything happened: no signal, no pivot stage, no files.
    new = journal(live.run_dir)[kinds_before:]
    assert not [r for r in new if r["kind"] in ("pivot_stage", "signal", "pivot")], new
    assert not (live.run_dir / "archive").exists() and not (live.run_dir / "policy.json").exists()
    assert live.status()["state"] == "running"
    live.still_supervising(before, same_pid=pid)


# ----------------------------------------------------------------------------- log


def append_to_log(run_dir: Path, data: bytes) -> None:
    fd = os.open(run_dir / "training.log", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@pytest.mark.parametrize("row", rows("log"))
def test_log(row: Bad, live: Live):
    before = live.newest_verified()
    status = live.running()
    pid, stats = status["trainer_pid"], status["log"]
    start = len(journal(live.run_dir))
    divergence = row.expect.startswith('"loss"')
    append_to_log(live.run_dir, row.input)
    if divergence:
        wait_for(
            lambda: any(r["kind"] == "divergence" for r in journal(live.run_dir)[start:]),
            10,
            what="a divergence record",
        )
    # Let the follower read it, then compare what it counted and what was journaled.
    time.sleep(0.5)
    status = live.running()
    delta = {k: status["log"][k] - stats[k] for k in ("skipped_long", "undecodable")}
    records = [
        {k: v for k, v in r.items() if k not in ("ts", "t")}
        for r in journal(live.run_dir)[start:]
        if r["kind"] in ("divergence", "crash", "quarantine", "halt", "signal")
    ]
    observed = json.dumps({"log": delta, "records": records}, sort_keys=True)
    if row.expect:
        assert row.expect in observed, observed
    else:
        assert records == [] and delta == {"skipped_long": 0, "undecodable": 0}, observed
    if divergence:
        # Killed without a save and restarted from the newest verified checkpoint.
        kinds = [r["kind"] for r in records]
        assert "divergence" in kinds and "signal" in kinds, observed
        assert not any(r["kind"] == "quarantine" for r in records), observed
        live.still_supervising(before, same_pid=None)
        assert live.status()["trainer_pid"] != pid and not pid_alive(pid)
    else:
        live.still_supervising(before, same_pid=pid)


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_name(row: Bad, step: int) -> str:
    kind, value = row.input
    return f"step_{value if kind == 'named step' else step:06d}.bin"


def plant(row: Bad, target: Path, outside: Path) -> None:
    """Make `target` (a checkpoint name) hold the row's bad input."""
    kind, value = row.input
    step = int(re.search(r"step_(\d+)\.bin", target.name).group(1))  # type: ignore[union-attr]
    if kind == "directory":
        target.mkdir()
        (target / "weights").write_bytes(b"x")
    elif kind == "link to":
        real = outside / f"real-{target.name}"
        if value == "valid":
            real.write_bytes(ckpt(step))
        target.symlink_to(real)
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "truncated to":
        target.write_bytes(ckpt(step)[:value])
    elif kind == "padded by":
        target.write_bytes(ckpt(step) + bytes(value))
    elif kind == "header step":
        target.write_bytes(ckpt(value))
    elif kind == "header n_params":
        target.write_bytes(struct.pack("<ii", step, value) + bytes(64))
    elif kind == "named step":
        target.write_bytes(ckpt(12345))
    else:
        target.write_bytes(value)


def reason_of(run_dir: Path, name: str, start: int = 0) -> str | None:
    for r in journal(run_dir)[start:]:
        if r["kind"] == "quarantine" and r["name"] == name:
            return r["reason"]
    return None


@pytest.mark.parametrize("row", rows("checkpoint", "live"))
def test_checkpoint_live(row: Bad, live: Live, tmp_path: Path):
    before = live.newest_verified()
    pid = live.status()["trainer_pid"]
    outside = tmp_path / "outside"
    outside.mkdir()
    name = checkpoint_name(row, 920000 + CATALOGUE.index(row))
    start = len(journal(live.run_dir))
    # Staged under another name in the checkpoint folder, then renamed: the contract's
    # commit point.
    staged = live.ckpts / f"staging-{name}"
    plant(row, staged, outside)
    os.replace(staged, live.ckpts / name)

    def quarantined() -> tuple[str] | None:
        assert live.daemon.alive, "the daemon died: " + live.daemon.stderr(1500)
        reason = reason_of(live.run_dir, name, start)
        if reason is None or not os.path.lexists(live.ckpts / "quarantine" / name):
            # The journal records the quarantine before the file is moved: wait for both.
            return None
        return (reason,)  # a tuple: an empty reason counts too

    (reason,) = wait_for(quarantined, 10, what=f"{name} to be quarantined")
    assert row.expect in reason, reason
    assert os.path.lexists(live.ckpts / "quarantine" / name)
    assert not os.path.lexists(live.ckpts / name)
    assert all(c["name"] != name for c in live.daemon.request("checkpoints")["checkpoints"])
    # A link is moved as a link: its target keeps every byte.
    for real in outside.iterdir():
        assert real.read_bytes() == ckpt(int(name[5:-4]))
    live.still_supervising(before, same_pid=pid)


def test_checkpoint_startup_batch(tmp_path: Path):
    """Every "startup" row at once, present when a daemon starts: each is quarantined with
    its reason, the daemon starts (a FIFO does not block it, a huge step does not crash
    it) and resumes from the one real checkpoint; link targets keep their bytes."""
    batch = [p.values[0] for p in rows("checkpoint", "startup")]
    run_dir = shared_run(tmp_path / "run")
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir()
    (ckpts / "step_000020.bin").write_bytes(ckpt(20))
    outside = tmp_path / "outside"
    outside.mkdir()
    names = {}
    for index, row in enumerate(batch):
        name = checkpoint_name(row, 30 + index)
        plant(row, ckpts / name, outside)
        names[name] = row
    targets = {p.name: p.read_bytes() for p in outside.iterdir()}
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running", timeout=60)
        for name, row in names.items():
            reason = reason_of(run_dir, name)
            assert reason is not None and row.expect in reason, (row.name, reason)
            assert os.path.lexists(ckpts / "quarantine" / name)
        spawn = next(r for r in journal(run_dir) if r["kind"] == "spawn")
        assert spawn["resume"]["step"] == 20
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == targets


# ----------------------------------------------------------------------------- sidecars


def snapshot(live: Live, topic: str) -> Any:
    with Client(live.run_dir / ".trainwarden" / "control.sock", timeout=10) as client:
        return client.request("subscribe", topics=[topic])["snapshot"][topic]


def wait_snapshot(live: Live, topic: str, expected: Any, timeout: float = 10.0) -> None:
    wait_for(
        lambda: snapshot(live, topic) == expected, timeout, 0.2, what=f"{topic} to be {expected}"
    )


@pytest.mark.parametrize("row", rows("sidecar"))
def test_sidecar(row: Bad, live: Live):
    filename, data = row.input
    topic = "bandit" if filename == ".state.json" else "samples"
    good = GOOD_STATE if topic == "bandit" else GOOD_SAMPLES
    good = {**good, "step": time.monotonic_ns()}  # a fresh good document each row
    (live.run_dir / filename).write_bytes(orjson.dumps(good))
    wait_snapshot(live, topic, good)
    before = live.newest_verified()
    pid = live.status()["trainer_pid"]
    (live.run_dir / filename).write_bytes(data)
    time.sleep(2.6)  # one sampling period (2 s) and a margin: the daemon has read it
    assert snapshot(live, topic) == good, "the topic lost the last good document"
    if topic == "bandit":
        replies = live.raw(request({"id": 1, "cmd": "pivot", "caps": {"docs": 0.5}}))
        assert not replies[0]["ok"] and row.expect in replies[0]["error"]["message"], replies
    assert not (live.run_dir / "archive").exists()
    live.still_supervising(before, same_pid=pid)
    (live.run_dir / filename).write_bytes(orjson.dumps(good))


# ----------------------------------------------------------------------------- policy file


@pytest.mark.parametrize("row", rows("policy_file"))
def test_policy_file(row: Bad, tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if row.input == "<directory>":
        (run_dir / "policy.json").mkdir()
    else:
        (run_dir / "policy.json").write_bytes(row.input)
    result = subprocess.run(
        [
            PYTHON,
            "-m",
            "trainwarden.trainer",
            "--run-dir",
            str(run_dir),
            "--steps",
            "1",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    line = one_line(result.stderr)
    assert line.startswith("trainer: ") and row.expect in line, line
    assert not (run_dir / "checkpoints").exists()


# ----------------------------------------------------------------------------- socket


def plant_for_socket(kind: str, where: Path) -> None:
    """Plant `kind` at `where` (owned by nobody, uid 65534, when it says "foreign")."""
    where.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if kind in ("file", "foreign file"):
        where.write_bytes(b"precious\n")
    elif kind == "foreign socket":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(where))
        sock.close()
    elif kind == "folder":
        where.mkdir()
    elif kind == "link":
        (where.parent / "target.txt").write_bytes(b"precious\n")
        where.symlink_to(where.parent / "target.txt")
    elif kind == "open folder":
        where.mkdir()
        os.chmod(where, 0o777)
    elif kind == "foreign folder":
        where.mkdir(mode=0o700)
    if kind.startswith("foreign"):
        os.chown(where, 65534, 65534)


def looks(path: Path) -> tuple[int, int, int, bytes | None]:
    st = path.lstat()
    data = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
    return st.st_mode, st.st_uid, st.st_ino, data


@pytest.mark.parametrize("row", rows("socket"))
def test_socket_place(row: Bad, tmp_path: Path):
    if os.geteuid() != 0 and "foreign" in row.input["plant"][0]:
        pytest.skip("needs root to plant another user's file")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    keep = run_dir / "checkpoints" / "step_000010.bin"
    keep.write_bytes(ckpt(10))
    (run_dir / "trainwarden.toml").write_text(
        TRAINER_OK + f"[control]\nsocket = {json.dumps(row.input['socket'])}\n"
    )
    kind, rel = row.input["plant"]
    planted = tmp_path / rel
    plant_for_socket(kind, planted)
    before = looks(planted)
    result = in_process("daemon", str(run_dir))
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert row.expect in line and "trainwarden.toml" in line and "control.socket" in line, line
    assert looks(planted) == before, "the daemon touched what sat at the socket's path"
    assert keep.read_bytes() == ckpt(10)
    assert not (run_dir / "training.log").exists()
