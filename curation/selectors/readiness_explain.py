"""Why a step is not ready to train on, and what would make it ready: the step page and the
trace view say it in words, from the readiness bits pool/services/readiness.py keeps
(pool/flags.py) and the facts behind them (the trajectory's status, the group's declared and
ended rollouts, the reward, the token source, the policy's staleness).

``explain`` is pure (facts in, reasons out: tests/curation/test_readiness_explain.py has one
row per reason); ``facts_for`` reads the facts of a trajectory's steps in two queries."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Q

from pool.flags import Readiness
from pool.models import PolicyVersion, PromptGroup, Step, Trajectory

TERMINAL = ("completed", "failed", "abandoned")


@dataclass(frozen=True, slots=True)
class Facts:
    readiness: int
    trajectory_uid: str
    trajectory_status: str
    token_source: str
    reward: float | None  # the step's effective reward
    # A final process reward waiting for its branch's outcome (pool/services/effective_reward.py).
    awaits_outcome: bool = False
    group_uid: str | None = None
    group_status: str | None = None
    group_expected: int | None = None
    group_ended: int = 0
    policy_behind: int | None = None  # current policy version - the step's


@dataclass(frozen=True, slots=True)
class Reason:
    code: str  # tokens, reward, trajectory, group, staleness
    why: str
    fix: str


def explain(f: Facts) -> list[Reason]:
    """The reasons ``f``'s step is not ready (empty when it is), each with what would make it
    ready; a stale policy is reported too (datasets bound it at query time)."""
    out: list[Reason] = []
    bits = f.readiness
    uid = f.trajectory_uid
    if not bits & Readiness.TRAJECTORY_COMPLETE:
        if f.trajectory_status == Trajectory.Status.RUNNING:
            out.append(
                Reason(
                    "trajectory",
                    "trajectory still running",
                    f"end it: send its last step with is_last: true, or POST /api/v1/trajectories/{uid}/complete",
                )
            )
        else:
            out.append(
                Reason(
                    "trajectory",
                    f"trajectory ended as {f.trajectory_status}",
                    "only completed trajectories are trained on: its steps stay out of datasets that ask for ready steps",
                )
            )
    if not bits & Readiness.REWARD_FINAL:
        if f.awaits_outcome:
            out.append(
                Reason(
                    "reward",
                    f"process reward {f.reward:g}: waiting for its branch's outcome",
                    "a final reward on the branch's final step, or the trajectory's reward "
                    "(POST /api/v1/rewards, or at completion)",
                )
            )
        elif f.reward is None:
            out.append(
                Reason(
                    "reward",
                    "waiting for reward",
                    "POST /api/v1/rewards for the step (step_uid) or its trajectory (trajectory_uid), final: true",
                )
            )
        else:
            out.append(
                Reason(
                    "reward",
                    f"reward {f.reward:g} is not final",
                    "POST /api/v1/rewards again with final: true",
                )
            )
    if not bits & Readiness.GROUP_COMPLETE and f.group_uid is not None:
        if f.group_expected is None:
            out.append(
                Reason(
                    "group",
                    f"group {f.group_uid} declares no expected_rollouts, so it never completes",
                    "declare the group: POST /api/v1/groups with uid and expected_rollouts "
                    "(or send its trajectories without a prompt group)",
                )
            )
        else:
            left = max(f.group_expected - f.group_ended, 0)
            out.append(
                Reason(
                    "group",
                    f"group {f.group_uid} has {f.group_ended} of {f.group_expected} rollouts ended",
                    f"waiting for {left} more rollout{'s' if left != 1 else ''} to end"
                    if left
                    else "the group completes with the next readiness sweep",
                )
            )
    if not bits & Readiness.TOKENS_EXACT:
        out.append(
            Reason(
                "tokens",
                f"token ids are not exact (token source: {f.token_source})",
                "send the ids the model sampled (an upstream with return_token_ids, or prompt_ids and "
                "response_ids from the agent), or use a dataset that admits retokenized ids",
            )
        )
    if f.policy_behind:
        out.append(
            Reason(
                "staleness",
                f"policy {f.policy_behind} version{'s' if f.policy_behind != 1 else ''} behind the current one",
                f"datasets with max_staleness below {f.policy_behind} do not serve it; "
                "raise their max_staleness or collect with the current policy",
            )
        )
    return out


def facts_for(trajectory: Trajectory, steps: list[Step]) -> dict[int, Facts]:
    """The readiness facts of a trajectory's steps, by step id (the group's ended rollouts
    and the current policy: two queries)."""
    group = trajectory.group if trajectory.group_id else None
    ended = 0
    if group is not None:
        ended = PromptGroup.objects.filter(id=group.id).aggregate(
            n=Count("trajectories", filter=Q(trajectories__status__in=TERMINAL))
        )["n"]
    current = PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()
    return {
        s.id: Facts(
            readiness=s.readiness,
            trajectory_uid=trajectory.uid,
            trajectory_status=trajectory.status,
            token_source=s.token_source,
            reward=s.effective_reward,
            awaits_outcome=s.process_reward is not None
            and s.reward_status == Step.RewardStatus.FINAL
            and s.outcome_reward is None,
            group_uid=group.uid if group else None,
            group_status=group.status if group else None,
            group_expected=group.expected_rollouts if group else None,
            group_ended=ended,
            policy_behind=(current - s.policy_version_id)
            if current is not None and s.policy_version_id is not None and current > s.policy_version_id
            else None,
        )
        for s in steps
    }
