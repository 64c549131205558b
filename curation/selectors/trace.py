"""A trajectory as a trace (the trajectory page, like Langfuse's trace view): each step a
turn showing only the chat messages new since the previous step of its branch, the
assistant's text and tool calls, tool results, and why the step is not ready yet.

Pure functions over the timeline's StepViews (curation/selectors/timeline.py): no queries
here except the readiness facts (readiness_explain.facts_for, two queries)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pool.flags import READY

from .readiness_explain import Reason, explain, facts_for


@dataclass(slots=True)
class ToolCall:
    name: str
    id: str | None
    arguments: Any  # parsed JSON arguments, or the raw string when they are not JSON
    arguments_json: bool


@dataclass(slots=True)
class Message:
    role: str
    text: str | None  # the text content, when there is one
    parts: list[Any] = field(default_factory=list)  # content parts that are not text
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    result: Any = None  # a tool message's content parsed as JSON (object or array)
    extra: dict[str, Any] = field(default_factory=dict)  # any other field of the message
    index: int | None = None  # its place in the step's prompt messages (images are keyed by it)
    part_at: list[int] = field(default_factory=list)  # each of ``parts``' place in its content
    # ``parts`` as the page shows them: {"part", "media"}, media being the stored image an
    # image part refers to (selectors.media), set by the timeline, shown in place.
    shown_parts: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class Turn:
    view: Any  # the StepView
    earlier: list[Message]  # the prompt's messages before the new ones
    new_messages: list[Message]
    prompt_scope: str  # "new" (messages since the previous step), "full" or "none"
    previous_index: int | None  # the step the new messages follow
    shown_from: int  # index of the first shown message in the step's prompt
    response: Message | None
    reasons: list[Reason]
    ready: bool
    model: str | None
    latency_ms: float | None  # recorded by the door, when it was
    gap_s: float | None  # seconds since the previous step of the branch was stored


def tool_calls_of(raw: Any) -> list[ToolCall]:
    """OpenAI tool calls ({function: {name, arguments}}), Anthropic tool_use blocks
    ({name, input}) or anything else with a name, as ToolCalls."""
    out = []
    for c in raw if isinstance(raw, list) else []:
        if not isinstance(c, dict):
            continue
        fn = c.get("function") if isinstance(c.get("function"), dict) else c
        args = fn.get("arguments", fn.get("input"))
        parsed, is_json = args, not isinstance(args, str)
        if isinstance(args, str):
            try:
                parsed, is_json = json.loads(args), True
            except ValueError:
                pass
        out.append(
            ToolCall(
                name=str(fn.get("name") or "?"), id=c.get("id"), arguments=parsed, arguments_json=is_json
            )
        )
    return out


def message_of(m: Any, index: int | None = None) -> Message:
    if not isinstance(m, dict):
        return Message(role="", text=None, parts=[m], index=index, shown_parts=[{"part": m, "media": None}])
    content = m.get("content")
    text: str | None = None
    parts: list[Any] = []
    part_at: list[int] = []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for at, p in enumerate(content):
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"):
                texts.append(str(p.get("text", "")))
            else:
                parts.append(p)
                part_at.append(at)
        text = "\n".join(texts) if texts else None
    elif content is not None:
        parts.append(content)
    role = str(m.get("role", ""))
    result = None
    if role in ("tool", "function") and text is not None:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict | list):
            result = parsed
    known = {"role", "content", "tool_calls", "tool_call_id", "name"}
    return Message(
        role=role,
        text=text,
        parts=parts,
        tool_calls=tool_calls_of(m.get("tool_calls")),
        tool_call_id=m.get("tool_call_id"),
        name=m.get("name"),
        result=result,
        extra={k: v for k, v in m.items() if k not in known and v is not None},
        index=index,
        part_at=part_at,
        shown_parts=[{"part": p, "media": None} for p in parts],
    )


def _key(m: Any) -> str:
    return json.dumps(m, sort_keys=True, ensure_ascii=False, default=str)


def _is_prefix(prev: list, cur: list) -> bool:
    return len(prev) <= len(cur) and all(_key(a) == _key(b) for a, b in zip(prev, cur, strict=False))


def trace_turns(trajectory: Any, views: list[Any]) -> list[Turn]:
    """One Turn per step (in step order). A step's new messages are those after its
    previous step's prompt and reply (the previous step of its branch; a branch's first step
    follows the step it branched from); the whole prompt for a first step or when the prompt
    is not an extension of that one."""
    by_id = {v.step.id: v for v in views}
    facts = facts_for(trajectory, [v.step for v in views])
    last_of_branch: dict[int, Any] = {}
    previous: dict[int, Any] = {}
    for v in views:
        s = v.step
        prev = last_of_branch.get(s.branch)
        if prev is None and s.parent_step_id is not None:
            prev = by_id.get(s.parent_step_id)
        previous[s.id] = prev
        last_of_branch[s.branch] = v
    # A reply's tool calls: stored with the step (the proxy keeps them in its metadata), else
    # as the next step of the branch echoes the reply back in its prompt.
    echoed: dict[int, dict[str, Any]] = {}
    for v in views:
        prev = previous[v.step.id]
        msgs = v.step.messages if isinstance(v.step.messages, list) else None
        if prev is None or msgs is None or not isinstance(prev.step.messages, list):
            continue
        n = len(prev.step.messages)
        if _is_prefix(prev.step.messages, msgs) and n < len(msgs):
            m = msgs[n]
            if isinstance(m, dict) and m.get("role") == "assistant":
                echoed[prev.step.id] = m
    turns = []
    for v in views:
        s = v.step
        prev = previous[s.id]
        msgs = s.messages if isinstance(s.messages, list) else None
        scope, start = ("none", 0) if msgs is None else ("full", 0)
        if msgs is not None and prev is not None and isinstance(prev.step.messages, list):
            if _is_prefix(prev.step.messages, msgs):
                scope, start = "new", len(prev.step.messages)
                if prev.step.id in echoed:
                    start += 1  # the previous reply: shown as that turn's response
        new = [message_of(m, i) for i, m in enumerate((msgs or [])[start:], start)]
        earlier = [message_of(m, i) for i, m in enumerate((msgs or [])[:start])]
        meta = s.metadata if isinstance(s.metadata, dict) else {}
        if msgs is None and isinstance(meta.get("prompt"), str):  # a text completion's prompt
            scope, new = "full", [Message(role="prompt", text=meta["prompt"])]
        calls = tool_calls_of(meta.get("tool_calls"))
        echo = echoed.get(s.id)
        if not calls and echo is not None:
            calls = tool_calls_of(echo.get("tool_calls"))
        text = s.response_text
        if text is None and echo is not None and isinstance(echo.get("content"), str):
            text = echo["content"]
        response = (
            Message(role="assistant", text=text, tool_calls=calls) if text is not None or calls else None
        )
        latency = meta.get("latency_ms")
        turns.append(
            Turn(
                view=v,
                earlier=earlier,
                new_messages=new,
                prompt_scope=scope,
                previous_index=prev.step.step_index if prev is not None and scope == "new" else None,
                shown_from=start,
                response=response,
                reasons=explain(facts[s.id]),
                ready=s.readiness == READY,
                model=meta.get("model") if isinstance(meta.get("model"), str) else None,
                latency_ms=float(latency) if isinstance(latency, int | float) else None,
                gap_s=(s.created_at - prev.step.created_at).total_seconds()
                if prev is not None and s.created_at and prev.step.created_at
                else None,
            )
        )
    return turns


def trace_summary(turns: list[Turn]) -> dict[str, Any]:
    """How many steps are ready, and every reason the others are not (each once, in the
    order the steps first give it), for the top of the trace view."""
    seen: dict[tuple[str, str], Reason] = {}
    for t in turns:
        for r in t.reasons:
            seen.setdefault((r.code, r.why), r)
    return {"ready": sum(t.ready for t in turns), "steps": len(turns), "reasons": list(seen.values())}
