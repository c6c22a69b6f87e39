"""trainwarden: a supervisor for multi-week single-GPU training runs.

The installed package is made of the repository's top-level folders:
`trainwarden.supervisor` (supervisor/), `trainwarden.tui` (tui/), `trainwarden.plugins`
(plugins/), `trainwarden.trainer` (trainer/) and `trainwarden.integrations`
(integrations/). In a checkout, the links beside this file lay the same tree out for tools that read sources (mypy, a bare `python -c`).
"""
