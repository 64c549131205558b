"""Gateway fixtures: demo upstream processes (real HTTP servers answering like vLLM), with
the test hooks of tests/gateway/upstream_harness.py."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.live import ROOT, listening_socket, stop_process


def start_upstream(
    *args: str, module: str = "tests.gateway.upstream_harness", env: dict[str, str] | None = None
) -> tuple[str, subprocess.Popen]:
    """Start an upstream server ``module`` (default: the demo upstream with the test hooks of
    tests/gateway/upstream_harness.py) with ``args`` on a socket listening on a free port;
    return ("http://127.0.0.1:PORT/v1", process) once GET /v1/models answers. The caller
    terminates it (tests.live.stop_process)."""
    # A file, not a pipe: a pipe nobody reads would block the server once its buffer fills.
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the process
    with listening_socket() as sock:  # the child keeps its own copy; the port dies with it
        port = sock.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--fd", str(sock.fileno()), *args],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(sock.fileno(),),
        )
    proc.stderr = log  # type: ignore[assignment] - kept so failures can show the output
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{module} exited early: {log.read().decode(errors='replace')}")
        try:
            if httpx.get(f"{base}/models", timeout=1).status_code == 200:
                return base, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    stop_process(proc)
    raise RuntimeError(f"{module} did not answer GET /v1/models within 30 s")


def _upstream(*args: str) -> Iterator[str]:
    base, proc = start_upstream(*args)
    try:
        yield base
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def demo_upstream() -> Iterator[str]:
    """The demo upstream with vLLM token-id fields; yields its base URL ending in /v1."""
    yield from _upstream()


@pytest.fixture(scope="session")
def idless_upstream() -> Iterator[str]:
    """The demo upstream with --no-token-ids: a plain OpenAI server without token ids."""
    yield from _upstream("--no-token-ids")


@pytest.fixture(scope="session")
def slow_upstream() -> Iterator[str]:
    """The demo upstream adding 300 ms to every request."""
    yield from _upstream("--latency-ms", "300")
