"""Per-token fields reach a trainer in every format with the values as sent, token by token:
a white-box step's ``token_rewards`` and ``token_policy_versions`` through GET
/api/v1/steps, the ``steps``, ``padded`` and ``tree`` batches and the snapshot files (Parquet
and JSONL), with ``versions_behind`` (current policy version minus the step's, at pull time).

One table of cases: each format's reader gives, per step uid, the fields it carries; each is
compared with what was sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
from django.core.files.storage import default_storage

from curation.models import Snapshot
from curation.services.datasets import dataset_create
from curation.services.snapshots import snapshot_build, snapshot_create
from pool.models import Scope
from pool.services.groups import group_upsert
from pool.services.policy import policy_version_set
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

CURRENT = 5
# A group of two rollouts of two steps: (trajectory, index, response, reward, policy
# version, token_rewards, token_policy_versions). Rollout 0's first step is a partial
# rollout continued under a newer policy; the others have one, the other or neither.
SENT = [
    ("r0", 0, [3, 4, 5], 1.0, 3, [0.5, -0.25, 1.5e-3], [[3, 2], [4, 1]]),
    ("r0", 1, [6, 7], 1.0, 4, [0.125, -2.0], None),
    ("r1", 0, [8, 9, 10, 11], 0.0, 4, None, [[4, 4]]),
    ("r1", 1, [12], 0.0, 4, None, None),
]


def expected() -> dict[str, dict[str, Any]]:
    """What each format must carry per step, from what was sent."""
    out = {}
    for traj, i, response, reward, version, rewards, runs in SENT:
        n = len(response)
        per_token = [v for v, c in runs for _ in range(c)] if runs is not None else None
        level = list(rewards) if rewards is not None else [0.0] * n
        level[-1] += reward  # the assigned reward is added at the last response token
        out[f"{traj}:{i}"] = {
            "token_rewards": rewards,
            "token_policy_versions": runs,
            "token_versions": per_token,
            "versions_behind": CURRENT - version,
            "token_level_rewards": level,
            # per token from token_policy_versions, else the step's versions_behind on each
            "token_versions_behind": [CURRENT - v for v in per_token]
            if per_token is not None
            else [CURRENT - version] * n,
            "steps_token_versions_behind": [CURRENT - v for v in per_token]
            if per_token is not None
            else None,
            "has_token_rewards": rewards is not None,
        }
    return out


@pytest.fixture
def sent(make_key):
    agent = client_for(make_key(Scope.INGEST, name="agent"))
    group_upsert(uid="g", expected_rollouts=2)
    steps = []
    prompt = {"r0": [1, 2], "r1": [1, 2]}
    for traj, i, response, reward, version, rewards, runs in SENT:
        steps.append(
            {
                "trajectory_uid": traj,
                "prompt_group_uid": "g",
                "step_index": i,
                "prompt_ids": prompt[traj],
                "response_ids": response,
                "reward": reward,
                "policy_version": version,
                "is_last": i == 1,
                "token_rewards": rewards,
                "token_policy_versions": runs,
            }
        )
        prompt[traj] = prompt[traj] + response
    resp = agent.post("/api/v1/steps", {"steps": steps}, format="json")
    assert resp.status_code in (200, 201), resp.content
    policy_version_set(version=CURRENT)
    dataset_create(name="d")
    return client_for(make_key(Scope.CONSUME, Scope.READ, name="trainer"))


def pulled(client, fmt: str) -> dict[str, Any]:
    resp = client.post(f"/api/v1/consumers/c-{fmt}/pull", {"dataset": "d", "format": fmt}, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()["batch"]


def read_api(client) -> dict[str, dict]:
    out = {}
    for uid in expected():
        s = client.get(f"/api/v1/steps/{uid}").json()
        out[uid] = {k: s[k] for k in ("token_rewards", "token_policy_versions")}
    return out


def read_steps(client) -> dict[str, dict]:
    return {
        s["uid"]: {
            "token_rewards": s["token_rewards"],
            "token_policy_versions": s["token_policy_versions"],
            "versions_behind": s["versions_behind"],
            "steps_token_versions_behind": s["token_versions_behind"],
        }
        for s in pulled(client, "steps")["steps"]
    }


def read_padded(client) -> dict[str, dict]:
    b = pulled(client, "padded")
    out = {}
    for i, uid in enumerate(b["uid"]):
        n = sum(b["attention_mask"][i][len(b["prompts"][i]) :])
        # padding is 0.0 in the rewards and -1 in the versions behind
        assert all(x == 0.0 for x in b["token_level_rewards"][i][n:])
        assert all(x == -1 for x in b["token_versions_behind"][i][n:])
        out[uid] = {
            "token_level_rewards": b["token_level_rewards"][i][:n],
            "token_versions_behind": b["token_versions_behind"][i][:n],
            "versions_behind": b["versions_behind"][i],
            "has_token_rewards": b["has_token_rewards"][i],
        }
    return out


def read_tree(client) -> dict[str, dict]:
    b = pulled(client, "tree")
    out = {}
    for i, uid in enumerate(b["uid"]):
        at = slice(b["response_offsets"][i], b["response_offsets"][i + 1])
        out[uid] = {
            "token_level_rewards": b["token_level_rewards"][at],
            "token_versions_behind": b["token_versions_behind"][at],
            "versions_behind": b["versions_behind"][i],
            "has_token_rewards": b["has_token_rewards"][i],
        }
    return out


def _snapshot() -> Snapshot:
    snap = snapshot_create(dataset="d", actor="t")
    snapshot_build(snapshot_id=snap.id)
    return Snapshot.objects.get(id=snap.id)


def read_parquet(client) -> dict[str, dict]:
    rows = pq.read_table(default_storage.path(_snapshot().files["parquet"])).to_pylist()
    return {
        r["uid"]: {"token_rewards": r["token_rewards"], "token_versions": r["token_versions"]} for r in rows
    }


def read_jsonl(client) -> dict[str, dict]:
    with default_storage.open(_snapshot().files["jsonl"], "rb") as fh:
        rows = [orjson.loads(line) for line in fh.read().splitlines()]
    return {
        r["uid"]: {"token_rewards": r["token_rewards"], "token_versions": r["token_versions"]} for r in rows
    }


# format -> (its reader, the fields it must carry)
FORMATS: dict[str, tuple[Callable[[Any], dict[str, dict]], set[str]]] = {
    "api": (read_api, {"token_rewards", "token_policy_versions"}),
    "steps": (
        read_steps,
        {"token_rewards", "token_policy_versions", "versions_behind", "steps_token_versions_behind"},
    ),
    "padded": (
        read_padded,
        {"token_level_rewards", "token_versions_behind", "versions_behind", "has_token_rewards"},
    ),
    "tree": (
        read_tree,
        {"token_level_rewards", "token_versions_behind", "versions_behind", "has_token_rewards"},
    ),
    "parquet": (read_parquet, {"token_rewards", "token_versions"}),
    "jsonl": (read_jsonl, {"token_rewards", "token_versions"}),
}


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"


@pytest.mark.parametrize("fmt", FORMATS)
def test_per_token_fields_arrive_as_sent_in_every_format(sent, fmt):
    """README: "They also carry versions_behind and has_token_rewards per row."
    README: "They are stored compactly (float64 and int64 bytes, as the logprobs) and read
    back as sent by GET /api/v1/steps and the steps format."
    README: "In padded and tree, a step's token_rewards are placed token by token in
    token_level_rewards and its own (assigned) reward is added to the value on its last
    response token: token rewards [0.1, 0.2] with reward 1.0 give [0.1, 1.2]."
    README: "token_versions_behind (padded: (N, R), aligned like token_level_rewards; tree:
    aligned with response_index) gives each response token's versions behind the current
    policy version (the step's versions_behind on every token where it has no
    token_policy_versions; -1 on padding and where unknown), and a steps row has the same per
    token as token_versions_behind (null without token_policy_versions)."
    README: "Snapshots (Parquet and JSONL) carry token_rewards and token_versions (the policy
    version of each response token, the runs expanded), null for a step without them." """
    read, fields = FORMATS[fmt]
    # when the trainer reads the steps in this format
    got = read(sent)
    want = expected()
    # then every step is there, each field its sent values token by token
    assert set(got) == set(want)
    for uid, row in got.items():
        assert set(row) == fields, uid
        for name in fields:
            assert row[name] == want[uid][name], (fmt, uid, name)


def test_padded_arrays_are_numpy_of_the_documented_types():
    from curation import formats

    # the docs' example: token rewards [0.1, 0.2] with reward 1.0 give [0.1, 1.2]
    example = {"response_ids": np.array([1, 2]), "reward": 1.0, "token_rewards": np.array([0.1, 0.2])}
    assert formats.token_level_rewards(example).tolist() == [0.1, 0.2 + 1.0]
    row = {
        "response_ids": np.array([1, 2], dtype=np.int32),
        "reward": 1.0,
        "token_rewards": np.array([0.25, 0.5]),
        "token_versions_behind": np.array([2, 1]),
        "versions_behind": 1,
    }
    assert formats.token_level_rewards(row).tolist() == [0.25, 1.5]
    assert formats.token_level_rewards(row).dtype == np.float64
    assert formats.token_versions_behind(row).dtype == np.int64
    # a step without a version: -1 on every token
    assert formats.token_versions_behind(
        {**row, "token_versions_behind": None, "versions_behind": None}
    ).tolist() == [
        -1,
        -1,
    ]
