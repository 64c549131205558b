"""The learning loop of examples/learning/ (bench.learning's modules): the policy learns the
lookup-and-answer task with GRPO and the permuted control does not (seeded, in-process
rollouts: seconds); and the loop closes through a live middleware, serving back exactly what
the policy sampled (ids, logprobs, the verifier's reward on the answer step, whole groups,
the serving policy's version)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("verl")
pytest.importorskip("openai")

from examples.learning.loop import Config, local_run, middleware_run  # noqa: E402
from examples.learning.policy import new_model  # noqa: E402
from examples.learning.policy_server import PolicyServer  # noqa: E402
from tests.live import LiveServer, live_server  # noqa: E402

STEPS = 200
WINDOW = 10  # steps averaged at each end of the curve
KEYS = """
from pool.services.api_keys import api_key_create
for name, scopes in (("agent-loop", ["ingest"]), ("trainer", ["consume", "policy"]), ("admin", ["admin"])):
    print(api_key_create(name=name, scopes=scopes)[1])
"""


def learning_margins(seed: int) -> tuple[float, float, float, float]:
    """(first WINDOW, last WINDOW steps) mean rewards of the run, then of the permuted
    control: 120 rollouts over 20 tasks each, so a policy stuck on one digit scores near 1/6."""
    run = local_run(cfg=Config(steps=STEPS, seed=seed))
    control = local_run(cfg=Config(steps=STEPS, seed=seed, permute=True))
    return (
        run.mean_reward(first=WINDOW),
        run.mean_reward(last=WINDOW),
        control.mean_reward(first=WINDOW),
        control.mean_reward(last=WINDOW),
    )


def test_grpo_learns_the_task_and_the_permuted_control_does_not():
    # given the untrained policy; when it trains 200 steps on the verifier's rewards, and again on them permuted
    run_first, run_last, control_first, control_last = learning_margins(seed=1)
    # then the run learns by a wide margin, from chance (1/6)
    assert run_first <= 0.3
    assert run_last - run_first >= 0.4
    # and the control, whose rewards say nothing about its answers, does not
    assert control_last <= 0.45
    assert control_last - control_first < 0.25


@pytest.fixture(scope="module")
def loop_server(tmp_path_factory) -> Iterator[tuple[LiveServer, PolicyServer, list[str]]]:
    with (
        PolicyServer(new_model(0)) as policy,
        # embedded mode (no broker): the verifier runs in the server process on commit
        live_server(
            tmp_path_factory.mktemp("srv"), {"CLAW_UPSTREAM_URL": policy.url, "REDIS_URL": ""}
        ) as srv,
    ):
        yield srv, policy, srv.manage("shell", "-c", KEYS).strip().splitlines()[-3:]


@pytest.mark.live
def test_the_loop_closes_through_the_middleware_with_the_served_numbers(loop_server):
    srv, policy, (agent, trainer, admin) = loop_server
    # when three steps of the loop run through the gateway, the pool and a fresh dataset
    res = middleware_run(
        site=srv.url,
        policy=policy,
        agent_key=agent,
        agent_source="agent-loop",
        trainer_key=trainer,
        admin_key=admin,
        name="loop",
        cfg=Config(steps=3),
    )
    # then each step trained on its own two groups, whole, at the serving policy's version
    assert [(c["policy_version"], c["groups"], c["rollouts"]) for c in res.curve] == [
        (0, 2, 12),
        (1, 2, 12),
        (2, 2, 12),
    ]
    # and every answer step came with the verifier's reward (grpo_step refuses a batch whose
    # answer step lacks one) and the exact served logprob
    # (the trainer's own logprob at the serving weights, before its step: a gap of 0)
    assert [c["max_logprob_gap"] for c in res.curve] == [0.0, 0.0, 0.0]
    # and two model calls per rollout went through the gateway: the tool call, then the answer
    assert res.model_calls == 3 * 12 * 2
