"""PostgreSQL restarts under a running app: requests during the outage get 503 with
Retry-After (in the API's error shape), and the app recovers by itself, without a restart.

The outage is made by a TCP relay between the app and the database: "down" drops every
open connection and refuses new ones, as a restarting server does; "up" lets them through
again. The real server is shared with the rest of the suite, so it is never stopped."""

from __future__ import annotations

import os
import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest

from tests.live import LiveServer, _with_db

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="needs PostgreSQL (a server)"
    ),
]


class Relay:
    """Forwards TCP connections from a local port to ``target``; ``down()`` cuts them."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = threading.Event()
        self.up.set()
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if not self.up.is_set():
                client.close()  # the server is "restarting": the connection is dropped
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def down(self) -> None:
        self.up.clear()
        with self.lock:
            dropped, self.open = self.open, []
        for s in dropped:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.down()
        self.listener.close()


def test_a_database_restart_is_503_with_retry_after_and_the_app_recovers(tmp_path):
    server = LiveServer(tmp_path, {"CLAW_DB_POOL_TIMEOUT": "2"})
    server.manage("migrate", "--noinput", "-v", "0")
    key = server.make_key("ingest", "read")
    db = urlparse(server.env["DATABASE_URL"])
    relay = Relay((db.hostname or "127.0.0.1", db.port or 5432))
    server.env["DATABASE_URL"] = _with_db(
        server.env["DATABASE_URL"].replace(f":{db.port or 5432}/", f":{relay.port}/"), db.path.lstrip("/")
    )
    try:
        server.start(migrate=False)
        step = {"trajectory_uid": "t", "step_index": 0, "prompt_ids": [1, 2], "response_ids": [3]}
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
            # given an app that works
            assert c.post("/api/v1/steps", json={"steps": [step]}).status_code == 201
            # when its database goes away, every request that needs it is a 503 with
            # Retry-After in the API's error shape (never a 500, never a hang)
            relay.down()
            for i in range(3):
                t0 = time.monotonic()
                resp = c.post("/api/v1/steps", json={"steps": [{**step, "step_index": i + 1}]})
                assert resp.status_code == 503, resp.text
                assert int(resp.headers["Retry-After"]) > 0
                assert resp.json()["error"]["type"] == "api_error"
                assert time.monotonic() - t0 < 20
                assert c.get("/api/v1/steps/t:0").status_code == 503
            # then once it is back, the same process answers again, and nothing was half-written
            relay.up.set()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if c.get("/api/v1/steps/t:0").status_code == 200:
                    break
                time.sleep(0.2)
            else:
                raise AssertionError("the app did not recover")
            for _ in range(3):
                assert c.get("/api/v1/steps/t:0").status_code == 200
            assert c.post("/api/v1/steps", json={"steps": [{**step, "step_index": 1}]}).status_code == 201
            assert c.get("/api/v1/trajectories/t").json()["step_count"] == 2
    finally:
        relay.close()
        server.close()
