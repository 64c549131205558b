"""examples/grpo_tiny.py end to end against a real server process (tests/live.py): an agent
submits GRPO groups of steps with rewards, the tiny trainer pulls them in the ``tree`` format,
takes 3 policy-gradient steps (one packed forward each), acks every lease and advances the
policy version by one per step."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from claw_client import ClawClient  # noqa: E402
from examples.grpo_tiny import TinyLM, grpo_advantages, main, train  # noqa: E402
from tests.live import LiveServer, live_server  # noqa: E402

pytestmark = pytest.mark.live

KEYS = """
from pool.services import api_key_create
for name, scope in (("agent", "ingest"), ("trainer", "consume"), ("admin", "admin")):
    print(api_key_create(name=name, scopes=[scope])[1])
"""

GROUPS = 3
ROLLOUTS = 2
TURNS = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    with live_server(tmp_path_factory.mktemp("srv")) as srv:
        agent, trainer, admin = srv.manage("shell", "-c", KEYS).strip().splitlines()[-3:]
        yield srv, {"agent": agent, "trainer": trainer, "admin": admin}


def rollout(group: str, g: int, k: int, reward: float) -> list[dict]:
    """A TURNS-step rollout; rollouts of a group share the prompt, each turn extends it."""
    prompt = [100 + g, 1, 2, 3, 4]
    steps = []
    for t in range(TURNS):
        response = [20 + 7 * k + t, 30 + g, 40 + k]
        last = t == TURNS - 1
        steps.append(
            {
                "trajectory_uid": f"{group}-r{k}",
                "prompt_group_uid": group,
                "step_index": t,
                "prompt_ids": prompt,
                "response_ids": response,
                "rollout_logprobs": [-4.0, -4.2, -4.1],
                "reward": reward if last else 0.0,
                "is_last": last,
                "policy_version": 0,
            }
        )
        prompt = [*prompt, *response, 9]
    return steps


def seed_groups(srv: LiveServer, keys: dict[str, str], dataset: str) -> None:
    with ClawClient(srv.url, keys["agent"]) as agent, ClawClient(srv.url, keys["admin"]) as admin:
        for g in range(GROUPS):
            group = f"{dataset}-g{g}"
            agent._request("POST", "/groups", json={"uid": group, "expected_rollouts": ROLLOUTS})
            steps = [s for k in range(ROLLOUTS) for s in rollout(group, g, k, reward=float(k == g % 2))]
            assert agent.submit_steps(steps)["created"] == ROLLOUTS * TURNS
        admin.create_dataset(dataset)


def versions(claw: ClawClient) -> list[int]:
    return [v["version"] for v in claw._json("GET", "/policy-versions")]


def test_grpo_advantages_are_group_normalised_and_masked():
    adv = grpo_advantages([1.0, 0.0, 0.5, None, 3.0], ["a", "a", "b", "b", "c"], [False] * 4 + [True])
    assert adv[0] == pytest.approx(1.0, abs=1e-4) and adv[1] == pytest.approx(-1.0, abs=1e-4)
    assert adv[2] == pytest.approx(1.0, abs=1e-4) and adv[3] == pytest.approx(-1.0, abs=1e-4)
    assert adv[4] == 0.0  # masked


def test_three_grpo_steps_consume_ack_and_advance_the_policy(server):
    srv, keys = server
    seed_groups(srv, keys, "grpo")
    torch.manual_seed(0)
    model = TinyLM()
    before = [p.detach().clone() for p in model.parameters()]
    with ClawClient(srv.url, keys["trainer"]) as trainer:
        start = max(versions(trainer), default=0)
        lines: list[str] = []
        stats = train(
            trainer, "grpo", "grpo-tiny", 3, batch_size=1, model=model, policy_version=start, log=lines.append
        )

        # each step consumed one whole group under a lease, from one packed forward
        assert len(stats) == len(lines) == 3
        assert len({s["lease_id"] for s in stats}) == 3
        for s in stats:
            assert s["steps"] == ROLLOUTS * TURNS and s["groups"] == 1
            assert s["unique_tokens"] < s["total_tokens"]  # shared prompts packed once
            assert math.isfinite(s["loss"]) and s["response_tokens"] == ROLLOUTS * TURNS * 3
        # every lease was acked: nothing is left for this consumer (no redelivery)
        with trainer.pull("grpo", consumer="grpo-tiny", format="tree", wait=0) as rest:
            assert not rest
        # the parameters moved
        assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
        # and the policy version advanced by one per step
        assert max(versions(trainer)) == start + 3
        assert [s["policy_version"] for s in stats] == [start + 1, start + 2, start + 3]


def test_main_runs_against_the_server(server, capsys):
    srv, keys = server
    seed_groups(srv, keys, "grpo-cli")
    argv = ["--url", srv.url, "--key", keys["trainer"], "--dataset", "grpo-cli", "--steps", "2"]
    argv += ["--batch-size", "1", "--consumer", "cli", "--start-version", "100"]
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and '"policy_version": 102' in out[-1]
