"""Reads of one trajectory and its steps, as the trajectory, review and step-inspector pages
show them: every step's text, flags, labels, rewards and feedback, the branches drawn as
lanes, and one step's exact token ids on demand. A bounded number of queries whatever the
step count (no per-step reads)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from claw_kit.llm.tokenizer import get_tokenizer, token_texts
from pool.flags import QUALITY_NAMES, READINESS_NAMES
from pool.flags import names as flag_names
from pool.models import Feedback, RewardEvent, Step, Trajectory
from pool.selectors.steps import steps_read

from ..models import LabelEvent, StepTag
from .lineage import step_verdicts
from .media import steps_media
from .trace import trace_summary, trace_turns


@dataclass(slots=True)
class StepView:
    """A step as the trajectory and review pages show it."""

    step: Step
    messages: list[dict[str, str]]
    response_text: str | None
    readiness: list[str]
    quality: list[str]
    tags: list[str]
    label_events: list[Any]
    reward_events: list[Any]
    feedback: list[Feedback]
    turn: Any = None  # the step as a trace turn (curation/selectors/trace.py)
    # The images of the messages this turn shows (all of them for a full prompt): an agent
    # re-sends its recent screenshots every turn, so the earlier ones are not repeated.
    media: list[dict[str, Any]] = field(default_factory=list)
    # Trainers' verdicts on the step (selectors.lineage.step_verdicts), oldest first.
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    # No text stored (a white-box step of ids only) and a tokenizer configured: its ids
    # decoded, and which tokenizer decoded them (a rendering, not what the model saw).
    decoded_prompt: str | None = None
    decoded_response: str | None = None
    decoded_by: str | None = None


BRANCH_DX, BRANCH_DY, BRANCH_PAD = 44, 34, 18


def branches_layout(steps: Sequence[Step]) -> dict[str, Any] | None:
    """The trajectory's branches drawn as lanes (one per branch, steps left to right in
    step order), each branch's first step joined to the step it branched from
    (gateway/proxy/branches.py: compactions, sub-agents, retries). None for a trajectory of
    one branch. Pure: reads the steps' branch and parent_step_id only."""
    if not steps or all(s.branch == 0 and s.parent_step_id is None for s in steps):
        return None
    lanes = sorted({s.branch for s in steps})
    lane_of = {b: i for i, b in enumerate(lanes)}
    at: dict[int, tuple[int, int]] = {}
    nodes = []
    for col, s in enumerate(steps):  # steps come in step_index order
        x, y = BRANCH_PAD + col * BRANCH_DX, BRANCH_PAD + lane_of[s.branch] * BRANCH_DY
        at[s.id] = (x, y)
        nodes.append({"x": x, "y": y, "index": s.step_index, "branch": s.branch, "uid": s.uid})
    index_of: dict[int | None, int] = {s.id: s.step_index for s in steps}
    edges = []
    last: dict[int, tuple[int, int]] = {}
    info: dict[int, dict[str, Any]] = {}
    for s in steps:
        here = at[s.id]
        if s.branch in last:
            edges.append(
                {
                    "x1": last[s.branch][0],
                    "y1": last[s.branch][1],
                    "x2": here[0],
                    "y2": here[1],
                    "fork": False,
                }
            )
        else:
            parent = at.get(s.parent_step_id) if s.parent_step_id is not None else None
            if parent is not None:
                edges.append({"x1": parent[0], "y1": parent[1], "x2": here[0], "y2": here[1], "fork": True})
            info[s.branch] = {
                "branch": s.branch,
                "first": s.step_index,
                "steps": 0,
                "from": index_of.get(s.parent_step_id),
            }
        info[s.branch]["steps"] += 1
        last[s.branch] = here
    return {
        "width": 2 * BRANCH_PAD + (len(steps) - 1) * BRANCH_DX,
        "height": 2 * BRANCH_PAD + (len(lanes) - 1) * BRANCH_DY,
        "nodes": nodes,
        "edges": edges,
        "branches": [info[b] for b in lanes],
    }


def trajectory_timeline(uid: str | None = None, *, trajectory_id: int | None = None) -> dict[str, Any] | None:
    """A trajectory (by uid or id) with every step's text, flags, labels, rewards and
    feedback, or None.
    Eight queries whatever the step count (no per-step reads); token ids stay in the
    database (step_token_ids loads one step's on demand)."""
    key = {"uid": uid} if uid is not None else {"id": trajectory_id}
    traj = Trajectory.objects.select_related("source", "group").filter(**key).first()
    if traj is None:
        return None
    steps = list(
        Step.objects.filter(trajectory=traj)
        .defer(
            "seq_delta",
            "rollout_logprobs",
            "token_rewards",
            "token_versions",
            "seq_hash",
            "content_hash",
            "response_hash",
        )
        .order_by("step_index")
    )
    ids = [s.id for s in steps]
    tags: dict[int, list[str]] = {i: [] for i in ids}
    for sid, tag in StepTag.objects.filter(step_id__in=ids).order_by("tag").values_list("step_id", "tag"):
        tags[sid].append(tag)
    labels: dict[int, list[Any]] = {i: [] for i in ids}
    for ev in LabelEvent.objects.filter(step_id__in=ids).order_by("-created_at", "-id"):
        labels[ev.step_id].append(ev)
    rewards: dict[int | None, list[Any]] = {i: [] for i in ids} | {None: []}
    for ev in RewardEvent.objects.filter(Q(step_id__in=ids) | Q(trajectory=traj)).order_by(
        "-created_at", "-id"
    ):
        rewards[ev.step_id if ev.step_id in labels else None].append(ev)
    feedback: dict[int | None, list[Feedback]] = {i: [] for i in ids} | {None: []}
    for fb in Feedback.objects.filter(Q(step_id__in=ids) | Q(trajectory=traj)).order_by("-created_at", "-id"):
        feedback[fb.step_id if fb.step_id in labels else None].append(fb)
    views = [
        StepView(
            step=s,
            messages=_messages_text(s.messages),
            response_text=s.response_text,
            readiness=flag_names(s.readiness, READINESS_NAMES),
            quality=flag_names(s.quality_flags, QUALITY_NAMES),
            tags=tags[s.id],
            label_events=labels[s.id],
            reward_events=rewards[s.id],
            feedback=feedback[s.id],
        )
        for s in steps
    ]
    verdicts = step_verdicts(ids)
    for v in views:
        v.verdicts = verdicts.get(v.step.id, [])
    turns = trace_turns(traj, views)
    _decode_unknown(views, turns)
    media = steps_media(ids)
    for v, t in zip(views, turns, strict=True):
        v.turn = t
        shown = [
            m
            for m in media.get(v.step.id, ())
            if t.prompt_scope != "new" or m["message_index"] is None or m["message_index"] >= t.shown_from
        ]
        placed = _place_images(t.new_messages, shown)
        # What is not in a shown message's parts (no place recorded) stays below the messages.
        v.media = [m for m in shown if id(m) not in placed]
    return {
        "trajectory": traj,
        "steps": views,
        "turns": turns,
        "summary": trace_summary(turns),
        "branches": branches_layout(steps),
        "reward_events": rewards[None],
        "feedback": feedback[None],
    }


def _place_images(messages: list[Any], media: list[dict[str, Any]]) -> set[int]:
    """Each image part of these messages gets its stored image (by message and part index),
    shown in place as a thumbnail; returns the ids of the images placed."""
    at = {(m["message_index"], m["part_index"]): m for m in media if m["message_index"] is not None}
    placed: set[int] = set()
    for msg in messages:
        for sp, part_index in zip(msg.shown_parts, msg.part_at, strict=False):
            found = at.get((msg.index, part_index))
            if found is not None:
                sp["media"] = found
                placed.add(id(found))
    return placed


def _decode_unknown(views: list[StepView], turns: list[Any]) -> None:
    """The steps whose text is unknown (no messages, no response text), decoded with the
    configured tokenizer (CLAW_TOKENIZER) in one read of their ids; nothing without one."""
    unknown = [
        v
        for v, t in zip(views, turns, strict=True)
        if not v.messages and v.response_text is None and t.response is None
    ]
    tok = get_tokenizer() if unknown else None
    if tok is None:
        return
    rendered = {r["uid"]: r for r in steps_read([v.step.id for v in unknown], texts=False).rows}
    name = _tokenizer_name(tok)
    for v in unknown:
        r = rendered.get(v.step.uid)
        if r is not None:
            v.decoded_prompt = tok.decode(r["prompt_ids"].tolist())
            v.decoded_response = tok.decode(r["response_ids"].tolist())
            v.decoded_by = name


def _messages_text(messages: Any) -> list[dict[str, str]]:
    """Chat messages as (role, text) pairs; content parts that are not text are shown as
    JSON, so nothing is hidden."""
    if not isinstance(messages, list):
        return []
    out = []
    for m in messages:
        if isinstance(m, dict):
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            out.append({"role": str(m.get("role", "")), "text": text})
        else:
            out.append({"role": "", "text": json.dumps(m, ensure_ascii=False)})
    return out


def step_token_ids(step_id: int) -> dict[str, Any] | None:
    """One step's exact token ids (rebuilt by steps_render), as plain lists, or None; with
    each id's text when a tokenizer is configured (CLAW_TOKENIZER; else null) and the
    response's rollout logprobs (null when none were recorded)."""
    read = steps_read([step_id], texts=False).rows
    if not read:
        return None
    r = read[0]
    prompt, response = r["prompt_ids"].tolist(), r["response_ids"].tolist()
    tok = get_tokenizer()
    lp = r["rollout_logprobs"]
    return {
        "uid": r["uid"],
        "token_source": r["token_source"],
        "drift_offset": r["drift_offset"],
        "prompt_ids": prompt,
        "response_ids": response,
        "tokenizer": _tokenizer_name(tok),
        "prompt_tokens": token_texts(tok, prompt) if tok is not None else None,
        "response_tokens": token_texts(tok, response) if tok is not None else None,
        "response_logprobs": lp.tolist() if lp is not None else None,
    }


def _tokenizer_name(tok: Any) -> str | None:
    if tok is None:
        return None
    return str(getattr(tok, "name_or_path", "") or type(tok).__name__)


@dataclass(slots=True)
class StepInspect:
    """One step for the inspector: the step's timeline view (text, flags, labels, rewards,
    feedback), where its text came from, and its neighbours in the trajectory."""

    view: StepView
    trajectory: Trajectory
    prompt_text: str | None  # decoded by CLAW_TOKENIZER when no chat messages are stored
    response_text: str | None
    text_origin: str  # "stored", "decoded" or "unknown"
    readiness_missing: list[str]
    turn: (
        Any  # the step as a trace turn (curation/selectors/trace.py): new messages, tool calls, why not ready
    )
    previous_id: int | None
    next_id: int | None


def step_inspect(step_id: int, *, decode: bool = True) -> StepInspect | None:
    """The step ``step_id`` for the inspector, or None. The text is what was stored; when
    none was and a local tokenizer is configured (CLAW_TOKENIZER), the exact token ids are
    decoded with it (marked "decoded": a rendering, not what the model saw as text)."""
    row = Step.objects.filter(id=step_id).values_list("trajectory_id", "step_index").first()
    if row is None:
        return None
    timeline = trajectory_timeline(trajectory_id=row[0])
    if timeline is None:  # deleted in between
        return None
    views = timeline["steps"]
    at = next(i for i, v in enumerate(views) if v.step.id == step_id)
    v = views[at]
    turn = timeline["turns"][at]
    prompt_text, response_text, origin = None, v.response_text, "stored"
    if not v.messages and v.response_text is None and turn.response is None:
        origin = "unknown"
        if decode:
            decoded = _decode(v.step)
            if decoded is not None:
                prompt_text, response_text, origin = decoded[0], decoded[1], "decoded"
    return StepInspect(
        view=v,
        trajectory=timeline["trajectory"],
        prompt_text=prompt_text,
        response_text=response_text,
        text_origin=origin,
        readiness_missing=[
            n for n in READINESS_NAMES if n not in flag_names(v.step.readiness, READINESS_NAMES)
        ],
        turn=turn,
        previous_id=views[at - 1].step.id if at > 0 else None,
        next_id=views[at + 1].step.id if at + 1 < len(views) else None,
    )


def _decode(step: Step) -> tuple[str, str] | None:

    tok = get_tokenizer()
    if tok is None:
        return None
    r = steps_read([step.id], texts=False).rows[0]
    return tok.decode(r["prompt_ids"].tolist()), tok.decode(r["response_ids"].tolist())
