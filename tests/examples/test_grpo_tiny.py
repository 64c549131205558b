"""examples/grpo_tiny.py end to end against a real server process (tests/live.py): an agent
submits GRPO groups of steps with rewards, the tiny trainer pulls them in the ``tree`` format,
takes 3 policy-gradient steps (one packed forward each), acks every lease and advances the
policy version by one per step. A batch with null rewards or without rollout logprobs is
refused (exit 2, naming the steps, the lease nacked) unless a flag allows it, and each step
prints the batch's mean reward and the fraction of its groups with reward variance.

Lineage: the trainer trains within a run across a server restart (SIGKILL) and a nacked
batch; every acked step is behind exactly one checkpoint, each checkpoint walks to its steps
and back, the run replays byte for byte (streamed through ASGI) and two checkpoints diff."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

torch = pytest.importorskip("torch")

from claw_client import ClawClient  # noqa: E402
from examples.grpo_tiny import (  # noqa: E402
    BadBatch,
    TinyLM,
    batch_check,
    batch_rewards,
    grpo_advantages,
    main,
    train,
)
from tests.live import LiveServer, live_server  # noqa: E402

pytestmark = pytest.mark.live

KEYS = """
from pool.services.api_keys import api_key_create
for name, scopes in (("agent", ["ingest"]), ("trainer", ["consume", "policy"]), ("admin", ["admin"])):
    print(api_key_create(name=name, scopes=scopes)[1])
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


# --- refusing bad data, and what each step prints ------------------------------------------------
def known_tree() -> dict:
    """The per-row fields of a tree batch: group a varies (1, 0), group b does not (0, 0),
    a groupless row (its own group of one), and a masked row (context: not trained on)."""
    return {
        "uid": ["a0", "a1", "b0", "b1", "solo", "ctx"],
        "prompt_group_uid": ["a", "a", "b", "b", None, "a"],
        "reward": [1.0, 0.0, 0.0, 0.0, 0.5, None],
        "mask": [False, False, False, False, False, True],
        "has_rollout_logprobs": [True, True, True, True, True, False],
    }


def test_the_batch_rewards_of_a_known_batch():
    got = batch_rewards(known_tree())
    # mean of the 5 trained rows: (1 + 0 + 0 + 0 + 0.5) / 5; 1 of 3 groups varies
    assert got == {
        "mean_reward": pytest.approx(0.3),
        "null_rewards": 0,
        "groups_with_variance": pytest.approx(1 / 3),
    }
    # and the masked row's null reward and missing logprobs do not matter: it is not trained on
    batch_check(known_tree())


def test_batch_check_names_the_steps_with_null_rewards_or_no_logprobs():
    tree = known_tree()
    tree["reward"][0] = None  # a0's 1.0
    tree["has_rollout_logprobs"][2] = False
    with pytest.raises(BadBatch) as err:
        batch_check(tree)
    message = str(err.value)
    assert "1 of the 5 steps to train on have a null reward (a0)" in message
    assert "1 of the 5 steps to train on have no rollout logprobs (b0)" in message
    assert "--allow-null-rewards" in message and "--allow-missing-logprobs" in message
    batch_check(tree, allow_null_rewards=True, allow_missing_logprobs=True)
    # with a null allowed it counts 0, as in the advantages: group a no longer varies
    assert batch_rewards(tree) == {
        "mean_reward": pytest.approx(0.5 / 5),
        "null_rewards": 1,
        "groups_with_variance": pytest.approx(0.0),
    }


def seed_source(
    srv: LiveServer, keys: dict[str, str], name: str, steps: list[dict], *, failed=(), **filters
) -> None:
    """``steps`` submitted by a source of their own (and the trajectories ``failed`` ended as
    failed), and a dataset ``name`` of that source's steps only (``filters`` added)."""
    with ClawClient(srv.url, srv.make_key("ingest", name=name)) as agent:
        for group in {s["prompt_group_uid"] for s in steps if s.get("prompt_group_uid")}:
            agent._request("POST", "/groups", json={"uid": group, "expected_rollouts": ROLLOUTS})
        assert agent.submit_steps(steps)["created"] == len(steps)
        for uid in failed:
            agent._request("POST", f"/trajectories/{uid}/complete", json={"status": "failed"})
    with ClawClient(srv.url, keys["admin"]) as admin:
        admin.create_dataset(name, filters={"sources": [name], **filters})


def run(srv, keys, dataset: str, *flags: str, capsys) -> tuple[int, list[str], str]:
    # from the current version: the server refuses a move back (tests/gateway/test_policy_versions.py)
    with ClawClient(srv.url, keys["trainer"]) as claw:
        start = str(max(versions(claw), default=0))
    argv = ["--url", srv.url, "--key", keys["trainer"], "--dataset", dataset, "--steps", "1"]
    argv += ["--start-version", start]
    code = main([*argv, "--batch-size", "2", "--consumer", dataset, *flags])
    out = capsys.readouterr()
    return code, out.out.strip().splitlines(), out.err


def test_a_batch_with_null_rewards_is_refused_then_runs_with_the_flag(server, capsys):
    srv, keys = server
    # given a ready group whose second rollout failed without a reward, in a dataset that
    # admits steps without a final reward (readiness "any")
    steps = rollout("nulls-g", 0, 0, reward=1.0)
    steps += [s | {"reward": None, "is_last": False} for s in rollout("nulls-g", 0, 1, reward=0.0)]
    seed_source(srv, keys, "nulls", steps, failed=["nulls-g-r1"], readiness="any")
    # when the trainer pulls it: refused, exit 2, the steps named, nothing trained
    code, out, err = run(srv, keys, "nulls", capsys=capsys)
    assert code == 2 and out == []
    assert "2 of the 4 steps to train on have a null reward (nulls-g-r1:0, nulls-g-r1:1)" in err
    assert "they would be trained on as reward 0 (--allow-null-rewards accepts that)" in err
    # and the lease was nacked: with the flag the same steps are served, and trained on
    code, out, err = run(srv, keys, "nulls", "--allow-null-rewards", capsys=capsys)
    assert code == 0, err
    (line,) = out
    row = json.loads(line)
    assert row["steps"] == 4 and row["null_rewards"] == 2
    assert row["mean_reward"] == pytest.approx(0.25)  # 0, 1 and two nulls counted 0


def test_a_batch_without_rollout_logprobs_is_refused_then_runs_with_the_flag(server, capsys):
    srv, keys = server
    # given a complete, rewarded group whose steps came without rollout logprobs
    steps = [
        {k: v for k, v in s.items() if k != "rollout_logprobs"}
        for k in range(ROLLOUTS)
        for s in rollout("bare-g", 0, k, reward=float(k))
    ]
    seed_source(srv, keys, "bare", steps)
    # when the trainer pulls it: refused, naming them
    code, out, err = run(srv, keys, "bare", capsys=capsys)
    assert code == 2 and out == []
    uids = "bare-g-r0:0, bare-g-r0:1, bare-g-r1:0, bare-g-r1:1"
    assert f"4 of the 4 steps to train on have no rollout logprobs ({uids})" in err
    assert "--allow-missing-logprobs" in err and "null reward" not in err
    # and with the flag the same batch is trained on
    code, out, err = run(srv, keys, "bare", "--allow-missing-logprobs", capsys=capsys)
    assert code == 0, err
    assert json.loads(out[0])["steps"] == 4


def test_each_step_prints_the_mean_reward_and_the_groups_with_variance(server, capsys):
    srv, keys = server
    # given two complete groups: "vary" rewards its rollouts 1 and 0, "flat" both 0
    steps = [s for k in range(ROLLOUTS) for s in rollout("vary", 0, k, reward=float(k == 0))]
    steps += [s for k in range(ROLLOUTS) for s in rollout("flat", 1, k, reward=0.0)]
    seed_source(srv, keys, "known", steps)
    # when one step trains on both (2 groups per pull)
    code, out, err = run(srv, keys, "known", capsys=capsys)
    assert code == 0, err
    (line,) = out
    row = json.loads(line)
    # then it prints their mean reward (8 steps: one last step rewarded 1, the rest 0) and
    # that one group of two has reward variance
    assert row["steps"] == 8 and row["groups"] == 2
    assert row["mean_reward"] == pytest.approx(1 / 8)
    assert row["groups_with_variance"] == pytest.approx(0.5)
    assert row["null_rewards"] == 0


# --- lineage: the trainer's run, walked, replayed and diffed ------------------------------------------
def test_a_run_across_a_restart_and_a_nack_accounts_for_every_acked_step_once(server, tmp_path):
    srv, keys = server
    # three ready groups of ROLLOUTS x TURNS steps, in a dataset of theirs alone (created
    # after the other tests' groups)
    with ClawClient(srv.url, keys["agent"]) as agent, ClawClient(srv.url, keys["admin"]) as admin:
        since = datetime.now(UTC).isoformat()  # the server shares this machine's clock
        for g in range(GROUPS):
            group = f"lin-g{g}"
            agent._request("POST", "/groups", json={"uid": group, "expected_rollouts": ROLLOUTS})
            agent.submit_steps([s for k in range(ROLLOUTS) for s in rollout(group, g, k, reward=float(k))])
        admin.create_dataset("lin", filters={"created_after": since})
    with ClawClient(srv.url, keys["trainer"]) as claw:
        v = max(versions(claw), default=0)  # the server refuses a move back
        # given a run that trains one step (checkpoint v+1), then a batch it nacks
        first = train(claw, "lin", "lin-c", 1, batch_size=1, log=None, run="lin-run", policy_version=v)
        with pytest.raises(RuntimeError), claw.pull("lin", consumer="lin-c", batch_size=1) as nacked:
            assert nacked
            raise RuntimeError("the trainer died on this batch")
        # when the server is killed and restarted, and the trainer continues the run
        srv.restart(kill=True)
        rest = train(claw, "lin", "lin-c", 5, batch_size=1, log=None, run="lin-run", policy_version=v + 1)
        # then it trained on the two other groups (the nacked one came back) and stopped
        stats = first + rest
        assert [s["policy_version"] for s in stats] == [v + 1, v + 2, v + 3]
        assert [s["checkpoint_leases"] for s in stats] == [1, 1, 1]
        assert {s["run"] for s in stats} == {"lin-run"}
        acked = {
            s["lease_id"]: json.loads(claw.replay(s["lease_id"]))["manifest"]["step_uids"] for s in stats
        }
        assert nacked.lease_id not in acked
        # every acked step is behind exactly one checkpoint, in the order it was served
        run = claw.run("lin-run")
        assert run.refresh()["unclaimed_leases"] == 0
        cps = run.checkpoints()
        assert [(c["version"], c["leases"], c["steps"]) for c in cps] == [
            (v + k, 1, ROLLOUTS * TURNS) for k in (1, 2, 3)
        ]
        behind = {c["version"]: run.step_uids(c["version"]) for c in cps}
        assert [behind[s["policy_version"]] for s in stats] == [acked[s["lease_id"]] for s in stats]
        counted = Counter(uid for uids in behind.values() for uid in uids)
        assert set(counted.values()) == {1} and len(counted) == 3 * ROLLOUTS * TURNS
        # and each step walks back to its checkpoint
        for version, uids in behind.items():
            for uid in uids[:2]:
                assert [(c["run"], c["version"]) for c in claw.step_checkpoints(uid)] == [
                    ("lin-run", version)
                ]
        detail = run.checkpoint(v + 2)
        assert detail["leases"] == [stats[1]["lease_id"]] and detail["trajectories"] == ROLLOUTS
        # the run replays byte for byte, in order, streamed
        replayed = list(run.replay())
        assert [(b.checkpoint, b.lease_id) for b in replayed] == [
            (s["policy_version"], s["lease_id"]) for s in stats
        ]
        assert [b.raw for b in replayed] == [claw.replay(s["lease_id"]) for s in stats]
        assert all(b.removed_steps == [] for b in replayed)
        path = run.download(str(tmp_path / "run.jsonl"))
        lines = open(path, "rb").read().splitlines()
        assert json.loads(lines[0])["checkpoints"] == 3 and [
            ln for ln in lines if ln.startswith(b'{"lease_id"')
        ] == [b.raw for b in replayed]
        # and two checkpoints' data differ by whole groups
        diff = run.diff(v + 1, v + 2)
        assert diff["counts"]["added"] == diff["counts"]["removed"] == ROLLOUTS * TURNS
        assert diff["counts"]["common"] == 0
        assert sorted(diff["added"]) == sorted(behind[v + 2])
        assert sorted(diff["removed"]) == sorted(behind[v + 1])
