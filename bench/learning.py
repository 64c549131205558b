"""bench.learning: proof that it trains, an RL run through the middleware on CPU.

    python -m bench.learning [--steps 150] [--seed 0] [--plot docs/learning_curve.png]

One live server (tests/live.py: uvicorn, its own SQLite file, or a fresh PostgreSQL database
under DATABASE_URL) whose gateway's upstream is the policy server of examples/learning/ (a
tiny causal LM, served with exact prompt/response ids and logprobs as vLLM does). Each step:
the task sampler picks 2 tasks, 6 ``openai`` SDK agents per task call the gateway's
trajectory URLs (the ``lookup`` tool call, its result, the answer), the pool's ``exact``
verifier scores each completed trajectory, the trainer (``claw_client`` only) pulls the two
groups in the ``padded`` format from a dataset with ``max_staleness`` 0, takes a GRPO step
with verl's advantage and policy loss, and publishes the next policy version, which the
policy server loads. Three runs in one invocation: the run, the control (the same loop with
the verifier's rewards permuted across each batch's rollouts: must not learn), and the
direct baseline (the same agents and trainer, no gateway and no pool).

Prints progress on stderr and one JSON line: ``initial_reward`` (mean over the first 10% of
steps), ``final_reward`` and ``control_final_reward`` (the last 10%), ``train_steps``,
``wall_s``, ``middleware_ms_per_call`` (every second the run spent in the middleware, over
its agents' model calls), ``middleware_share`` (of the run's wall time),
``middleware_share_at_1s_calls`` (the same per-call cost beside a policy whose calls take
1 s), ``direct_over_middleware_steps_per_s`` and the parts of the middleware's time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from examples.learning.loop import Config, Result, direct_run, middleware_run
from examples.learning.policy import new_model
from examples.learning.policy_server import PolicyServer
from tests.live import live_server

KEYS = """
from pool.services.api_keys import api_key_create
for name, scopes in (("agent-run", ["ingest"]), ("agent-control", ["ingest"]),
                     ("trainer", ["consume", "policy"]), ("admin", ["admin"])):
    print(api_key_create(name=name, scopes=scopes)[1])
"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="", help="write the learning curve PNG here")
    a = p.parse_args(argv)
    out = run(a.steps, a.seed, a.plot)
    print(json.dumps(out), flush=True)


def run(steps: int, seed: int, plot: str = "") -> dict:
    t0 = time.perf_counter()
    cfg = Config(steps=steps, seed=seed)
    with (
        tempfile.TemporaryDirectory() as tmp,
        PolicyServer(new_model(seed), seed=seed) as policy,
        live_server(Path(tmp), {"CLAW_UPSTREAM_URL": policy.url, "REDIS_URL": ""}) as srv,
    ):
        run_key, control_key, trainer, admin = srv.manage("shell", "-c", KEYS).strip().splitlines()[-4:]
        common = {"site": srv.url, "policy": policy, "trainer_key": trainer, "admin_key": admin}
        _log("run")
        main_run = middleware_run(**common, agent_key=run_key, agent_source="agent-run", name="run", cfg=cfg)
        _log("control")
        control = middleware_run(
            **common,
            agent_key=control_key,
            agent_source="agent-control",
            name="control",
            cfg=Config(steps=steps, seed=seed, permute=True),
            start_version=steps,
        )
    _log("direct")
    direct = direct_run(cfg=cfg)
    tail = max(1, steps // 10)
    per_call_ms = 1000 * main_run.middleware_s / main_run.model_calls
    mw_steps_per_s = steps / main_run.wall_s
    direct_steps_per_s = steps / direct.wall_s
    out = {
        "initial_reward": round(main_run.mean_reward(first=tail), 3),
        "final_reward": round(main_run.mean_reward(last=tail), 3),
        "control_final_reward": round(control.mean_reward(last=tail), 3),
        "direct_final_reward": round(direct.mean_reward(last=tail), 3),
        "train_steps": steps,
        "rollouts_per_step": cfg.groups * cfg.rollouts,
        "model_calls": main_run.model_calls,
        "wall_s": round(main_run.wall_s, 1),
        "middleware_ms_per_call": round(per_call_ms, 2),
        "middleware_share": round(main_run.middleware_s / main_run.wall_s, 3),
        "middleware_share_at_1s_calls": round(per_call_ms / (per_call_ms + 1000), 4),
        "middleware_parts_ms_per_call": {
            k: round(1000 * v / main_run.model_calls, 2) for k, v in main_run.parts_s.items()
        },
        "middleware_steps_per_s": round(mw_steps_per_s, 3),
        "direct_steps_per_s": round(direct_steps_per_s, 3),
        "direct_over_middleware_steps_per_s": round(direct_steps_per_s / mw_steps_per_s, 2),
        "max_logprob_gap": max(r["max_logprob_gap"] for r in main_run.curve),
        "total_s": round(time.perf_counter() - t0, 1),
    }
    if plot:
        _plot(plot, main_run, control, direct)
    return out


def _plot(path: str, run: Result, control: Result, direct: Result) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    def smooth(res: Result) -> tuple[list[int], np.ndarray]:
        r = np.array([c["reward"] for c in res.curve])
        k = 5
        return [c["policy_version"] for c in res.curve][k - 1 :], np.convolve(r, np.ones(k) / k, "valid")

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for res, label in (
        (run, "through the middleware"),
        (control, "control: rewards permuted"),
        (direct, "direct baseline"),
    ):
        x, y = smooth(res)
        x = [v - res.curve[0]["policy_version"] for v in x]
        ax.plot(x, y, label=label)
    ax.set_xlabel("policy version (training steps)")
    ax.set_ylabel("mean reward (5-step mean)")
    ax.set_ylim(0, 1.02)
    ax.set_title("bench.learning: lookup-and-answer, 12 rollouts per step (2-core CPU)")
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path)


def _log(msg: str) -> None:
    print(f"bench.learning: {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
