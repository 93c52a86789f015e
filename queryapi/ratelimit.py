"""Per-key token buckets. In-process: the sidecar runs one worker process per replica
(the SQLite lock needs that), so a key's budget is per replica; behind a load balancer
with N replicas a key gets at most N times its rate."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    def __init__(self, clock=time.monotonic) -> None:
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def allow(self, key: str, per_second: float, burst: int, cost: float = 1.0) -> tuple[bool, float]:
        """(allowed, seconds until `cost` tokens are available); a refused call spends nothing."""
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(float(burst), now)
            bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.updated) * per_second)
            bucket.updated = now
            if bucket.tokens >= cost:
                bucket.tokens -= cost
                return True, 0.0
            return False, (cost - bucket.tokens) / per_second
