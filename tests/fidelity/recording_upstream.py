"""The demo upstream with a request log: every completion request it receives (the path and
the JSON body, as the gateway sent it) is appended as one line to the file named by
CLAW_FIDELITY_RECORD, before it is answered. So a test knows exactly what the upstream saw for
each call an agent made through the gateway, and can ask the upstream again, directly, for
the token ids and logprobs it computes for that request (its answer is a pure function of
it: gateway/demo/upstream.py).

A request with the header ``x-fidelity-direct`` (the test's own direct calls) is not logged.

``python -m tests.fidelity.recording_upstream --fd N [demo upstream options]``
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from gateway.demo import upstream
from tests.live import ROOT, listening_socket, stop_process

RECORDED_PATHS = ("/v1/chat/completions", "/v1/completions")
DIRECT_HEADER = "x-fidelity-direct"


def with_record(app: Any, record: Path) -> Any:
    """``app`` logging each completion request to ``record`` (one JSON line, unbuffered)."""
    out = open(record, "ab", buffering=0)  # noqa: SIM115 - lives as long as the process
    direct = DIRECT_HEADER.encode()

    async def recorded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] not in RECORDED_PATHS
            or any(k == direct for k, _ in scope["headers"])
        ):
            await app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            parsed: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = body.decode(errors="replace")
        out.write(orjson.dumps({"path": scope["path"], "body": parsed}) + b"\n")
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def replay() -> dict[str, Any]:
            return pending.pop() if pending else await receive()

        await app(scope, replay, send)

    return recorded


def start(record: Path) -> tuple[str, subprocess.Popen]:
    """Start it logging to ``record``; return ("http://127.0.0.1:PORT/v1", process) once it
    answers. The caller stops it (tests.live.stop_process)."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the process
    with listening_socket() as sock:
        port = sock.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fidelity.recording_upstream", "--fd", str(sock.fileno())],
            cwd=ROOT,
            env={**os.environ, "CLAW_FIDELITY_RECORD": str(record)},
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(sock.fileno(),),
        )
    proc.stderr = log  # type: ignore[assignment] - closed by stop_process
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"recording upstream exited early: {log.read().decode(errors='replace')}")
        try:
            if httpx.get(f"{base}/models", timeout=1).status_code == 200:
                return base, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    stop_process(proc)
    raise RuntimeError("recording upstream did not answer GET /v1/models within 30 s")


def recorded(record: Path) -> list[dict[str, Any]]:
    """Every logged request so far, in arrival order."""
    if not record.exists():
        return []
    return [orjson.loads(line) for line in record.read_bytes().splitlines() if line]


def main() -> None:
    record = Path(os.environ["CLAW_FIDELITY_RECORD"])
    upstream.main(sys.argv[1:], wrap=lambda app: with_record(app, record))


if __name__ == "__main__":
    main()
