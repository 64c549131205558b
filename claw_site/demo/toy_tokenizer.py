"""A deterministic byte-level tokenizer with an append-only chat template.

Ids: 0 <pad>, 1 <bos>, 2 <eos>; byte b is id b + 3 (ids 3..258); 259..264 are role and
section markers. No files, no merges: ``decode(encode(text)) == text`` for every string, and
``encode`` is the only way a text becomes ids, so there is no retokenization ambiguity.

Append-only template. For messages M and an assistant reply whose ids are exactly what the
model generated, G = encode(content) [+ encode(tool_calls json)] + [<|end|>]::

    apply_chat_template(M) + G  is a prefix of  apply_chat_template(M + [reply] + more)

because the template renders every message independently as ``marker + body + <|end|>`` and the
generation prompt is just the assistant marker. Tool calls are rendered through
:func:`canonical_tool_calls`, so an agent that echoes the reply's ``tool_calls`` back (with
extra keys or a different key order) still renders byte-identical ids. A multi-turn agent that
goes through the gateway therefore sees no drift between upstream ids and re-rendered prompts.
A reply cut off by max_tokens (finish_reason "length") lacks the final <|end|>; the next
prompt still starts with prompt + response, since the template adds the <|end|>.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import orjson

PAD, BOS, EOS = 0, 1, 2
BYTE_OFFSET = 3
SYSTEM, USER, ASSISTANT, TOOL, END, TOOLS = 259, 260, 261, 262, 263, 264

# Outside the vocabulary, as Qwen2-VL's ids: an image is <|vision_start|> <|image_pad|>*n
# <|vision_end|> (see ToyTokenizer.image_tokens).
VISION_START, VISION_END, IMAGE_PAD = 151652, 151653, 151655

SPECIAL_TOKENS: dict[int, str] = {
    PAD: "<pad>",
    BOS: "<bos>",
    EOS: "<eos>",
    SYSTEM: "<|system|>",
    USER: "<|user|>",
    ASSISTANT: "<|assistant|>",
    TOOL: "<|tool|>",
    END: "<|end|>",
    TOOLS: "<|tools|>",
}
ROLE_MARKERS: dict[str, int] = {
    "system": SYSTEM,
    "developer": SYSTEM,  # OpenAI's newer name for the system role
    "user": USER,
    "assistant": ASSISTANT,
    "tool": TOOL,
    "function": TOOL,
}


class ToyTokenizer:
    """Byte-level tokenizer; see the module docstring for the id layout and template contract."""

    vocab_size: int = 265
    pad_token_id: int = PAD
    bos_token_id: int = BOS
    eos_token_id: int = EOS
    end_token_id: int = END
    # Image parts (image_url / image) rendered as a run of this many placeholder ids between
    # vision start/end ids, as a VLM server expands Qwen2-VL's <|image_pad|>; 0: images add
    # nothing (the default).
    image_tokens: int = 0
    image_token_id: int = IMAGE_PAD

    def encode(self, text: str) -> list[int]:
        """UTF-8 bytes of ``text`` shifted by 3. Never adds special tokens."""
        return _encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        """Inverse of :meth:`encode`; special ids are skipped, invalid UTF-8 is replaced."""
        return bytes(i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < SYSTEM).decode(
            "utf-8", errors="replace"
        )

    def token_text(self, token_id: int) -> str:
        """The text of one id: its special name, or its byte (U+FFFD when not valid alone)."""
        return _TEXTS[token_id]

    def token_bytes(self, token_id: int) -> list[int]:
        """The raw bytes of one id, as OpenAI's logprobs ``bytes`` field lists them."""
        return list(_BYTES[token_id])

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Render chat messages to ids (append-only; see the module docstring).

        Layout: <bos> [<|tools|> json(tools) <|end|>] (marker content [json(tool_calls)] <|end|>)*
        [<|assistant|>]. Raises ValueError on an unknown role or a non-dict message.
        """
        ids = [BOS]
        if tools:
            ids.append(TOOLS)
            ids += _encode_cached(compact_json(tools))
            ids.append(END)
        for m in messages:
            if not isinstance(m, dict):
                raise ValueError("each message must be an object")
            role = m.get("role")
            marker = ROLE_MARKERS.get(role)  # type: ignore[arg-type]
            if marker is None:
                raise ValueError(f"unknown role {role!r}")
            ids.append(marker)
            content = m.get("content")
            if self.image_tokens and isinstance(content, list):
                ids += self._parts(content)
            else:
                ids += _encode_cached(message_text(content))
            tool_calls = m.get("tool_calls")
            if tool_calls:
                ids += _encode_cached(compact_json(canonical_tool_calls(tool_calls)))
            ids.append(END)
        if add_generation_prompt:
            ids.append(ASSISTANT)
        return ids

    def _parts(self, parts: list) -> list[int]:
        """Content parts in order: texts encoded, each image a run of placeholder ids."""
        out: list[int] = []
        for p in parts:
            if isinstance(p, dict) and p.get("type") in ("image_url", "image", "input_image"):
                out += [VISION_START, *[self.image_token_id] * self.image_tokens, VISION_END]
            elif isinstance(p, dict):
                out += _encode_cached(p.get("text") or "")
        return out


def _encode(text: str) -> list[int]:
    # numpy does the shift in C: ~10x a list comprehension on long texts.
    raw = text.encode("utf-8")
    if len(raw) < 32:
        return [b + BYTE_OFFSET for b in raw]
    return (np.frombuffer(raw, dtype=np.uint8).astype(np.int32) + BYTE_OFFSET).tolist()


@lru_cache(maxsize=4096)
def _encode_cached(text: str) -> tuple[int, ...]:
    """Message bodies repeat across the turns of a conversation (and system prompts across
    conversations), so the template encodes each distinct body once."""
    return tuple(_encode(text))


def _token_text(token_id: int) -> str:
    special = SPECIAL_TOKENS.get(token_id)
    if special is not None:
        return special
    if BYTE_OFFSET <= token_id < SYSTEM:
        return bytes([token_id - BYTE_OFFSET]).decode("utf-8", errors="replace")
    raise IndexError(f"token id {token_id} is outside the vocabulary")


_TEXTS: tuple[str, ...] = tuple(_token_text(i) for i in range(ToyTokenizer.vocab_size))
_BYTES: tuple[tuple[int, ...], ...] = tuple(
    tuple(SPECIAL_TOKENS[i].encode()) if i in SPECIAL_TOKENS else (i - BYTE_OFFSET,)
    for i in range(ToyTokenizer.vocab_size)
)


def compact_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: one text per value, whatever the key order."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def canonical_tool_calls(tool_calls: Sequence[Any]) -> list[dict[str, Any]]:
    """Keep only id, type and function{name, arguments} of each call (drops index and nulls
    that clients add when they echo a reply back)."""
    out = []
    for call in tool_calls:
        if not isinstance(call, dict):
            raise ValueError("each tool call must be an object")
        fn = call.get("function") or {}
        out.append(
            {
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "function": {"name": fn.get("name"), "arguments": fn.get("arguments")},
            }
        )
    return out


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the concatenated text of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    raise ValueError("message content must be a string, an array of parts, or null")
