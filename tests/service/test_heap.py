"""The garbage-collector tuning of app/service/heap.py: once per process, or not at all."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from app.service import heap


@pytest.fixture
def fresh_gc() -> Iterator[None]:
    thresholds, tuned = gc.get_threshold(), heap._tuned
    heap._tuned = False
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        heap._tuned = tuned


def test_tune_freezes_the_start_up_heap_and_raises_the_thresholds_once(fresh_gc: None) -> None:
    gc.unfreeze()
    assert heap.tune(12_345)
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (12_345, 50, 100)
    assert not heap.tune(999)  # the first start-up decides
    assert gc.get_threshold() == (12_345, 50, 100)


def test_a_zero_threshold_leaves_the_collector_alone(fresh_gc: None) -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    assert not heap.tune(0)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
