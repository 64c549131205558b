"""Demo traffic: agents that keep a fresh install showing live data, curation included.

Five agents take turns, one HTTP call at a time, ``pace_s`` apart:

- **black-box**: an unmodified agent using the official ``openai`` client, pointed at the
  gateway's scoped base URL ``{base}/t/{trajectory_uid}/{group_uid}/v1``. A group of 4 rollouts
  shares one task, declared with ``expected_rollouts`` through ``POST /api/v1/groups``; each
  rollout runs 3-5 turns with a tool (the reply, and its tool call, is appended to the messages,
  then a ``tool`` observation or a user nudge), then completes its trajectory with
  ``POST /api/v1/trajectories/<uid>/complete``. Every third group's first rollout streams.
- **white-box**: an agent that runs its own (toy) inference and posts exact steps to
  ``POST /api/v1/steps`` with ``prompt_group_uid``, ``rollout_logprobs`` and a reward on the
  last step (``is_last``), after declaring its group the same way.
- **doors**: the same kind of coding agent speaking other protocols through the gateway, with
  raw HTTP: in turn an Anthropic Messages agent (``POST /v1/messages``, tool_use and
  tool_result blocks; halfway it compacts its context into a summary and restarts from it,
  which the gateway records as a new branch of its trajectory) and an OpenAI Responses agent
  (``POST /v1/responses``, function_call items, chained by ``previous_response_id`` so it
  never resends its history). Each rollout is completed with a reward.
- **screenshot**: a GUI agent on the official ``openai`` client, through the same scoped base
  URL: a group of ``SCREEN_ROLLOUTS`` rollouts, each turn sending the text history plus its
  last ``SCREENS_IN_PROMPT`` screenshots (PNG, drawn in code with Pillow from a seed:
  rectangles and text-like stripes) as ``image_url`` data URLs, as such agents re-send them.
  Rollouts of a group start from the same first screenshot. The gateway stores each distinct
  screenshot once; the demo upstream puts a run of image placeholder ids in the prompt ids.
- **judge**: a slow verifier. Rollouts of some groups complete without a reward; the judge
  posts it ``LATE_REWARD_PACES`` paces later through ``POST /api/v1/rewards``, and only then
  do their steps and group become ready.

So that the curation pages have something to show, each group follows a plan chosen by its
number (``GroupPlan.of``): within every four groups of a kind there are late rewards, an easy
task (every rollout rewarded 1.0: zero reward variance), a degenerate rollout (its text answers
loop until max_tokens: truncated and repetition flags), a rollout whose sandbox crashes
(completed as ``failed``), one that gives up (``abandoned``), and user feedback on a rollout.
Everything goes through the public HTTP API and the gateway, as real agents would.

Errors are logged and never end the loop: the gateway may be restarting. A rollout that fails
midway is marked ``failed`` (best effort) so its group can still complete.
"""

from __future__ import annotations

import base64
import io
import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
from PIL import Image, ImageDraw

from .toy_tokenizer import ToyTokenizer
from .upstream import MODEL_ID, generate_reply

logger = logging.getLogger(__name__)

ROLLOUTS_PER_GROUP = 4
MIN_TURNS, MAX_TURNS = 3, 5
# Turns a rollout that crashes or gives up runs before it ends.
SHORT_TURNS = 2
MAX_TOKENS = 64
MAX_BACKOFF_S = 30.0
# A late reward arrives this many paces (5 s at the default pace) after its rollout completed.
LATE_REWARD_PACES = 5
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "run_shell",
        "description": "Run a shell command in the sandbox and return its output.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    },
}
_TOOLS: list[Any] = [TOOL]  # Any: a plain dict, as apps write it, not the SDK's TypedDict
TASKS = (
    "Fix the failing test in tests/test_parser.py.",
    "Find why the nightly build is slow and speed it up.",
    "Add a --dry-run flag to the deploy script.",
    "Rename the config key `timeout` to `timeout_s` everywhere.",
    "Write a script that counts TODO comments per file.",
)
SYSTEM = "You are a coding agent. Use run_shell to inspect and change the repository."
OBSERVATIONS = ("exit 0", "2 passed, 1 failed", "No such file or directory", "OK", "real 0m1.204s")

_tok = ToyTokenizer()
# An agent is a generator making at most one HTTP call per step; it yields True after a call
# that worked (or when it had nothing to do) and False after one that failed (and was
# handled), which drives the back-off.
Agent = Iterator[bool]


@dataclass(frozen=True)
class GroupPlan:
    """What one demo group shows on the curation pages."""

    late_rewards: bool  # rollouts complete without a reward; the judge posts it later
    easy: bool  # every rollout is rewarded 1.0: zero reward variance, no GRPO signal
    degenerate: int | None  # this rollout's text answers loop: truncated, repetition
    crashes: int | None  # this rollout's sandbox crashes: completed as failed
    gives_up: int | None  # this rollout stops early: completed as abandoned
    feedback: bool  # a user rates rollout 0

    @classmethod
    def of(cls, n: int) -> GroupPlan:
        """The plan of a kind's ``n``-th group (from 0): every case within four groups."""
        return cls(
            late_rewards=n % 2 == 0,
            easy=n % 3 == 1,
            degenerate=1 if n % 2 == 1 else None,
            crashes=3 if n % 4 == 2 else None,
            gives_up=2 if n % 4 == 3 else None,
            feedback=n % 3 == 0,
        )

    def ending(self, k: int) -> str:
        """How rollout ``k`` ends: "completed", "failed" or "abandoned"."""
        if k == self.crashes:
            return "failed"
        if k == self.gives_up:
            return "abandoned"
        return "completed"

    def reward(self, rng: random.Random) -> float:
        return 1.0 if self.easy else round(rng.random(), 3)


@dataclass
class LateReward:
    due: float  # time.monotonic() at which the judge posts it
    trajectory_uid: str
    reward: float


def run_demo_traffic(base_url: str, api_key: str, *, stop: threading.Event, pace_s: float = 1.0) -> None:
    """Drive black-box and white-box demo agents and the judge against the gateway at
    ``base_url`` (its root, e.g. ``http://127.0.0.1:8000``) with the ingest key ``api_key``
    until ``stop`` is set. Never raises: every failure is logged, and an agent whose calls keep
    failing (the gateway is restarting, or has no upstream) backs off exponentially, up to
    MAX_BACKOFF_S."""
    late: list[LateReward] = []  # shared by the agents and the judge, all on this thread
    late_s = LATE_REWARD_PACES * pace_s
    with (
        httpx.Client(timeout=30, headers={"Authorization": f"Bearer {api_key}"}) as http,
        openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=30) as llm,
    ):
        wb_groups, bb_groups = itertools.count(), itertools.count()

        def white_box() -> Agent:
            return _white_box_group(base_url, http, GroupPlan.of(next(wb_groups)), late, late_s)

        def black_box() -> Agent:
            n = next(bb_groups)
            plan = GroupPlan.of(n)
            return _black_box_group(base_url, llm, http, plan, late, late_s, stream_first=n % 3 == 1)

        doors_runs = itertools.count()
        makers: list[tuple[str, Callable[[], Agent]]] = [
            ("white-box", white_box),
            ("black-box", black_box),
            ("doors", lambda: _doors_rollout(base_url, http, next(doors_runs))),
            ("screenshot", lambda: _screenshot_group(base_url, llm, http)),
            ("judge", lambda: _judge(base_url, http, late)),
        ]
        agents: list[Agent | None] = [None] * len(makers)
        failures = [0] * len(makers)
        due = [0.0] * len(makers)
        while not stop.is_set():
            i = min(range(len(makers)), key=due.__getitem__)
            if stop.wait(max(0.0, due[i] - time.monotonic())):
                break
            name, make = makers[i]
            ok = False
            try:
                agent = agents[i] or make()
                agents[i] = agent
                ok = next(agent)
            except StopIteration:
                agents[i], ok = None, True
            except Exception as e:  # noqa: BLE001 - demo traffic must survive anything
                logger.warning("demo traffic: %s agent error: %s", name, _describe(e))
                agents[i] = None
            failures[i] = 0 if ok else failures[i] + 1
            backoff = min(MAX_BACKOFF_S, pace_s * 2 ** min(failures[i], 16)) if failures[i] else pace_s
            due[i] = time.monotonic() + backoff


# --- black-box agents ---------------------------------------------------------------------------
def _black_box_group(
    base_url: str,
    llm: openai.OpenAI,
    http: httpx.Client,
    plan: GroupPlan,
    late: list[LateReward],
    late_s: float,
    *,
    stream_first: bool,
) -> Agent:
    """One prompt group of black-box rollouts; yields after each HTTP call."""
    rng = random.Random()
    group = f"demo-bb-g-{uuid.uuid4().hex[:12]}"
    task_uid, task = _demo_task(http, base_url, rng)
    _post(
        http, f"{base_url}/api/v1/groups", {"uid": group, "expected_rollouts": ROLLOUTS_PER_GROUP, **task_uid}
    )
    yield True
    for k in range(ROLLOUTS_PER_GROUP):
        traj = f"demo-bb-{uuid.uuid4().hex[:12]}"
        # The scoped base URL is all a black-box agent is told; the copy shares the connection
        # pool. x-demo-reply asks the demo upstream for a degenerate (looping) model.
        headers = {"x-demo-reply": "loop"} if k == plan.degenerate else {}
        client = llm.with_options(base_url=f"{base_url}/t/{traj}/{group}/v1", default_headers=headers)
        ending = plan.ending(k)
        turns = rng.randint(MIN_TURNS, MAX_TURNS) if ending == "completed" else SHORT_TURNS
        turns_done = 0
        try:
            for _ in _black_box_rollout(client, task, rng, turns, stream=stream_first and k == 0):
                turns_done += 1
                yield True
            yield from _end_rollout(base_url, http, plan, traj, k, rng, late, late_s)
        except Exception as e:  # noqa: BLE001 - one failed rollout must not stall its group
            logger.warning("demo traffic: black-box rollout %s failed: %s", traj, _describe(e))
            if turns_done:  # the gateway recorded the trajectory: end it so the group can complete
                _abandon(http, base_url, traj)
            yield False


def _black_box_rollout(
    client: openai.OpenAI, task: str, rng: random.Random, turns: int, *, stream: bool
) -> Iterator[None]:
    """The ``turns`` turns of one rollout; yields after each chat call."""
    # Any: plain dicts, as apps build them, rather than the SDK's TypedDict unions.
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for _ in range(turns):
        if stream:
            reply = _streamed_reply(client, messages)
        else:
            r = client.chat.completions.create(
                model=MODEL_ID, messages=messages, tools=_TOOLS, max_tokens=MAX_TOKENS
            )
            reply = r.choices[0].message.model_dump(exclude_none=True)
        yield
        messages.append(reply)
        if reply.get("tool_calls"):
            for call in reply["tool_calls"]:
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": rng.choice(OBSERVATIONS)}
                )
        else:
            messages.append({"role": "user", "content": "Go on."})


def _end_rollout(
    base_url: str,
    http: httpx.Client,
    plan: GroupPlan,
    traj: str,
    k: int,
    rng: random.Random,
    late: list[LateReward],
    late_s: float,
) -> Agent:
    """Complete rollout ``k`` of a black-box group as its plan says (with its reward, or
    without and the reward queued for the judge, or as failed or abandoned), then the user's
    feedback; yields after each call."""
    ending = plan.ending(k)
    body: dict[str, Any] = {"status": ending}
    if ending == "completed":
        reward = plan.reward(rng)
        if plan.late_rewards:
            late.append(LateReward(time.monotonic() + late_s, traj, reward))
        else:
            body["reward"] = reward
    _post(http, f"{base_url}/api/v1/trajectories/{traj}/complete", body)
    yield True
    if plan.feedback and k == 0:
        _post(http, f"{base_url}/api/v1/feedback", _feedback(traj, rng))
        yield True


def _streamed_reply(client: openai.OpenAI, messages: list[Any]) -> dict[str, Any]:
    """Stream one turn and reassemble the assistant message as an OpenAI client app would."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    stream = client.chat.completions.create(
        model=MODEL_ID,
        messages=messages,
        tools=_TOOLS,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for tc in choice.delta.tool_calls or []:
                call = calls.setdefault(
                    tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = tc.id or call["id"]
                if tc.function:
                    call["function"]["name"] += tc.function.name or ""
                    call["function"]["arguments"] += tc.function.arguments or ""
    reply: dict[str, Any] = {"role": "assistant"}
    if calls:
        reply["tool_calls"] = [calls[i] for i in sorted(calls)]
    else:
        reply["content"] = "".join(content)
    return reply


# --- agents of the other doors --------------------------------------------------------------------
ANTHROPIC_TOOL = {
    "name": TOOL["function"]["name"],
    "description": TOOL["function"]["description"],
    "input_schema": TOOL["function"]["parameters"],
}
RESPONSES_TOOL = {"type": "function", **TOOL["function"]}


def _doors_rollout(base_url: str, http: httpx.Client, n: int) -> Agent:
    """One rollout through the Anthropic Messages door (even ``n``) or the Responses door
    (odd), completed with a reward; yields after each HTTP call."""
    rng = random.Random()
    kind = "anth" if n % 2 == 0 else "resp"
    traj = f"demo-{kind}-{uuid.uuid4().hex[:12]}"
    task = rng.choice(TASKS)
    turns = rng.randint(MIN_TURNS, MAX_TURNS)
    headers = {"X-Claw-Trajectory": traj}
    calls = 0
    try:
        turns_of = _anthropic_turns if kind == "anth" else _responses_turns
        for _ in turns_of(base_url, http, headers, task, rng, turns):
            calls += 1
            yield True
        body = {"status": "completed", "reward": round(rng.random(), 3)}
        _post(http, f"{base_url}/api/v1/trajectories/{traj}/complete", body)
        yield True
    except Exception as e:  # noqa: BLE001 - one failed rollout must not stop the agent
        logger.warning("demo traffic: %s rollout %s failed: %s", kind, traj, _describe(e))
        if calls:
            _abandon(http, base_url, traj)
        yield False


def _anthropic_turns(
    base_url: str, http: httpx.Client, headers: dict[str, str], task: str, rng: random.Random, turns: int
) -> Iterator[None]:
    """An Anthropic Messages agent: tool_use answered with tool_result blocks; after its
    second turn it restarts from a summary (a compaction: a new branch)."""
    headers = {**headers, "anthropic-version": "2023-06-01"}
    messages: list[Any] = [{"role": "user", "content": task}]
    for turn in range(turns):
        body = {
            "model": MODEL_ID,
            "max_tokens": MAX_TOKENS,
            "system": SYSTEM,
            "messages": messages,
            "tools": [ANTHROPIC_TOOL],
        }
        reply = _post(http, f"{base_url}/v1/messages", body, headers=headers).json()
        yield
        if turn == 1:
            summary = " ".join(b.get("text", "") for b in reply["content"]) or "one command ran"
            messages = [{"role": "user", "content": f"{task} Summary of the work so far: {summary}"}]
            continue
        messages.append({"role": "assistant", "content": reply["content"]})
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        if uses:
            results = [
                {"type": "tool_result", "tool_use_id": b["id"], "content": rng.choice(OBSERVATIONS)}
                for b in uses
            ]
            messages.append({"role": "user", "content": results})
        else:
            messages.append({"role": "user", "content": "Go on."})


def _responses_turns(
    base_url: str, http: httpx.Client, headers: dict[str, str], task: str, rng: random.Random, turns: int
) -> Iterator[None]:
    """A Responses agent: function calls answered with function_call_output items, each
    turn chained to the last by previous_response_id (the gateway keeps the history)."""
    previous: str | None = None
    new_input: Any = task
    for _ in range(turns):
        body: dict[str, Any] = {
            "model": MODEL_ID,
            "instructions": SYSTEM,
            "input": new_input,
            "tools": [RESPONSES_TOOL],
            "max_output_tokens": MAX_TOKENS,
        }
        if previous is not None:
            body["previous_response_id"] = previous
        reply = _post(http, f"{base_url}/v1/responses", body, headers=headers).json()
        yield
        previous = reply["id"]
        calls = [item for item in reply["output"] if item["type"] == "function_call"]
        new_input = [
            {"type": "function_call_output", "call_id": c["call_id"], "output": rng.choice(OBSERVATIONS)}
            for c in calls
        ] or "Go on."


# --- white-box agents ---------------------------------------------------------------------------
def _white_box_group(
    base_url: str, http: httpx.Client, plan: GroupPlan, late: list[LateReward], late_s: float
) -> Agent:
    """One prompt group of white-box rollouts posting exact steps; yields after each call."""
    rng = random.Random()
    group = f"demo-wb-g-{uuid.uuid4().hex[:12]}"
    task_uid, task = _demo_task(http, base_url, rng)
    _post(
        http, f"{base_url}/api/v1/groups", {"uid": group, "expected_rollouts": ROLLOUTS_PER_GROUP, **task_uid}
    )
    yield True
    for k in range(ROLLOUTS_PER_GROUP):
        traj = f"demo-wb-{uuid.uuid4().hex[:12]}"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task},
        ]
        ending = plan.ending(k)
        turns = rng.randint(MIN_TURNS, MAX_TURNS) if ending == "completed" else SHORT_TURNS
        posted = False
        try:
            for t in range(turns):
                prompt = _tok.apply_chat_template(messages, [TOOL])
                tool = TOOL["function"]["name"] if messages[-1]["role"] == "user" else None
                # Rollouts of a group differ through the choice index, as n>1 sampling would.
                reply = generate_reply(prompt, 0, k, MAX_TOKENS, tool=tool, loop=k == plan.degenerate)
                # A completed rollout ends with an is_last step; the others end below.
                last = t == turns - 1 and ending == "completed"
                step: dict[str, Any] = {
                    "trajectory_uid": traj,
                    "prompt_group_uid": group,
                    "step_index": t,
                    "prompt_ids": prompt,
                    "response_ids": reply.ids,
                    "rollout_logprobs": reply.logprobs,
                    "finish_reason": reply.finish_reason,
                    "is_last": last,
                    "metadata": {"demo": "white-box", "task": task},
                }
                if reply.content is not None:
                    step["response_text"] = reply.content
                if last:
                    reward = plan.reward(rng)
                    if plan.late_rewards:
                        late.append(LateReward(time.monotonic() + late_s, traj, reward))
                    else:
                        step["reward"] = reward
                _post(http, f"{base_url}/api/v1/steps", {"steps": [step]})
                posted = True
                yield True
                message: dict[str, Any] = {"role": "assistant", "content": reply.content}
                if reply.tool_calls:
                    message["tool_calls"] = reply.tool_calls
                    messages.append(message)
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": reply.tool_calls[0]["id"],
                            "content": rng.choice(OBSERVATIONS),
                        }
                    )
                else:
                    messages.append(message)
                    messages.append({"role": "user", "content": "Go on."})
            if ending != "completed":
                _post(http, f"{base_url}/api/v1/trajectories/{traj}/complete", {"status": ending})
                yield True
        except Exception as e:  # noqa: BLE001 - one failed rollout must not stall its group
            logger.warning("demo traffic: white-box rollout %s failed: %s", traj, _describe(e))
            if posted:
                _abandon(http, base_url, traj)
            yield False


# --- the screenshot agent ------------------------------------------------------------------------
SCREEN_ROLLOUTS = 2
SCREEN_TURNS = 3
SCREENS_IN_PROMPT = 3  # the last screenshots each prompt carries (the rest is text history)
SCREEN_SIZE = (640, 400)  # a small screen: W-vision's bench uses 1280x800
SCREEN_TASKS = (
    "Open the settings page and turn on dark mode.",
    "Find the latest invoice and download it as PDF.",
    "Add a new contact named Ada Lovelace.",
)
SCREEN_SYSTEM = "You are a computer-use agent. Each user turn shows the screen; say what to click next."


def screenshot_png(seed: str) -> bytes:
    """A PNG screen drawn from ``seed`` (the same seed, the same bytes): a title bar, a side
    panel, a few windows and text-like stripes, so it compresses like a real screen."""
    rng = random.Random(seed)
    w, h = SCREEN_SIZE
    image = Image.new("RGB", SCREEN_SIZE, (rng.randrange(200, 256),) * 3)
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 0, w, 28], fill=(40, 44, 52))
    draw.rectangle([0, 28, 120, h], fill=(230, 232, 236))
    for y in range(44, h - 20, 22):  # side panel entries
        draw.rectangle([12, y, 12 + rng.randrange(40, 96), y + 8], fill=(120, 124, 132))
    for _ in range(rng.randint(2, 4)):  # windows with lines of "text"
        x0, y0 = rng.randrange(130, w - 220), rng.randrange(40, h - 160)
        x1, y1 = x0 + rng.randrange(160, 320), y0 + rng.randrange(100, 220)
        draw.rectangle([x0, y0, x1, y1], fill=(255, 255, 255), outline=(180, 184, 190))
        draw.rectangle([x0, y0, x1, y0 + 18], fill=tuple(rng.randrange(60, 200) for _ in range(3)))
        for y in range(y0 + 28, y1 - 8, 12):
            draw.rectangle([x0 + 8, y, x0 + 8 + rng.randrange(20, x1 - x0 - 16), y + 5], fill=(90, 94, 102))
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)
    return out.getvalue()


def _image_part(png: bytes) -> dict[str, Any]:
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
    }


def _screenshot_group(base_url: str, llm: openai.OpenAI, http: httpx.Client) -> Agent:
    """One prompt group of screenshot-agent rollouts, completed with a reward; yields after
    each HTTP call."""
    rng = random.Random()
    group = f"demo-ss-g-{uuid.uuid4().hex[:12]}"
    task = rng.choice(SCREEN_TASKS)
    _post(http, f"{base_url}/api/v1/groups", {"uid": group, "expected_rollouts": SCREEN_ROLLOUTS})
    yield True
    for _ in range(SCREEN_ROLLOUTS):
        traj = f"demo-ss-{uuid.uuid4().hex[:12]}"
        client = llm.with_options(base_url=f"{base_url}/t/{traj}/{group}/v1")
        turns_done = 0
        try:
            for _ in _screenshot_rollout(client, task, group, traj, rng):
                turns_done += 1
                yield True
            body = {"status": "completed", "reward": round(rng.random(), 3)}
            _post(http, f"{base_url}/api/v1/trajectories/{traj}/complete", body)
            yield True
        except Exception as e:  # noqa: BLE001 - one failed rollout must not stall its group
            logger.warning("demo traffic: screenshot rollout %s failed: %s", traj, _describe(e))
            if turns_done:
                _abandon(http, base_url, traj)
            yield False


def _screenshot_rollout(
    client: openai.OpenAI, task: str, group: str, traj: str, rng: random.Random
) -> Iterator[None]:
    """SCREEN_TURNS turns; each adds a screenshot (the first is the group's own, shared by its
    rollouts) and sends the text history with the last SCREENS_IN_PROMPT screenshots."""
    screens: list[bytes] = []
    history: list[Any] = []
    for turn in range(SCREEN_TURNS):
        screens.append(screenshot_png(group if turn == 0 else f"{traj}:{turn}"))
        shown = screens[-SCREENS_IN_PROMPT:]
        text = task if turn == 0 else "Done. The screen now:"
        user = {
            "role": "user",
            "content": [{"type": "text", "text": text}, *(_image_part(png) for png in shown)],
        }
        messages: list[Any] = [{"role": "system", "content": SCREEN_SYSTEM}, *history, user]
        r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=MAX_TOKENS)
        yield
        # The history keeps the text only: the screenshots of earlier turns are re-sent above.
        history += [
            {"role": "user", "content": text},
            {"role": "assistant", "content": r.choices[0].message.content or ""},
        ]


# --- the judge ----------------------------------------------------------------------------------
def _judge(base_url: str, http: httpx.Client, late: list[LateReward]) -> Agent:
    """Post the late rewards that are due, in one batch per turn; yields after each turn
    (True when nothing was due). A batch the gateway refuses (a 4xx: its trajectory is
    gone) is dropped; one that could not be sent, or met a 5xx, stays queued for the next turn."""
    while True:
        now = time.monotonic()
        due = [r for r in late if r.due <= now]
        if not due:
            yield True
            continue
        body = {"rewards": [{"trajectory_uid": r.trajectory_uid, "reward": r.reward} for r in due]}
        try:
            _post(http, f"{base_url}/api/v1/rewards", body)
        except Refused as e:
            if e.status < 500:
                late[:] = [r for r in late if r.due > now]
            raise
        late[:] = [r for r in late if r.due > now]  # the agents run on this thread: nothing new is due
        yield True


# --- helpers ------------------------------------------------------------------------------------
class Refused(Exception):
    """The gateway answered a request with an error status."""

    def __init__(self, message: str, *, status: int):
        super().__init__(message)
        self.status = status


# --- the demo task set: groups roll out what the task sampler picks ---------------------------------
DEMO_SET = "demo"


def _demo_task(http: httpx.Client, base_url: str, rng: random.Random) -> tuple[dict[str, str], str]:
    """The task a demo group rolls out: the demo set is registered (idempotent by uid), then
    ``POST /api/v1/task-sampler`` picks one (``informative``), so the tasks page fills. Returns
    ({"task": uid}, its prompt); when the sampler cannot answer, a random task without a uid."""
    try:
        tasks = [{"uid": f"demo-task-{i}", "set": DEMO_SET, "prompt": t} for i, t in enumerate(TASKS)]
        _post(http, f"{base_url}/api/v1/tasks", {"tasks": tasks})
        body = {"tasks": {"set": DEMO_SET}, "n": 1, "strategy": "informative", "seed": rng.randrange(2**31)}
        [picked] = _post(http, f"{base_url}/api/v1/task-sampler", body).json()["tasks"]
        return {"task": picked["uid"]}, picked["prompt"]
    except (Refused, httpx.HTTPError, ValueError, KeyError) as e:
        logger.warning("demo traffic: no task from the sampler: %s", _describe(e))
        return {}, rng.choice(TASKS)


def _post(
    http: httpx.Client, url: str, body: dict[str, Any], *, headers: dict[str, str] | None = None
) -> httpx.Response:
    r = http.post(url, json=body, headers=headers)
    if r.status_code >= 400:
        raise Refused(f"POST {url} -> {r.status_code}: {r.text[:300]}", status=r.status_code)
    return r


def _feedback(traj: str, rng: random.Random) -> dict[str, Any]:
    rating = rng.choice((2.0, 4.0, 5.0))
    comment = {2.0: "Went in circles.", 4.0: "Fine, a bit slow.", 5.0: "Exactly what I asked for."}[rating]
    return {"trajectory_uid": traj, "rating": rating, "comment": comment, "author": "demo-user"}


def _abandon(http: httpx.Client, base_url: str, traj: str) -> None:
    """Best effort: end a broken rollout as failed so its group can still complete."""
    try:
        http.post(f"{base_url}/api/v1/trajectories/{traj}/complete", json={"status": "failed"})
    except httpx.HTTPError:
        pass


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:300]}"
