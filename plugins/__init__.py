"""Checkpoint formats and log parsers: the plugin API and the built-in plugins.

- `api`: everything a plugin needs; third-party plugins import only this module
- `formats/`: the built-in checkpoint formats
- `parsers/`: the built-in log parsers

The built-in plugins are registered by entry point in pyproject.toml, exactly as a
third-party one is, and found through `trainwarden.supervisor.registry`. Plugins import
only the contract and the errors of the rest of trainwarden, and no plugin imports torch
at module level.
"""
