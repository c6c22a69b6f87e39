"""Errors that end the trainer before training with exit status 2 and a one-line message."""


class TrainerError(Exception):
    """Base class: the message is the one line the user sees on stderr."""

    exit_code = 2


class UsageError(TrainerError):
    """The command line, the environment or policy.json asks for something impossible."""


class ResumeRefused(TrainerError):
    """The checkpoint to resume from cannot give an exact resume (bad file, data changed)."""
