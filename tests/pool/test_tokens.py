"""Token storage (pool.tokens + steps_ingest): exact round trips, bounded delta chains,
prefix sharing within a group, and concurrent identical submissions."""

from __future__ import annotations

import hashlib
import random
import threading

import numpy as np
import pytest
from django.db import connection, connections

from pool import tokens
from pool.ingest.pipeline import steps_ingest
from pool.models import Step
from pool.selectors.steps import steps_render
from tests.pool.factories import random_ids, step_in

pytestmark = pytest.mark.django_db

MAX_ID = 2**31 - 1


def stored_token_bytes() -> int:
    return sum(len(bytes(b)) for b in Step.objects.values_list("seq_delta", flat=True))


def read_back(uids: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(prompt_ids, response_ids) of each step, through the selector the API uses."""
    steps = list(Step.objects.with_context().filter(uid__in=uids))
    return {r["uid"]: (r["prompt_ids"], r["response_ids"]) for r in steps_render(steps)}


def assert_exact(written: dict[str, tuple[list[int], list[int]]]) -> None:
    got = read_back(list(written))
    assert set(got) == set(written)
    for uid, (prompt, response) in written.items():
        p, r = got[uid]
        assert p.dtype == np.int32 and r.dtype == np.int32
        assert p.tolist() == prompt, uid
        assert r.tolist() == response, uid


# --- unit: the encoding ------------------------------------------------------------------------
def test_ids_are_little_endian_int32():
    assert tokens.ids_to_bytes(np.array([1, MAX_ID], dtype=np.int32)) == b"\x01\x00\x00\x00\xff\xff\xff\x7f"
    assert tokens.bytes_to_ids(b"\x00\x00\x00\x00\xff\xff\xff\x7f").tolist() == [0, MAX_ID]


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        ([], [], 0),
        ([1], [], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2], [1, 2, 3], 2),
        ([5, 2], [1, 2], 0),
        ([1, 2, 3, 4], [1, 2, 9, 4], 2),
    ],
)
def test_common_prefix_len(a, b, n):
    assert tokens.common_prefix_len(np.array(a, dtype=np.int32), np.array(b, dtype=np.int32)) == n


def test_encode_against_uses_a_parent_only_past_the_threshold():
    # given a parent and two children sharing MIN_SHARED_TOKENS - 1 and MIN_SHARED_TOKENS tokens
    k = tokens.MIN_SHARED_TOKENS
    parent = np.arange(100, dtype=np.int32)
    short = np.concatenate((parent[: k - 1], np.array([7, 7], dtype=np.int32)))
    long = np.concatenate((parent[:k], np.array([7, 7], dtype=np.int32)))
    # then the first is stored whole, the second as a delta of its tail
    whole = tokens.encode_against(short, parent, 0)
    delta = tokens.encode_against(long, parent, 0)
    assert (whole.shared, whole.depth, whole.delta) == (0, 0, tokens.ids_to_bytes(short))
    assert (delta.shared, delta.depth, delta.delta) == (k, 1, tokens.ids_to_bytes(long[k:]))
    # and a parent already at the depth bound is not used
    capped = tokens.encode_against(long, parent, tokens.MAX_CHAIN_DEPTH)
    assert (capped.shared, capped.depth) == (0, 0)


# --- round trips through steps_ingest ----------------------------------------------------------
def test_random_sequences_round_trip_exactly():
    # given random multi-turn trajectories (some in groups sharing a prompt), empty responses,
    # ids at both ends of the range, submitted in random chunks
    rng = random.Random(2024)
    batches, written = [], {}
    for g in range(4):
        group_prompt = [0, MAX_ID] + random_ids(rng, rng.randrange(0, 60), high=2**31) + [MAX_ID, 0]
        for r in range(rng.randrange(1, 4)):
            traj = f"g{g}-r{r}"
            ctx = list(group_prompt)
            for t in range(rng.randrange(1, 6)):
                response = rng.choice([[], [0], [MAX_ID], random_ids(rng, rng.randrange(1, 40), high=2**31)])
                s = step_in(
                    traj, t, prompt=list(ctx), response=response, group=f"grp{g}" if g % 2 == 0 else None
                )
                batches.append(s)
                written[s.uid] = (list(ctx), list(response))
                # sometimes the next prompt diverges (retokenised history), usually it extends
                if rng.random() < 0.2:
                    ctx = ctx[: rng.randrange(1, len(ctx) + 1)] + random_ids(rng, 5)
                else:
                    ctx = ctx + response + random_ids(rng, rng.randrange(0, 30))
    # keep each trajectory in order across chunks, as a client would send it
    i = 0
    while i < len(batches):
        n = rng.randrange(1, 8)
        steps_ingest(steps=batches[i : i + n])
        i += n
    # when read back, then every step is exactly what was written
    assert_exact(written)
    # and each seq_hash is the blake2b-128 of the full sequence bytes
    for uid, seq_hash_ in Step.objects.values_list("uid", "seq_hash"):
        prompt, response = written[uid]
        full = np.array(prompt + response, dtype="<i4").tobytes()
        assert bytes(seq_hash_) == hashlib.blake2b(full, digest_size=16).digest()


def test_logprobs_round_trip_bit_exact():
    # given logprobs including -0.0, subnormals and extreme magnitudes
    values = [-0.0, -5e-324, -1e-300, -1e300, -0.1, -123.456789012345678, 0.0]
    steps_ingest(
        steps=[step_in("lp", 0, prompt=[1, 2], response=list(range(len(values))), rollout_logprobs=values)]
    )
    # when read back
    got = steps_render(list(Step.objects.with_context()))[0]["rollout_logprobs"]
    # then the float64 bits are identical
    assert np.asarray(got, dtype="<f8").tobytes() == np.asarray(values, dtype="<f8").tobytes()


@pytest.mark.parametrize("per_batch", [1, 200], ids=["one-step-per-batch", "one-batch"])
def test_long_chains_are_bounded_and_still_exact(per_batch):
    # given a trajectory longer than MAX_CHAIN_DEPTH whose every prompt extends the previous step
    rng = random.Random(5)
    n = tokens.MAX_CHAIN_DEPTH + 12
    ctx = random_ids(rng, 40)
    steps, written = [], {}
    for i in range(n):
        response = random_ids(rng, 3)
        steps.append(step_in("long", i, prompt=list(ctx), response=response))
        written[f"long:{i}"] = (list(ctx), response)
        ctx = ctx + response + random_ids(rng, 2)
    # when stored (in one batch, or one step per request)
    for start in range(0, n, per_batch):
        steps_ingest(steps=steps[start : start + per_batch])
    # then no chain is deeper than the bound, a new chain was started, and reads are exact
    depths = list(Step.objects.order_by("step_index").values_list("seq_depth", "seq_parent_id"))
    assert max(d for d, _ in depths) <= tokens.MAX_CHAIN_DEPTH
    assert sum(1 for _, parent in depths if parent is None) >= 2
    assert_exact(written)
    # and the storage stays near the unique tokens (only the restarted chain repeats its context)
    unique = 40 + n * 3 + (n - 1) * 2
    assert stored_token_bytes() < 2 * unique * tokens.TOKEN_BYTES


@pytest.mark.parametrize("split", [False, True], ids=["one-batch", "one-rollout-per-batch"])
def test_group_rollouts_store_the_shared_prompt_once(split):
    # given 6 rollouts of one prompt group sharing a 300-token prompt
    rng = random.Random(11)
    prompt = random_ids(rng, 300)
    steps, written = [], {}
    for r in range(6):
        response = random_ids(rng, 20)
        steps.append(step_in(f"roll{r}", 0, prompt=list(prompt), response=response, group="shared"))
        written[f"roll{r}:0"] = (list(prompt), response)
    # when stored
    for chunk in [[s] for s in steps] if split else [steps]:
        steps_ingest(steps=chunk)
    # then the stored bytes are exactly the unique tokens x 4, and reads are exact
    assert stored_token_bytes() == (300 + 6 * 20) * tokens.TOKEN_BYTES
    assert_exact(written)


@pytest.mark.parametrize("read", ["level by level", "one recursive query"])
def test_loading_many_chains_in_small_chunks(monkeypatch, read):
    # given chunked loading forced to 3 ids per query, chains read level by level (as a
    # pull's batch is) or by one recursive query (as a proxied call's parent is), and 5
    # rollouts of 4 turns in a group
    monkeypatch.setattr(tokens, "_LOAD_CHUNK", 3)
    monkeypatch.setattr(tokens, "_RECURSIVE_MAX", 0 if read == "level by level" else 100)
    rng = random.Random(3)
    prompt = random_ids(rng, 50)
    written, steps = {}, []
    for r in range(5):
        ctx = list(prompt)
        for t in range(4):
            response = random_ids(rng, 10)
            steps.append(step_in(f"c{r}", t, prompt=list(ctx), response=response, group="cg"))
            written[f"c{r}:{t}"] = (list(ctx), response)
            ctx = ctx + response + random_ids(rng, 5)
    steps_ingest(steps=steps)
    # when all are loaded at once
    ids = dict(Step.objects.values_list("uid", "id"))
    full = tokens.load_sequences(ids.values())
    # then each sequence is exact
    for uid, (prompt_ids, response_ids) in written.items():
        assert tokens.bytes_to_ids(full[ids[uid]]).tolist() == prompt_ids + response_ids


# --- concurrency (PostgreSQL only) --------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_two_threads_submitting_the_same_batch():
    # given PostgreSQL (SQLite serialises writers on one lock: there is no race to test)
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL")
    rng = random.Random(9)
    prompt = random_ids(rng, 64)
    for round_ in range(4):
        batch = [
            step_in(
                f"race{round_}-{r}",
                t,
                prompt=prompt + random_ids(rng, 8 * t),
                response=random_ids(rng, 4),
                group=f"race{round_}",
            )
            for r in range(3)
            for t in range(2)
        ]
        barrier = threading.Barrier(2)
        results: list = [None, None]
        errors: list[BaseException] = []

        def submit(i: int, batch=batch, barrier=barrier, results=results, errors=errors) -> None:
            try:
                barrier.wait()
                results[i] = steps_ingest(steps=batch)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        # when two threads submit it at the same moment
        threads = [threading.Thread(target=submit, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        # then one created every step and the other saw them all as duplicates
        assert errors == [], errors
        created = sorted(len(r.created) for r in results)
        duplicates = sorted(len(r.duplicates) for r in results)
        assert created == [0, len(batch)] and duplicates == [0, len(batch)]
        assert Step.objects.filter(trajectory__group__uid=f"race{round_}").count() == len(batch)
