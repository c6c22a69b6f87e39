"""The exceptions trainwarden raises; each carries a one-line, user-facing message."""


class TrainwardenError(Exception):
    """Base class: the message is what the user sees."""

    exit_code = 1


class ConfigError(TrainwardenError):
    """The run's configuration is missing, unreadable or invalid."""

    exit_code = 2


class UsageError(TrainwardenError):
    """The command line asked for something that cannot be done as asked."""

    exit_code = 2


class CheckpointInvalid(TrainwardenError):
    """A checkpoint file failed verification by its format plugin."""


class PluginError(TrainwardenError):
    """A plugin could not be found or loaded."""

    exit_code = 2


class ProtocolError(TrainwardenError):
    """A control-socket message is malformed or breaks the protocol."""


class DaemonNotRunning(TrainwardenError):
    """No daemon answers on the run's control socket."""


class NobodyAnswers(DaemonNotRunning):
    """Nothing listens on the socket (no such socket, or a stale one): no daemon runs there."""

    def __init__(self, message: str, socket_path: object = None) -> None:
        super().__init__(message)
        self.socket_path = socket_path


class UntrustedServer(DaemonNotRunning):
    """The socket is served by another user than ours, root or its folder's owner."""


class LockHeld(TrainwardenError):
    """Another daemon already supervises this run directory."""


class UnsafePath(TrainwardenError):
    """A file or folder the daemon writes is a symbolic link or not what it must be."""

    exit_code = 2


class CommandRefused(TrainwardenError):
    """The daemon refused an operator command; `code` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
