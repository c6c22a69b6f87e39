"""The command line against a real daemon: every command through --socket (no run
directory), unpin that would delete refused without --yes, and checkpoints read from the
directory once no daemon runs: newest first, sizes in binary units, reasons in words."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

from tests.support import PYTHON, running_daemon, scripted_run, wait_for
from trainwarden.supervisor.cli.main import main
from trainwarden.supervisor.cli.offline import OFFLINE_NOTE

RUNNING = ("--steps", "100000000", "--save-every", "25", "--dt", "0.02", "--usr1", "save")
"""Endless for a test, a checkpoint every half second, and one on SIGUSR1."""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
    )


def verified_steps(daemon) -> list[int]:
    return [c["step"] for c in daemon.request("checkpoints")["checkpoints"]]


def test_every_daemon_command_takes_socket_and_needs_no_run_directory(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", *RUNNING)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with running_daemon(run_dir) as daemon:
        sock = str(daemon.socket)
        daemon.wait_state("running")
        wait_for(lambda: len(verified_steps(daemon)) >= 2, 120, what="two checkpoints")
        # Without --socket, "." is not the run (no config, no socket): said so, exit 2.
        done = cli("status", cwd=elsewhere)
        assert done.returncode == 2 and "no run at" in done.stderr, done.stderr

        done = cli("status", "--socket", sock, cwd=elsewhere)
        assert done.returncode == 0 and "state     running" in done.stdout, done.stderr
        done = cli("checkpoints", "--socket", sock, cwd=elsewhere)
        assert done.returncode == 0 and done.stdout.split()[0] == "step", done.stderr
        done = cli("events", "--socket", sock, "-n", "50", cwd=elsewhere)
        assert done.returncode == 0 and "daemon_start" in done.stdout, done.stderr
        done = cli("save", "--socket", sock, "--wait", cwd=elsewhere)
        assert done.returncode == 0 and "checkpoint committed" in done.stdout, done.stderr
        step = verified_steps(daemon)[-1]
        done = cli("pin", "--socket", sock, str(step), cwd=elsewhere)
        assert done.returncode == 0 and f"step {step} pinned" in done.stdout, done.stderr
        done = cli("unpin", str(step), "--socket", sock, "--yes", cwd=elsewhere)
        assert done.returncode == 0 and f"step {step} unpinned" in done.stdout, done.stderr
        # The scripted trainer keeps no bandit: the daemon itself refuses the pivot, and
        # says why asking again will not help (it has saved, and written no .state.json).
        done = cli("pivot", "--socket", sock, "--cap", "docs=0.5", cwd=elsewhere)
        assert done.returncode == 1, done.stderr
        assert "refused (unsupported): the trainer reports no data arms" in done.stderr
        assert "pivot needs a trainer that mixes its data with a bandit" in done.stderr
        done = cli("stop", "--socket", sock, cwd=elsewhere)
        assert done.returncode == 0 and "trainer stopped" in done.stdout, done.stderr
        done = cli("start", "--socket", sock, cwd=elsewhere)
        assert done.returncode == 0 and "trainer starting" in done.stdout, done.stderr
        daemon.wait_state("running")
        done = cli("shutdown", "--socket", sock, cwd=elsewhere)
        assert done.returncode == 0 and "the daemon is exiting" in done.stdout, done.stderr
        assert daemon.wait_exit(60) == 0


def pinned_steps(daemon) -> list[int]:
    return [c["step"] for c in daemon.request("checkpoints")["checkpoints"] if c["pinned"]]


def test_unpin_that_retention_would_delete_needs_yes(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        *RUNNING,
        checkpoints={"keep_last": 2},
        # keep_last alone: with spike handling on, retention would keep the pinned step as
        # the one rollback target (test_spikes), and unpinning it would delete nothing.
        divergence={"spikes": False},
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running")
        oldest = wait_for(lambda: (verified_steps(daemon) or [None])[0], 120, what="a checkpoint")
        assert daemon.request("pin", step=oldest)["pinned"]
        wait_for(lambda: len(verified_steps(daemon)) >= 3, 120, what="two newer checkpoints")
        daemon.request("stop", timeout=120)  # no more checkpoints: retention holds still
        *_, older, newest = verified_steps(daemon)
        path = run_dir / "checkpoints" / f"step_{oldest:06d}.bin"

        refused = cli("unpin", str(run_dir), str(oldest), cwd=tmp_path)
        assert refused.returncode == 1, refused
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "refused (would_delete)" in lines[0], refused.stderr
        assert f"step {oldest} would be deleted" in lines[0] and "--yes" in lines[0]
        assert path.exists() and pinned_steps(daemon) == [oldest]

        # Unpinned, the newest is still among the newest two: nothing is asked.
        daemon.request("pin", step=newest)
        done = cli("unpin", str(run_dir), str(newest), cwd=tmp_path)
        assert done.returncode == 0 and f"step {newest} unpinned" in done.stdout, done.stderr
        assert pinned_steps(daemon) == [oldest] and older in verified_steps(daemon)

        done = cli("unpin", str(run_dir), str(oldest), "--yes", cwd=tmp_path)
        assert done.returncode == 0 and f"step {oldest} unpinned" in done.stdout, done.stderr
        wait_for(lambda: not path.exists(), 30, what="retention to delete it")
        assert oldest not in verified_steps(daemon)


def test_checkpoints_without_a_daemon_reads_the_directory_newest_first(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", *RUNNING, checkpoints={"keep_last": 3})
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running")
        wait_for(lambda: len(verified_steps(daemon)) >= 3, 120, what="three checkpoints")
        live = cli("checkpoints", str(run_dir), cwd=tmp_path)
        live_json = cli("status", str(run_dir), "--json", cwd=tmp_path)
        daemon.request("shutdown", timeout=120)
        assert daemon.wait_exit(60) == 0
    assert live.returncode == 0, live.stderr
    live_steps = [
        int(line.split()[0]) for line in live.stdout.splitlines()[1:] if line[:10].strip()
    ]
    assert live_steps == sorted(live_steps, reverse=True) and len(live_steps) >= 3, live.stdout
    assert " MB" not in live.stdout and " KiB" in live.stdout, live.stdout
    (run_dir / "checkpoints" / "step_999999.bin").write_bytes(b"not a checkpoint")

    done = cli("checkpoints", str(run_dir), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == OFFLINE_NOTE, done.stdout
    rows = [line.split() for line in lines[2:] if line[:10].strip()]
    steps = [int(row[0]) for row in rows]
    assert steps == sorted(steps, reverse=True) and steps[0] == 999_999, done.stdout
    # Never verified by a daemon: said so, not counted as good.
    assert rows[0][-1] == "not-verified" and all("not-verified" not in r for r in rows[1:])
    assert all(row[2] in ("B", "KiB", "MiB", "GiB") for row in rows), done.stdout
    # The JSON is the daemon's shape, marked as read from the directory.
    done = cli("checkpoints", str(run_dir), "--json", cwd=tmp_path)
    assert done.returncode == 0 and '"offline": true' in done.stdout, done.stderr
    # Newest first in the JSON too, as in every list the CLI prints.
    listed = [c["step"] for c in json.loads(done.stdout)["checkpoints"]]
    assert listed == sorted(listed, reverse=True) and listed[0] == 999_999, listed
    listed = [c["step"] for c in json.loads(live_json.stdout)["checkpoints"]]
    assert listed == sorted(listed, reverse=True) and len(listed) >= 3, listed


def test_the_printed_quarantine_tells_a_pivots_archive_from_a_failure():
    from trainwarden.supervisor.cli.output import format_checkpoints

    view = {
        "checkpoints": [
            {"step": s, "bytes": 3 * 2**20, "mtime": 0.0, "pinned": False, "next_to_delete": False}
            for s in (8_000, 8_400)
        ],
        "quarantined": [
            {
                "name": "step_008489.bin",
                "why": "set aside by the pivot at step 8,400",
                "alarming": False,
            },
            {
                "name": "step_009500.bin",
                "why": "failed verification: digest mismatch",
                "alarming": True,
            },
        ],
    }
    lines = format_checkpoints(view, now=60.0).splitlines()
    assert [line.split()[0] for line in lines[1:3]] == ["8400", "8000"]
    assert lines[1].split()[1:3] == ["3.0", "MiB"]
    assert lines[3].split(None, 2)[:2] == ["set", "aside:"]
    assert lines[3].endswith("step_008489.bin: set aside by the pivot at step 8,400")
    assert lines[4].strip() == "quarantined: step_009500.bin: failed verification: digest mismatch"


def test_a_socket_nobody_answers_on_names_no_run_to_start(tmp_path: Path):
    """A forwarded socket's folder is no run directory: the error must not tell the user to
    start a daemon there."""
    tunnels = tmp_path / "tunnels"
    tunnels.mkdir(mode=0o700)
    done = cli("status", "--socket", str(tunnels / "run.sock"), cwd=tmp_path)
    assert done.returncode == 1
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "no trainwarden daemon answers on" in line and "ssh tunnel" in line, line
    assert "daemon --detach" not in line, line


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    """The CLI in process: (exit status, stdout, stderr)."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_folder_that_is_no_run_is_named_so_not_sent_to_start_a_daemon(tmp_path: Path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in ("status", "checkpoints", "events", "stop"):
        code, out, err = run_main(capsys, command, str(empty))
        assert code == 2 and out == "", (command, err)
        assert err.strip() == (
            f"trainwarden: no run at {empty} (no trainwarden.toml there): name a run directory,"
            f" or make one with `trainwarden init {empty}`"
        )
    code, _, err = run_main(capsys, "status", str(tmp_path / "nope"))
    assert code == 2
    assert (
        err.strip()
        == f"trainwarden: no run at {tmp_path / 'nope'} (no such directory): name a run directory"
    )


def test_shutdown_with_no_daemon_says_there_is_nothing_to_shut_down(tmp_path: Path, capsys):
    run_dir = scripted_run(tmp_path / "run", "--steps", "5")
    code, out, err = run_main(capsys, "shutdown", str(run_dir))
    assert code == 0 and err == ""
    assert out.strip() == (
        f"nothing to shut down: no daemon answers on {run_dir / '.trainwarden' / 'control.sock'}"
    )
    # Other commands still call it a failure, with how to start one.
    code, _, err = run_main(capsys, "status", str(run_dir))
    assert code == 1 and "start one with `trainwarden daemon --detach" in err


def test_usage_errors_carry_one_prefix(tmp_path: Path, capsys):
    code, _, err = run_main(capsys, "pin", str(tmp_path), "ten")
    assert code == 2
    assert err.strip() == (
        "trainwarden: pin: argument step: invalid int value: 'ten' (see `trainwarden pin --help`)"
    )
    code, _, err = run_main(capsys, "status", str(tmp_path), "--bogus")
    assert code == 2
    assert err.strip() == "trainwarden: unrecognized arguments: --bogus (see `trainwarden --help`)"


def test_a_reader_that_closed_the_pipe_ends_the_command_quietly(tmp_path: Path):
    """`trainwarden ... | head -1`: the reader is gone before the output is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", "init", str(tmp_path / "run")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (tmp_path / "run" / "trainwarden.toml").exists()


def test_a_socket_that_closes_before_any_reply_says_so(tmp_path: Path, capsys):
    """A forwarded socket whose tunnel is down: ssh accepts, then hangs up."""
    path = tmp_path / "tunnels" / "run.sock"
    path.parent.mkdir(mode=0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)

    def hang_up() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            conn.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        code, _, err = run_main(capsys, "status", "--socket", str(path))
    finally:
        thread.join(10)
        server.close()
    assert code == 1
    assert err.strip() == (
        f"trainwarden: the socket {path} closed before a reply: is the ssh tunnel up,"
        " and the daemon running?"
    )
