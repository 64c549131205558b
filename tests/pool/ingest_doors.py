"""The doors through which steps enter the pool, driven through their stable entry points,
and a column-by-column picture of what they stored (tests/pool/test_ingest_paths.py).

A logical rollout (prompt/response ids per turn, group, policy version, final reward) is
written through one door under fresh uids (``<logical name>-<token>``), so doors never share
a trajectory and the proxy's per-process memory of a trajectory's last call (keyed by uid)
never carries over between doors or tests. ``snapshot`` maps the uids back to the logical
names, so the rows of two doors can be compared column by column.

Doors:

* ``json``: POST /api/v1/steps with a JSON body, one batch per write;
* ``msgpack``: the same endpoint with claw_client.encode_step_batch (packed arrays);
* ``claw_r1``: POST /compat/claw-r1/submit_steps with Claw-R1 StepPayloads;
* ``proxy_fast``: gateway.proxy.recording.record_answer, one call per turn, as the gateway
  records them: the first call of a trajectory it minted (Identity(new=True)), then the next
  calls of that trajectory in the same process, each committed (its on-commit callbacks run,
  so the process remembers the call). These take the fast path (one statement on
  PostgreSQL) except a group's first call and the first call naming an unseen policy version;
* ``proxy_named``: the same calls for a trajectory the agent named (a ``/t/<trajectory>/``
  URL: Identity(new=False)), recorded in one process: the first call creates the trajectory
  (and a new group, or joins one without an anchor yet) in its one statement, the next ones
  continue it as ``proxy_fast``'s do; a group's other rollouts, whose first steps are stored
  against the group's anchor, take the general path;
* ``proxy_general``: the same calls for a trajectory the gateway did not mint
  (Identity(new=False)), recorded as if each by another gateway process: the on-commit
  callbacks are dropped, so no call finds the previous one in memory and every call after
  the first takes the general path (reserve, look up the previous call in the pool,
  steps_ingest); the first, the trajectory being new, is created as ``proxy_named``'s is
  (a group's other rollouts: tried so, then the general path, the process not knowing the
  group has its anchor);
* ``proxy_group``: the ``proxy_fast`` calls as the gateway's writer records concurrent calls
  (recording.record_group, one group commit): each shares its commit with another
  trajectory's call; a call the group does not take (a group's first call) is recorded
  alone with record_answer, as gateway/proxy/faults.py does.

Both proxy doors end a trajectory through Claw-R1's complete_trajectory endpoint, with the
reward; the white-box doors with an ``is_last`` step carrying it.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from claw_client import MSGPACK, encode_step_batch
from gateway.proxy.recording import CHAT, Identity, Outcome, RecordJob, record_answer, record_group
from pool import tokens
from pool.models import PolicyVersion, PromptGroup, Step, Trajectory

MODEL = "claw-test-model"


# --- the logical data -------------------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    response: list[int]
    logprobs: list[float]
    text: str


@dataclass(frozen=True)
class Turn:
    """One generation: a prompt and its choices (n > 1: alternatives, one step each)."""

    prompt: list[int]
    choices: tuple[Choice, ...]
    messages: list[dict[str, Any]]
    policy_version: int | None


@dataclass(frozen=True)
class Rollout:
    """One trajectory: its turns, group (logical name or None) and the reward it ends with."""

    name: str
    group: str | None
    turns: tuple[Turn, ...]
    reward: float

    def first_index(self, k: int) -> int:
        """The step_index of turn ``k``'s first choice."""
        return sum(len(t.choices) for t in self.turns[:k])

    def steps(self, turns: Iterable[int] | None = None) -> list[tuple[int, Turn, int]]:
        """(step_index, turn, choice index) of every step of ``turns`` (default: all)."""
        ks = range(len(self.turns)) if turns is None else turns
        return [
            (self.first_index(k) + c, self.turns[k], c) for k in ks for c in range(len(self.turns[k].choices))
        ]

    @property
    def last_index(self) -> int:
        return self.first_index(len(self.turns)) - 1


def rollout(
    name: str,
    *,
    group: str | None,
    prompt: list[int],
    turns: int,
    reward: float,
    versions: int | None | Sequence[int | None],
    seed: int,
    choices: dict[int, int] | None = None,
) -> Rollout:
    """A multi-turn rollout: each prompt is the previous prompt + the response of its first
    choice + a reply. ``versions``: one policy version for all turns, or one per turn;
    ``choices``: turn -> n for turns sampled with n > 1."""
    rng = random.Random(seed)
    per_turn = list(versions) if isinstance(versions, Sequence) else [versions] * turns
    ctx = list(prompt)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "solve the task"}]
    out = []
    for k in range(turns):
        alternatives = []
        for c in range((choices or {}).get(k, 1)):
            response = [rng.randrange(150_000) for _ in range(6 + (k + c) % 4)]
            alternatives.append(
                Choice(
                    response=response, logprobs=[-rng.random() * 3 for _ in response], text=f"{name} {k}.{c}"
                )
            )
        out.append(Turn(list(ctx), tuple(alternatives), [dict(m) for m in messages], per_turn[k]))
        ctx = ctx + alternatives[0].response + [rng.randrange(150_000) for _ in range(5)]
        messages += [
            {"role": "assistant", "content": alternatives[0].text},
            {"role": "user", "content": f"reply {k}"},
        ]
    return Rollout(name, group, tuple(out), reward)


def group_prompt(seed: int = 0, length: int = 40) -> list[int]:
    """A prompt long enough (>= pool.tokens.MIN_SHARED_TOKENS) to be stored once per group."""
    rng = random.Random(seed)
    return [rng.randrange(150_000) for _ in range(length)]


# --- doors ------------------------------------------------------------------------------------
Capture = Callable[..., Any]  # pytest-django's django_capture_on_commit_callbacks


@dataclass
class Door:
    """Writes logical rollouts under fresh uids. ``capture`` runs a request's on-commit
    callbacks (as its commit would) where the door says so."""

    name: str
    client: APIClient
    key: str
    source_id: int
    capture: Capture
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:10])

    # uids
    def uid(self, logical: str) -> str:
        return f"{logical}-{self.token}"

    def group_uid(self, r: Rollout) -> str | None:
        return self.uid(r.group) if r.group else None

    def logical(self, real: str) -> str:
        suffix = f"-{self.token}"
        return real[: -len(suffix)] if real.endswith(suffix) else f"<foreign {real}>"

    # writing
    def write(self, r: Rollout) -> None:
        """Every turn of ``r``, then its end (with the reward)."""
        self.write_turns(r, range(len(r.turns)), end=True)

    def write_turns(self, r: Rollout, turns: Iterable[int], *, end: bool) -> None:
        raise NotImplementedError

    def step_uid(self, r: Rollout, k: int) -> str:
        return f"{self.uid(r.name)}:{k}"


class WhiteBoxDoor(Door):
    """A door taking batches of steps (json, msgpack, claw_r1): one batch per write."""

    def steps(self, r: Rollout, turns: Iterable[int], *, end: bool) -> list[dict[str, Any]]:
        """The batch in the API's field names: ``end`` puts is_last and the reward on the
        last step of ``r`` (when it is in the batch)."""
        out = []
        for index, t, c in r.steps(turns):
            choice = t.choices[c]
            last = end and index == r.last_index
            step: dict[str, Any] = {
                "uid": self.step_uid(r, index),
                "trajectory_uid": self.uid(r.name),
                "prompt_group_uid": self.group_uid(r),
                "step_index": index,
                "prompt_ids": t.prompt,
                "response_ids": choice.response,
                "rollout_logprobs": choice.logprobs,
                "policy_version": t.policy_version,
                "is_last": last,
                "finish_reason": "stop",
                "messages": t.messages,
                "response_text": choice.text,
                "metadata": {"choice_index": c, "n": len(t.choices)} if len(t.choices) > 1 else {},
            }
            if last:
                step["reward"] = r.reward
            out.append(step)
        return out

    def post(self, steps: Sequence[dict[str, Any]], **kw: Any):
        raise NotImplementedError

    def write_turns(self, r: Rollout, turns: Iterable[int], *, end: bool) -> None:
        with self.capture(execute=True):
            resp = self.post(self.steps(r, turns, end=end))
        assert resp.status_code in (200, 201), resp.content


class JsonDoor(WhiteBoxDoor):
    def post(self, steps, *, raw: bytes | None = None, **kw):
        body = raw if raw is not None else json.dumps({"steps": list(steps)}).encode()
        return self.client.post("/api/v1/steps", data=body, content_type="application/json")


class MsgpackDoor(WhiteBoxDoor):
    def post(self, steps, **kw):
        return self.client.generic("POST", "/api/v1/steps", encode_step_batch(steps), content_type=MSGPACK)


# Claw-R1's StepPayload fields; it has no uid, messages, response_text or finish_reason.
CLAW_R1_NAMES = {
    "prompt_ids": "prompt_ids",
    "response_ids": "response_ids",
    "rollout_logprobs": "rollout_log_probs",
    "reward": "reward",
    "trajectory_uid": "trajectory_uid",
    "prompt_group_uid": "prompt_uid",
    "step_index": "step_index",
    "policy_version": "policy_version",
    "is_last": "is_last",
    "metadata": "metadata",
}


class ClawR1Door(WhiteBoxDoor):
    def post(self, steps, *, channel: str = "train", raw: bytes | None = None, **kw):
        if raw is None:
            payloads = [{CLAW_R1_NAMES[k]: v for k, v in s.items() if k in CLAW_R1_NAMES} for s in steps]
            raw = json.dumps({"steps": payloads}).encode()
        return Client().post(
            f"/compat/claw-r1/submit_steps?channel={channel}",
            data=raw,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {self.key}",
        )


class ProxyDoor(Door):
    """Proxied chat calls, one per turn, recorded with record_answer (see module docstring)."""

    fast = True

    def ident(self, r: Rollout, k: int) -> Identity:
        return Identity(
            trajectory_uid=self.uid(r.name),
            prompt_group_uid=self.group_uid(r),
            policy_version=r.turns[k].policy_version,
            new=self.fast and k == 0,
        )

    def call(self, r: Rollout, k: int, *, prompt: list[int] | None = None) -> Outcome:
        """Record turn ``k`` of ``r`` as an upstream answer (``prompt`` replaces its ids)."""
        t = r.turns[k]
        request: dict[str, Any] = {"model": MODEL, "messages": t.messages}
        if len(t.choices) > 1:
            request["n"] = len(t.choices)
        answer = {
            "object": "chat.completion",
            "model": MODEL,
            "prompt_token_ids": t.prompt if prompt is None else prompt,
            "choices": [
                {
                    "index": c,
                    "message": {"role": "assistant", "content": choice.text},
                    "finish_reason": "stop",
                    "token_ids": choice.response,
                    "logprobs": {"content": [{"logprob": x} for x in choice.logprobs]},
                }
                for c, choice in enumerate(t.choices)
            ],
        }
        # fast: the call commits and the process remembers it; general: as if recorded by
        # another process, the memory of the call (an on-commit callback) is dropped.
        with self.capture(execute=self.fast):
            return self.record(self.ident(r, k), request, answer)

    def record(self, ident: Identity, request: dict[str, Any], answer: dict[str, Any]) -> Outcome:
        return record_answer(
            endpoint=CHAT, ident=ident, request=request, answer=answer, source_id=self.source_id
        )

    def end(self, r: Rollout, body: dict[str, Any] | None = None):
        """Claw-R1's complete_trajectory on the rollout's base URL."""
        base = f"/compat/claw-r1/{self.uid(r.name)}/{self.group_uid(r) or '-'}/v1"
        with self.capture(execute=True):
            return Client().post(
                f"{base}/complete_trajectory",
                data=json.dumps({"reward": r.reward} if body is None else body),
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {self.key}",
            )

    def write_turns(self, r: Rollout, turns: Iterable[int], *, end: bool) -> None:
        for k in turns:
            outcome = self.call(r, k)
            first = r.first_index(k)
            assert outcome.event is None, outcome
            assert [s.step_index for s in outcome.steps] == list(
                range(first, first + len(r.turns[k].choices))
            )
        if end:
            resp = self.end(r)
            assert resp.status_code == 200, resp.content


class ProxyNamedDoor(ProxyDoor):
    """``proxy_fast``'s calls for a trajectory the agent named (see module docstring)."""

    def ident(self, r: Rollout, k: int) -> Identity:
        return Identity(
            trajectory_uid=self.uid(r.name),
            prompt_group_uid=self.group_uid(r),
            policy_version=r.turns[k].policy_version,
            new=False,
        )


class ProxyGeneralDoor(ProxyDoor):
    fast = False


class ProxyGroupDoor(ProxyDoor):
    """``proxy_fast``'s calls, each in a group commit beside another trajectory's call."""

    def record(self, ident: Identity, request: dict[str, Any], answer: dict[str, Any]) -> Outcome:
        companion = RecordJob(
            CHAT,
            Identity(trajectory_uid=f"companion-{uuid.uuid4().hex}", new=True),
            {"model": MODEL, "messages": [{"role": "user", "content": "beside"}]},
            {
                "model": MODEL,
                "prompt_token_ids": [1, 2, 3],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "token_ids": [4]}],
            },
            self.source_id,
        )
        job = RecordJob(CHAT, ident, request, answer, self.source_id)
        grouped = record_group([companion, job])
        assert grouped[0] is not None  # a new trajectory without a group always joins
        # The companion was written with the call; its rows go, so the pool holds this door's only.
        Step.objects.filter(trajectory__uid=companion.ident.trajectory_uid).delete()
        Trajectory.objects.filter(uid=companion.ident.trajectory_uid).delete()
        outcome = grouped[1]
        if outcome is None:
            return super().record(ident, request, answer)
        self.joined += 1
        return outcome

    joined = 0  # calls the group commit took

    def write_turns(self, r: Rollout, turns: Iterable[int], *, end: bool) -> None:
        turns = list(turns)
        before = self.joined
        super().write_turns(r, turns, end=end)
        # a later call of one choice is a fused append (unless its policy version is new): the
        # group takes it, so every rollout of two turns or more has calls the group took
        if len(turns) >= 2:
            assert self.joined > before, turns


DOORS: dict[str, type[Door]] = {
    "json": JsonDoor,
    "msgpack": MsgpackDoor,
    "claw_r1": ClawR1Door,
    "proxy_fast": ProxyDoor,
    "proxy_named": ProxyNamedDoor,
    "proxy_general": ProxyGeneralDoor,
    "proxy_group": ProxyGroupDoor,
}
WHITE_BOX = ("json", "msgpack", "claw_r1")
PROXIED = ("proxy_fast", "proxy_named", "proxy_general", "proxy_group")


# --- what a door stored -----------------------------------------------------------------------
def snapshot(door: Door, rollouts: Sequence[Rollout]) -> dict[str, dict[Any, dict[str, Any]]]:
    """Every concrete column of the Step, Trajectory, PromptGroup and PolicyVersion rows of ``rollouts``,
    keyed by logical names. References to other rows are given as what they point at (a
    step as (logical trajectory, step_index), a trajectory or group as its logical name)
    rather than as surrogate ids; binary columns as bytes; uids with the door's token
    removed. Deferred foreign keys are checked first, so a dangling reference fails here."""
    connection.check_constraints()
    traj_names = {door.uid(r.name): r.name for r in rollouts}
    group_names = {door.uid(r.group): r.group for r in rollouts if r.group}
    trajs = {t.id: t for t in Trajectory.objects.filter(uid__in=traj_names)}
    groups = {g.id: g for g in PromptGroup.objects.filter(uid__in=group_names)}
    steps = list(Step.objects.filter(trajectory_id__in=trajs))
    step_pos = {s.id: (traj_names[trajs[s.trajectory_id].uid], s.step_index) for s in steps}

    def step_ref(step_id: int | None) -> Any:
        if step_id is None:
            return None
        if step_id in step_pos:
            return step_pos[step_id]
        other = Step.objects.select_related("trajectory").get(id=step_id)
        return ("<outside the rollouts>", other.trajectory.uid, other.step_index)

    def uid_of(real: str) -> str:
        for traj_uid, name in traj_names.items():
            if real.startswith(f"{traj_uid}:"):
                return name + real[len(traj_uid) :]
        return f"<foreign {real}>"

    versions = {t.policy_version for r in rollouts for t in r.turns if t.policy_version is not None}
    out: dict[str, dict[Any, dict[str, Any]]] = {"Step": {}, "Trajectory": {}, "PromptGroup": {}}
    out["PolicyVersion"] = {
        v.version: _columns(v) for v in PolicyVersion.objects.filter(version__in=versions)
    }
    for s in steps:
        row = _columns(s)
        row["uid"] = uid_of(s.uid)
        row["trajectory_id"] = traj_names[trajs[s.trajectory_id].uid]
        row["seq_parent_id"] = step_ref(s.seq_parent_id)
        out["Step"][step_pos[s.id]] = row
    for t in trajs.values():
        row = _columns(t)
        row["uid"] = traj_names[t.uid]
        row["group_id"] = group_names.get(groups[t.group_id].uid) if t.group_id in groups else t.group_id
        out["Trajectory"][row["uid"]] = row
    for g in groups.values():
        row = _columns(g)
        row["uid"] = group_names[g.uid]
        row["anchor_step_id"] = step_ref(g.anchor_step_id)
        out["PromptGroup"][row["uid"]] = row
    return out


def _columns(obj: Any) -> dict[str, Any]:
    row = {}
    for f in type(obj)._meta.concrete_fields:
        value = getattr(obj, f.attname)
        row[f.attname] = bytes(value) if isinstance(value, memoryview | bytearray) else value
    return row


def differences(
    expected: dict[str, dict[Any, dict[str, Any]]],
    got: dict[str, dict[Any, dict[str, Any]]],
    exempt: Iterable[tuple[str, str]],
) -> list[tuple]:
    """(table, row, column, expected, got) for every differing column not in ``exempt``
    ((table, column) pairs), plus rows present on one side only."""
    skip = set(exempt)
    out: list[tuple] = []
    for table in expected:
        want, have = expected[table], got[table]
        for key in sorted(want.keys() | have.keys(), key=repr):
            if key not in have or key not in want:
                out.append((table, key, "<row>", key in want, key in have))
                continue
            for column in want[key]:
                if (table, column) not in skip and want[key][column] != have[key][column]:
                    out.append((table, key, column, want[key][column], have[key][column]))
    return out


def read_back(door: Door, rollouts: Sequence[Rollout]) -> dict[tuple[str, int], dict[str, Any]]:
    """GET /api/v1/steps/<uid> of every turn, with the door's token removed from the uids."""
    out = {}
    for r in rollouts:
        for k, _, _ in r.steps():
            resp = door.client.get(f"/api/v1/steps/{door.step_uid(r, k)}")
            assert resp.status_code == 200, resp.content
            body = resp.json()
            body["uid"] = f"{r.name}:{k}"
            body["trajectory_uid"] = door.logical(body["trajectory_uid"])
            if body["prompt_group_uid"] is not None:
                body["prompt_group_uid"] = door.logical(body["prompt_group_uid"])
            out[(r.name, k)] = body
    return out


def stored_ids(door: Door, r: Rollout) -> list[list[int]]:
    """The full token sequence of each stored step of ``r``, rebuilt by pool.tokens."""
    steps = dict(
        Step.objects.filter(trajectory__uid=door.uid(r.name))
        .values_list("step_index", "id")
        .order_by("step_index")
    )
    full = tokens.load_sequences(steps.values())
    return [tokens.bytes_to_ids(full[sid]).tolist() for sid in steps.values()]
