"""Who may serve the control socket and who may reach it, tried with throwaway users.

A squatter (another user binding the socket's path first, in a shared folder) must get
nothing from the CLI or the TUI's client; allow_uids must let exactly its users in through
[control] group; a refused client must read its refusal and a clean end, however much it
sent first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import PYTHON, DaemonProcess, histories, running_daemon, scripted_run
from tests.support.users import (
    User,
    as_user,
    can_make_users,
    reachable_by_all,
    reap,
    restore_modes,
    spawn_as,
    throwaway_group,
    throwaway_user,
)
from trainwarden.supervisor.cli.main import main
from trainwarden.supervisor.config import Config, load_config
from trainwarden.supervisor.errors import ConfigError, UntrustedServer
from trainwarden.supervisor.protocol import AsyncClient, Client
from trainwarden.supervisor.serve.control import ControlServer

pytestmark = pytest.mark.timeout(300)
needs_users = pytest.mark.skipif(not can_make_users(), reason="needs root to create users")


def squat(socket_path: Path, heard: Path, ready: Callable[[], None]) -> None:
    """Bind `socket_path` and answer "ok" (a saved stop) to every request; keep what it heard."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(socket_path))
    server.listen(16)
    ready()
    ok = {"state": "stopped", "outcome": "saved", "steps_lost": 0, "message": "trainer saved"}
    while True:
        conn, _ = server.accept()
        with contextlib.suppress(OSError, ValueError), open(heard, "ab") as log:
            data = conn.recv(65536)
            log.write(data)
            for line in data.splitlines():
                rid = json.loads(line).get("id")
                conn.sendall(json.dumps({"id": rid, "ok": True, "result": ok}).encode() + b"\n")
        conn.close()


def pipeline_then_read(socket_path: Path, requests: int) -> int:
    """Connect, send `requests` status requests before reading anything, then read to the
    end; print what came back and how the stream ended."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(socket_path))
    line = b'{"id": 1, "cmd": "status"}\n'
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        for _ in range(requests):
            sock.sendall(line)
    data, end = b"", "eof"
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        end = "reset"
    print(json.dumps({"lines": data.decode().splitlines(), "end": end}))
    return 0


def cli_as(user: User, *args: str) -> tuple[int, str, str]:
    return as_user(user, lambda: main(list(args)))


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder anyone may create files in (like /tmp), outside pytest's private one."""
    folder = Path(tempfile.mkdtemp(prefix="tw-shared-", dir="/tmp"))
    os.chmod(folder, 0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A folder every user can reach (run directories the throwaway users talk to)."""
    folder = Path(tempfile.mkdtemp(prefix="tw-run-", dir="/tmp"))
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_users
def test_the_cli_refuses_a_socket_another_user_serves(tmp_path: Path, shared_dir: Path):
    sock = shared_dir / "run.sock"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "trainwarden.toml").write_text(
        f'[trainer]\ncommand = ["python", "train.py"]\n[control]\nsocket = "{sock}"\n'
    )
    heard = shared_dir / "heard"
    heard.touch()
    os.chmod(heard, 0o666)
    with throwaway_user() as squatter:
        pid = spawn_as(squatter, lambda ready: squat(sock, heard, ready))
        try:
            result = subprocess.run(
                [PYTHON, "-m", "trainwarden.supervisor", "stop", str(run_dir)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            tui_client = AsyncClient(sock)
            with pytest.raises(UntrustedServer):
                asyncio.run(tui_client.connect())
            with pytest.raises(UntrustedServer):
                Client(sock)
        finally:
            reap(pid)
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"served by uid {squatter.uid}" in lines[0] and str(sock) in lines[0], lines[0]
    assert "saved" not in result.stdout and "stopped" not in result.stdout
    assert heard.read_bytes() == b"", "a request reached the squatter"


@needs_users
def test_a_folder_the_squatter_made_first_proves_nothing(tmp_path: Path, shared_dir: Path):
    """The squatter makes `tunnels` (0777) before the owner's `mkdir -p` and serves the
    socket from it: owning the folder is no credential. Only a user named as the daemon's
    is trusted, and then not from a folder others may write to."""
    with throwaway_user() as squatter:
        tunnels = shared_dir / "tunnels"

        def make_it_first() -> None:
            tunnels.mkdir()
            os.chmod(tunnels, 0o777)

        assert as_user(squatter, make_it_first)[0] == 0
        sock = tunnels / "run.sock"
        heard = shared_dir / "heard"
        heard.touch()
        os.chmod(heard, 0o666)
        pid = spawn_as(squatter, lambda ready: squat(sock, heard, ready))
        try:
            cli = [PYTHON, "-m", "trainwarden.supervisor", "stop", "--socket", str(sock)]
            plain = subprocess.run(cli, capture_output=True, text=True, timeout=60)
            named = subprocess.run(
                [*cli, "--daemon-user", squatter.name], capture_output=True, text=True, timeout=60
            )
            with pytest.raises(UntrustedServer, match="--daemon-user"):
                asyncio.run(AsyncClient(sock).connect())
            with pytest.raises(UntrustedServer, match="written by others"):
                Client(sock, daemon_uid=squatter.uid)
        finally:
            reap(pid)
    for done in (plain, named):
        assert done.returncode != 0 and "saved" not in done.stdout, done.stdout
        (line,) = done.stderr.strip().splitlines()
        assert f"uid {squatter.uid}" in line or "written by others" in line, line
    assert "--daemon-user" in plain.stderr and "written by others" in named.stderr
    assert heard.read_bytes() == b"", "a request reached the squatter"


@pytest.fixture
def group_run(open_base: Path) -> Iterator[tuple[Path, User, User]]:
    """A daemon whose allow_uids lists one throwaway user of a throwaway group; another
    user is in the group but not in allow_uids."""
    with (
        throwaway_group() as gid,
        throwaway_user([gid]) as allowed,
        throwaway_user([gid]) as other,
    ):
        run_dir = scripted_run(
            open_base / "run",
            *("--steps", "100000000", "--save-every", "50", "--dt", "0.05"),
            control={"allow_uids": [allowed.uid], "group": str(gid)},
        )
        changed = reachable_by_all(run_dir)
        try:
            with running_daemon(run_dir) as daemon:
                daemon.wait_state("running", timeout=60)
                yield run_dir, allowed, other
        finally:
            restore_modes(changed)


@needs_users
def test_allow_uids_lets_exactly_the_listed_users_of_the_group_in(
    group_run: tuple[Path, User, User],
):
    run_dir, allowed, other = group_run
    sock = run_dir / ".trainwarden" / "control.sock"
    folder = sock.parent
    gid = allowed.groups[0]
    assert (folder.stat().st_gid, stat.S_IMODE(folder.stat().st_mode)) == (gid, 0o710)
    assert (sock.stat().st_gid, stat.S_IMODE(sock.stat().st_mode)) == (gid, 0o660)

    code, out, err = cli_as(allowed, "status", str(run_dir), "--json")
    assert code == 0, err
    assert json.loads(out)["state"] == "running"

    code, out, err = cli_as(other, "status", str(run_dir))
    assert code == 1, out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "forbidden" in lines[0] and f"uid {other.uid}" in lines[0], lines[0]


@needs_users
def test_a_second_detached_start_leaves_the_allowed_users_their_way_in(
    group_run: tuple[Path, User, User],
):
    """`daemon --detach` prepares .trainwarden/ before it finds the lock held: it must not
    take the group's search bit the running daemon gave the folder (it made it 0700)."""
    run_dir, allowed, _other = group_run
    folder = run_dir / ".trainwarden"
    second = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "daemon", "--detach", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode != 0, second.stdout
    assert stat.S_IMODE(folder.stat().st_mode) == 0o710
    code, out, err = cli_as(allowed, "status", str(run_dir), "--json")
    assert code == 0, err


@needs_users
def test_a_user_outside_the_group_is_told_what_keeps_it_out(group_run: tuple[Path, User, User]):
    run_dir, _allowed, _other = group_run
    with throwaway_user() as stranger:
        code, _out, err = cli_as(stranger, "status", str(run_dir))
    assert code == 1
    line = err.strip()
    assert "\n" not in line and "permission denied" in line, line
    # What is wrong (the folder's mode and group), not "add your uid" to a list it may be on.
    assert "mode 0710" in line and "[control] group" in line, line


@needs_users
def test_a_refused_client_reads_its_refusal_and_a_clean_end(group_run: tuple[Path, User, User]):
    """However much a refused client sent first (here more than any bounded discard reads),
    the daemon's hang-up must not reset it: the refusal, then end of stream."""
    run_dir, _allowed, other = group_run
    sock = run_dir / ".trainwarden" / "control.sock"
    for requests in (1, 20_000):
        code, out, err = as_user(other, lambda n=requests: pipeline_then_read(sock, n))
        assert code == 0, err
        seen = json.loads(out)
        assert seen["end"] == "eof", seen
        assert len(seen["lines"]) == 1, seen
        reply = json.loads(seen["lines"][0])
        assert reply["ok"] is False and reply["error"]["code"] == "forbidden", reply
    with Client(sock) as client:
        assert client.request("status")["state"] == "running"


def history_of_as(user: User, sock: Path, run: str) -> dict[str, Any]:
    """`history_of run` asked by `user`: the reply's result, or its error."""

    def ask() -> int:
        with Client(sock) as client:
            client.sock.sendall(
                (
                    json.dumps({"id": 1, "cmd": "history_of", "run": run, "points": 5}) + "\n"
                ).encode()
            )
            print(json.dumps(client.read_message()))
        return 0

    code, out, err = as_user(user, ask)
    assert code == 0, err
    return json.loads(out)


def loss_run(path: Path, mode: int) -> Path:
    """A run folder holding a few logged losses, its loss file of `mode`."""
    histories.make_run(path, {s: 5.0 - s / 100 for s in range(1, 6)})
    os.chmod(path / ".loss.json", mode)
    return path


@needs_users
def test_history_of_gives_another_user_only_related_runs_it_may_read(
    group_run: tuple[Path, User, User], open_base: Path
):
    """An allowed user of another uid: a sibling it may read, yes; a sibling private to the
    daemon's user, an unrelated run elsewhere, or no run at all: the same refusal, so the
    daemon neither hands out what the user could not read nor says what is where."""
    run_dir, allowed, _other = group_run
    sock = run_dir / ".trainwarden" / "control.sock"
    loss_run(open_base / "open-sibling", 0o644)
    loss_run(open_base / "private-sibling", 0o600)
    elsewhere = Path(tempfile.mkdtemp(prefix="tw-elsewhere-", dir="/tmp"))
    try:
        os.chmod(elsewhere, 0o755)
        unrelated = loss_run(elsewhere / "run", 0o644)
        assert history_of_as(allowed, sock, "open-sibling")["ok"]
        refused = [
            history_of_as(allowed, sock, name)
            for name in ("private-sibling", str(unrelated), str(open_base / "no-such-run"))
        ]
        # The daemon's own user (here root) still reads them all.
        with Client(sock) as client:
            assert client.request("history_of", run="private-sibling", points=5)["step"]
            assert client.request("history_of", run=str(unrelated), points=5)["step"]
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
    errors = [r["error"] for r in refused]
    assert all(not r["ok"] for r in refused) and {e["code"] for e in errors} == {"not_a_run"}
    assert all("no run related to this one" in e["message"] for e in errors), errors
    assert "5.0" not in json.dumps(refused)


class Bare:
    """Just what ControlServer.start needs of a daemon."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def add_journal_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        pass


def test_the_place_is_checked_again_at_bind(tmp_path: Path):
    """A file that appears at the socket's path after the config was loaded is still not
    unlinked: the bind refuses it with the same one line."""
    run_dir = scripted_run(tmp_path / "run", "--steps", "10")
    cfg = load_config(run_dir)
    (run_dir / ".trainwarden").mkdir(mode=0o700)
    precious = run_dir / ".trainwarden" / "control.sock"
    precious.write_bytes(b"precious\n")
    server = ControlServer(Bare(cfg))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="is a regular file, which the daemon never replaces"):
        asyncio.run(server.start())
    assert precious.read_bytes() == b"precious\n"


def test_a_private_folder_of_ours_takes_the_socket_and_its_stale_one_is_replaced(
    tmp_path: Path,
):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    stale = private / "run.sock"
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(stale))  # bound, never listening, closed: nobody answers
    leftover.close()
    run_dir = scripted_run(
        tmp_path / "run",
        *("--steps", "100000000", "--save-every", "50", "--dt", "0.05"),
        control={"socket": str(stale)},
    )
    daemon = DaemonProcess(run_dir)
    daemon.socket = stale
    try:
        daemon.start()
        assert daemon.wait_state("running", timeout=60)["state"] == "running"
        assert stat.S_ISSOCK(stale.lstat().st_mode)
        assert stat.S_IMODE(stale.lstat().st_mode) == 0o600
    finally:
        daemon.cleanup()
