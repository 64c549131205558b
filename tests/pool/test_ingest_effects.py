"""Effects of the one write pipeline: every door's write runs the registered effects once,
inside its transaction, with what it stored."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.proxy.recording import ProxiedCall, ProxiedChoice, record_call
from pool import bus
from pool.ingest.claim import recent
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, Step, Trajectory
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = list(range(100, 140))


@pytest.fixture
def seen():
    """A registered effect that records each write it sees (and can be told to fail)."""
    calls: list[bus.StepsWritten] = []
    fail: list[bool] = [False]

    def effect(written: bus.StepsWritten) -> None:
        calls.append(written)
        if fail[0]:
            raise RuntimeError("effect failed")

    bus.register(effect)
    bus.register(effect)  # registering twice is once
    recent.clear()
    try:
        yield calls, fail
    finally:
        bus.unregister(effect)
        recent.clear()


def proxied(traj: str, prompt: list[int], response: list[int], *, new: bool = False) -> ProxiedCall:
    return ProxiedCall(
        trajectory_uid=traj,
        token_source=Step.TokenSource.UPSTREAM,
        new_trajectory=new,
        choices=[
            ProxiedChoice(prompt_ids=np.array(prompt, np.int32), response_ids=np.array(response, np.int32))
        ],
    )


def test_every_door_runs_the_registered_effects_once_per_write(seen):
    calls, _ = seen
    # when: a white-box batch of two steps, then a proxied call on the fused path (a minted
    # trajectory) and one on the general path (a trajectory it does not know)
    steps_ingest(
        steps=[step_in("wb", 0, prompt=PROMPT, response=[1]), step_in("wb", 1, prompt=PROMPT, response=[2])]
    )
    record_call(call=proxied("px", PROMPT, [3], new=True), source_id=None)
    record_call(call=proxied("wb", [*PROMPT, 2, 9], [4]), source_id=None)
    # then: three writes, each seen once with its steps and doors
    assert [(w.door, [s.uid for s in w.steps]) for w in calls] == [
        ("batch", ["wb:0", "wb:1"]),
        ("append", ["px:0"]),
        ("append", ["wb:2"]),
    ]
    ids = {s.uid: s.id for s in Step.objects.all()}
    assert [s.id for w in calls for s in w.steps] == [ids["wb:0"], ids["wb:1"], ids["px:0"], ids["wb:2"]]
    assert calls[1].counted and not calls[2].counted
    assert {t.uid for w in calls for t in w.trajectories.values()} == {"wb", "px"}


def test_an_effect_runs_inside_the_write_transaction(seen):
    calls, fail = seen
    fail[0] = True
    # when: an effect fails after a batch and after a proxied call
    with pytest.raises(RuntimeError):
        steps_ingest(steps=[step_in("rb", 0, prompt=PROMPT, response=[1], group="g")])
    with pytest.raises(RuntimeError):
        record_call(call=proxied("rp", PROMPT, [3], new=True), source_id=None)
    # then: the writes rolled back with it
    assert len(calls) == 2
    assert not Step.objects.exists() and not Trajectory.objects.exists()
    assert not PromptGroup.objects.filter(anchor_step__isnull=False).exists()
