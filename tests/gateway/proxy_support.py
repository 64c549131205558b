"""Helpers for the OpenAI gateway tests (tests/gateway/test_proxy_*.py, test_compat_claw_r1.py):
reading back what a live server stored, asking the demo upstream directly for the ids it
produces, and building a small local Hugging Face tokenizer (no downloads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.live import LiveServer

# The demo upstream's answer is a pure function of (prompt ids, seed, choice index,
# max_tokens), so asking it directly with return_token_ids gives the exact ids it produced
# for the same request through the gateway.


def upstream_ids(
    upstream: str, body: dict[str, Any], *, endpoint: str = "chat/completions"
) -> dict[str, Any]:
    """The demo upstream's answer to ``body`` with its token ids (called directly)."""
    r = httpx.post(
        f"{upstream}/{endpoint}", json={**body, "return_token_ids": True, "stream": False}, timeout=30
    )
    r.raise_for_status()
    return r.json()


def upstream_received(upstream: str, name: str) -> list[dict[str, Any]]:
    """The bodies the demo upstream was sent with the header ``x-test-record: NAME``, in
    arrival order (tests/gateway/upstream_harness.py)."""
    r = httpx.get(f"{upstream.removesuffix('/v1')}/test/received/{name}", timeout=30)
    r.raise_for_status()
    return r.json()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def steps_of(server: LiveServer, key: str, trajectory_uid: str) -> list[dict[str, Any]]:
    """The stored steps of a trajectory, in step order (read through the REST API)."""
    r = httpx.get(
        f"{server.url}/api/v1/steps", params={"trajectory_uid": trajectory_uid}, headers=auth(key), timeout=30
    )
    r.raise_for_status()
    return sorted(r.json()["results"], key=lambda s: s["step_index"])


def events_of(
    server: LiveServer, key: str, type: str, trajectory_uid: str | None = None
) -> list[dict[str, Any]]:
    """Stored events of ``type`` (newest first); with a trajectory uid, only those whose
    payload names it (events of trajectories that do not exist are not linked)."""
    r = httpx.get(f"{server.url}/api/v1/events", params={"type": type}, headers=auth(key), timeout=30)
    r.raise_for_status()
    events = r.json()["results"]
    if trajectory_uid is not None:
        events = [e for e in events if e["payload"].get("trajectory_uid") == trajectory_uid]
    return events


def trajectory_of(server: LiveServer, key: str, uid: str) -> httpx.Response:
    return httpx.get(f"{server.url}/api/v1/trajectories/{uid}", headers=auth(key), timeout=30)


CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m['tool_calls'] %}{{ m['tool_calls'] | tojson }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(directory: Path) -> Path:
    """Save a tiny byte-level BPE tokenizer (every byte a token, no merges) with a ChatML-like
    chat template to ``directory``: what CLAW_TOKENIZER points at."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|im_start|>": 0, "<|im_end|>": 1}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(str(directory))
    return directory
