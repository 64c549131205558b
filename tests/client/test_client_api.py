"""ClawClient against a real server process (tests/live.py): an agent writes steps and ends
trajectories, a trainer pulls under leases (ack on success, nack on failure), replays byte
for byte, and gets the server's errors as ClawError."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from claw_client import Batch, ClawClient, ClawError, collate_steps
from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live

KEYS = """
from pool.services.api_keys import api_key_create
for name, scopes in (("agent", ["ingest"]), ("trainer", ["consume", "policy"]), ("admin", ["admin"])):
    print(api_key_create(name=name, scopes=scopes)[1])
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    var_dir = tmp_path_factory.mktemp("srv")
    with live_server(var_dir) as srv:
        # One Django start for the three keys (each manage.py call costs a second or two).
        agent, trainer, admin = srv.manage("shell", "-c", KEYS).strip().splitlines()[-3:]
        yield srv, {"agent": agent, "trainer": trainer, "admin": admin}


def steps_of(uid: str, n: int = 2) -> list[dict]:
    prompt = [1, 2, 3]
    out = []
    for i in range(n):
        out.append(
            {
                "trajectory_uid": uid,
                "step_index": i,
                "prompt_ids": prompt,
                "response_ids": [10 + i, 11 + i],
                "rollout_logprobs": [-0.5, -0.25],
                "is_last": i == n - 1,
            }
        )
        prompt = [*prompt, 10 + i, 11 + i, 7]
    return out


def test_agent_writes_and_trainer_pulls_acks_nacks_and_replays(server):
    """README: "The client (claw_client.ClawClient(url, key), httpx, no Django): agents call
    submit_steps (msgpack=True for packed arrays), open_trajectory,
    complete_trajectory/complete_trajectories, rewards, event, feedback;
    trainers set_policy_version (the policy scope)."
    README: "Trainers write with claw.pull("grpo-main", consumer="ppo", batch_size=8) as
    batch:, which acks when the block ends and nacks if it raises (the same units come
    back)."
    README: "batch.steps gives ids and logprobs as numpy arrays, batch.raw the exact bytes;
    claw.replay(lease_id) returns them again; claw.batches(...) keeps pulling." """
    srv, keys = server
    with (
        ClawClient(srv.url, keys["agent"]) as agent,
        ClawClient(srv.url, keys["trainer"]) as trainer,
        ClawClient(srv.url, keys["admin"]) as admin,
    ):
        # given an agent that opened three trajectories, submitted their steps (JSON and
        # MessagePack) and ended them with rewards, one by one and in a batch
        opened = agent.open_trajectory("c-t0", metadata={"task": "x"})
        assert opened["uid"] == "c-t0" and opened["base_url"]
        assert agent.submit_steps(steps_of("c-t0"))["created"] == 2
        assert agent.submit_steps(steps_of("c-t1") + steps_of("c-t2"), msgpack=True)["created"] == 4
        assert agent.submit_steps(steps_of("c-t0"))["duplicates"] == 2  # idempotent by uid
        assert agent.rewards([{"step_uid": "c-t0:0", "reward": 0.5}]) == {"applied": 1, "received": 1}
        assert agent.complete_trajectory("c-t0", reward=1.0)["status"] == "completed"
        assert (
            agent.complete_trajectories(
                [{"uid": "c-t1", "reward": 0.0}, {"uid": "c-t2", "reward": 0.5, "status": "completed"}]
            )
            == 2
        )
        assert agent.event("tool_call", trajectory_uid="c-t0", payload={"tool": "grep"})["recorded"] == 1
        assert agent.feedback(trajectory_uid="c-t0", rating=1.0, label="good")["id"]
        # and the trainer, not the agent, publishes the policy version it trains (the policy scope)
        with pytest.raises(ClawError, match="403"):
            agent.set_policy_version(3)
        assert trainer.set_policy_version(3)["version"] == 3
        # and a dataset made with an admin key
        assert admin.create_dataset("c-all")["version"] == 1

        # when the trainer pulls one trajectory and its block ends normally
        with trainer.pull("c-all", consumer="c1", batch_size=1) as batch:
            assert isinstance(batch, Batch) and batch
            first = batch.manifest["step_uids"]
            assert [s["uid"] for s in batch.batch["steps"]] == first
            step = batch.steps[0]
            assert step["prompt_ids"].dtype == np.int32 and step["response_ids"].tolist() == [10, 11]
            assert step["rollout_logprobs"].tolist() == [-0.5, -0.25]
            assert step["rollout_logprobs"].dtype == np.float64
            # c-t0: step 0 keeps its own late reward, a process reward of that step alone;
            # step 1, its branch's final step, is served the outcome: the trajectory's 1.0
            # (issue 18: a process reward no longer overrides the outcome for other steps)
            assert [
                (s["uid"], s["reward"], s["reward_scope"], s["outcome_reward"], s["process_reward"])
                for s in batch.steps
            ] == [
                ("c-t0:0", 0.5, "step", 1.0, 0.5),
                ("c-t0:1", 1.0, "trajectory", 1.0, None),
            ]
            assert isinstance(batch.batch["steps"][0]["prompt_ids"], list)  # the JSON as served
        # then it was acked: the next pull gets another trajectory
        with trainer.pull("c-all", consumer="c1", batch_size=1) as second:
            assert set(second.manifest["step_uids"]).isdisjoint(first)
        assert trainer.replay(batch.lease_id) == batch.raw  # byte-identical, after ack too
        assert trainer.replay_batch(batch.lease_id).manifest == batch.manifest

        # when a block raises, the batch is nacked and the same units come again
        with pytest.raises(RuntimeError, match="train step failed"):
            with trainer.pull("c-all", consumer="c1", batch_size=1) as failing:
                third = failing.manifest["step_uids"]
                raise RuntimeError("train step failed")
        assert set(third).isdisjoint(first + second.manifest["step_uids"])
        again = trainer.pull("c-all", consumer="c1", batch_size=1)
        assert again.manifest["step_uids"] == third
        assert trainer.ack(again.lease_id)["status"] == "acked"

        # then everything is consumed: an empty, falsy batch whose block does nothing
        with trainer.pull("c-all", consumer="c1") as empty:
            assert not empty and empty.lease_id is None and empty.steps == [] and len(empty) == 0
        # and another consumer iterates over all of it again
        seen = []
        for b in trainer.batches("c-all", consumer="c2", batch_size=2):
            with b:
                seen += b.manifest["step_uids"]
        assert sorted(seen) == sorted(first + second.manifest["step_uids"] + third)

        # collate: left-padded prompts, right-padded responses
        t = collate_steps(batch)
        assert t["input_ids"].shape[0] == len(first) == t["rewards"].shape[0]
        assert t["response_mask"].all() and t["attention_mask"][:, -1].all()


def test_bad_input_raises_claw_error_with_the_param(server):
    """README: "Errors raise ClawError(status, type, message, param)." """
    srv, keys = server
    with ClawClient(srv.url, keys["trainer"]) as trainer, ClawClient(srv.url, keys["agent"]) as agent:
        with pytest.raises(ClawError) as e:
            trainer.pull("c-none", consumer="c1", batch_size=0)
        assert (e.value.status, e.value.param) == (400, "batch_size")
        assert e.value.type == "invalid_request_error" and "batch_size" in e.value.message
        with pytest.raises(ClawError) as e:
            trainer.pull("c-none", consumer="c1")
        assert (e.value.status, e.value.param) == (404, "dataset")
        with pytest.raises(ClawError) as e:
            agent.submit_steps(
                [{"trajectory_uid": "x", "step_index": -1, "prompt_ids": [1], "response_ids": [2]}]
            )
        assert e.value.status == 400 and "step_index" in (e.value.param or "")
        # a key without the consume scope
        with pytest.raises(ClawError) as e:
            agent.pull("c-none", consumer="c1")
        assert e.value.status == 403


def test_collate_pads_prompts_left_and_responses_right():
    pytest.importorskip("torch")
    steps = [
        {"uid": "a", "prompt_ids": [1, 2, 3], "response_ids": [4], "reward": 1.0, "mask": True},
        {"uid": "b", "prompt_ids": [5], "response_ids": [6, 7, 8], "rollout_logprobs": [-1, -2, -3]},
    ]
    t = collate_steps({"steps": steps}, pad_id=0)
    assert t["prompts"].tolist() == [[1, 2, 3], [0, 0, 5]]
    assert t["responses"].tolist() == [[4, 0, 0], [6, 7, 8]]
    assert t["input_ids"].tolist() == [[1, 2, 3, 4, 0, 0], [0, 0, 5, 6, 7, 8]]
    assert t["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 3, 3, 3], [0, 0, 0, 1, 2, 3]]
    # a masked step ("mask": true: served only to keep its group whole) trains no token
    assert t["response_mask"].tolist() == [[0, 0, 0], [1, 1, 1]]
    assert t["rollout_logprobs"].tolist() == [[0, 0, 0], [-1, -2, -3]]
    assert t["rewards"].tolist() == [1.0, 0.0] and t["has_reward"].tolist() == [True, False]
    assert t["step_uids"] == ["a", "b"] and t["step_mask"].tolist() == [False, True]


CRASHING_TRAINER = """
import os, signal, sys
from claw_client import ClawClient

url, key = sys.argv[1], sys.argv[2]
with ClawClient(url, key) as claw:
    with claw.pull("crash-ds", consumer="crashy", batch_size=1, lease_seconds=2) as batch:
        print(batch.lease_id, " ".join(batch.manifest["step_uids"]), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # dies mid-batch: no ack, no nack
"""


def test_a_trainer_that_crashes_mid_batch_gets_its_batch_redelivered(server):
    import subprocess
    import sys
    from datetime import UTC, datetime

    srv, keys = server
    # The dataset admits this test's trajectory only: with other ready units in the module's
    # pool, the pull below would be served one of them at once instead of waiting for the
    # crashed lease to expire.
    since = datetime.now(UTC).isoformat()
    with ClawClient(srv.url, keys["agent"]) as agent, ClawClient(srv.url, keys["admin"]) as admin:
        agent.submit_steps(steps_of("crash-t0"))
        agent.complete_trajectory("crash-t0", reward=1.0)
        admin.create_dataset("crash-ds", filters={"created_after": since})
    # given a trainer process killed while it held a leased batch
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_TRAINER, srv.url, keys["trainer"]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr
    lease_id, uids = proc.stdout.split(" ", 1)
    with ClawClient(srv.url, keys["trainer"]) as trainer:
        # then its units are nobody else's while the lease runs, and once it expires the
        # next pull of that consumer (long-polling until then) gets the same batch
        with trainer.pull("crash-ds", consumer="crashy", batch_size=1, wait=20) as batch:
            assert batch, "the crashed batch was not redelivered"
            assert batch.lease_id != lease_id
            assert batch.manifest["step_uids"] == uids.split()
        # acked now: consumed for good, and the dead lease can no longer be acked
        assert not trainer.pull("crash-ds", consumer="crashy")
        with pytest.raises(ClawError) as err:
            trainer.ack(lease_id)
        assert err.value.status == 409


# --- every format through the client ------------------------------------------------------------
# Posted once for the table below: a prompt group of two rollouts (a two-step one, and one
# without logprobs whose prompt and response hold token id 0, the pad id) and a trajectory of
# its own. Each step gets its own reward, so every format serves exactly what was posted.
FORMAT_STEPS = [
    {"trajectory_uid": "fmt-a", "step_index": 0, "prompt_ids": [1, 2, 3], "response_ids": [4, 5]},
    {"trajectory_uid": "fmt-a", "step_index": 1, "prompt_ids": [1, 2, 3, 4, 5, 6], "response_ids": [7]},
    {"trajectory_uid": "fmt-b", "step_index": 0, "prompt_ids": [1, 2, 0], "response_ids": [0, 9, 8]},
    {"trajectory_uid": "fmt-c", "step_index": 0, "prompt_ids": [11], "response_ids": [12, 13]},
]
FORMAT_LOGPROBS = {"fmt-a:0": [-0.5, -0.25], "fmt-a:1": [-0.125], "fmt-b:0": None, "fmt-c:0": [-1.5, -2.0]}
FORMAT_REWARDS = {"fmt-a:0": 0.25, "fmt-a:1": 1.0, "fmt-b:0": 0.0, "fmt-c:0": 0.75}
FORMAT_GROUPS = {"fmt-a": "fmt-g", "fmt-b": "fmt-g", "fmt-c": None}


@pytest.fixture(scope="module")
def formats_dataset(server) -> str:
    """A dataset that admits the steps above only (their channel, posted after now)."""
    from datetime import UTC, datetime

    srv, keys = server
    since = datetime.now(UTC).isoformat()
    with ClawClient(srv.url, keys["agent"]) as agent, ClawClient(srv.url, keys["admin"]) as admin:
        agent.open_group("fmt-g", expected_rollouts=2)
        for traj, group in FORMAT_GROUPS.items():
            agent.open_trajectory(traj, prompt_group_uid=group, channel="val")
        steps = []
        for s in FORMAT_STEPS:
            uid = f"{s['trajectory_uid']}:{s['step_index']}"
            steps.append({**s, "uid": uid, "rollout_logprobs": FORMAT_LOGPROBS[uid]})
        assert agent.submit_steps(steps)["created"] == len(steps)
        assert (
            agent.rewards([{"step_uid": u, "reward": r} for u, r in FORMAT_REWARDS.items()])["applied"] == 4
        )
        assert agent.complete_trajectories([{"uid": t} for t in FORMAT_GROUPS]) == 3
        admin.create_dataset("fmt-all", filters={"channel": "val", "created_after": since})
    return "fmt-all"


@pytest.mark.parametrize("fmt", ["steps", "padded", "tree"])
def test_every_format_pulls_under_a_lease_with_its_steps_len_and_repr(server, formats_dataset, fmt):
    """README: "A Batch reads every format (batch.format): len(batch) is its number of steps
    and its repr names the format; batch.steps, and iterating over the batch, give one dict
    per step, in batch order, in every format (claw_client.formats): a padded row is cut back
    to its real tokens by its attention_mask (never by the pad id, which a real token may
    equal), and a tree step is read back from the packed layout (from its last_index along
    parent to a root, split by prompt_lens; its logprobs are its response_offsets slice)."
    README: "A padded or tree step has the fields of the per-row lists, with prompt_ids,
    response_ids and rollout_logprobs (None for a step stored without); a step's other fields
    (metadata, token_source, ...) come in the steps format only."

    Each format inside `with claw.pull(...)`, whose block then acks the lease."""
    srv, keys = server
    consumer = f"fmt-{fmt}"
    with ClawClient(srv.url, keys["trainer"]) as trainer:
        # when a trainer pulls everything in fmt and reads it inside the with block
        with trainer.pull(formats_dataset, consumer=consumer, format=fmt) as batch:
            assert batch.format == fmt
            assert len(batch) == len(FORMAT_STEPS) == len(batch.steps)
            assert repr(batch) == f"Batch(lease_id={batch.lease_id!r}, format={fmt!r}, steps=4)"
            steps = {s["uid"]: s for s in batch}
        # then the block acked its lease: the consumer's one lease is acked
        status = trainer.http.get(f"/consumers/{consumer}").json()
        (entry,) = status["datasets"]
        assert entry["leases"] == {"leased": 0, "acked": 1, "released": 0, "expired": 0}
    # and every step is what was posted, field by field
    assert [s["uid"] for s in batch.steps] == batch.manifest["step_uids"]
    assert sorted(steps) == sorted(FORMAT_LOGPROBS)
    for posted in FORMAT_STEPS:
        uid = f"{posted['trajectory_uid']}:{posted['step_index']}"
        got = steps[uid]
        assert (got["trajectory_uid"], got["step_index"]) == (posted["trajectory_uid"], posted["step_index"])
        assert got["prompt_group_uid"] == FORMAT_GROUPS[posted["trajectory_uid"]]
        assert got["prompt_ids"].dtype == np.int32 and got["response_ids"].dtype == np.int32
        assert got["prompt_ids"].tolist() == posted["prompt_ids"], (fmt, uid)
        assert got["response_ids"].tolist() == posted["response_ids"], (fmt, uid)
        if FORMAT_LOGPROBS[uid] is None:
            assert got["rollout_logprobs"] is None, (fmt, uid)
        else:
            assert got["rollout_logprobs"].dtype == np.float64
            assert got["rollout_logprobs"].tolist() == FORMAT_LOGPROBS[uid], (fmt, uid)
        assert (got["reward"], got["reward_scope"]) == (FORMAT_REWARDS[uid], "step"), (fmt, uid)
        assert got["mask"] is False
        if fmt != "steps":
            assert "metadata" not in got and "token_source" not in got
