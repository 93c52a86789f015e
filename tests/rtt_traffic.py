"""Traffic for the RTT lab (tests/rtt_lab.py), one role per process so no flow waits on
another's interpreter lock:

  python -m tests.rtt_traffic echo PORT              request/response server (64-byte echo)
  python -m tests.rtt_traffic sink PORT [WINDOW]     bulk receiver (reads and drops); with
                                                     WINDOW, its receive buffer is that many
                                                     bytes (SO_RCVBUF before listen(), so the
                                                     first window is small too), which bounds
                                                     the queue a sender can build
  python -m tests.rtt_traffic rr HOST PORT OUT       request/response client: 64 bytes every
                                                     10 ms, TCP_NODELAY; appends
                                                     "<unix time> <round trip s>" lines to OUT
  python -m tests.rtt_traffic bulk HOST PORT START STOP CC [RATE [CHUNK]]
                                                     bulk sender from unix time START to STOP
                                                     under congestion control CC (cubic, bbr),
                                                     paced to RATE bytes/s by the kernel
                                                     (SO_MAX_PACING_RATE) when given; with
                                                     CHUNK, RATE bytes/s written as CHUNK-byte
                                                     messages (TCP_NODELAY): one small packet
                                                     each, so a request waits behind one at most
"""
from __future__ import annotations

import socket
import sys
import threading
import time

MESSAGE = 64
THINK_SECONDS = 0.010
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)


def listener(port: int, rcvbuf: int | None = None) -> socket.socket:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if rcvbuf:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    srv.bind(("0.0.0.0", port))
    srv.listen(16)
    return srv


def read_exactly(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def echo(port: int) -> None:
    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while (data := read_exactly(conn, MESSAGE)) is not None:
            conn.sendall(data)

    srv = listener(port)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def sink(port: int, window: int | None) -> None:
    def drain(conn: socket.socket) -> None:
        while conn.recv(1 << 16):
            pass

    srv = listener(port, window)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def connect(host: str, port: int, deadline: float = 10.0) -> socket.socket:
    end = time.monotonic() + deadline
    while True:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def request_response(host: str, port: int, out: str) -> None:
    conn = connect(host, port)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"x" * MESSAGE
    with open(out, "a", buffering=1) as log:
        next_send = time.monotonic()
        while True:
            start = time.perf_counter()
            conn.sendall(payload)
            if read_exactly(conn, MESSAGE) is None:
                return
            log.write(f"{time.time():.3f} {time.perf_counter() - start:.6f}\n")
            next_send += THINK_SECONDS
            time.sleep(max(0.0, next_send - time.monotonic()))


def bulk(host: str, port: int, start: float, stop: float, congestion_control: str, rate: float | None,
         chunk: int | None) -> None:
    time.sleep(max(0.0, start - time.time()))
    conn = connect(host, port)
    # Set per socket: a namespace otherwise runs the host's default, and only root may pick
    # one the host does not allow (tests/rtt_lab.py says why the lab picks).
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion_control.encode())
    if rate and chunk:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message, period = b"\0" * chunk, chunk / rate
        next_send = time.monotonic()
        while time.time() < stop:
            conn.sendall(message)
            next_send += period
            time.sleep(max(0.0, next_send - time.monotonic()))
        conn.close()
        return
    if rate:
        conn.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, int(rate))
    block = b"\0" * (1 << 16)
    conn.settimeout(1.0)
    while time.time() < stop:
        try:
            conn.send(block)
        except socket.timeout:
            continue
    conn.close()


def main(argv: list[str]) -> None:
    role, args = argv[0], argv[1:]
    if role == "echo":
        echo(int(args[0]))
    elif role == "sink":
        sink(int(args[0]), int(args[1]) if len(args) > 1 else None)
    elif role == "rr":
        request_response(args[0], int(args[1]), args[2])
    elif role == "bulk":
        bulk(args[0], int(args[1]), float(args[2]), float(args[3]), args[4],
             float(args[5]) if len(args) > 5 else None, int(args[6]) if len(args) > 6 else None)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
