"""Frame tests run with a clean configuration environment and leave logging as they found it."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from app.config import get_settings

_CONFIG_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PROMETHEUS_MULTIPROC_DIR")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.upper().startswith("CARRYOVER_") or name.upper() in _CONFIG_VARIABLES:
            monkeypatch.delenv(name)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
