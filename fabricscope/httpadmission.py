"""Fair admission for the HTTP server: what one client address may hold at once.

Everything here runs on the server's event loop thread, so plain counters need no locks.

- `SourceConnections` caps open connections in total and per source address: beyond its
  share a new connection from that address is closed at once, so one client holding a
  thousand silent sockets cannot take the slots everyone else needs (nginx `limit_conn`).
  When the total is reached, the oldest connection that has not yet completed a request
  is dropped for the new one rather than the new one refused: a crowd of silent sockets
  from many addresses (a NAT, a pod network) then holds capacity only until someone uses
  it. Configured scrapers' addresses (`TrustedSources`) have slots of the total kept for
  them alone, and theirs are never the ones dropped.
- `FairPool` is a bounded set of worker threads. A complete request waits for a worker
  here, on the loop, costing no thread. Free workers go round-robin to the waiting
  sources, each source and each key (the credential the request carries) may have only
  its share running, and a request that waits longer than `max_wait` is answered 503: a
  source flooding the pool, or a key whose requests all wait on a slow backend, delays
  only itself.
"""
from __future__ import annotations

import asyncio
import ipaddress
import queue
import threading
from collections import Counter, OrderedDict, deque
from typing import Any, Callable


class TrustedSources:
    """The configured scrapers' networks (`--web.trusted-sources`, the sidecar's
    `trusted_sources`): a list of CIDRs, validated when the process starts."""

    def __init__(self, cidrs: "list[str] | tuple[str, ...]" = ()) -> None:
        self.networks = tuple(parse_cidr(cidr) for cidr in cidrs)
        self._known: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __contains__(self, source: str) -> bool:
        known = self._known.get(source)
        if known is None:
            try:
                address = ipaddress.ip_address(source)
            except ValueError:
                return False
            known = any(address in network for network in self.networks)
            if len(self._known) < 65536:        # a cache, bounded: addresses are the client's choice
                self._known[source] = known
        return known


def parse_cidr(text: str) -> "ipaddress.IPv4Network | ipaddress.IPv6Network":
    """A network from `10.0.0.0/8`, `192.0.2.7` (one address) or `::1`; ValueError naming
    the text otherwise."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address or CIDR network (e.g. 10.0.0.0/8)") from None


class Slot:
    """One admitted connection. `evict` (set once its task runs) ends it; `proven` once it
    has sent a whole request, after which it is never dropped for another."""

    __slots__ = ("source", "trusted", "evict", "proven", "released")

    def __init__(self, source: str, trusted: bool) -> None:
        self.source, self.trusted = source, trusted
        self.evict: Callable[[], Any] | None = None
        self.proven = self.released = False


class SourceConnections:
    """Open connections, in total and per source address."""

    def __init__(self, total: int, per_source: int, trusted: TrustedSources | None = None,
                 reserved: int | None = None) -> None:
        self.total, self.per_source = total, per_source
        self.trusted = trusted or TrustedSources()
        # Slots only trusted sources may take: a sixteenth of the total by default.
        self.reserved = (max(1, total // 16) if reserved is None else reserved) if self.trusted else 0
        self.open: Counter[str] = Counter()
        self.count = 0
        self.evicted = 0
        # Connections that have not completed a request, oldest first: the ones dropped
        # when the total is reached.
        self._unproven: OrderedDict[Slot, None] = OrderedDict()

    def admit(self, source: str) -> Slot | None:
        """A slot for a new connection from `source`, or None (close it)."""
        if self.open[source] >= self.per_source:
            return None
        trusted = source in self.trusted
        limit = self.total if trusted else self.total - self.reserved
        if self.count >= limit and not self._evict_oldest_unproven():
            return None
        slot = Slot(source, trusted)
        self.open[source] += 1
        self.count += 1
        if not trusted:
            self._unproven[slot] = None
        return slot

    def prove(self, slot: Slot) -> None:
        """The connection has sent a complete request: it is in use, not merely held."""
        if not slot.proven:
            slot.proven = True
            self._unproven.pop(slot, None)

    def _evict_oldest_unproven(self) -> bool:
        for slot in self._unproven:
            if slot.evict is not None:          # its task is running: it can be ended
                self.release(slot)
                self.evicted += 1
                slot.evict()
                return True
        return False

    def release(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        self._unproven.pop(slot, None)
        self.count -= 1
        self.open[slot.source] -= 1
        if not self.open[slot.source]:
            del self.open[slot.source]


class Busy(Exception):
    """No worker came free for this request within the pool's max_wait: answer 503."""


class _Waiter:
    __slots__ = ("source", "key", "future")

    def __init__(self, source: str, key: str | None, future: asyncio.Future) -> None:
        self.source, self.key, self.future = source, key, future


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if not future.done():                    # a request cancelled meanwhile (stop) wants nothing
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


class WorkerThreads:
    """Threads that run calls for an event loop and hand each outcome back to it.

    Why not loop.run_in_executor: it wraps a concurrent.futures.Future (a Condition and
    its lock) in an asyncio one and copies the state across with two callbacks; here the
    worker sets the loop's future itself, through one call_soon_threadsafe. Measured on a
    trivial application with bench/http_overhead.py, that was most of what the hand-off
    cost the loop. Daemon threads, started as they are first needed: a call stuck in the
    kernel must not hold the process's exit."""

    def __init__(self, name: str, count: int) -> None:
        self.name, self.count = name, count
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._started = 0
        self._idle = 0
        self._lock = threading.Lock()

    def run(self, work: Callable[..., Any], *args: Any) -> asyncio.Future:
        """`work(*args)` on a worker; the future is the running loop's."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._idle == 0 and self._started < self.count:
                self._started += 1
                threading.Thread(target=self._serve, name=f"{self.name}-{self._started}", daemon=True).start()
            else:
                self._idle -= 1
        self._calls.put((loop, future, work, args))
        return future

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            loop, future, work, args = call
            result, error = None, None
            try:
                result = work(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                error = exc
            with self._lock:
                self._idle += 1
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:                  # the loop closed meanwhile (stop)
                pass
            del call, future, result, error

    def shutdown(self) -> None:
        """Each thread ends once it has finished the call it is in; calls not begun are dropped."""
        while True:
            try:
                self._calls.get_nowait()
            except queue.Empty:
                break
        for _ in range(self._started):
            self._calls.put(None)


class FairPool:
    """`workers` threads; at most `per_source` running for one address and `per_key` for
    one key (None: no per-key limit)."""

    def __init__(self, name: str, workers: int, *, per_source: int, per_key: int | None = None,
                 max_wait: float = 10.0) -> None:
        self.name, self.workers = name, workers
        self.per_source, self.per_key, self.max_wait = max(1, per_source), per_key, max_wait
        self.threads = WorkerThreads(f"http-{name}", workers)
        self.running = 0
        self._by_source: Counter[str] = Counter()
        self._by_key: Counter[str] = Counter()
        # Waiting requests per source; the order of the sources is the round-robin order.
        self._waiting: OrderedDict[str, deque[_Waiter]] = OrderedDict()

    async def run(self, source: str, key: str | None, work: Callable[..., Any], *args: Any) -> Any:
        """Run `work(*args)` on a worker once this source's and key's turn comes."""
        await self._acquire(source, key)
        try:
            return await self.threads.run(work, *args)
        finally:
            self._release(source, key)

    def _may_run(self, source: str, key: str | None) -> bool:
        return (self.running < self.workers and self._by_source[source] < self.per_source
                and (key is None or self.per_key is None or self._by_key[key] < self.per_key))

    def _start(self, source: str, key: str | None) -> None:
        self.running += 1
        self._by_source[source] += 1
        if key is not None:
            self._by_key[key] += 1

    async def _acquire(self, source: str, key: str | None) -> None:
        if source not in self._waiting and self._may_run(source, key):
            self._start(source, key)
            return
        waiter = _Waiter(source, key, asyncio.get_running_loop().create_future())
        self._waiting.setdefault(source, deque()).append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), self.max_wait)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if waiter.future.done() and not waiter.future.cancelled():
                self._release(source, key)          # granted just as the wait ended
            else:
                waiter.future.cancel()
                self._forget(waiter)
            if isinstance(exc, asyncio.TimeoutError):
                raise Busy(f"no {self.name} worker free within {self.max_wait:g} s") from None
            raise

    def _forget(self, waiter: _Waiter) -> None:
        queue = self._waiting.get(waiter.source)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[waiter.source]

    def _release(self, source: str, key: str | None) -> None:
        self.running -= 1
        self._by_source[source] -= 1
        if not self._by_source[source]:
            del self._by_source[source]
        if key is not None:
            self._by_key[key] -= 1
            if not self._by_key[key]:
                del self._by_key[key]
        self._grant()

    def _grant(self) -> None:
        """Hand free workers to waiting requests, one source at a time in turn."""
        progress = True
        while progress and self.running < self.workers and self._waiting:
            progress = False
            for source in list(self._waiting):
                queue = self._waiting[source]
                waiter = next((w for w in queue if self._may_run(w.source, w.key)), None)
                if waiter is None:
                    continue
                queue.remove(waiter)
                if not queue:
                    del self._waiting[source]
                else:
                    self._waiting.move_to_end(source)     # its next request waits its turn
                self._start(waiter.source, waiter.key)
                waiter.future.set_result(None)
                progress = True
                break

    def shutdown(self) -> None:
        self.threads.shutdown()


class SourceRequests:
    """Requests in progress per source address, from their complete head until their
    answer: a request beyond its source's share waits, unread, before its body is taken
    in, so one address can fill neither the memory that bodies are read into nor the
    queue for workers."""

    def __init__(self, per_source: int, max_wait: float) -> None:
        self.per_source, self.max_wait = max(1, per_source), max_wait
        self.active: Counter[str] = Counter()
        self._waiting: dict[str, deque[asyncio.Future]] = {}

    async def acquire(self, source: str) -> None:
        if self.active[source] < self.per_source and source not in self._waiting:
            self.active[source] += 1
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(source, deque()).append(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), self.max_wait)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if future.done() and not future.cancelled():
                self.release(source)                    # granted just as the wait ended
            else:
                future.cancel()
                queue = self._waiting.get(source)
                if queue is not None and future in queue:
                    queue.remove(future)
                    if not queue:
                        del self._waiting[source]
            if isinstance(exc, asyncio.TimeoutError):
                raise Busy(f"more than {self.per_source} requests in progress from one address") from None
            raise

    def release(self, source: str) -> None:
        queue = self._waiting.get(source)
        if queue:
            queue.popleft().set_result(None)            # the slot passes on, count unchanged
            if not queue:
                del self._waiting[source]
            return
        self.active[source] -= 1
        if not self.active[source]:
            del self.active[source]
