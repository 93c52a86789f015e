"""Start-up steps run in a short-lived child process, so what they import dies with it.

Validating --config.file and --web.config.file needs PyYAML and pydantic: about 15 MB of
modules, compiled validators and their C libraries that the exporter would otherwise
carry for its whole life, though it only needs the validated values
(docs/cost.md "Memory"). `in_child(function, *args)` forks, runs the function in the
child and hands its result (pickled through a pipe) back to the parent; the child's
memory, imports included, goes when it exits.

Errors keep their meaning: a ConfigError raised in the child is raised again in the
parent with the same message (file and key path); any other exception comes back as
IsolatedStepError with the child's traceback, and a child that dies without answering is
reported with its exit status.

fork() is only safe while the process has a single thread (another thread may hold a lock
the child would then wait on forever), so where other threads already run (an exporter
started inside a test or the demo) or the platform cannot fork, the function runs in
this process instead: the same checks, only the memory stays.
"""
from __future__ import annotations

import os
import pickle
import threading
import traceback
from typing import Any, Callable, TypeVar

from .schema import ConfigError

Result = TypeVar("Result")


class IsolatedStepError(RuntimeError):
    """The step failed in its child process for a reason other than a bad configuration."""


def can_fork() -> bool:
    return hasattr(os, "fork") and threading.active_count() == 1


def in_child(function: Callable[..., Result], *args: Any) -> Result:
    """function(*args), computed in a forked child when that is safe (see module doc)."""
    if not can_fork():
        return function(*args)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # child: answer, then leave at once
        status = 0
        try:
            os.close(read_end)
            try:
                answer = ("ok", function(*args))
            except ConfigError as exc:
                answer = ("config", str(exc))
            except BaseException as exc:   # noqa: BLE001 - every failure goes to the parent
                answer = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            data = pickle.dumps(answer)
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(data)
        except BaseException:   # noqa: BLE001 - the parent reports a child without an answer
            status = 1
        finally:
            # No atexit handlers, no flushing of the parent's inherited buffers.
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()                           # to EOF before waiting: the pipe may fill
    _, wait_status = os.waitpid(pid, 0)
    if not data:
        raise IsolatedStepError(f"{getattr(function, '__qualname__', function)} ended without an answer "
                                f"(child {describe_status(wait_status)})")
    kind, value = pickle.loads(data)                 # our own child wrote it
    if kind == "ok":
        return value
    if kind == "config":
        raise ConfigError(value)
    raise IsolatedStepError(f"{getattr(function, '__qualname__', function)} failed: {value}")


def describe_status(wait_status: int) -> str:
    if os.WIFSIGNALED(wait_status):
        return f"killed by signal {os.WTERMSIG(wait_status)}"
    return f"exit status {os.waitstatus_to_exitcode(wait_status)}"
