"""The command line: the parser, one function per command, and the text they print."""

from trainwarden.supervisor.cli.main import main

__all__ = ["main"]
