"""Finding the Debian-packaged servers and checking ports before anything starts."""
from __future__ import annotations

import os
import shutil
import socket

from .errors import StackError

SETUP_HINT = "run `make setup` (installs the Debian packages prometheus and prometheus-alertmanager)"


def find_binary(name: str) -> str:
    """Absolute path of `name` from PATH or /usr/bin, or a StackError saying how to get it."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if not found:
        raise StackError(f"{name} not found on PATH or in /usr/bin; {SETUP_HINT}")
    return found


def ensure_port_free(host: str, port: int, what: str, flag: str | None = None) -> None:
    """Fail early and clearly instead of letting a child process die on bind."""
    if port == 0:
        return
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            hint = f"; choose another with {flag}" if flag else ""
            raise StackError(f"{what} port {host}:{port} is already in use ({exc.strerror}){hint}") from None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` different free ports: each held bound until all are picked (free_port twice
    in a row may answer the same port)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
