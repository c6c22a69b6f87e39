"""The torch-pt format on real torch.save files: weights_only verification in a subprocess."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tests.format_trainer import daemon_scenario
from tests.support import make_run, pid_alive
from trainwarden.plugins.formats.torch_pt import TorchPt
from trainwarden.supervisor.errors import CheckpointInvalid, ConfigError

pytestmark = pytest.mark.timeout(240)


def save(path: Path, obj: object, **kwargs: object) -> Path:
    torch.save(obj, path, **kwargs)  # type: ignore[arg-type]
    return path


def good_state(step: int | None = 100) -> dict[str, object]:
    state: dict[str, object] = {
        "model": {"wte": torch.zeros(10, 4), "ln": torch.ones(4)},
        "optimizer": {"state": {}, "param_groups": [{"lr": 3e-4, "params": [0, 1]}]},
    }
    if step is not None:
        state["step"] = step
    return state


def invalid(fmt: TorchPt, path: Path) -> str:
    with pytest.raises(CheckpointInvalid) as caught:
        fmt.verify(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(path.name)
    return message


def test_names_in_flight_and_pattern_option(tmp_path: Path):
    fmt = TorchPt({})
    assert fmt.step_of(tmp_path / "ckpt_000100.pt") == 100
    assert fmt.step_of(tmp_path / "step-100.pt") == 100
    for other in ("ckpt.pt", "ckpt_000100.pt.tmp", "model_100.pt", "step-100.pth", "ckpt_x.pt"):
        assert fmt.step_of(tmp_path / other) is None
    assert fmt.is_in_flight(tmp_path / "ckpt_000100.pt.tmp")
    assert not fmt.is_in_flight(tmp_path / "ckpt_000100.pt")
    assert not fmt.is_in_flight(tmp_path / "notes.tmp")
    assert fmt.companions(tmp_path / "ckpt_000100.pt") == []
    custom = TorchPt({"options": {"pattern": r"^iter(\d+)\.pth$", "tmp_suffix": ".partial"}})
    assert custom.step_of(tmp_path / "iter42.pth") == 42
    assert custom.is_in_flight(tmp_path / "iter42.pth.partial")
    assert custom.step_of(tmp_path / "ckpt_000100.pt") is None


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"pattern": r"^ckpt_\d+\.pt$"}, "pattern"),
        ({"pattern": "(unclosed"}, "pattern"),
        ({"required_keys": "model"}, "required_keys"),
        ({"verify_timeout_s": 0}, "verify_timeout_s"),
    ],
)
def test_bad_options_are_config_errors_naming_the_key(options: dict[str, object], key: str):
    with pytest.raises(ConfigError, match=rf"'checkpoints\.options\.{key}'"):
        TorchPt(options)


def test_a_real_checkpoint_verifies_with_its_size_and_parameter_count(tmp_path: Path):
    path = save(tmp_path / "ckpt_000100.pt", good_state(100))
    info = TorchPt({}).verify(path)
    assert (info.step, info.path, info.bytes, info.n_params) == (100, path, path.stat().st_size, 44)
    legacy = save(tmp_path / "step-7.pt", good_state(None), _use_new_zipfile_serialization=False)
    assert TorchPt({}).verify(legacy).step == 7  # not mmap-able: loaded without mmap


def test_a_malicious_pickle_is_refused_and_never_executed(tmp_path: Path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    path = save(tmp_path / "ckpt_000100.pt", {"model": Payload(), "optimizer": {}, "step": 100})
    message = invalid(TorchPt({}), path)
    assert "weights_only refused it" in message and "system" in message
    assert not marker.exists()
    # The file really is hostile: an unrestricted load runs the payload.
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: p.write_bytes(b""), "empty file"),
        (lambda p: p.write_bytes(b"not a checkpoint at all"), "torch.load failed"),
        (
            lambda p: save(p, good_state(100)) and p.write_bytes(p.read_bytes()[:300]),
            "torch.load failed",
        ),
        (lambda p: save(p, [torch.zeros(2)]), "top-level object is a list"),
        (lambda p: save(p, {"model": {}, "step": 100}), "missing required key(s) optimizer"),
        (lambda p: save(p, good_state(90)), "step value 90 does not match the step 100"),
        (lambda p: save(p, {**good_state(None), "step": "100"}), "expected an integer"),
        (lambda p: os.mkfifo(p), "not a regular file"),
    ],
    ids=["empty", "junk", "truncated", "list", "missing-key", "step-mismatch", "step-type", "fifo"],
)
def test_broken_files_are_invalid_with_a_one_line_reason(tmp_path: Path, make, expected: str):
    path = tmp_path / "ckpt_000100.pt"
    make(path)
    assert expected in invalid(TorchPt({}), path)


def test_iter_num_counts_as_the_step_and_required_keys_are_configurable(tmp_path: Path):
    path = save(tmp_path / "ckpt_000100.pt", {"model": {"w": torch.zeros(3)}, "iter_num": 100})
    assert "missing required key(s) optimizer" in invalid(TorchPt({}), path)
    assert TorchPt({"required_keys": ["model"]}).verify(path).step == 100
    wrong = save(tmp_path / "ckpt_000200.pt", {"model": {}, "iter_num": 150})
    assert "step value 150" in invalid(TorchPt({"required_keys": ["model"]}), wrong)


def test_a_probe_that_hangs_is_killed_at_the_timeout(tmp_path: Path):
    path = save(tmp_path / "ckpt_000100.pt", good_state(100))
    pid_file = tmp_path / "probe.pid"
    slow_python = tmp_path / "slow-python"
    slow_python.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import os, time
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(600)
            """
        )
    )
    slow_python.chmod(0o755)
    fmt = TorchPt({"python": str(slow_python), "verify_timeout_s": 1.5})
    started = time.monotonic()
    message = invalid(fmt, path)
    assert "did not finish within 1.5 s" in message
    assert time.monotonic() - started < 10
    assert not pid_alive(int(pid_file.read_text()))


def test_a_missing_probe_interpreter_is_reported(tmp_path: Path):
    path = save(tmp_path / "ckpt_000100.pt", good_state(100))
    message = invalid(TorchPt({"python": str(tmp_path / "no-such-python")}), path)
    assert "cannot start the probe interpreter" in message


def test_daemon_retains_and_falls_back_with_torch_pt(tmp_path: Path):
    def corrupt(directory: Path, step: int) -> None:
        path = directory / f"ckpt_{step:06d}.pt"
        path.write_bytes(path.read_bytes()[:200])

    def unit_step(name: str) -> int | None:
        return TorchPt({}).step_of(Path(name))

    daemon_scenario(tmp_path, TorchPt({}), unit_step, corrupt, "torch.load failed")


def test_an_unchanged_file_that_passed_is_not_probed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    fmt = TorchPt({})
    probes = []
    real_probe = fmt._probe

    def counting_probe(path: Path) -> dict[str, object]:
        probes.append(path)
        return real_probe(path)

    monkeypatch.setattr(fmt, "_probe", counting_probe)
    path = save(tmp_path / "ckpt_000100.pt", good_state(100))
    assert fmt.verify(path) == fmt.verify(path)
    assert len(probes) == 1
    save(path, good_state(90))  # rewritten in place: probed afresh, and now wrong
    assert "step value 90" in invalid(fmt, path)
    assert len(probes) == 2


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh venv (no system site-packages): it cannot import torch."""
    venv = tmp_path_factory.mktemp("no-torch") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    python = venv / "bin" / "python"
    probe = subprocess.run([python, "-I", "-c", "import torch"], capture_output=True, timeout=60)
    assert probe.returncode != 0, "the fresh venv can import torch: the tests below prove nothing"
    return python


def test_a_probe_interpreter_without_torch_is_a_config_error_naming_the_extra(
    python_without_torch: Path,
):
    with pytest.raises(ConfigError) as caught:
        TorchPt({"python": str(python_without_torch)})
    message = str(caught.value)
    assert "\n" not in message
    assert "pip install 'trainwarden[trainer]'" in message
    assert str(python_without_torch) in message and "'checkpoints.format'" in message


def test_torch_gone_after_start_makes_verify_name_the_extra(
    tmp_path: Path, python_without_torch: Path
):
    path = save(tmp_path / "ckpt_000100.pt", good_state(100))
    fmt = TorchPt({})
    fmt.python = str(python_without_torch)  # torch uninstalled while the daemon runs
    message = invalid(fmt, path)
    assert "cannot import torch in the probe interpreter" in message
    assert "pip install 'trainwarden[trainer]'" in message


def test_the_daemon_refuses_to_start_torch_pt_without_torch(
    tmp_path: Path, python_without_torch: Path
):
    run_dir = tmp_path / "run"
    make_run(
        run_dir,
        [sys.executable, "-c", "pass"],
        checkpoints={"format": "torch-pt", "options": {"python": str(python_without_torch)}},
    )
    done = subprocess.run(
        [sys.executable, "-m", "trainwarden.supervisor", "daemon", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, f"expected exit 2 (config), got {done.returncode}: {done.stderr}"
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "pip install 'trainwarden[trainer]'" in done.stderr
    assert not (run_dir / ".trainwarden" / "journal.jsonl").exists(), "the daemon started"


# --------------------------------------------------------------- the persistent verifier


def fake_python(tmp_path: Path, body: str) -> Path:
    """An executable standing in for the probe interpreter: it records its pid, then `body`."""
    script = tmp_path / "fake-python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, signal, sys, time\n"
        f"open({str(tmp_path / 'pids')!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        + textwrap.dedent(body)
    )
    script.chmod(0o755)
    return script


def started_pids(tmp_path: Path) -> list[int]:
    return [int(line) for line in (tmp_path / "pids").read_text().split()]


def test_one_worker_imports_torch_once_and_serves_every_verification(tmp_path: Path):
    fmt = TorchPt({})
    assert fmt.worker_pid is None  # started by the first verify, not by the constructor
    pids = set()
    for step in (100, 200, 300, 400):
        path = save(tmp_path / f"ckpt_{step:06d}.pt", good_state(step))
        assert fmt.verify(path).step == step
        pids.add(fmt.worker_pid)
    wrong = save(tmp_path / "ckpt_000500.pt", good_state(90))
    assert "step value 90" in invalid(fmt, wrong)
    pids.add(fmt.worker_pid)
    assert len(pids) == 1 and None not in pids
    (pid,) = pids
    assert pid_alive(pid) and pid != os.getpid()
    assert os.getsid(pid) == pid  # its own session: a signal to the daemon's group misses it
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"OMP_NUM_THREADS=1" in environ and b"CUDA_VISIBLE_DEVICES=" in environ
    fmt.close()


def test_two_threads_verifying_at_once_get_their_own_verdicts(tmp_path: Path):
    from concurrent.futures import ThreadPoolExecutor

    fmt = TorchPt({})
    paths = [save(tmp_path / f"ckpt_{s:06d}.pt", good_state(s)) for s in range(100, 900, 100)]
    paths.append(save(tmp_path / "ckpt_000900.pt", good_state(1)))
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda p: _verdict(fmt, p), paths))
    assert outcomes[:-1] == list(range(100, 900, 100))
    assert "step value 1 " in str(outcomes[-1])
    fmt.close()


def _verdict(fmt: TorchPt, path: Path) -> int | str:
    try:
        return fmt.verify(path).step
    except CheckpointInvalid as exc:
        return str(exc)


def test_a_hanging_load_is_killed_and_the_next_verification_gets_a_new_worker(tmp_path: Path):
    fmt = TorchPt({})
    assert fmt.verify(save(tmp_path / "ckpt_000100.pt", good_state(100))).step == 100
    first = fmt.worker_pid
    assert first is not None
    # verify (and the store before it) refuses a FIFO before the worker sees it: here it
    # stands for any file whose load never returns, handed to the worker directly.
    fifo = tmp_path / "ckpt_000200.pt"
    os.mkfifo(fifo)
    fmt.verify_timeout_s = 1.5
    assert fmt._probe(fifo) == {"error": "the probe did not finish within 1.5 s (killed)"}
    assert not pid_alive(first) and fmt.worker_pid is None
    fmt.verify_timeout_s = 120.0
    assert fmt.verify(save(tmp_path / "ckpt_000300.pt", good_state(300))).step == 300
    assert fmt.worker_pid not in (None, first)
    fmt.close()


@pytest.mark.parametrize("wait_for_death", [False, True], ids=["at-once", "after-death"])
def test_a_worker_killed_from_outside_between_verifications_changes_no_verdict(
    tmp_path: Path, wait_for_death: bool
):
    fmt = TorchPt({})
    assert fmt.verify(save(tmp_path / "ckpt_000100.pt", good_state(100))).step == 100
    first = fmt.worker_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    if wait_for_death:
        deadline = time.monotonic() + 10
        while pid_alive(first) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert fmt.verify(save(tmp_path / "ckpt_000200.pt", good_state(200))).step == 200
    second = fmt.worker_pid
    assert second not in (None, first)
    os.kill(second, signal.SIGKILL)  # type: ignore[arg-type]
    assert "step value 7 " in invalid(fmt, save(tmp_path / "ckpt_000300.pt", good_state(7)))
    fmt.close()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "sys.stdin.readline(); os.kill(os.getpid(), signal.SIGSEGV)",
            "the probe died of signal 11",
        ),
        (
            "sys.stdin.readline(); sys.stderr.write('boom\\n'); sys.exit(4)",
            "the probe exited 4: boom",
        ),
    ],
    ids=["signal", "exit-status"],
)
def test_a_worker_that_dies_on_a_file_says_how_and_the_next_one_is_fresh(
    tmp_path: Path, body: str, expected: str
):
    path = save(tmp_path / "ckpt_000100.pt", good_state(100))
    fmt = TorchPt({"python": str(fake_python(tmp_path, body))})
    (tmp_path / "pids").unlink()  # the construction's check for torch ran it once
    assert expected in invalid(fmt, path)
    assert fmt.worker_pid is None
    assert expected in invalid(fmt, path)
    first, second = started_pids(tmp_path)  # a fresh worker's death is the verdict: no retry
    assert first != second and not pid_alive(first) and not pid_alive(second)


def test_a_malicious_pickle_leaves_the_worker_serving_and_never_runs(tmp_path: Path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    fmt = TorchPt({})
    assert fmt.verify(save(tmp_path / "ckpt_000100.pt", good_state(100))).step == 100
    pid = fmt.worker_pid
    hostile = save(tmp_path / "ckpt_000200.pt", {"model": Payload(), "optimizer": {}, "step": 200})
    assert "weights_only refused it" in invalid(fmt, hostile)
    assert fmt.verify(save(tmp_path / "ckpt_000300.pt", good_state(300))).step == 300
    assert fmt.worker_pid == pid
    assert not marker.exists()
    fmt.close()


def test_close_ends_the_worker_and_a_collected_format_leaves_none(tmp_path: Path):
    fmt = TorchPt({})
    assert fmt.verify(save(tmp_path / "ckpt_000100.pt", good_state(100))).step == 100
    pid = fmt.worker_pid
    assert pid is not None and pid_alive(pid)
    fmt.close()
    assert fmt.worker_pid is None and not pid_alive(pid)
    fmt.close()  # twice is harmless
    # A later verification starts a new worker; dropping the format ends that one too.
    assert fmt.verify(save(tmp_path / "ckpt_000200.pt", good_state(200))).step == 200
    again = fmt.worker_pid
    assert again not in (None, pid)
    del fmt
    gc.collect()
    assert not pid_alive(again)  # type: ignore[arg-type]


def test_the_worker_keeps_no_checkpoint_mapped_after_checking_it(tmp_path: Path):
    fmt = TorchPt({})
    path = save(tmp_path / "ckpt_000100.pt", good_state(100))
    assert fmt.verify(path).step == 100
    # A mapping left behind would hold a checkpoint that retention deleted on the disk.
    assert str(path) not in Path(f"/proc/{fmt.worker_pid}/maps").read_text()
    fmt.close()
