"""Backoff for retryable provider errors: the one retry policy of the service.

Only ``retryable`` errors (rate limits, overload, 5xx, dropped connections, malformed stream
data) are retried, at most ``max_retries`` times per answer, whether or not the attempt had
streamed something: an attempt that did is recorded in the run record before the retry
(docs/decisions.md, "Retries continue after content was streamed"). The provider's
``retry-after`` wins over the computed delay, capped by ``max_delay`` so a hostile or broken
header cannot park a run for hours.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 4
    base_delay: float = 0.5
    max_delay: float = 30.0
    jitter: float = 0.2

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        if retry_after is not None and retry_after >= 0:
            return float(min(retry_after, self.max_delay))
        backoff = min(self.base_delay * (2 ** (retry - 1)), self.max_delay)
        jitter = 1.0 + random.uniform(-self.jitter, self.jitter)
        return float(backoff * jitter)
