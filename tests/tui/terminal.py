"""A real terminal for tests: one tmux session on a private server, read back as text."""

from __future__ import annotations

import os
import subprocess
import time
import uuid


class Tmux:
    """One detached session on a private tmux server, so only our own session is touched."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:10]
        self.server = f"trainwarden-test-{tag}"
        self.session = f"tui-{tag}"

    def run(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.server, *args], capture_output=True, text=True, timeout=30
        )
        return result.stdout

    def start(self, command: list[str]) -> None:
        env = {**os.environ, "TERM": "xterm-256color"}
        subprocess.run(
            [
                "tmux",
                "-L",
                self.server,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "80",
                "-y",
                "24",
                "-s",
                self.session,
                *command,
            ],
            check=True,
            env=env,
            timeout=30,
        )
        # Keep the pane after the program exits, to read why if it failed.
        self.run("set-option", "-t", self.session, "remain-on-exit", "on")

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-J", "-t", self.session)

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.session, *keys)

    def wait_for(self, *texts: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if all(text in screen for text in texts):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{texts} not on screen after {timeout} s:\n{screen}")
            time.sleep(0.2)

    def pane_dead(self) -> bool:
        return self.run("display-message", "-p", "-t", self.session, "#{pane_dead}").strip() == "1"

    def close(self) -> None:
        self.run("kill-session", "-t", self.session)
        self.run("kill-server")
