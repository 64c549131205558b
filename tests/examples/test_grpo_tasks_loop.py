"""The example trainer runs the whole loop against a live server: sample tasks, roll them out
with the policy (white-box, exact logprobs), reward them, pull, train, bump the policy version;
the tasks' statistics and the sampler's records show every round."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from claw_client import ClawClient  # noqa: E402
from examples.grpo_tiny import TinyLM, rollout_tasks, train  # noqa: E402
from tests.examples.test_grpo_tiny import KEYS  # noqa: E402
from tests.live import LiveServer, live_server  # noqa: E402

pytestmark = pytest.mark.live

TASKS = [{"uid": f"tok-{i}", "prompt": [5, 6, i], "ground_truth": i} for i in range(6)]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    with live_server(tmp_path_factory.mktemp("srv")) as srv:
        agent, trainer, admin = srv.manage("shell", "-c", KEYS).strip().splitlines()[-3:]
        yield srv, {"agent": agent, "trainer": trainer, "admin": admin}


def test_sample_roll_out_pull_train_and_bump_the_version(server):
    srv, keys = server
    with (
        ClawClient(srv.url, keys["agent"]) as agent,
        ClawClient(srv.url, keys["trainer"]) as trainer,
        ClawClient(srv.url, keys["admin"]) as admin,
    ):
        # given a registered task set and a dataset of every ready step
        assert agent.register_tasks(TASKS, set="tokens")["created"] == 6
        admin.create_dataset("loop")
        torch.manual_seed(0)
        model = TinyLM()
        seen_versions = []

        def rollout(m, version):
            seen_versions.append(version)
            rollout_tasks(agent, m, version, task_set="tokens", groups=2, rollouts=4)

        # when three rounds of the loop run
        stats = train(
            trainer, "loop", "loop-trainer", 3, batch_size=2, model=model, rollout=rollout, log=None
        )
        # then each round rolled out two groups with the policy of its version and trained on them
        assert seen_versions == [0, 1, 2]
        assert [s["groups"] for s in stats] == [2, 2, 2]
        assert [s["policy_version"] for s in stats] == [1, 2, 3]
        current = [
            v for v in trainer._json("GET", "/policy-versions") if v.get("is_current") or v.get("current")
        ]
        assert [v["version"] for v in current] == [3]
        # and the tasks' statistics hold the six groups, 24 rewarded rollouts
        tasks = agent.list_tasks(set="tokens")
        assert sum(t["stats"]["seen"] for t in tasks) == 6
        assert sum(t["stats"]["rewarded"] for t in tasks) == 24
        assert {t["stats"]["last_policy_version"] for t in tasks if t["stats"]["seen"]} <= {0, 1, 2}
        # and every sampler answer is recorded
        records = agent._json("GET", "/task-sampler/records")["results"]
        assert [r["strategy"] for r in records] == ["informative"] * 3
