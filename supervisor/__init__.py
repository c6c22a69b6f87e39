"""trainwarden supervisor: the daemon that keeps a training run alive."""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
