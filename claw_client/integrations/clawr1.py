"""A drop-in for Claw-R1's ``DataPool`` Ray actor (``claw_r1/data_pool/data_pool.py``) backed
by the server: Claw-R1's trainers call it unchanged, and nothing it holds is lost with it::

    import ray
    from claw_client.integrations.clawr1 import DataPool

    pool = ray.remote(DataPool).options(name="data_pool").remote(
        config, backend,                          # Claw-R1's DataPoolConfig and VerlBackend, or None
        url=URL, api_key=KEY, datasets={"train": "claw-r1-train", "val": "claw-r1-val"})
    batch = ray.get(pool.fetch_batch.remote(batch_size=8))   # a DataProto, as from Claw-R1's pool

* ``fetch_batch(batch_size, n_rollouts=None, channel="train")`` pulls whole prompt groups of
  the channel's dataset (which should serve ``grouping.reward_assignment: last_step``, as
  Claw-R1's pool rewards) under leases, ``steps`` format, until it holds ``batch_size``
  groups (it waits, as Claw-R1's pool does; None once ``shutdown``), orders each group's
  steps by (trajectory uid, step index) as Claw-R1's pool does, leaves out steps the dataset
  serves masked (Claw-R1's trainers have no mask), converts them and then acks the leases.
  The converter is ``training_backend.convert(steps)`` with Claw-R1-shaped ``Step`` objects
  when a backend is given (Claw-R1's own ``VerlBackend`` works), else
  ``claw_client.integrations.verl.to_dataproto`` (``prompt_length``/``response_length``,
  step metadata spread into non-tensor columns). A conversion that raises nacks them.
* ``ack="handover"`` (the default) acks when the batch is handed over (fetch_batch
  returns); ``ack="next_fetch"`` acks a batch only at the next fetch_batch (or ``ack()``), so
  a trainer that dies while training on it gets it again once the leases expire.
* ``submit_step(s)`` and ``complete_trajectory`` go to the server's Claw-R1 door
  (``/compat/claw-r1/submit_steps``, ``/complete_trajectory/<uid>``); a new prompt uid first
  becomes a prompt group of ``n_rollouts`` expected rollouts (``POST /api/v1/groups``).
* ``get_statistics`` and ``stats`` are this actor's counters and the server's view of the
  consumer (``GET /api/v1/consumers/{name}``); ``put_validate``/``get_validate`` keep
  Claw-R1's in-memory validation-metrics queue.
* Lineage: ``open_run`` opens (or, by uid, continues) the training run of this pool's
  consumer on the train channel's dataset, with the DataPoolConfig (or any config) as its
  config; ``set_policy_version(version)`` publishes a version as a checkpoint of it (the
  leases acked since the previous one; a run with defaults is opened on first use);
  ``post_verdicts(data)`` sends the trainer's verdict on the last fetched batch's steps back
  to the pool (``claw_client.integrations.verl.post_verdicts``, by the lease of each step).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any
from urllib.parse import quote

from ..client import Batch, ClawClient, ClawError

__all__ = ["DEFAULT_CHANNEL", "DataPool", "Step", "steps_of"]

DEFAULT_CHANNEL = "train"
ACK_MODES = ("handover", "next_fetch")
# How long one pull long-polls the server (it caps a pull's wait at 30 s); shutdown is
# noticed between pulls.
POLL_SECONDS = 5.0


@dataclass
class Step:
    """Claw-R1's ``claw_r1.data_pool.data_model.Step`` (the same fields), without its verl
    import: what a ``training_backend`` receives."""

    prompt_ids: list[int]
    response_ids: list[int]
    reward: float | None = None
    multi_modal_data: dict[str, Any] | None = None
    rollout_log_probs: list[float] | None = None
    routed_experts: Any = None
    trajectory_uid: str = ""
    prompt_uid: str = ""
    step_index: int = 0
    policy_version: int = 0
    is_last: bool = False
    metadata: dict[str, Any] | None = None


def steps_of(rows: Iterable[Mapping[str, Any]]) -> list[Step]:
    """Claw-R1 Steps of served step rows (``steps`` format): the effective reward, the
    prompt group uid as ``prompt_uid`` ("" for none), policy version 0 for none, and the
    step's metadata less the ``claw_r1`` key the server keeps Claw-R1's other fields in
    (``multi_modal_data`` comes back from there)."""
    out = []
    for r in rows:
        meta = dict(r.get("metadata") or {})
        extra = meta.pop("claw_r1", None) or {}
        logprobs = r.get("rollout_logprobs")
        out.append(
            Step(
                prompt_ids=[int(t) for t in r["prompt_ids"]],
                response_ids=[int(t) for t in r["response_ids"]],
                reward=r.get("reward"),
                multi_modal_data=extra.get("multi_modal_data"),
                rollout_log_probs=[float(x) for x in logprobs] if logprobs is not None else None,
                trajectory_uid=r["trajectory_uid"],
                prompt_uid=r.get("prompt_group_uid") or "",
                step_index=int(r["step_index"]),
                policy_version=r.get("policy_version") or 0,
                is_last=bool(r.get("is_last")),
                metadata=meta or None,
            )
        )
    return out


class DataPool:
    """Claw-R1's DataPool over the server. Make it a Ray actor with ``ray.remote(DataPool)``
    (its name: ``data_pool``, where Claw-R1's trainers look it up).

    ``config`` (Claw-R1's ``DataPoolConfig``, a mapping or None) gives ``n_rollouts``;
    ``training_backend`` converts ``list[Step]`` (None: our verl converter);
    ``max_queue_size`` is kept for the signature: the server's equivalent is the dataset's
    ``serving.capacity``. ``datasets`` maps each channel to a dataset name (a string: the
    train channel's). ``api_key`` needs the consume scope to fetch and ingest to submit.
    """

    def __init__(
        self,
        config: Any = None,
        training_backend: Any = None,
        max_queue_size: int | None = None,
        *,
        url: str,
        api_key: str,
        datasets: str | Mapping[str, str],
        consumer: str = "claw-r1-trainer",
        prompt_length: int | None = None,
        response_length: int | None = None,
        pad_token_id: int = 0,
        lease_seconds: int = 300,
        ack: str = "handover",
        poll_seconds: float = POLL_SECONDS,
    ):
        if ack not in ACK_MODES:
            raise ValueError(f"ack must be one of {', '.join(ACK_MODES)}, not {ack!r}")
        self._config = config
        self._n_rollouts = int(_field(config, "n_rollouts", 1))
        self._training_backend = training_backend
        self._max_queue_size = max_queue_size
        self._datasets = {DEFAULT_CHANNEL: datasets} if isinstance(datasets, str) else dict(datasets)
        self._consumer = consumer
        self._convert_kwargs = {
            "prompt_length": prompt_length,
            "response_length": response_length,
            "pad_token_id": pad_token_id,
        }
        self._lease_seconds = lease_seconds
        self._ack_mode = ack
        self._poll_seconds = poll_seconds
        self._client = ClawClient(url, api_key)
        self._groups_known: set[str] = set()
        self._unacked: list[str] = []
        self._shutdown: set[str] = set()
        self._all_shut = False
        self._counters: dict[str, dict[str, Any]] = {}
        self._val_queue: list[Any] = []
        self._run: Any = None  # claw_client.Run, once open_run (or set_policy_version) opens it
        # The lease each step uid of the recent fetches came in (post_verdicts posts by lease).
        self._step_leases: dict[str, str] = {}

    # --- producer API (Claw-R1's names) ---------------------------------------------------
    def submit_step(self, step: Any, channel: str = DEFAULT_CHANNEL) -> None:
        self.submit_steps([step], channel=channel)

    def submit_steps(self, steps: list[Any], channel: str = DEFAULT_CHANNEL) -> None:
        """Store ``steps`` (Claw-R1 Steps or their dicts) durably, in one atomic request."""
        payload = [_payload(s) for s in steps]
        for uid in dict.fromkeys(p["prompt_uid"] for p in payload if p.get("prompt_uid")):
            if uid not in self._groups_known:
                self._client._json(
                    "POST", "/groups", json={"uid": uid, "expected_rollouts": self._n_rollouts}
                )
                self._groups_known.add(uid)
        self._compat("submit_steps", params={"channel": channel}, json={"steps": payload})
        self._count(channel)["total_produced"] += len(payload)

    def complete_trajectory(
        self, trajectory_uid: str, reward: float | None = None, channel: str = DEFAULT_CHANNEL
    ) -> bool:
        """End the trajectory (its last step gets is_last and ``reward``); False when the
        server knows no such trajectory."""
        body = {"channel": channel} if reward is None else {"reward": reward, "channel": channel}
        try:
            self._compat(f"complete_trajectory/{quote(trajectory_uid, safe='')}", json=body)
        except ClawError as e:
            if e.status == 404:
                return False
            raise
        return True

    # --- consumer API ---------------------------------------------------------------------
    async def fetch_batch(
        self, batch_size: int, n_rollouts: int | None = None, channel: str = DEFAULT_CHANNEL
    ) -> Any:
        """The next ``batch_size`` prompt groups of ``channel``, converted; waits until there
        are that many; None once the channel is shut down (leases held then are nacked).
        ``n_rollouts`` is recorded: the server's groups decide how many rollouts they hold."""
        dataset = self._dataset(channel)
        await asyncio.to_thread(self.ack)
        held: list[Batch] = []
        groups: dict[str, list[dict[str, Any]]] = {}
        while len(groups) < batch_size:
            if self._is_shut(channel):
                await asyncio.to_thread(_nack_all, held)
                return None
            got = await asyncio.to_thread(
                self._client.pull,
                dataset,
                consumer=self._consumer,
                batch_size=batch_size - len(groups),
                unit="groups",
                format="steps",
                lease_seconds=self._lease_seconds,
                wait=self._poll_seconds,
            )
            if got:
                held.append(got)
                for row in got.batch["steps"]:
                    groups.setdefault(row.get("prompt_group_uid") or row["trajectory_uid"], []).append(row)
        rows = [
            r
            for members in groups.values()
            for r in sorted(members, key=lambda r: (r["trajectory_uid"], r["step_index"]))
            if not r.get("mask")
        ]
        try:
            result = self._convert(rows, held)
        except BaseException:
            await asyncio.to_thread(_nack_all, held)
            raise
        leases = [b.lease_id for b in held]
        self._step_leases = {uid: b.lease_id for b in held for uid in (b.manifest or {}).get("step_uids", [])}
        if self._ack_mode == "handover":
            await asyncio.to_thread(_ack_all, self._client, leases)
        else:
            self._unacked += leases
        c = self._count(channel)
        c["total_consumed"] += len(groups)
        c["fetch_count"] += 1
        c["last_fetch"] = {
            "fetch_count": c["fetch_count"],
            "batch_size": batch_size,
            "n_rollouts": n_rollouts if n_rollouts is not None else self._n_rollouts,
            "prompt_uids": list(groups),
            "step_count": len(rows),
            "masked_steps_left_out": sum(len(m) for m in groups.values()) - len(rows),
            "lease_ids": leases,
            "fetched_at": time.time(),
        }
        return result

    def ack(self) -> int:
        """Ack the batches handed over and not acked yet (``ack="next_fetch"``); how many."""
        leases, self._unacked = self._unacked, []
        _ack_all(self._client, leases)
        return len(leases)

    # --- lineage ---------------------------------------------------------------------------
    def open_run(
        self,
        *,
        name: str | None = None,
        config: Any = None,
        code_version: str | None = None,
        uid: str | None = None,
        channel: str = DEFAULT_CHANNEL,
    ) -> str:
        """Open the training run of this pool's consumer on ``channel``'s dataset (or
        continue run ``uid``); ``config`` defaults to the DataPoolConfig. Returns its uid."""
        self._run = self._client.open_run(
            consumer=self._consumer,
            dataset=self._dataset(channel),
            name=name or "claw-r1",
            config=_plain(config if config is not None else self._config),
            code_version=code_version,
            uid=uid,
        )
        return self._run.uid

    def set_policy_version(self, version: int, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Publish ``version`` as a checkpoint of the run (opened with defaults first when
        none is): it holds the leases acked since the previous one. The server's answer."""
        if self._run is None:
            self.open_run()
        return self._run.set_policy_version(version, metadata=metadata)

    def post_verdicts(self, data: Any, **kwargs: Any) -> dict[str, Any]:
        """The trainer's verdict on the last fetched batch's steps, by the lease each came in
        (``claw_client.integrations.verl.post_verdicts``; ``kwargs``: clip_ratio, ...)."""
        from .verl import post_verdicts

        return post_verdicts(self._client, data, lease_of=self._step_leases, **kwargs)

    # --- observability --------------------------------------------------------------------
    def get_statistics(self, channel: str = DEFAULT_CHANNEL) -> dict[str, Any]:
        """This actor's counters for ``channel`` with the server's view of the consumer on
        the channel's dataset: ``queue_size`` (ready groups waiting for it), ``dropped``."""
        c = self._count(channel)
        server = self._server_entry(channel)
        return {
            **{k: c[k] for k in ("total_produced", "total_consumed", "fetch_count", "last_fetch")},
            "total_dropped": sum((server.get("dropped") or {}).values()),
            "queue_size": server.get("pending_units"),
            "ready_prompt_groups": server.get("pending_units"),
            "max_queue_size": self._max_queue_size,
            "shutdown": self._is_shut(channel),
            "unacked_leases": len(self._unacked),
            "server": server,
        }

    def stats(self, channel: str = DEFAULT_CHANNEL) -> dict[str, Any]:
        c = self._count(channel)
        server = self._server_entry(channel)
        return {
            "consumed_prompt_groups": c["total_consumed"],
            "fetch_count": c["fetch_count"],
            "last_fetch": c["last_fetch"],
            "pending_prompt_groups": server.get("pending_units"),
            "ready_prompt_groups": server.get("pending_units"),
            "server": server,
        }

    # --- lifecycle ------------------------------------------------------------------------
    def shutdown(self, channel: str | None = None) -> None:
        """Stop serving ``channel`` (every channel when None): a waiting fetch_batch returns
        None after its current pull."""
        if channel is None:
            self._all_shut = True
        else:
            self._shutdown.add(channel)

    def put_validate(self, data: Any) -> None:
        self._val_queue.append(data)

    def get_validate(self) -> Any | None:
        return self._val_queue.pop(0) if self._val_queue else None

    # --- internals ------------------------------------------------------------------------
    def _convert(self, rows: list[dict[str, Any]], held: list[Batch]) -> Any:
        if self._training_backend is not None:
            return self._training_backend.convert(steps_of(rows))
        from .verl import to_dataproto

        data = to_dataproto(rows, metadata=True, **self._convert_kwargs)
        manifests = [b.manifest or {} for b in held]
        data.meta_info.update(
            lease_id=held[0].lease_id if len(held) == 1 else None,
            lease_ids=[b.lease_id for b in held],
            dataset_version=manifests[-1].get("dataset_version"),
            policy_versions=_sum_counts(m.get("policy_versions") or {} for m in manifests),
            staleness=_span(m.get("staleness") for m in manifests),
        )
        return data

    def _dataset(self, channel: str) -> str:
        try:
            return self._datasets[channel]
        except KeyError:
            raise ValueError(
                f"no dataset for channel {channel!r}: datasets names {sorted(self._datasets)}"
            ) from None

    def _is_shut(self, channel: str) -> bool:
        return self._all_shut or channel in self._shutdown

    def _count(self, channel: str) -> dict[str, Any]:
        return self._counters.setdefault(
            channel, {"total_produced": 0, "total_consumed": 0, "fetch_count": 0, "last_fetch": None}
        )

    def _server_entry(self, channel: str) -> dict[str, Any]:
        dataset = self._datasets.get(channel)
        try:
            status = self._client._json("GET", f"/consumers/{quote(self._consumer, safe='')}")
        except ClawError as e:
            if e.status == 404:  # it never pulled
                return {}
            raise
        for entry in status.get("datasets") or []:
            if entry.get("dataset") == dataset:
                return entry
        return {}

    def _compat(self, path: str, **kwargs: Any) -> Any:
        resp = self._client.http.request("POST", f"{self._client.base_url}/compat/claw-r1/{path}", **kwargs)
        if resp.status_code >= 400:
            from ..client import _error_of

            raise _error_of(resp)
        return resp.json()


def _payload(step: Any) -> dict[str, Any]:
    """A Claw-R1 StepPayload (JSON) of a Step or its dict; None fields left out."""
    if is_dataclass(step) and not isinstance(step, type):
        fields = asdict(step)
    elif isinstance(step, Mapping):
        fields = dict(step)
    else:
        fields = dict(vars(step))
    fields.pop("routed_experts", None)  # a numpy array per token: not for JSON
    for key in ("prompt_ids", "response_ids", "rollout_log_probs"):
        if fields.get(key) is not None:
            fields[key] = [x.item() if hasattr(x, "item") else x for x in fields[key]]
    return {k: v for k, v in fields.items() if v is not None}


def _plain(config: Any) -> dict[str, Any] | None:
    """A config as JSON: an OmegaConf config resolved, a dataclass or mapping as a dict,
    values JSON cannot hold as their text."""
    if config is None:
        return None
    if not isinstance(config, Mapping) and type(config).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(config, resolve=True)
    elif is_dataclass(config) and not isinstance(config, type):
        config = asdict(config)
    elif not isinstance(config, Mapping):
        config = dict(vars(config))
    return json.loads(json.dumps(dict(config), default=str))


def _field(config: Any, name: str, default: Any) -> Any:
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def _ack_all(client: ClawClient, leases: list[str]) -> None:
    for lease in leases:
        client.ack(lease)


def _nack_all(held: list[Batch]) -> None:
    for b in held:
        b.nack()


def _sum_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def _span(spans: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    found = [s for s in spans if s and s.get("min") is not None]
    if not found:
        return None
    return {"min": min(s["min"] for s in found), "max": max(s["max"] for s in found)}
