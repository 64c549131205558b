"""The demo upstream with a request log: every completion request it receives (the path and
the JSON body, as the gateway sent it) is appended as one line to the file named by
CLAW_FIDELITY_RECORD, before it is answered. So a test knows exactly what the upstream saw for
each call an agent made through the gateway, and can ask the upstream again, directly, for
the token ids and logprobs it computes for that request (its answer is a pure function of
it: claw_site/demo/upstream.py).

A request with the header ``x-fidelity-direct`` (the test's own direct calls) is not logged.

``python -m tests.fidelity.recording_upstream --fd N [demo upstream options]``
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from claw_site.demo import upstream
from tests.gateway.conftest import start_upstream

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
    return start_upstream(
        module="tests.fidelity.recording_upstream", env={"CLAW_FIDELITY_RECORD": str(record)}
    )


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
