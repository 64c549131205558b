"""What the gateway adds to the agent's request on its way upstream, and takes back out of
the answer on its way to the agent.

Every call sent to the upstream's /v1/chat/completions or /v1/completions (by the OpenAI
endpoints, the doors and Claw-R1's /generate) asks for what a step needs:

- the exact token ids: ``return_token_ids: true`` (vLLM >= 0.10.2, SGLang);
- the sampled tokens' logprobs, the step's ``rollout_logprobs`` (importance sampling needs
  them): chat ``logprobs: true, top_logprobs: 0`` (an agent's own top_logprobs is kept),
  completions ``logprobs: 1``. CLAW_UPSTREAM_LOGPROBS=0 asks only when the agent does; its
  steps are then flagged missing_logprobs.

Whatever the agent did not ask for itself is taken out of the answer and of every stream
chunk before it reaches it: vLLM's id fields are removed and a choice's ``logprobs`` is
null, as OpenAI answers when none were asked. What it asked for reaches it as the upstream
sent it.

An upstream that refuses an added field (a 400 naming it: OpenAI's API does for
return_token_ids, some servers for logprobs) is asked again without it, once per field. When
that answer succeeds the refusal is remembered for the upstream (CLAW_UPSTREAM_URL, per
process) and later calls go without the field: steps without ids are retokenized
(CLAW_TOKENIZER), steps without logprobs are flagged missing_logprobs. A 400 that names the
field for another reason (a validation error echoing the whole body) is not taken for a
refusal: the retry fails too, its error is passed on, and nothing is remembered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from django.conf import settings

from claw_kit.llm import upstream

from .recording import CHAT

IDS = "return_token_ids"
_CHAT_LOGPROBS = ("logprobs", "top_logprobs")
# Upstreams (by CLAW_UPSTREAM_URL) known to refuse the ids / logprobs fields.
_ids_refused: set[str] = set()
_logprobs_refused: set[str] = set()


@dataclass(slots=True)
class Ask:
    """One call's body for the upstream, and what the gateway added to the agent's."""

    body: dict[str, Any]
    agent: dict[str, Any]  # the agent's own body
    added: dict[str, Any]  # the fields added to it (or overriding its own), still in body
    strip_ids: bool  # the agent did not ask for ids: vLLM's id fields leave its answer
    strip_logprobs: bool  # the gateway asked for logprobs the agent did not: they leave its answer
    dropped: list[str] = field(default_factory=list)  # added fields taken out after a 400

    @property
    def strips(self) -> bool:
        """Whether the answer the agent gets differs from the upstream's."""
        return self.strip_ids or self.strip_logprobs

    def refused(self, raw: bytes) -> bool:
        """After a 400 answering ``raw``: take the added fields it names out of the body (the
        agent's own value, if it had one, goes back in). True when there were any: the caller
        asks again."""
        names = []
        if IDS in self.added and b"return_token_ids" in raw:
            names.append(IDS)
        if "logprobs" in self.added and b"logprobs" in raw:
            names += [k for k in _CHAT_LOGPROBS if k in self.added]
        if not names:
            return False
        body = dict(self.body)
        for k in names:
            del self.added[k]
            if k in self.agent:
                body[k] = self.agent[k]
            else:
                del body[k]
        self.body = body
        self.dropped += names
        return True

    def remember(self) -> None:
        """The upstream answered once the dropped fields were out: it refuses them."""
        url = settings.CLAW_UPSTREAM_URL
        if IDS in self.dropped:
            _ids_refused.add(url)
        if "logprobs" in self.dropped:
            _logprobs_refused.add(url)


def ask(endpoint: str, body: dict[str, Any], *, also: dict[str, Any] | None = None) -> Ask:
    """What to send upstream for the agent's ``body`` to ``endpoint`` (CHAT or COMPLETIONS);
    ``also``: fields a door sets besides (stream options). See the module docstring."""
    url = settings.CLAW_UPSTREAM_URL
    added: dict[str, Any] = {}
    strip_ids = body.get(IDS) is not True
    if strip_ids and url not in _ids_refused:
        added[IDS] = True
    strip_logprobs = False
    if settings.CLAW_UPSTREAM_LOGPROBS and url not in _logprobs_refused:
        lp = body.get("logprobs")
        if endpoint == CHAT:
            if not lp:
                strip_logprobs = True
                added["logprobs"] = True
                if body.get("top_logprobs") is None:
                    added["top_logprobs"] = 0
        elif lp is None or lp is False:  # completions: an integer (0 too) is the agent's ask
            strip_logprobs = True
            added["logprobs"] = 1
    send = {**body, **added, **also} if also else {**body, **added} if added else body
    return Ask(send, body, added, strip_ids, strip_logprobs)


async def request(a: Ask, path: str, headers: dict[str, str]) -> httpx.Response:
    """POST ``a.body`` upstream (upstream.request), asked again without the added fields an
    upstream 400 names."""
    resp = await upstream.request("POST", path, content=orjson.dumps(a.body), headers=headers)
    while resp.status_code == 400 and a.refused(resp.content):
        resp = await upstream.request("POST", path, content=orjson.dumps(a.body), headers=headers)
    if a.dropped and resp.status_code < 400:
        a.remember()
    return resp


async def open_stream(a: Ask, path: str, headers: dict[str, str]) -> tuple[httpx.Response, bytes | None]:
    """upstream.open_stream of ``a.body``, with the same retries as :func:`request`. A 400
    comes back read and closed, with its body; any other answer unread."""
    resp = await upstream.open_stream(path, content=orjson.dumps(a.body), headers=headers)
    raw = None
    while resp.status_code == 400:
        raw = await read_closed(resp)
        if not a.refused(raw):
            break
        resp = await upstream.open_stream(path, content=orjson.dumps(a.body), headers=headers)
        raw = None
    if a.dropped and resp.status_code < 400:
        a.remember()
    return resp, raw


def strip(answer: dict[str, Any], a: Ask) -> None:
    """Take what the agent did not ask for out of an answer or a stream chunk, in place:
    vLLM's token-id fields, and the logprobs the gateway asked for (set to null)."""
    ids, logprobs = a.strip_ids, a.strip_logprobs
    if ids:
        answer.pop("prompt_token_ids", None)
    for choice in answer.get("choices") or ():
        if isinstance(choice, dict):
            if ids:
                choice.pop("prompt_token_ids", None)
                choice.pop("token_ids", None)
            if logprobs and "logprobs" in choice:
                choice["logprobs"] = None


async def read_closed(resp: httpx.Response) -> bytes:
    """The whole body of an answer that is not relayed (an error), then closed."""
    try:
        return await resp.aread()
    except httpx.HTTPError:
        return b""
    finally:
        await resp.aclose()
