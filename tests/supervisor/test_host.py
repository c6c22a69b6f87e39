"""Host and trainer-tree figures against a real process tree of busy Python children."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil
import pytest

from trainwarden.supervisor.inputs.host import HostSample, HostSampler, disk_low
from trainwarden.supervisor.inputs.proctree import _kernel_descendants, descendants

# A stand-in trainer: starts two busy-looping workers, prints their pids, then waits.
TRAINER = """
import subprocess, sys, time
busy = "while True: pass"
workers = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(2)]
print(" ".join(str(w.pid) for w in workers), flush=True)
time.sleep(600)
"""


class Tree:
    def __init__(self, trainer: subprocess.Popen[str], workers: list[int]) -> None:
        self.trainer = trainer
        self.workers = workers


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def tree() -> Iterator[Tree]:
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        assert trainer.stdout is not None
        workers = [int(pid) for pid in trainer.stdout.readline().split()]
        yield Tree(trainer, workers)
    finally:
        for pid in [*workers, trainer.pid]:
            kill_pid(pid)
        trainer.wait(timeout=10)
        if trainer.stdout is not None:
            trainer.stdout.close()


def test_trainer_tree_cpu_rss_and_count(tree: Tree, tmp_path: Path) -> None:
    sampler = HostSampler(tmp_path)

    sampler.sample(tree.trainer.pid)  # first cpu_percent call of each process sets its baseline
    time.sleep(0.5)
    sample = sampler.sample(tree.trainer.pid)

    assert sample.trainer_processes == 3
    # Two busy loops: a sampler that rebuilt its psutil objects would read 0.0 here.
    assert sample.trainer_cpu_percent is not None and sample.trainer_cpu_percent > 10.0
    own_rss = [psutil.Process(pid).memory_info().rss for pid in [tree.trainer.pid, *tree.workers]]
    assert sample.trainer_rss_bytes is not None
    assert sample.trainer_rss_bytes > max(own_rss)
    assert abs(sample.trainer_rss_bytes - sum(own_rss)) < sum(own_rss) * 0.5


def test_dead_children_are_dropped(tree: Tree, tmp_path: Path) -> None:
    sampler = HostSampler(tmp_path)
    assert sampler.sample(tree.trainer.pid).trainer_processes == 3

    kill_pid(tree.workers[0])
    deadline = time.monotonic() + 10
    while psutil.pid_exists(tree.workers[0]) and psutil.Process(tree.workers[0]).status() not in (
        psutil.STATUS_ZOMBIE,
        psutil.STATUS_DEAD,
    ):
        assert time.monotonic() < deadline
        time.sleep(0.01)

    sample = sampler.sample(tree.trainer.pid)

    assert sample.trainer_processes == 2
    assert tree.workers[0] not in sampler._tree


def test_no_trainer_and_a_gone_trainer_give_none(tree: Tree, tmp_path: Path) -> None:
    sampler = HostSampler(tmp_path)

    idle = sampler.sample(None)
    assert (idle.trainer_cpu_percent, idle.trainer_rss_bytes, idle.trainer_processes) == (
        None,
        None,
        0,
    )

    assert sampler.sample(tree.trainer.pid).trainer_processes == 3
    kill_pid(tree.trainer.pid)
    tree.trainer.wait(timeout=10)

    gone = sampler.sample(tree.trainer.pid)
    assert gone.trainer_cpu_percent is None and gone.trainer_rss_bytes is None
    assert gone.trainer_processes == 0


def test_host_figures(tmp_path: Path) -> None:
    sample = HostSampler(tmp_path).sample(None)

    usage = shutil.disk_usage(tmp_path)
    memory = psutil.virtual_memory()
    assert sample.mem_total_bytes == memory.total
    assert 0 < sample.mem_used_bytes < sample.mem_total_bytes
    assert sample.disk_total_bytes == usage.total
    assert sample.disk_free_bytes is not None
    assert abs(sample.disk_free_bytes - usage.free) < 256 * 1024**2
    assert (sample.load_avg_1m, sample.load_avg_5m, sample.load_avg_15m) == pytest.approx(
        os.getloadavg(), abs=2.0
    )


def test_checkpoint_dir_not_created_yet_reports_its_volume(tmp_path: Path) -> None:
    sample = HostSampler(tmp_path / "run" / "checkpoints").sample(None)

    assert sample.disk_total_bytes == shutil.disk_usage(tmp_path).total


def test_to_dict_is_json(tmp_path: Path) -> None:
    sample = HostSampler(tmp_path).sample(os.getpid())

    data = orjson.loads(orjson.dumps(sample.to_dict()))

    assert set(data) == set(HostSample._fields)
    assert data["trainer_processes"] >= 1
    assert data["trainer_rss_bytes"] > 0


@pytest.mark.parametrize(
    ("free", "newest", "low"),
    [
        (10 * 10**9, 1_488_000_008, False),
        (2_232_000_013, 1_488_000_008, False),  # exactly 1.5x, rounded up: enough
        (2_232_000_011, 1_488_000_008, True),
        (0, 1, True),
        (0, 0, False),
        (None, 1_488_000_008, False),
        (100, None, False),
    ],
)
def test_disk_low_below_one_and_a_half_checkpoints(
    free: int | None, newest: int | None, low: bool
) -> None:
    assert disk_low(free, newest) is low


def test_descendants_match_psutil_for_a_nested_tree(tmp_path: Path) -> None:
    # sh -> (sh -> sleep), sleep: a grandchild as well as children.
    top = subprocess.Popen(["sh", "-c", "sh -c 'sleep 60; :' & sleep 60 & wait"])
    try:
        expected: set[int] = set()
        deadline = time.monotonic() + 10
        while len(expected) < 3 and time.monotonic() < deadline:
            expected = {p.pid for p in psutil.Process(top.pid).children(recursive=True)}
            time.sleep(0.02)
        assert len(expected) == 3
        assert set(_kernel_descendants(top.pid) or []) == expected
        assert set(descendants(top.pid)) == expected
        sample = HostSampler(tmp_path).sample(top.pid)
        assert sample.trainer_processes == 4
    finally:
        for pid in sorted(expected, reverse=True):
            kill_pid(pid)
        kill_pid(top.pid)
        top.wait(timeout=10)


def test_descendants_of_a_gone_process_is_empty() -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    assert descendants(done.pid) == []


def test_without_kernel_children_lists_psutil_walks_the_tree(
    tree: Tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "trainwarden.supervisor.inputs.proctree._kernel_descendants", lambda pid: None
    )
    assert set(descendants(tree.trainer.pid)) == set(tree.workers)
    sample = HostSampler(tmp_path).sample(tree.trainer.pid)
    assert sample.trainer_processes == 3


def test_descendants_is_none_when_the_kernel_has_no_children_lists(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainwarden.supervisor.inputs import proctree

    real_read = proctree.read_proc

    def no_children_file(path: str) -> bytes:  # CONFIG_PROC_CHILDREN off
        if path.endswith("/children"):
            raise FileNotFoundError(path)
        return real_read(path)

    monkeypatch.setattr(proctree, "read_proc", no_children_file)
    assert _kernel_descendants(tree.trainer.pid) is None


def test_the_daemon_samples_the_host_at_the_configured_interval(tmp_path: Path) -> None:
    from tests.support import PYTHON, make_run, running_daemon

    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, "-c", "import time; time.sleep(60)"],
        telemetry={"sample_interval_s": 0.1},
    )
    with running_daemon(run_dir) as daemon, daemon.client(timeout=10.0) as client:
        client.request("subscribe", topics=["host"])
        frames = 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if client.read_message().get("topic") == "host":
                frames += 1
    # About 20 at 0.1 s; at the default 2 s there would be one or two.
    assert frames >= 5, f"{frames} host samples in 2 s at a 0.1 s interval"


@pytest.mark.parametrize("value", [0, -1.0, "nan", "inf"])
def test_a_sample_interval_that_is_not_a_finite_positive_number_is_refused(
    tmp_path: Path, value: object
) -> None:
    from trainwarden.supervisor.config import load_config
    from trainwarden.supervisor.errors import ConfigError

    literal = value if isinstance(value, str) else repr(value)
    (tmp_path / "trainwarden.toml").write_text(
        f'[trainer]\ncommand = ["python", "train.py"]\n[telemetry]\nsample_interval_s = {literal}\n'
    )
    with pytest.raises(ConfigError, match=r"'telemetry.sample_interval_s' = .* finite number > 0"):
        load_config(tmp_path, check_plugins=False)
    (tmp_path / "trainwarden.toml").write_text('[trainer]\ncommand = ["python", "train.py"]\n')
    assert load_config(tmp_path, check_plugins=False).telemetry.sample_interval_s == 2.0


def test_read_proc_reads_a_file_longer_than_one_read_whole(tmp_path: Path):
    from trainwarden.supervisor.inputs.proctree import READ_BYTES, read_proc

    data = os.urandom(READ_BYTES * 2 + 123)
    path = tmp_path / "long"
    path.write_bytes(data)
    assert read_proc(str(path)) == data
    assert read_proc(f"/proc/{os.getpid()}/stat").startswith(f"{os.getpid()} (".encode())
    with pytest.raises(FileNotFoundError):
        read_proc(str(tmp_path / "missing"))
    # Nothing is left open: a daemon reads these every second for weeks.
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        read_proc(str(path))
    assert len(os.listdir("/proc/self/fd")) == before
