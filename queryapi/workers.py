"""Background work of the sidecar: a thread that runs a function every `interval`
seconds until stopped. Started once the server listens, stopped on shutdown; a failing
run is logged and retried next interval."""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("fabricscope.sidecar.workers")


class PeriodicWorker:
    def __init__(self, name: str, interval: float, run_once: Callable[[], object]) -> None:
        self.name = name
        self.interval = interval
        self.run_once = run_once
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stopping(self) -> bool:
        """Whether stop() was called: long runs check it to end early."""
        return self._stop.is_set()

    def wake(self) -> None:
        """Run soon instead of at the next interval (new work arrived)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:
                log.exception("%s failed; retrying in %.1fs", self.name, self.interval)
            self._wake.wait(self.interval)
            self._wake.clear()

    def request_stop(self) -> None:
        """Stop after the current run (or at once, when waiting); stop() waits for it."""
        self._stop.set()
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("%s still running after %.1fs; leaving it to the process's exit", self.name, timeout)
            self._thread = None
