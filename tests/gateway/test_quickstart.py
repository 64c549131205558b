"""The README's quickstart runs as written: its key command, its agent (the official openai
SDK through the gateway, the group declared with expected_rollouts), its dataset curl and its
trainer (claw_client) pull, in that order, against a live server before the demo upstream.

Each snippet is taken from README.md as it is, so a changed quickstart is the one tested.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.live import ROOT, LiveServer

pytestmark = pytest.mark.live

README = ROOT / "README.md"


def blocks(lang: str) -> list[str]:
    """The README's fenced ``lang`` blocks, in order."""
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def run(args: list[str], env: dict[str, str]) -> str:
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{args[:3]} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _dicts(value):
    """Every dict in a JSON value, nested ones included."""
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from _dicts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _dicts(v)


def test_the_quickstart_snippets_parse():
    # given the README's python and sh blocks
    python, sh = blocks("python"), blocks("sh")
    # then there is an agent and a trainer snippet, both valid Python
    assert len(python) == 2, python
    for code in python:
        compile(code, "README.md", "exec")
    # and the agent declares its group with expected_rollouts before its calls
    agent = python[0]
    assert agent.index('"/groups"') < agent.index("chat.completions.create")
    assert "expected_rollouts" in agent
    # and the agent's key is an ingest key alone: it reads back its own source's rows only
    # (pool/tenancy.py); "read" would read every source's
    (key_line,) = [line for code in sh for line in code.splitlines() if line.startswith("export AGENT_KEY=")]
    assert re.findall(r"--scope ([a-z]+)", key_line) == ["ingest"], key_line
    # and every sh block is valid bash
    for code in sh:
        run(["bash", "-n", "-c", code], {})
    # and the server's address is defined once (CLAW_URL, following PORT) and every command
    # and snippet uses it: none names the default port itself
    (defined,) = [line for code in sh for line in code.splitlines() if line.startswith("export CLAW_URL=")]
    assert "${PORT:-8000}" in defined
    for code in [*python, *sh]:
        assert "127.0.0.1:8000" not in code.replace(defined, ""), code
    assert all('os.environ["CLAW_URL"]' in code for code in python)


def test_the_quickstart_leads_from_an_agents_calls_to_a_pulled_batch(tmp_path: Path, demo_upstream: str):
    # given a server before the demo upstream, with the admin and trainer keys make run keeps
    server = LiveServer(tmp_path, {"CLAW_UPSTREAM_URL": demo_upstream})
    try:
        server.start()
        env = {
            **server.env,
            "CLAW_URL": server.url,
            "ADMIN_KEY": server.make_key("admin"),
            "TRAINER_KEY": server.make_key("consume", "policy", "read"),
        }
        # when the quickstart's key command runs as written (its .venv is this interpreter)
        key_line = next(
            line
            for code in blocks("sh")
            for line in code.splitlines()
            if line.startswith("export AGENT_KEY=")
        )
        command = re.fullmatch(r"export AGENT_KEY=\$\((.*)\)", key_line).group(1)
        agent_key = run(["bash", "-c", command.replace(".venv/bin/python", sys.executable)], env).strip()
        env["AGENT_KEY"] = agent_key.splitlines()[-1]
        # and the agent snippet
        agent, trainer = blocks("python")
        out = run([sys.executable, "-c", agent], env)
        group = re.search(r"^group (\S+)$", out, re.M).group(1)
        trajectories = {f"{group}-r0", f"{group}-r1"}
        # then each rollout got the demo model's answer and is stored as a ready step
        answered = dict(line.split(" ", 1) for line in out.splitlines() if not line.startswith("group "))
        assert set(answered) == trajectories and all(answered.values()), out
        auth = {"Authorization": f"Bearer {env['ADMIN_KEY']}"}
        stored = httpx.get(
            f"{server.url}/api/v1/steps", params={"prompt_group_uid": group}, headers=auth
        ).json()["results"]
        assert {s["trajectory_uid"] for s in stored} == trajectories
        assert all(s["ready"] and s["token_source"] == "upstream" for s in stored), stored
        # when the dataset curl runs as written
        (curl,) = [code for code in blocks("sh") if "/api/v1/datasets" in code]
        created = run(["bash", "-c", curl], env)
        assert '"name":"quickstart"' in created.replace(" ", ""), created
        # and the trainer snippet
        pulled = run([sys.executable, "-c", trainer], env)
        # then it printed the group's two steps: trajectory, reward and response tokens, as stored
        rows = [line.split() for line in pulled.splitlines()]
        want = {
            s["trajectory_uid"]: (s["reward"], len(s["response_ids"]))
            for s in (httpx.get(f"{server.url}/api/v1/steps/{s['uid']}", headers=auth).json() for s in stored)
        }
        got = {r[0]: (float(r[1]), int(r[2])) for r in rows}
        assert got == want, (pulled, want)
        assert want == {
            f"{group}-r0": (0.0, want[f"{group}-r0"][1]),
            f"{group}-r1": (1.0, want[f"{group}-r1"][1]),
        }
        # and the lease was acked: the consumer holds one acked lease and the group is not offered again
        status = httpx.get(f"{server.url}/api/v1/consumers/my-trainer", headers=auth).json()
        leases = [d["leases"] for d in _dicts(status) if "leases" in d]
        assert len(leases) == 1 and leases[0]["acked"] == 1 and sum(leases[0].values()) == 1, status
        again = httpx.post(
            f"{server.url}/api/v1/consumers/my-trainer/pull",
            headers={"Authorization": f"Bearer {env['TRAINER_KEY']}"},
            json={"dataset": "quickstart", "batch_size": 1},
        )
        assert again.status_code == 200 and again.json().get("lease_id") is None, again.text
    finally:
        server.close()
