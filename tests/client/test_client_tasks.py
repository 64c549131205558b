"""ClawClient.register_tasks / sample_tasks / list_tasks against a real server process: a
rollout driver registers a set, samples, rolls out, rewards, and the statistics come back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from claw_client import ClawClient, ClawError
from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[LiveServer, str]]:
    with live_server(tmp_path_factory.mktemp("srv")) as srv:
        yield srv, srv.make_key("ingest", name="driver")


def test_a_driver_registers_samples_rolls_out_and_reads_the_statistics(server):
    srv, key = server
    with ClawClient(srv.url, key) as claw:
        # given a registered set of four tasks
        tasks = [{"uid": f"q{i}", "prompt": f"question {i}", "ground_truth": str(i)} for i in range(4)]
        assert claw.register_tasks(tasks, set="train")["created"] == 4
        assert claw.register_tasks(tasks, set="train")["unchanged"] == 4
        # when two are sampled and each rolled out as a group of two rewarded rollouts
        picked = claw.sample_tasks(2, strategy="uniform", tasks={"set": "train"}, seed=3)
        assert len({t["uid"] for t in picked}) == 2
        assert claw.last_task_sample is not None and claw.last_task_sample["seed"] == 3
        by_uid = {t["uid"]: t for t in tasks}
        for t in picked:
            assert (t["prompt"], t["ground_truth"]) == (
                by_uid[t["uid"]]["prompt"],
                by_uid[t["uid"]]["ground_truth"],
            )
            claw.open_group(f"g-{t['uid']}", expected_rollouts=2, task=t["uid"])
            claw.submit_steps(
                [
                    {
                        "trajectory_uid": f"{t['uid']}-{r}",
                        "prompt_group_uid": f"g-{t['uid']}",
                        "step_index": 0,
                        "prompt_ids": [1, 2, 3],
                        "response_ids": [4 + r],
                        "is_last": True,
                        "reward": float(r),
                    }
                    for r in range(2)
                ]
            )
        # then their statistics say one pass in two, an informative group each
        listed = {t["uid"]: t["stats"] for t in claw.list_tasks(set="train", sort="uid")}
        assert sorted(listed) == ["q0", "q1", "q2", "q3"]
        for t in picked:
            s = listed[t["uid"]]
            assert (s["seen"], s["rewarded"], s["passes"], s["informative_groups"]) == (1, 2, 1, 1)
            assert s["mean_reward"] == 0.5 and s["reward_variance"] == 0.25
        # and the seen ones are no longer the least seen
        rest = claw.sample_tasks(2, strategy="least_seen", tasks={"set": "train"})
        assert {t["uid"] for t in rest} == set(listed) - {t["uid"] for t in picked}
        # and a bad strategy is a ClawError naming the field
        with pytest.raises(ClawError) as e:
            claw.sample_tasks(2, strategy="best")
        assert e.value.status == 400 and e.value.param == "strategy"
