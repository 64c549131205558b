"""An LLM judge that scores a whole GRPO group at once, relative to each other, the way
OpenPipe ART's RULER does: one chat call to the configured upstream (CLAW_UPSTREAM_URL,
through the gateway's own transport) with every rollout, asking for a JSON object
``{"scores": [{"trajectory_id", "explanation", "score"}]}`` with scores in [0, 1].

Settings: CLAW_JUDGE_MODEL (the model name sent; empty: none), CLAW_JUDGE_MAX_TOKENS.
The system prompt starts with JUDGE_MARKER, which the demo upstream recognises and answers
deterministically (claw_site/demo/upstream.py), so the judge runs end to end without a model.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import orjson
from django.conf import settings

from claw_kit.llm import upstream

from .base import RewardError, RewardResult, RewardSample, group

JUDGE_MARKER = "[claw-judge]"
SYSTEM_PROMPT = f"""{JUDGE_MARKER}
All of the rollouts below were produced for the same task. Your job is to consider each of
them and give each a score between 0 and 1, judged relative to each other.

Grading standards:
- A rollout that achieves the task (matches the reference answer, when one is given) must
  score significantly higher than one that does not.
- If one rollout is only slightly better than another, the difference in their scores should
  be small; if it is significantly better, the difference should be large.
- You may give partial credit to a rollout that makes progress without finishing.

Answer with JSON only, in this form:
{{"scores": [{{"trajectory_id": "1", "explanation": "...", "score": 0.0}}]}}
with one entry for every rollout, using the rollout ids given."""


@group(source="model")
def ruler(samples: list[RewardSample]) -> list[RewardResult]:
    """Score ``samples`` relative to each other with one judge call (see the module
    docstring). Raises RewardError when the upstream fails or answers unusable JSON."""
    if not samples:
        return []
    body: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": judge_prompt(samples)},
        ],
        "temperature": 0,
        "max_tokens": settings.CLAW_JUDGE_MAX_TOKENS,
    }
    if settings.CLAW_JUDGE_MODEL:
        body["model"] = settings.CLAW_JUDGE_MODEL
    answer = _chat(body)
    try:
        content = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise RewardError("the judge's answer has no message content") from None
    if not isinstance(content, str):
        raise RewardError("the judge's answer has no message content")
    scores = parse_scores(content, [str(i + 1) for i in range(len(samples))])
    return [RewardResult(score, {"explanation": why, "judge": "ruler"}) for score, why in scores]


def judge_prompt(samples: list[RewardSample]) -> str:
    """The user message: the task, the reference answer if any, then the rollouts by id."""
    first = samples[0]
    parts = []
    if first.prompt_text:
        parts.append(f"<task>\n{first.prompt_text}\n</task>")
    if first.ground_truth is not None:
        parts.append(f"<reference>{_text(first.ground_truth)}</reference>")
    rollouts = "\n".join(
        f'<rollout id="{i + 1}">\n{s.response_text}\n</rollout>' for i, s in enumerate(samples)
    )
    parts.append(f"<rollouts>\n{rollouts}\n</rollouts>")
    return "\n".join(parts)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def parse_scores(content: str, ids: list[str]) -> list[tuple[float, str]]:
    """(score, explanation) per id, in ``ids`` order; scores clipped to [0, 1]. Raises
    RewardError for text that is not the asked-for JSON or misses an id."""
    text = _FENCE.sub("", content.strip())
    start, end = text.find("{"), text.rfind("}")
    try:
        data = orjson.loads(text[start : end + 1]) if start >= 0 else None
    except orjson.JSONDecodeError:
        data = None
    entries = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise RewardError(f"the judge did not answer the scores JSON: {content[:200]!r}")
    by_id: dict[str, tuple[float, str]] = {}
    for e in entries:
        if not isinstance(e, dict):
            continue
        score = e.get("score")
        if isinstance(score, bool) or not isinstance(score, int | float) or score != score:
            continue
        by_id[str(e.get("trajectory_id"))] = (min(1.0, max(0.0, float(score))), str(e.get("explanation", "")))
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise RewardError(f"the judge gave no score for rollout(s) {', '.join(missing)}")
    return [by_id[i] for i in ids]


def _chat(body: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/chat/completions to the upstream (sync: tasks and database threads call it)."""

    async def call() -> dict[str, Any]:
        headers = upstream.forward_headers({"content-type": "application/json"})
        try:
            resp = await upstream.request(
                "POST", "/v1/chat/completions", content=orjson.dumps(body), headers=headers
            )
        except upstream.UpstreamFault as f:
            raise RewardError(f"judge call failed: {f.message}") from None
        finally:
            await upstream.transport().aclose()  # this loop ends with the call
        if resp.status_code >= 400:
            raise RewardError(
                f"judge call failed: the upstream answered {resp.status_code}: "
                f"{upstream.scrub(resp.text[:300])}"
            )
        try:
            answer = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise RewardError("judge call failed: the upstream's answer is not a JSON object")
        return answer

    return run_sync(call())


def run_sync(coro: Any) -> Any:
    """Run a coroutine to its end from sync code, also from a thread whose loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
