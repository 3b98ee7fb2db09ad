"""Conversations as managed objects (metadata, search, retention, fork, export/import, the
pending-action listing): the app runs on the test's ``clock``, a ManualClock the test moves.

- ``managed``: ``async with managed(agents=..., **settings) as client`` starts an app on the
  test database and the test's clock.
- ``client``: one such app with the default settings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from app.clock import ManualClock

from ..conftest import AppClient, SettingsFactory, apps


@pytest.fixture
def managed(make_settings: SettingsFactory, clock: ManualClock) -> Callable[..., Any]:
    """``async with managed(agents=..., **settings) as client``: the app on the test's clock."""
    return apps(make_settings, clock)


@pytest.fixture
async def client(managed: Callable[..., Any]) -> AsyncIterator[AppClient]:
    async with managed() as http:
        yield http
