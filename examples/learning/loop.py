"""The closed loop, step by step: sample tasks, roll them out through the gateway, pull the
groups once the verifier has scored them, train, publish the next policy version, load it.

``middleware_run`` goes through the middleware (gateway, pool, task sampler, dataset with a
freshness rule); ``direct_run`` is the baseline, the same agents and trainer with the rows
read straight from the agents' process. Both return the learning curve and their timings:
``middleware_s`` is every second spent in the middleware, measured, not estimated: the
gateway's added latency (the agents' wall per chat call minus the policy server's time in
that call, so the gateway's two loopback hops count as its own) and every call to the pool's
API (groups, trajectory completion, the task sampler, pulls with their wait for readiness,
acks and policy versions).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np
import torch

from claw_client import ClawClient
from claw_client.integrations.verl import batch_rows

from .agent import Timings, direct_group, gateway_group, local_group
from .policy import DIGITS, new_model
from .policy_server import PolicyServer
from .trainer import grpo_step

MAX_STALENESS = 0  # the dataset's freshness rule: only the serving policy's rollouts


@dataclass
class Config:
    steps: int = 150
    groups: int = 2  # prompt groups per step
    rollouts: int = 6  # rollouts per group
    lr: float = 3e-3
    seed: int = 0
    permute: bool = False  # the control: the verifier's rewards permuted across the batch


@dataclass
class Result:
    curve: list[dict[str, Any]] = field(default_factory=list)  # one row per step
    wall_s: float = 0.0
    middleware_s: float = 0.0
    model_calls: int = 0
    parts_s: dict[str, float] = field(default_factory=dict)
    run: str | None = None  # the middleware run's training run (its checkpoints' lineage)

    def mean_reward(self, first: int | None = None, last: int | None = None) -> float:
        rows = self.curve[:first] if first is not None else self.curve[-(last or len(self.curve)) :]
        return float(np.mean([r["reward"] for r in rows]))


def tasks_of(name: str, n: int = 24, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` lookup tasks: each task's code (what the tool returns) is its ground truth."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        code = DIGITS[int(rng.integers(len(DIGITS)))]
        out.append({"uid": f"{name}-{i}", "prompt": None, "ground_truth": code, "metadata": {"code": code}})
    return out


def middleware_run(
    *,
    site: str,
    policy: PolicyServer,
    agent_key: str,
    agent_source: str,
    trainer_key: str,
    admin_key: str,
    name: str,
    cfg: Config,
    start_version: int = 0,
) -> Result:
    """``cfg.steps`` steps of the loop through the middleware, served by ``policy`` (the
    gateway's upstream; it is loaded with this run's fresh model first); tasks, the dataset (its agent
    key's source, ``agent_source``, only, ``max_staleness`` 0) and the consumer are named after ``name``."""
    model, opt, rng, control = _trainer(cfg)
    res, timings = Result(), Timings()
    with (
        ClawClient(site, agent_key) as agent,
        ClawClient(site, trainer_key) as trainer,
        ClawClient(site, admin_key) as admin,
        httpx.Client(timeout=60) as http,
    ):
        policy.load(model.state_dict(), start_version)
        busy0 = policy.busy_s
        agent.register_tasks(tasks_of(name), set=name)
        admin.create_dataset(name, filters={"max_staleness": MAX_STALENESS, "sources": [agent_source]})
        version = start_version
        trainer.set_policy_version(version)
        # One training run: each version it publishes is a checkpoint holding the leases
        # acked since the previous one (the lineage of every version).
        run = trainer.open_run(consumer=name, dataset=name, name=f"bench.learning {name}", config=asdict(cfg))
        res.run = run.uid
        t_start = time.perf_counter()
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            picked = agent.sample_tasks(
                cfg.groups, strategy="uniform", tasks={"set": name}, seed=int(rng.integers(2**31))
            )
            timings.add_api("sample_tasks", time.perf_counter() - t0)
            groups = []
            for g, task in enumerate(picked):
                group = f"{name}-s{step}-g{g}"
                groups.append(group)
                gateway_group(
                    agent,
                    site=site,
                    api_key=agent_key,
                    http=http,
                    task=task,
                    group=group,
                    rollouts=cfg.rollouts,
                    version=version,
                    timings=timings,
                )
            rows, leases = _pull_groups(trainer, name, set(groups), cfg.rollouts, timings)
            stats = grpo_step(model, opt, rows, permute=control)
            t0 = time.perf_counter()
            for lease in leases:
                trainer.ack(lease)
            version += 1
            run.set_policy_version(version)
            timings.add_api("ack_and_policy_version", time.perf_counter() - t0)
            policy.load(model.state_dict(), version)
            res.curve.append({"step": step, "policy_version": version - 1, **stats})
        res.wall_s = time.perf_counter() - t_start
        gateway_s = timings.model_call_s - (policy.busy_s - busy0)
    res.model_calls = timings.model_calls
    res.parts_s = {"gateway_added": gateway_s, **timings.api}
    res.middleware_s = gateway_s + timings.api_s
    return res


def direct_run(*, cfg: Config) -> Result:
    """The baseline: the same loop, the agents straight at the policy server, the rows handed
    to the trainer in-process (no gateway, no pool), tasks sampled uniformly here."""
    model, opt, rng, control = _trainer(cfg)
    tasks = tasks_of("direct")
    res, timings = Result(), Timings()
    with httpx.Client(timeout=60) as http, PolicyServer(model, seed=cfg.seed) as policy:
        t_start = time.perf_counter()
        for step in range(cfg.steps):
            rows = []
            for g in range(cfg.groups):
                task = tasks[int(rng.integers(len(tasks)))]
                rows += direct_group(
                    policy_url=policy.url,
                    http=http,
                    task=task,
                    group=f"direct-s{step}-g{g}",
                    rollouts=cfg.rollouts,
                    timings=timings,
                )
            stats = grpo_step(model, opt, rows, permute=control)
            policy.load(model.state_dict(), step + 1)
            res.curve.append({"step": step, "policy_version": step, **stats})
        res.wall_s = time.perf_counter() - t_start
    res.model_calls = timings.model_calls
    return res


def local_run(*, cfg: Config) -> Result:
    """The loop with the policy server's ``complete`` called in-process (no HTTP, no
    middleware): the same policy, rollouts, verifier and trainer, in milliseconds a step."""
    model, opt, rng, control = _trainer(cfg)
    tasks = tasks_of("local")
    policy = PolicyServer(model, seed=cfg.seed)  # never started: complete() only
    res = Result()
    try:
        t_start = time.perf_counter()
        for step in range(cfg.steps):
            rows = []
            for g in range(cfg.groups):
                task = tasks[int(rng.integers(len(tasks)))]
                rows += local_group(policy, task=task, group=f"local-s{step}-g{g}", rollouts=cfg.rollouts)
            stats = grpo_step(model, opt, rows, permute=control)
            policy.load(model.state_dict(), step + 1)
            res.curve.append({"step": step, "policy_version": step, **stats})
        res.wall_s = time.perf_counter() - t_start
    finally:
        policy.close()
    return res


def _pull_groups(
    trainer: ClawClient, dataset: str, groups: set[str], rollouts: int, timings: Timings
) -> tuple[list[dict[str, Any]], list[str]]:
    """Pull (padded format, long-polling for readiness) until this step's groups are all in,
    whole. A group split across batches, or one of another step, is a fidelity defect."""
    rows: list[dict[str, Any]] = []
    leases: list[str] = []
    seen: set[str] = set()
    t0 = time.perf_counter()
    while seen != groups:
        if time.perf_counter() - t0 > 60:
            raise TimeoutError(f"groups {sorted(groups - seen)} were not served within 60 s")
        batch = trainer.pull(dataset, consumer=dataset, batch_size=len(groups), format="padded", wait=10)
        if not batch:
            continue
        got, _ = batch_rows(batch)
        leases.append(batch.lease_id)
        these = {str(r["prompt_group_uid"]) for r in got}
        if these - groups or these & seen:
            raise AssertionError(f"pulled groups {sorted(these)} while waiting for {sorted(groups - seen)}")
        for g in these:
            n = len({r["trajectory_uid"] for r in got if r["prompt_group_uid"] == g})
            if n != rollouts:
                raise AssertionError(f"group {g} came with {n} of its {rollouts} rollouts")
        seen |= these
        rows += got
    timings.add_api("pull", time.perf_counter() - t0)
    return rows, leases


def _trainer(
    cfg: Config,
) -> tuple[Any, torch.optim.Optimizer, np.random.Generator, np.random.Generator | None]:
    """What every loop starts from, the same for the run, the control and the baselines: the
    seeded model on one torch thread, its Adam, the rollouts' rng, and the control's rng that
    permutes the verifier's rewards (None outside the control)."""
    model = new_model(cfg.seed)
    torch.set_num_threads(1)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    control = np.random.default_rng(cfg.seed + 1) if cfg.permute else None
    return model, opt, rng, control
