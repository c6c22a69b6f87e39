"""Options for the whole suite (registered here so `pytest --run-slow` works from the root)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="also run the long chaos soak (20,000 steps; about 18 minutes on 2 busy CPU cores)",
    )
