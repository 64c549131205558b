"""bench.slow_clients: /healthz and an authenticated API read under slowloris.

    python -m bench.slow_clients [--slowloris 50] [--samples 200] [--header-timeout 2] [--body-timeout 3]

One live server (`manage.py serve`, tests/live.py: its own SQLite file) with small header and
body deadlines (claw_kit/web/slow_clients.py). The p99 latency of ``GET /healthz`` and of
``GET /api/v1/trajectories?page_size=1`` (a reader's key) is measured with nothing else
going on, then while ``--slowloris`` connections send one header byte a second each and one
request announces a 200 MB body and sends one byte of it a second (each replaced when the
server closes it), until the server has closed the first round of them.

Prints one JSON line: ``healthz_p99_ms`` and ``healthz_p99_ms_slowloris``, ``api_p99_ms`` and
``api_p99_ms_slowloris``, ``closed_by_deadline`` (slow connections the server closed) and
``wall_s``. tests/gateway/test_slow_clients.py runs the same attack and judges the figures.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.live import live_server

Targets = list[tuple[str, str, dict[str, str]]]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slowloris", type=int, default=50)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--header-timeout", type=float, default=2.0)
    p.add_argument("--body-timeout", type=float, default=3.0)
    a = p.parse_args(argv)
    print(json.dumps(run(a.slowloris, a.samples, a.header_timeout, a.body_timeout)), flush=True)


def run(slowloris: int, samples: int, header_timeout: float, body_timeout: float) -> dict:
    t0 = time.perf_counter()
    env = {
        "CLAW_HEADER_TIMEOUT_S": str(header_timeout),
        "CLAW_BODY_TIMEOUT_S": str(body_timeout),
        "CLAW_BODY_MIN_BYTES_PER_S": "100000",
        "CLAW_MAX_CONNECTIONS_PER_IP": str(slowloris + 30),
    }
    with live_server(Path(tempfile.mkdtemp(prefix="bench-slow-")), env, serve=True) as server:
        key = server.make_key("read")
        targets = [
            ("healthz", f"{server.url}/healthz", {}),
            ("api", f"{server.url}/api/v1/trajectories?page_size=1", {"Authorization": f"Bearer {key}"}),
        ]
        with httpx.Client(timeout=10) as client:
            baseline = p99s(client, targets, samples)
            attack = Attack(server.port, slowloris)
            thread = threading.Thread(target=attack.run, daemon=True)
            thread.start()
            try:
                attack.wait_open(10)
                attacked = p99s(
                    client, targets, samples, until=attack.first_round_closed, timeout=body_timeout + 15
                )
            finally:
                attack.stop.set()
                thread.join(timeout=10)
    out: dict = {}
    for name, _, _ in targets:
        out[f"{name}_p99_ms"] = round(baseline[name] * 1000, 1)
        out[f"{name}_p99_ms_slowloris"] = round(attacked[name] * 1000, 1)
    out["closed_by_deadline"] = len(attack.closed())
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def p99s(
    client: httpx.Client,
    targets: Targets,
    samples: int,
    *,
    until: Callable[[], bool] | None = None,
    timeout: float = 30,
) -> dict[str, float]:
    """p99 latency (s) of each target, its requests taken in turn: ``samples`` each, and on
    until ``until()`` holds (within ``timeout``), so the figures cover what an attack does
    meanwhile."""
    times: dict[str, list[float]] = {name: [] for name, _, _ in targets}
    deadline = time.monotonic() + timeout
    while len(times[targets[0][0]]) < samples or (until is not None and not until()):
        if time.monotonic() > deadline:
            raise TimeoutError("timed out measuring")
        for name, url, headers in targets:
            t0 = time.perf_counter()
            r = client.get(url, headers=headers)
            times[name].append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"{url}: {r.status_code} {r.text[:500]}")
    return {name: sorted(t)[max(0, int(len(t) * 0.99) - 1)] for name, t in times.items()}


@dataclass
class Slow:
    """One slow connection: what it sends before trickling, and what came back."""

    head: bytes  # the request's start
    trickle: bytes  # what it then sends a byte a second (then "a" on and on)
    sock: socket.socket
    opened: float
    closed: float | None = None
    answer: bytes = b""
    sent: int = 0


@dataclass
class Attack:
    """``slowloris`` connections that send one header byte a second each, plus one request that
    announces a 200 MB body and sends one byte of it a second. A connection the server closes
    is recorded and replaced (as an attacker would), so the attack lasts until stopped."""

    port: int
    slowloris: int
    done: list[Slow] = field(default_factory=list)
    live: list[Slow] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self, kind: str) -> Slow:
        sock = socket.create_connection(("127.0.0.1", self.port))
        if kind == "body":  # whole headers, then the body a byte a second
            head, trickle = (
                b"POST /api/v1/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 200000000\r\n\r\n",
                b"",
            )
        else:  # the headers themselves a byte a second, never ending
            head, trickle = b"G", b"ET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: "
        sock.sendall(head)
        return Slow(head=head, trickle=trickle, sock=sock, opened=time.monotonic())

    def run(self) -> None:
        kinds = ["header"] * self.slowloris + ["body"]
        self.live = [self.open(k) for k in kinds]
        next_tick = time.monotonic() + 1.0
        while not self.stop.is_set():
            socks = {s.sock: (i, s) for i, s in enumerate(self.live)}
            ready, _, _ = select.select(list(socks), [], [], max(0.0, min(next_tick - time.monotonic(), 0.1)))
            for sock in ready:
                i, slow = socks[sock]
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:  # our next byte crossed the server's close
                    chunk = b""
                slow.answer += chunk
                if not chunk:
                    slow.closed = time.monotonic()
                    sock.close()
                    with self.lock:
                        self.done.append(slow)
                    self.live[i] = self.open(kinds[i])
            if time.monotonic() >= next_tick:
                next_tick += 1.0
                for slow in self.live:
                    try:
                        slow.sock.send(slow.trickle[slow.sent : slow.sent + 1] or b"a")
                        slow.sent += 1
                    except OSError:
                        pass  # closed by the server: the read above records it
        for slow in self.live:
            slow.sock.close()

    def closed(self) -> list[Slow]:
        with self.lock:
            return list(self.done)

    def wait_open(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.live) < self.slowloris + 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the slow connections did not open")
            time.sleep(0.02)

    def first_round_closed(self) -> bool:
        """The server closed as many slow connections as were opened, the slow body among them."""
        closed = self.closed()
        return len(closed) > self.slowloris and any(s.head.startswith(b"POST") for s in closed)


if __name__ == "__main__":
    main()
