"""An HTTP client of the Claw-R1 API for agents and trainers (httpx; no Django).

Agents submit steps, open and complete trajectories, post rewards, events and feedback.
Trainers pull batches under leases::

    with ClawClient(url, key) as claw:
        with claw.pull("train", consumer="ppo") as batch:   # acks on exit, nacks if it raises
            if batch:
                train(batch.steps)                        # token arrays as numpy

A pull that finds nothing ready returns an empty Batch: falsy, and its ``with`` block does
not ack or nack anything. Errors are ``ClawError`` built from the server's error body.

A training run records which data trained which checkpoint::

    run = claw.open_run(consumer="ppo", dataset="train", config={"lr": 1e-6}, code_version=sha)
    with claw.pull("train", consumer="ppo") as batch:
        train(batch.steps)
    run.set_policy_version(1)          # checkpoint 1: the leases acked since the run opened
    run.step_uids(1)                    # what trained it; claw.step_checkpoints(uid): the other way
    for batch in run.replay():          # every batch of the run, byte for byte, in order
        ...
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote

import httpx

from .formats import batch_steps
from .media import MediaCache, check_sha256, image_refs, to_pil
from .wire import MSGPACK, encode_step_batch

# The server caps a long-poll at 30 s; an endless iterator waits that long per pull.
FOREVER_WAIT_SECONDS = 30.0


class ClawError(Exception):
    """An error answer of the server: HTTP status and the body's error type, message, param."""

    def __init__(
        self, status: int, type: str, message: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(f"{status} {type}: {message}" + (f" (param {param})" if param else ""))
        self.status = status
        self.type = type
        self.message = message
        self.param = param
        self.code = code


class Batch:
    """One pull's answer: ``lease_id``, ``manifest``, the ``batch`` as parsed JSON and the
    ``raw`` bytes served. Empty (falsy, all None) when nothing was ready.

    It reads every format the server serves (``format``: ``steps``, ``padded`` or ``tree``):
    ``len(batch)`` is its number of steps, ``batch.steps`` one dict per step in batch order
    with token ids and logprobs as numpy arrays (claw_client/formats.py: padded rows are cut
    back to their real tokens by their masks, tree steps read back from the packed layout),
    and iterating over it gives those steps. A format this client does not know (a newer
    server's) still loads, with ``len`` and ``repr``: its ``steps`` raises TypeError naming
    it, and ``batch`` holds its JSON.

    As a context manager it acks the lease when its block ends normally and nacks it when the
    block raises (the exception propagates); an empty batch does neither.
    """

    def __init__(self, raw: bytes, client: ClawClient | None = None):
        self.raw = raw
        body = json.loads(raw)
        self.lease_id: str | None = body.get("lease_id")
        self.manifest: dict[str, Any] | None = body.get("manifest")
        self.batch: dict[str, Any] | None = body.get("batch")
        self._client = client
        self._steps: list[dict[str, Any]] | None = None

    def __bool__(self) -> bool:
        return self.lease_id is not None

    @property
    def format(self) -> str | None:
        """The format it was served in (``steps``, ``padded``, ``tree``); None when empty."""
        return self.manifest.get("format") if self.manifest else None

    @property
    def use_indexes(self) -> dict[str, int]:
        """Each step uid's use index: which use of its unit by this consumer this delivery
        is, from 0. A dataset with a reuse budget (``serving.reuse.max_uses`` K > 1) may
        deliver a unit up to K times, one use at a time; without one every use is 0 (the
        manifest then has no ``use_indexes``). Empty for an empty batch."""
        if not self.manifest:
            return {}
        uids = self.manifest["step_uids"]
        return dict(zip(uids, self.manifest.get("use_indexes") or [0] * len(uids), strict=True))

    def __len__(self) -> int:
        """The number of steps, whatever the format (the manifest's ``step_uids``)."""
        return len(self.manifest["step_uids"]) if self.manifest else 0

    def __repr__(self) -> str:
        return f"Batch(lease_id={self.lease_id!r}, format={self.format!r}, steps={len(self)})"

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The steps, in batch order, with ``prompt_ids`` and ``response_ids`` as int32 arrays
        and ``rollout_logprobs`` as float64 arrays (None where a step has none), in every
        format (claw_client.formats.batch_steps): a ``steps`` batch's steps carry every field
        served; a ``padded`` or ``tree`` batch's the fields of its per-row lists (uid,
        trajectory_uid, prompt_group_uid, step_index, policy_version, staleness, mask, reward,
        reward_scope, reward_source, images). ``batch`` keeps the JSON as served. Raises
        TypeError for a format this client has no step view of."""
        if self._steps is None:
            self._steps = batch_steps(self.batch, self.format) if self.batch else []
        return self._steps

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.steps)

    def ack(self) -> dict[str, Any] | None:
        return self._lease_client().ack(self.lease_id) if self else None  # type: ignore[arg-type]

    def nack(self) -> dict[str, Any] | None:
        return self._lease_client().nack(self.lease_id) if self else None  # type: ignore[arg-type]

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self:
            if exc_type is None:
                self.ack()
            else:
                self.nack()

    def _lease_client(self) -> ClawClient:
        if self._client is None:
            raise RuntimeError("this Batch is not bound to a ClawClient")
        return self._client


class ClawClient:
    """The API at ``base_url`` (e.g. ``http://host:8000``) with one API key. Closes its
    connection pool when used as a context manager, or by ``close()``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 60.0,
        media_cache: str | os.PathLike[str] | None = None,
        **httpx_kwargs: Any,
    ):
        self.base_url = base_url.rstrip("/")
        # Images by sha256 on disk (claw_client/media.py): ``media_cache`` or the default
        # (~/.cache/claw_client/media, $CLAW_CLIENT_MEDIA_CACHE).
        self.media_cache = MediaCache(media_cache)
        self.http = httpx.Client(
            base_url=f"{self.base_url}/api/v1",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            **httpx_kwargs,
        )
        self.last_task_sample: dict[str, Any] | None = None  # record id and seed of sample_tasks

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ClawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- agents -----------------------------------------------------------------------------
    def submit_steps(self, steps: list[dict[str, Any]], *, msgpack: bool = False) -> dict[str, Any]:
        """Submit a batch of steps (atomic, idempotent by uid); ``msgpack`` sends MessagePack
        with token arrays packed (wire.encode_step_batch)."""
        if msgpack:
            return self._json(
                "POST", "/steps", content=encode_step_batch(steps), headers={"Content-Type": MSGPACK}
            )
        return self._json("POST", "/steps", json={"steps": steps})

    def open_trajectory(
        self,
        uid: str | None = None,
        *,
        prompt_group_uid: str | None = None,
        channel: str | None = None,
        policy_version: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create a trajectory (idempotent by uid); the answer holds its capability ``base_url``."""
        body = _present(
            uid=uid,
            prompt_group_uid=prompt_group_uid,
            channel=channel,
            policy_version=policy_version,
            metadata=metadata,
        )
        return self._json("POST", "/trajectories", json=body)

    def complete_trajectory(
        self,
        uid: str,
        reward: float | None = None,
        status: str = "completed",
        *,
        reward_source: str | None = None,
    ) -> dict[str, Any]:
        body = _present(reward=reward, status=status, reward_source=reward_source)
        return self._json("POST", f"/trajectories/{quote(uid, safe='')}/complete", json=body)

    def complete_trajectories(self, completions: Iterable[dict[str, Any]]) -> int:
        """End many trajectories at once (all or none): items ``{"uid", "reward", "status"}``."""
        return self._json("POST", "/trajectory-completions", json={"completions": list(completions)})[
            "completed"
        ]

    def rewards(self, rewards: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """Late rewards: items ``{"step_uid" | "trajectory_uid", "reward", "final"}``."""
        return self._json("POST", "/rewards", json={"rewards": list(rewards)})

    def event(
        self,
        type: str,
        *,
        payload: dict[str, Any] | None = None,
        trajectory_uid: str | None = None,
        step_uid: str | None = None,
        occurred_at: str | None = None,
    ) -> dict[str, Any]:
        body = _present(
            type=type,
            payload=payload,
            trajectory_uid=trajectory_uid,
            step_uid=step_uid,
            occurred_at=occurred_at,
        )
        return self._json("POST", "/events", json=body)

    def feedback(
        self,
        *,
        step_uid: str | None = None,
        trajectory_uid: str | None = None,
        rating: float | None = None,
        label: str | None = None,
        correction: str | None = None,
        comment: str | None = None,
        author: str | None = None,
    ) -> dict[str, Any]:
        body = _present(
            step_uid=step_uid,
            trajectory_uid=trajectory_uid,
            rating=rating,
            label=label,
            correction=correction,
            comment=comment,
            author=author,
        )
        return self._json("POST", "/feedback", json=body)

    def set_policy_version(
        self,
        version: int,
        *,
        current: bool = True,
        metadata: dict[str, Any] | None = None,
        policy: str | None = None,
        run: str | None = None,
    ) -> dict[str, Any]:
        """Publish a policy version (and by default make it ``policy``'s current one). With
        ``run`` (a run's uid) it is also a checkpoint of that run: the answer's
        ``checkpoint`` says how many acked leases it took (``Run.set_policy_version``)."""
        body = _present(version=version, current=current, metadata=metadata, policy=policy, run=run)
        return self._json("POST", "/policy-versions", json=body)

    # --- tasks: what to roll out next ------------------------------------------------------
    def register_tasks(self, tasks: Iterable[dict[str, Any]], *, set: str | None = None) -> dict[str, Any]:
        """Register tasks in bulk, idempotent by uid: items ``{"uid", "set", "prompt",
        "ground_truth", "metadata"}`` (``set`` fills in items without one). Returns the
        created / updated / unchanged counts and each task's status."""
        items = [dict(t) if set is None or "set" in t else {**t, "set": set} for t in tasks]
        return self._json("POST", "/tasks", json={"tasks": items})

    def sample_tasks(
        self,
        n: int = 64,
        *,
        strategy: str = "informative",
        tasks: dict[str, Any] | None = None,
        seed: int | None = None,
        **options: Any,
    ) -> list[dict[str, Any]]:
        """The tasks to roll out next (``POST /task-sampler``, recorded by the pool): ``strategy``
        one of uniform, least_seen, informative, easy_to_hard; ``tasks`` filters them as
        ``GET /tasks`` does (``{"set": "train"}``); ``options``: explore_below,
        explore_fraction, temperature, target. Each item has uid, prompt, ground_truth,
        metadata, reason and stats; the answer's record id and seed are on
        ``last_task_sample``."""
        body = _present(n=n, strategy=strategy, tasks=tasks, seed=seed, **options)
        answer = self._json("POST", "/task-sampler", json=body)
        self.last_task_sample = {"record": answer["record"], "seed": answer["seed"]}
        return answer["tasks"]

    def open_group(
        self,
        uid: str,
        *,
        expected_rollouts: int | None = None,
        task: str | None = None,
        dataset: str | None = None,
        ground_truth: Any = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create (or update) a prompt group; ``task``: the uid of the task it rolls out."""
        body = _present(
            uid=uid,
            expected_rollouts=expected_rollouts,
            task=task,
            dataset=dataset,
            ground_truth=ground_truth,
            metadata=metadata,
        )
        return self._json("POST", "/groups", json=body)

    def list_tasks(self, **query: Any) -> list[dict[str, Any]]:
        """Every task matching ``query`` (filters and ``sort`` of ``GET /tasks``), page by page."""
        out: list[dict[str, Any]] = []
        params: dict[str, Any] | None = {k: v for k, v in query.items() if v is not None}
        url = "/tasks"
        while url:
            page = self._json("GET", url, params=params)
            out.extend(page["results"])
            url = page["next"] or ""
            params = None  # the next link carries the query and the cursor
        return out

    # --- datasets (admin keys) --------------------------------------------------------------
    def create_dataset(
        self,
        name: str,
        *,
        filters: dict[str, Any] | None = None,
        grouping: dict[str, Any] | None = None,
        description: str = "",
    ) -> dict[str, Any]:
        body = _present(name=name, filters=filters, grouping=grouping, description=description)
        return self._json("POST", "/datasets", json=body)

    # --- trainers ---------------------------------------------------------------------------
    def pull(
        self,
        dataset: str,
        *,
        consumer: str,
        batch_size: int = 64,
        unit: str = "groups",
        format: str = "steps",
        lease_seconds: int = 300,
        wait: float = 0,
    ) -> Batch:
        """Lease the next batch of ``dataset`` to ``consumer`` (long-polls up to ``wait``
        seconds). An empty, falsy Batch when nothing is ready."""
        body = {
            "dataset": dataset,
            "batch_size": batch_size,
            "unit": unit,
            "format": format,
            "lease_seconds": lease_seconds,
            "wait": wait,
        }
        resp = self._request("POST", f"/consumers/{quote(consumer, safe='')}/pull", json=body)
        return Batch(resp.content, self)

    def batches(
        self, dataset: str, *, consumer: str, forever: bool = False, wait: float = 0, **pull: Any
    ) -> Iterator[Batch]:
        """Pull and yield batches until one pull finds nothing ready; with ``forever``, keep
        long-polling (``wait``, else 30 s per pull) instead. Each batch is the caller's to ack
        (``with batch:``): one left alone is redelivered when its lease expires."""
        if forever and not wait:
            wait = FOREVER_WAIT_SECONDS
        while True:
            batch = self.pull(dataset, consumer=consumer, wait=wait, **pull)
            if batch:
                yield batch
            elif not forever:
                return

    def ack(self, lease_id: str) -> dict[str, Any]:
        """The batch was consumed: its units are done for this consumer (idempotent)."""
        return self._json("POST", f"/leases/{lease_id}/ack")

    def nack(self, lease_id: str) -> dict[str, Any]:
        """Give the batch back: its units are deliverable again."""
        return self._json("POST", f"/leases/{lease_id}/nack")

    def replay(self, lease_id: str) -> bytes:
        """The lease's pull answer exactly as first served, byte for byte."""
        return self._request("GET", f"/leases/{lease_id}/batch").content

    def replay_batch(self, lease_id: str) -> Batch:
        return Batch(self.replay(lease_id), self)

    # --- training runs and lineage -----------------------------------------------------------
    def open_run(
        self,
        *,
        consumer: str,
        dataset: str,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        code_version: str | None = None,
        policy: str | None = None,
        uid: str | None = None,
        versions: ClawClient | None = None,
    ) -> Run:
        """Open a training run (``POST /runs``): the consumer it pulls as and the dataset it
        reads; ``config`` and ``code_version`` are kept as given. Idempotent by ``uid``
        (minted by the server when None): a trainer that restarts reopens its run.
        ``versions``: the client that publishes its checkpoints (default: this one)."""
        body = _present(
            consumer=consumer,
            dataset=dataset,
            name=name,
            config=config,
            code_version=code_version,
            policy=policy,
            uid=uid,
        )
        return Run(self, self._json("POST", "/runs", json=body), versions=versions)

    def run(self, uid: str) -> Run:
        """The run ``uid`` (``GET /runs/{uid}``)."""
        return Run(self, self._json("GET", f"/runs/{_seg(uid)}"))

    def runs(self) -> list[dict[str, Any]]:
        """Every run this key reads, newest first."""
        return self.pages("/runs")

    def step_checkpoints(self, uid: str) -> list[dict[str, Any]]:
        """The checkpoints a step trained: ``{"run", "version", "created_at", "uses"}``."""
        return self.pages(f"/steps/{quote(uid, safe='')}/checkpoints")

    def trajectory_checkpoints(self, uid: str) -> list[dict[str, Any]]:
        """The checkpoints a trajectory's steps trained."""
        return self.pages(f"/trajectories/{quote(uid, safe='')}/checkpoints")

    def source_checkpoints(self, name: str) -> list[dict[str, Any]]:
        """The checkpoints a source's data trained."""
        return self.pages(f"/sources/{quote(name, safe='')}/checkpoints")

    def replay_run(self, uid: str) -> Iterator[ReplayedBatch]:
        """Every batch of run ``uid`` in its order (its checkpoints in version order, each
        one's leases in ack order), byte for byte as first served (``raw``), each with its
        ``checkpoint`` version and ``removed_steps``: the uids of its steps removed from
        the pool since (named, never skipped: the batch still holds them as served)."""
        checkpoint: dict[str, Any] = {}
        removed: dict[str, list[str]] = {}
        for line in self._lines(f"/runs/{_seg(uid)}/replay"):
            if line.startswith(b'{"lease_id":'):
                batch = ReplayedBatch(line)
                batch.checkpoint = checkpoint.get("version")
                batch.removed_steps = removed.get(batch.lease_id or "", [])
                yield batch
                continue
            meta = json.loads(line)
            if meta.get("type") == "checkpoint":
                checkpoint = meta
                removed = {x["lease_id"]: x["removed_steps"] for x in meta["leases"]}

    def download_run(self, uid: str, path: str) -> str:
        """A snapshot of run ``uid``: its replay as a JSON-lines file at ``path`` (a
        ``run`` line, then per checkpoint a ``checkpoint`` line and its batches as served)."""
        return self._download(f"/runs/{_seg(uid)}/replay", path)

    def post_verdicts(self, lease_id: str, steps: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """A trainer's verdict on the steps of a lease it trained on (``POST
        /leases/{id}/verdicts``): items ``{"uid", "importance_ratio", "logprob_kl",
        "advantage", "clipped_fraction", "tokens": {name: [one per response token]}}``
        (every statistic optional). Answers how many were stored and flagged."""
        return self._json("POST", f"/leases/{lease_id}/verdicts", json={"steps": list(steps)})

    def pages(self, path: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every result of a keyset-paged list, page by page (its ``next`` links)."""
        out: list[Any] = []
        url: str = path
        while url:
            page = self._json("GET", url, params=params)
            out.extend(page["results"])
            url = page["next"] or ""
            params = None  # the next link carries the query and the cursor
        return out

    def _download(self, url: str, path: str, params: dict[str, str] | None = None) -> str:
        """Stream the answer of ``GET url`` to the file ``path`` (an error answer raises its
        ClawError, writing nothing); returns ``path``."""
        with self.http.stream("GET", url, params=params) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise _error_of(resp)
            with open(path, "wb") as fh:
                for chunk in resp.iter_bytes():
                    fh.write(chunk)
        return path

    def _lines(self, path: str) -> Iterator[bytes]:
        """A streamed answer's lines, as bytes (exactly as sent, without the newline)."""
        with self.http.stream("GET", path) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise _error_of(resp)
            pending: list[bytes] = []  # the line being read, in pieces (a batch spans chunks)
            for chunk in resp.iter_bytes():
                start = 0
                while (end := chunk.find(b"\n", start)) != -1:
                    pending.append(chunk[start:end])
                    yield b"".join(pending)
                    pending, start = [], end + 1
                if start < len(chunk):
                    pending.append(chunk[start:])
            if pending:
                yield b"".join(pending)

    # --- snapshots --------------------------------------------------------------------------
    def snapshot(
        self,
        dataset: str,
        *,
        format: str | None = None,
        min_reward: float | None = None,
        margin: float | None = None,
        timeout: float = 600.0,
    ) -> dict[str, Any]:
        """Freeze what ``dataset`` admits now (POST /snapshots, optionally with the TRL export
        ``format`` ``sft`` / ``dpo`` and its ``min_reward`` / ``margin``) and wait until it is
        built: its status, once done. A failed build raises ClawError (status 500, type
        ``snapshot_failed``); one not done in ``timeout`` seconds raises TimeoutError."""
        body = _present(dataset=dataset, format=format, min_reward=min_reward, margin=margin)
        snap = self._json("POST", "/snapshots", json=body)
        deadline = time.monotonic() + timeout
        delay = 0.05
        while snap["status"] not in ("done", "failed"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"snapshot {snap['id']} not built in {timeout} s")
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            snap = self._json("GET", f"/snapshots/{snap['id']}")
        if snap["status"] == "failed":
            raise ClawError(500, "snapshot_failed", snap.get("error") or "", "snapshot")
        return snap

    def download_snapshot(self, snapshot_id: str, format: str, path: str) -> str:
        """Stream a done snapshot's file (``jsonl``, ``parquet``, ``sft`` or ``dpo``) to
        ``path``; returns ``path``."""
        return self._download(f"/snapshots/{snapshot_id}/download", path, params={"format": format})

    # --- images (issue 24) ------------------------------------------------------------------
    def fetch_media(self, sha256: str) -> bytes:
        """The bytes of the stored image ``sha256`` (GET /media/<sha256>), from the disk cache
        when there, else downloaded once, checked against the hash and cached. Raises
        ClawError (type ``sha256_mismatch``) when the bytes served do not hash to it."""
        cached = self.media_cache.get(check_sha256(sha256))
        if cached is not None:
            return cached
        resp = self._request("GET", f"/media/{sha256}")
        data = resp.content
        got = hashlib.sha256(data).hexdigest()
        if got != sha256:
            raise ClawError(
                resp.status_code,
                "sha256_mismatch",
                f"image {sha256} was served as bytes hashing to {got}",
                "sha256",
            )
        self.media_cache.put(sha256, data)
        return data

    def media_bytes(self, row: dict[str, Any]) -> list[bytes]:
        """A row's stored images' bytes, in order (claw_client.media.image_refs); no Pillow."""
        return [self.fetch_media(r["sha256"]) for r in image_refs(row)]

    def images(self, row: dict[str, Any]) -> list[Any]:
        """A row's stored images as loaded PIL images, in order (needs Pillow: the ``images``
        extra). Each is downloaded once (the disk cache); remote images are left out."""
        return to_pil(self.media_bytes(row))

    # --- transport --------------------------------------------------------------------------
    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        resp = self.http.request(method, path, **kwargs)
        if resp.status_code >= 400:
            raise _error_of(resp)
        return resp


class ReplayedBatch(Batch):
    """A batch of a run's replay (``ClawClient.replay_run``): ``raw`` as first served, the
    ``checkpoint`` (version) whose data it is, and ``removed_steps``. Not bound to a client:
    it was acked long ago, so it neither acks nor nacks."""

    checkpoint: int | None = None
    removed_steps: list[str]

    def __init__(self, raw: bytes):
        super().__init__(raw, None)
        self.removed_steps = []


class Run:
    """A training run (``ClawClient.open_run``): ``uid`` and the server's ``info``. Each
    policy version published through it is a checkpoint of the run, holding the leases its
    consumer acked since the previous one."""

    def __init__(self, client: ClawClient, info: dict[str, Any], *, versions: ClawClient | None = None):
        self.client = client
        self.versions = versions or client
        self.info = info
        self.uid: str = info["uid"]

    def __repr__(self) -> str:
        return f"Run(uid={self.uid!r}, consumer={self.info.get('consumer')!r}, dataset={self.info.get('dataset')!r})"

    def set_policy_version(
        self, version: int, *, current: bool = True, metadata: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Publish ``version`` of the run's policy as a checkpoint of this run (and, by
        default, the current version); the answer's ``checkpoint`` says how many acked
        leases it took. Idempotent for the run's last checkpoint."""
        return self.versions.set_policy_version(
            version, current=current, metadata=metadata, policy=self.info.get("policy"), run=self.uid
        )

    def refresh(self) -> dict[str, Any]:
        """The run as the server sees it now: checkpoints, last one, acks not taken yet."""
        self.info = self.client._json("GET", f"/runs/{_seg(self.uid)}")
        return self.info

    def checkpoints(self) -> list[dict[str, Any]]:
        """Its checkpoints in version order: version, leases, steps, mean reward."""
        return self.client.pages(f"/runs/{_seg(self.uid)}/checkpoints")

    def checkpoint(self, version: int) -> dict[str, Any]:
        """What is behind checkpoint ``version``: leases in ack order, counts of steps,
        trajectories, sources, tasks and dataset versions."""
        return self.client._json("GET", f"/runs/{_seg(self.uid)}/checkpoints/{int(version)}")

    def steps(self, version: int) -> list[dict[str, Any]]:
        """The steps behind checkpoint ``version`` in the order served: position, uid,
        trajectory uid, lease, removed."""
        return self.client.pages(f"/runs/{_seg(self.uid)}/checkpoints/{int(version)}/steps")

    def step_uids(self, version: int) -> list[str]:
        """Every step uid behind checkpoint ``version``, in order (one download)."""
        path = f"/runs/{_seg(self.uid)}/checkpoints/{int(version)}/steps/download"
        return [line.decode() for line in self.client._lines(path) if line]

    def trajectories(self, version: int) -> list[dict[str, Any]]:
        return self.client.pages(f"/runs/{_seg(self.uid)}/checkpoints/{int(version)}/trajectories")

    def diff(self, version: int, to: int, *, to_run: str | None = None) -> dict[str, Any]:
        """How checkpoint ``to``'s data (of ``to_run``, default this run) differs from
        ``version``'s: ``counts`` and every step uid ``added``, ``removed`` and ``common``."""
        path = f"/runs/{_seg(self.uid)}/checkpoints/{int(version)}/diff"
        out: dict[str, Any] = {}
        for side in ("added", "removed", "common"):
            params = _present(to=to, to_run=to_run, side=side)
            first = self.client._json("GET", path, params=params)
            out.setdefault("counts", first["counts"])
            uids = list(first["results"])
            if first["next"]:
                uids += self.client.pages(first["next"])
            out[side] = uids
        return out

    def replay(self) -> Iterator[ReplayedBatch]:
        """Every batch of the run in its order, byte for byte (``ClawClient.replay_run``)."""
        return self.client.replay_run(self.uid)

    def download(self, path: str) -> str:
        return self.client.download_run(self.uid, path)


def _seg(value: str) -> str:
    return quote(value, safe="")


def _present(**fields: Any) -> dict[str, Any]:
    """The fields that were given (not None): the server applies its own defaults."""
    return {k: v for k, v in fields.items() if v is not None}


def _error_of(resp: httpx.Response) -> ClawError:
    try:
        err = resp.json()["error"]
        return ClawError(
            resp.status_code,
            err.get("type") or "error",
            err.get("message") or "",
            err.get("param"),
            err.get("code"),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return ClawError(resp.status_code, "http_error", resp.text[:500] or resp.reason_phrase)
