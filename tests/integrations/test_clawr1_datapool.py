"""Claw-R1's trainer side on the server: ``claw_client.integrations.clawr1.DataPool`` registered
under the Ray actor name Claw-R1's trainers look up (``data_pool``) and driven with Claw-R1's
own calls (``submit_steps``, ``complete_trajectory``, ``ray.get(pool.fetch_batch.remote(
batch_size=...))``, ``get_statistics``, ``shutdown``) against a real server process
(tests/live.py; PostgreSQL in CI's second pass), Ray started locally with one CPU.

Claw-R1's own ``VerlBackend``, ``DataPool`` and advantage code are not kept in this repository
(its code is not committed here): the comparison with them runs when ``CLAW_R1_SRC`` names a
Claw-R1 checkout (the directory holding ``claw_r1/``), and is skipped otherwise.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pytest.importorskip("verl")

from claw_client import ClawClient  # noqa: E402
from claw_client.integrations.clawr1 import DataPool, Step  # noqa: E402
from tests.live import ROOT, LiveServer, live_server  # noqa: E402

pytestmark = pytest.mark.live

CLAW_R1_SRC = os.environ.get("CLAW_R1_SRC")
KEYS = """
from pool.services.api_keys import api_key_create
for name, scopes in (("pool", ["ingest", "consume"]), ("admin", ["admin"])):
    print(api_key_create(name=name, scopes=scopes)[1])
"""
PROMPT_LENGTH, RESPONSE_LENGTH = 16, 8
ROLLOUTS, TURNS = 2, 2
# (group, rollout) -> the trajectory's outcome reward, given at complete_trajectory.
OUTCOMES = {(0, 0): 1.0, (0, 1): 0.0, (1, 0): 0.25, (1, 1): 0.75}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[LiveServer, dict[str, str]]]:
    with tempfile.TemporaryDirectory() as tmp, live_server(Path(tmp)) as srv:
        pool_key, admin_key = srv.manage("shell", "-c", KEYS).strip().splitlines()[-2:]
        with ClawClient(srv.url, admin_key) as admin:
            for name in ("claw-r1-train", "claw-r1-val"):
                channel = name.rsplit("-", 1)[1]
                admin.create_dataset(
                    name, filters={"channel": channel}, grouping={"reward_assignment": "last_step"}
                )
        yield srv, {"pool": pool_key, "admin": admin_key}


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """Ray on this machine; its workers import this worktree (and Claw-R1, when given)."""
    paths = [str(ROOT), *([CLAW_R1_SRC] if CLAW_R1_SRC else []), os.environ.get("PYTHONPATH", "")]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if CLAW_R1_SRC:
        sys.path.insert(0, CLAW_R1_SRC)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        if CLAW_R1_SRC:
            sys.path.remove(CLAW_R1_SRC)
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def steps_for(prefix: str, step_type=Step) -> list:
    """ROLLOUTS rollouts of TURNS steps per group: rollouts of a group share the prompt, each
    turn extends it; no step carries a reward or is_last (complete_trajectory gives them)."""
    out = []
    for g, k in OUTCOMES:
        prompt = [3 + g, 4, 5, 6 + k]
        for t in range(TURNS):
            response = [20 + 4 * g + 2 * k + t, 30 + t, 40 + k][: 2 + (g + k + t) % 2]
            out.append(
                step_type(
                    prompt_ids=list(prompt),
                    response_ids=response,
                    rollout_log_probs=[-0.5 - 0.25 * j - k for j in range(len(response))],
                    trajectory_uid=f"{prefix}-g{g}-r{k}",
                    prompt_uid=f"{prefix}-g{g}",
                    step_index=t,
                    policy_version=0,
                    metadata={"uid": f"{prefix}-g{g}", "data_source": "toy"},
                )
            )
            prompt = prompt + response + [9]
    return out


def roll_out(pool, prefix: str, step_type=Step) -> list:
    """Claw-R1's producer calls: submit_steps, then complete_trajectory with the outcome."""
    steps = steps_for(prefix, step_type)
    ray.get(pool.submit_steps.remote(steps, channel="train"))
    for (g, k), reward in OUTCOMES.items():
        assert ray.get(pool.complete_trajectory.remote(f"{prefix}-g{g}-r{k}", reward=reward, channel="train"))
    return steps


def drain(srv, keys, consumer: str) -> None:
    """Ack everything ``consumer`` could pull now (earlier tests' groups), so what it fetches
    next is what the test sends."""
    with ClawClient(srv.url, keys["pool"]) as claw:
        for batch in claw.batches("claw-r1-train", consumer=consumer, batch_size=64):
            batch.ack()


def our_pool(srv, keys, backend=None, *, name: str, consumer: str, **kwargs):
    actor = (
        ray.remote(DataPool)
        .options(name=name)
        .remote(
            {"n_rollouts": ROLLOUTS},
            backend,
            url=srv.url,
            api_key=keys["pool"],
            datasets={"train": "claw-r1-train", "val": "claw-r1-val"},
            consumer=consumer,
            prompt_length=PROMPT_LENGTH,
            response_length=RESPONSE_LENGTH,
            poll_seconds=1.0,
            **kwargs,
        )
    )
    return actor


def expected_rows(steps: list) -> list:
    """Claw-R1's pool order: groups in order, each group's steps by (trajectory, step index);
    the outcome reward on each trajectory's last step."""
    by_group: dict[str, list] = {}
    for s in steps:
        by_group.setdefault(s.prompt_uid, []).append(s)
    out = []
    for group in by_group.values():
        out += sorted(group, key=lambda s: (s.trajectory_uid, s.step_index))
    return out


def test_claw_r1s_calls_drive_the_pool_and_get_a_dataproto(server, ray_local):
    """The DataPool answers Claw-R1's trainer calls by name; fetch_batch pulls whole groups
    under leases from a last_step dataset, orders them as Claw-R1's pool does and acks."""
    srv, keys = server
    actor = our_pool(srv, keys, name="data_pool", consumer="claw-r1-a")
    try:
        pool = ray.get_actor("data_pool")  # how Claw-R1's trainers find it
        sent = roll_out(pool, "a")
        data = ray.get(pool.fetch_batch.remote(batch_size=len({s.prompt_uid for s in sent})))
        rows = expected_rows(sent)
        outcome = {f"a-g{g}-r{k}": r for (g, k), r in OUTCOMES.items()}
        b, nt = data.batch, data.non_tensor_batch
        assert len(data) == len(rows)
        assert b["prompts"].shape == (len(rows), PROMPT_LENGTH)
        assert b["responses"].shape == (len(rows), RESPONSE_LENGTH)
        for i, s in enumerate(rows):
            lp, lr = len(s.prompt_ids), len(s.response_ids)
            assert nt["trajectory_uids"][i] == s.trajectory_uid and nt["step_indices"][i] == s.step_index
            assert nt["prompt_uids"][i] == nt["uid"][i] == s.prompt_uid
            assert nt["data_source"][i] == "toy"  # step metadata, spread as Claw-R1's backend does
            assert b["prompts"][i].tolist() == [0] * (PROMPT_LENGTH - lp) + s.prompt_ids
            assert b["responses"][i].tolist() == s.response_ids + [0] * (RESPONSE_LENGTH - lr)
            assert b["response_mask"][i].tolist() == [1] * lr + [0] * (RESPONSE_LENGTH - lr)
            want_lp = s.rollout_log_probs + [0.0] * (RESPONSE_LENGTH - lr)
            assert torch.equal(b["rollout_log_probs"][i], torch.tensor(want_lp, dtype=torch.float32))
            reward = [0.0] * RESPONSE_LENGTH
            if s.step_index == TURNS - 1:
                reward[lr - 1] = outcome[s.trajectory_uid]
            assert b["rm_scores"][i].tolist() == reward
            assert nt["reward_scope"][i] == ("step" if s.step_index == TURNS - 1 else "none")
        assert data.meta_info["lease_id"] and data.meta_info["policy_versions"] == {"0": len(rows)}

        # acked at handover: nothing is left for this consumer
        with ClawClient(srv.url, keys["pool"]) as claw:
            assert not claw.pull("claw-r1-train", consumer="claw-r1-a")
        stats = ray.get(pool.get_statistics.remote())
        assert stats["total_produced"] == len(sent) and stats["total_consumed"] == 2
        assert stats["fetch_count"] == 1 and stats["last_fetch"]["prompt_uids"] == ["a-g0", "a-g1"]
        assert stats["last_fetch"]["step_count"] == len(rows) and stats["shutdown"] is False
        assert stats["server"]["leases"]["acked"] == 1 and stats["unacked_leases"] == 0

        # shutdown: a waiting fetch_batch returns None, as Claw-R1's pool does
        waiting = pool.fetch_batch.remote(batch_size=1)
        ray.get(pool.shutdown.remote())
        assert ray.get(waiting) is None
    finally:
        ray.kill(actor)


class FailingBackend:
    def convert(self, steps):
        raise RuntimeError(f"cannot convert {len(steps)} steps")


def test_a_failed_conversion_nacks_and_an_unacked_batch_comes_back_after_a_restart(server, ray_local):
    """A conversion that raises nacks the leases (the same groups are served again); with
    ack="next_fetch" a batch is acked only at the next fetch, so a trainer that dies while
    training on it gets it again once its lease expires (a new pool, the same consumer)."""
    srv, keys = server
    drain(srv, keys, "claw-r1-b")
    failing = our_pool(srv, keys, FailingBackend(), name="data_pool_failing", consumer="claw-r1-b")
    try:
        sent = roll_out(failing, "b")
        with pytest.raises(ray.exceptions.RayTaskError, match="cannot convert 8 steps"):
            ray.get(failing.fetch_batch.remote(batch_size=2))
    finally:
        ray.kill(failing)
    first = our_pool(
        srv, keys, name="data_pool_first", consumer="claw-r1-b", ack="next_fetch", lease_seconds=1
    )
    try:
        got = ray.get(first.fetch_batch.remote(batch_size=2))
        assert list(got.non_tensor_batch["trajectory_uids"]) == [
            s.trajectory_uid for s in expected_rows(sent)
        ]
        assert ray.get(first.get_statistics.remote())["unacked_leases"] == 1
    finally:
        ray.kill(first)  # the trainer dies before its next fetch: nothing acked
    again = our_pool(srv, keys, name="data_pool_again", consumer="claw-r1-b")
    try:
        redelivered = ray.get(again.fetch_batch.remote(batch_size=2))  # waits out the lease
        for key in got.batch.keys():
            assert torch.equal(got.batch[key], redelivered.batch[key]), key
    finally:
        ray.kill(again)


def test_channels_without_a_dataset_and_unknown_ack_modes_are_refused():
    with pytest.raises(ValueError, match=re.escape("ack must be one of handover, next_fetch, not 'never'")):
        DataPool(url="http://127.0.0.1:1", api_key="k", datasets="d", ack="never")
    pool = DataPool(url="http://127.0.0.1:1", api_key="k", datasets="d")
    with pytest.raises(ValueError, match=re.escape("no dataset for channel 'val': datasets names ['train']")):
        pool._dataset("val")


@pytest.mark.skipif(not CLAW_R1_SRC, reason="CLAW_R1_SRC names no Claw-R1 checkout")
def test_the_dataproto_equals_claw_r1s_own_pool_with_its_own_backend(server, ray_local):
    """Claw-R1's own VerlBackend through our pool gives the DataProto Claw-R1's in-memory
    pool gives for the same steps; Claw-R1's trajectory GRPO runs on both alike."""
    from claw_r1.core_algos import compute_grpo_outcome_advantage
    from claw_r1.data_pool import DataPool as ClawR1Pool
    from claw_r1.data_pool import DataPoolConfig, VerlBackend
    from claw_r1.data_pool import Step as ClawR1Step
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    srv, keys = server
    vocab = {f"t{i}": i for i in range(64)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t1")), pad_token="t0"
    )
    backend = VerlBackend(tokenizer=tokenizer, prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH)
    theirs = ClawR1Pool.options(name="claw_r1_reference").remote(DataPoolConfig(n_rollouts=ROLLOUTS), backend)
    drain(srv, keys, "claw-r1-c")
    ours = our_pool(srv, keys, backend, name="data_pool_claw_r1", consumer="claw-r1-c")
    try:
        roll_out(theirs, "c", ClawR1Step)
        roll_out(ours, "c", ClawR1Step)
        want = ray.get(theirs.fetch_batch.remote(batch_size=2))
        got = ray.get(ours.fetch_batch.remote(batch_size=2))
    finally:
        ray.kill(theirs)
        ray.kill(ours)
    assert sorted(got.batch.keys()) == sorted(want.batch.keys())
    for key in want.batch.keys():
        assert got.batch[key].dtype == want.batch[key].dtype, key
        assert torch.equal(got.batch[key], want.batch[key]), key
    assert got.non_tensor_batch.keys() == want.non_tensor_batch.keys()
    for key, value in want.non_tensor_batch.items():
        assert list(got.non_tensor_batch[key]) == list(value), key
    advantages = []
    for data in (want, got):
        adv, _ = compute_grpo_outcome_advantage(
            token_level_rewards=data.batch["rm_scores"],
            response_mask=data.batch["response_mask"],
            index=data.non_tensor_batch["uid"],
            trajectory_uids=data.non_tensor_batch["trajectory_uids"],
        )
        advantages.append(adv)
    assert torch.equal(advantages[0], advantages[1]) and advantages[0].abs().sum() > 0


def test_the_readme_claw_r1_snippet_runs_verbatim(server, ray_local, monkeypatch):
    srv, keys = server
    monkeypatch.setenv("CLAW_URL", srv.url)
    monkeypatch.setenv("CLAW_KEY", keys["pool"])
    text = (ROOT / "docs" / "trainers.md").read_text()
    at = text.index("\n### Claw-R1's trainer: the DataPool actor\n")
    block = re.search(r"```python\n(.*?)```", text[at:], re.S).group(1)
    drain(srv, keys, "claw-r1-trainer")  # the snippet's consumer
    with ClawClient(srv.url, keys["pool"]) as agent:  # two ready groups on the train channel
        for g in range(2):
            agent._json("POST", "/groups", json={"uid": f"readme-g{g}", "expected_rollouts": 1})
        agent._json(
            "POST",
            "/steps",
            json={
                "steps": [
                    {
                        "trajectory_uid": f"readme-g{g}-r0",
                        "prompt_group_uid": f"readme-g{g}",
                        "step_index": 0,
                        "prompt_ids": [1, 2],
                        "response_ids": [3],
                        "reward": 1.0,
                        "is_last": True,
                    }
                    for g in range(2)
                ]
            },
        )
    scope: dict = {}
    try:
        exec(compile(block, "docs/trainers.md", "exec"), scope)
        batch = scope["batch"]
        assert sorted(set(batch.non_tensor_batch["uid"])) == ["readme-g0", "readme-g1"]
        assert batch.meta_info["lease_id"] and batch.batch["rm_scores"].sum() == 2.0
    finally:
        if "pool" in scope:
            ray.kill(scope["pool"])


def test_the_pool_trains_within_a_run_and_posts_the_trainers_verdicts(server):
    """Lineage through the DataPool (a plain instance, Claw-R1's calls in process): its run
    records the DataPoolConfig, a published version is a checkpoint of the fetched leases,
    and post_verdicts sends each step's verdict by the lease it came in."""
    import asyncio

    srv, keys = server
    key = srv.make_key("ingest", "consume", "policy", name="claw-r1-lineage")
    pool = DataPool(
        {"n_rollouts": ROLLOUTS},
        url=srv.url,
        api_key=key,
        datasets={"train": "claw-r1-train"},
        consumer="claw-r1-run",
        prompt_length=PROMPT_LENGTH,
        response_length=RESPONSE_LENGTH,
        poll_seconds=1.0,
    )
    with ClawClient(srv.url, key) as claw:
        for batch in claw.batches("claw-r1-train", consumer="claw-r1-run", batch_size=64):
            batch.ack()  # earlier tests' groups
        uid = pool.open_run(name="lineage")
        sent = steps_for("lin")
        pool.submit_steps(sent)
        for (g, k), reward in OUTCOMES.items():
            assert pool.complete_trajectory(f"lin-g{g}-r{k}", reward=reward)
        data = asyncio.run(pool.fetch_batch(batch_size=2))
        data.batch["old_log_probs"] = data.batch["rollout_log_probs"] - 0.5 * data.batch["response_mask"]
        answers = pool.post_verdicts(data)
        # every step trained on has its verdict, posted to its lease
        leases = pool.get_statistics()["last_fetch"]["lease_ids"]
        assert set(answers) == set(leases) and sum(a["stored"] for a in answers.values()) == len(sent)
        version = max((v["version"] for v in claw._json("GET", "/policy-versions")), default=0) + 1
        published = pool.set_policy_version(version)
        run = claw.run(uid)
        assert run.info["config"] == {"n_rollouts": ROLLOUTS} and published["checkpoint"]["leases"] == len(
            leases
        )
        assert sorted(run.step_uids(version)) == sorted(data.non_tensor_batch["step_uids"])
