"""Keeping the garbage collector off a run's hot path (docs/performance.md).

A run allocates tens of thousands of objects (the request, the provider's events, the new
messages, the SQL parameters) and most of them live past a young collection, so with
CPython's default thresholds (700, 10, 10) every few runs end in a full collection, which
walks every tracked object in the process: the imported modules, pydantic's and SQLAlchemy's
schema caches, and every context this process keeps in its cache. The longer the
conversations the more often, and the longer each pass.

:func:`tune` (once per process, at the app's first start-up):

- ``gc.collect()`` then ``gc.freeze()``: everything alive after start-up (modules, classes,
  compiled validators and statements) moves to the permanent generation, which collections
  never walk again;
- ``gc.set_threshold(gen0, 50, 100)``: young collections every ``gen0`` net allocations
  (``CARRYOVER_GC_GEN0_THRESHOLD``, 50,000) instead of 700, and older generations far less
  often. What a run leaves as garbage is freed by reference counting anyway (the values are
  acyclic); the collector only has cycles to find, which a run makes few of. CPython still
  defers a full collection until the objects that survived since the last one are a quarter
  of the long-lived heap, so the cost stays proportional to what was allocated.

``CARRYOVER_GC_GEN0_THRESHOLD=0`` leaves the collector as Python sets it (no freeze either).
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

_tuned = False


def tune(gen0: int) -> bool:
    """Freeze the start-up heap and raise the thresholds, once per process; False when
    already done or switched off."""
    global _tuned
    if _tuned or gen0 <= 0:
        return False
    _tuned = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0, 50, 100)
    log.debug("gc: froze %d objects, thresholds %s", gc.get_freeze_count(), gc.get_threshold())
    return True


__all__ = ["tune"]
