"""The README's two SSH recipes, run for real: the OpenSSH client `/usr/bin/ssh` against an
SSH server on 127.0.0.1 (asyncssh, with a throwaway host key and client key), in front of a
real daemon.

- the forwarded socket: the README's `mkdir` and `ssh -o StreamLocalBindUnlink=yes -N -L ...`
  lines, taken from the README itself, bind the daemon's control socket in a private folder,
  over a stale socket a previous ssh left; a status request through it is answered;
- `ssh -t host .../trainwarden tui RUN` in tmux: the server runs the command in a pty, the
  TUI shows the run, and `q` leaves it running.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import re
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import running_daemon
from tests.support.procs import kill_quietly
from tests.support.runs import reference_run
from tests.support.wait import poll, wait_for
from tests.tui.terminal import Tmux
from trainwarden.supervisor.protocol import Client

asyncssh = pytest.importorskip("asyncssh")

SSH = "/usr/bin/ssh"
README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
TRAINWARDEN = Path(sys.executable).parent / "trainwarden"

pytestmark = [
    pytest.mark.skipif(not Path(SSH).exists(), reason="the OpenSSH client is not installed"),
    pytest.mark.timeout(300),
]


# ------------------------------------------------------------------------ the recipe's text


def forward_recipe() -> list[str]:
    """The README's forwarded-socket block (after its `<!-- ssh-forward -->` marker)."""
    match = re.search(r"<!-- ssh-forward -->\n```sh\n(.*?)```", README, re.S)
    assert match, "README lacks the forwarded-socket recipe"
    return match.group(1).strip().splitlines()


def local_words(line: str, home: Path, run_dir: Path) -> list[str]:
    """One recipe line as the shell would run it: `~` is `home`, /path/to/RUN the run."""
    words = shlex.split(line.replace("/path/to/RUN", str(run_dir)))
    words = [str(home) + w[1:] if w.startswith("~/") else w for w in words]
    return [w.replace(":~/", f":{home}/") for w in words if w != "&"]


# ------------------------------------------------------------------------ the SSH server


class PtySession:
    """Runs an exec request's command in a pseudo-terminal, as sshd does for `ssh -t` (this
    server gives every command one)."""

    def __init__(self, process: Any) -> None:
        self.process = process

    async def run(self) -> None:
        process = self.process
        cols, rows = (process.term_size or (80, 24, 0, 0))[:2]
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {**os.environ, "TERM": process.term_type or "xterm-256color"}

        def controlling_tty() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        child = subprocess.Popen(
            shlex.split(process.command),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
            preexec_fn=controlling_tty,
        )
        os.close(slave)
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def readable() -> None:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its side
                data = b""
            if data:
                with contextlib.suppress(Exception):  # the client may be gone already
                    process.stdout.write(data)
            elif not done.done():
                done.set_result(None)

        loop.add_reader(master, readable)

        async def typed() -> None:
            while data := await process.stdin.read(4096):
                os.write(master, data)

        typing = asyncio.ensure_future(typed())
        try:
            await done
            code = await loop.run_in_executor(None, child.wait)
        finally:
            loop.remove_reader(master)
            typing.cancel()
            os.close(master)
            if child.poll() is None:
                kill_quietly(child.pid)  # its own session: the TUI and anything it started
                await loop.run_in_executor(None, child.wait)
        process.exit(code)


class Server(asyncssh.SSHServer):  # type: ignore[misc]
    def unix_connection_requested(self, dest_path: str) -> bool:
        return True  # direct-streamlocal (ssh -L LOCAL.sock:REMOTE.sock): forward it


class SshServer:
    """An asyncssh server on 127.0.0.1 in a thread of its own, with keys in `folder`."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(mode=0o700)
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key_path = folder / "id_ed25519"
        self.client_key_path.write_bytes(client_key.export_private_key())
        self.client_key_path.chmod(0o600)
        self.authorized = folder / "authorized_keys"
        self.authorized.write_bytes(client_key.export_public_key())
        self.known_hosts = folder / "known_hosts"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.port = 0

    async def _listen(self) -> Any:
        return await asyncssh.create_server(
            Server,
            "127.0.0.1",
            0,
            server_host_keys=[self.host_key],
            authorized_client_keys=str(self.authorized),
            process_factory=lambda process: PtySession(process).run(),
            encoding=None,
        )

    def __enter__(self) -> SshServer:
        self.thread.start()
        self.acceptor = asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(30)
        self.port = self.acceptor.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            self.acceptor.close()
            await self.acceptor.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()

    def client_options(self) -> list[str]:
        """What the test adds to the README's command to reach this server and no other."""
        return [
            "-F",
            "/dev/null",
            "-p",
            str(self.port),
            "-i",
            str(self.client_key_path),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=accept-new",
        ]


@contextlib.contextmanager
def ssh_client(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                kill_quietly(proc.pid, group=False)
                proc.wait(15)


def live_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    reference_run(run_dir, 100_000, 50)
    return run_dir


SLOW_STEPS = {"TRAINER_TEST_STEP_SLEEP_S": "0.05"}


def stale_socket(path: Path) -> None:
    """What an ssh killed with its forward up leaves: a socket file nobody listens on."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


def forwarded_status(local_sock: Path) -> dict[str, Any] | None:
    try:
        with Client(local_sock, timeout=10) as client:
            result: dict[str, Any] = client.request("status")
            return result
    except Exception:
        return None


# ------------------------------------------------------------------------ the tests


@pytest.mark.skipif(not TRAINWARDEN.exists(), reason="no trainwarden script beside python")
def test_the_forwarded_socket_recipe_reaches_the_daemon(tmp_path: Path):
    mkdir_line, ssh_line, tui_line = forward_recipe()
    assert "-o StreamLocalBindUnlink=yes -N -L" in ssh_line
    assert tui_line.startswith("trainwarden tui --socket ")
    home = tmp_path / "home"
    home.mkdir()
    run_dir = live_run(tmp_path)

    with running_daemon(run_dir, SLOW_STEPS) as daemon, SshServer(tmp_path / "keys") as server:
        daemon.wait_state("running")
        mkdir = local_words(mkdir_line, home, run_dir)
        subprocess.run(mkdir, check=True, timeout=30)
        ssh = local_words(ssh_line, home, run_dir)
        assert ssh[0] == "ssh" and ssh[-1] == "host"
        local_sock = Path(ssh[ssh.index("-L") + 1].split(":", 1)[0])
        tunnels = local_sock.parent
        assert stat.S_IMODE(tunnels.stat().st_mode) == 0o700, "the socket's folder is private"
        stale_socket(local_sock)  # StreamLocalBindUnlink=yes must replace it

        argv = [SSH, *server.client_options(), *ssh[1:-1], "127.0.0.1"]
        with ssh_client(argv, tmp_path / "ssh.log") as proc:
            status = poll(lambda: proc.poll() is None and forwarded_status(local_sock), 60)
            log = (tmp_path / "ssh.log").read_text(errors="replace")
            assert status, f"no status reply through the forwarded socket; ssh said: {log}"
            assert status["run_dir"] == str(run_dir)
            assert status["state"] == "running"
            assert status["daemon_pid"] == daemon.pid
            assert stat.S_ISSOCK(local_sock.stat().st_mode)
            assert stat.S_IMODE(tunnels.stat().st_mode) == 0o700
            assert proc.poll() is None, "ssh -N keeps the forward up"
            # The CLI's read commands take the forwarded socket too, with no RUN.
            cli = subprocess.run(
                [str(TRAINWARDEN), "status", "--socket", str(local_sock), "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=home,
            )
            assert cli.returncode == 0, cli.stderr
            assert json.loads(cli.stdout)["run_dir"] == str(run_dir)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.skipif(not TRAINWARDEN.exists(), reason="no trainwarden script beside python")
def test_ssh_t_runs_the_tui_on_the_training_machine(tmp_path: Path):
    recipe = next(line for line in README.splitlines() if line.startswith("ssh -t host "))
    assert recipe == "ssh -t host /path/to/.venv/bin/trainwarden tui /path/to/RUN"
    run_dir = live_run(tmp_path)
    with running_daemon(run_dir, SLOW_STEPS) as daemon, SshServer(tmp_path / "keys") as server:
        daemon.wait_state("running")
        remote = [str(TRAINWARDEN), "tui", str(run_dir)]
        argv = [SSH, "-t", *server.client_options(), "127.0.0.1", shlex.join(remote)]
        tmux = Tmux()
        try:
            tmux.start(argv)
            tmux.wait_for("RUNNING", run_dir.name, "q quit", timeout=90)
            tmux.keys("q")
            wait_for(tmux.pane_dead, 60, 0.2, "ssh to end with the TUI")
            assert daemon.status()["state"] == "running", "q quits the TUI, not the run"
        finally:
            tmux.close()
