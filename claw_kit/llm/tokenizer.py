"""Local tokenizer fallback for upstreams that return no token ids.

CLAW_TOKENIZER names a local Hugging Face tokenizer directory (tokenizer.json +
tokenizer_config.json with a chat_template); nothing is ever downloaded. Ids made here are
re-encodings of text, not what the server used (see "retokenization drift" in the docs), so
steps built from them carry token_source "retokenized".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings

_lock = threading.Lock()
_loaded: dict[str, Any] = {}
# Named tokenizers that are not Hugging Face directories (CLAW_TOKENIZER=<name>): registered
# by the composition root (claw_site/apps.py registers "demo", the demo's toy tokenizer), so
# this module imports no app. A loader returns an object with the Hugging Face methods used
# here (encode, decode, apply_chat_template).
_loaders: dict[str, Callable[[], Any]] = {}


def register_loader(name: str, loader: Callable[[], Any]) -> None:
    """Make ``CLAW_TOKENIZER=name`` load ``loader()`` instead of a tokenizer directory."""
    _loaders[name] = loader


def get_tokenizer() -> Any | None:
    """The tokenizer CLAW_TOKENIZER names (a registered loader's name, else a local
    directory; loaded once per process), or None when unset."""
    path = settings.CLAW_TOKENIZER
    if not path:
        return None
    tok = _loaded.get(path)
    if tok is None:
        with _lock:
            tok = _loaded.get(path)
            if tok is None and path in _loaders:
                tok = _loaders[path]()
                _loaded[path] = tok
            elif tok is None:
                from transformers import AutoTokenizer  # heavy import: only when configured

                tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
                _loaded[path] = tok
    return tok


def chat_ids(
    tok: Any, messages: list, tools: list | None, reply: dict[str, Any]
) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a chat call.

    The prompt is the chat template with the generation prompt, as a server renders it. The
    response is the template's rendering of the reply appended to the conversation, minus
    the prompt, when the template is append-only there (this renders tool calls as the model
    would write them); otherwise the encoded reply text.
    """
    prompt = _ids(
        tok.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    try:
        full = _ids(
            tok.apply_chat_template(
                [*messages, reply],
                tools=tools or None,
                add_generation_prompt=False,
                tokenize=True,
                return_dict=False,
            )
        )
    except Exception:  # noqa: BLE001 - templates raise anything; fall back to the text
        full = []
    if len(full) > len(prompt) and full[: len(prompt)] == prompt:
        return prompt, full[len(prompt) :]
    return prompt, _ids(tok.encode(reply.get("content") or "", add_special_tokens=False))


def completion_ids(tok: Any, prompt: Any, text: str) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a text completion; a token-id prompt is taken as is."""
    if isinstance(prompt, list) and all(type(i) is int for i in prompt):
        prompt_ids = list(prompt)
    else:
        prompt_ids = _ids(tok.encode(prompt if isinstance(prompt, str) else "", add_special_tokens=True))
    return prompt_ids, _ids(tok.encode(text, add_special_tokens=False))


def _ids(value: Any) -> list[int]:
    if isinstance(value, dict) or hasattr(value, "input_ids"):
        value = value["input_ids"]
    return list(value)


def token_texts(tok: Any, ids: list[int]) -> list[str | None]:
    """Each id's own text (for showing tokens one by one): the tokenizer's ``token_text``
    when it has one, else the id decoded alone; None for an id outside its vocabulary."""
    one = getattr(tok, "token_text", None)
    out: list[str | None] = []
    for i in ids:
        try:
            out.append(one(i) if one is not None else tok.decode([i]))
        except (IndexError, KeyError, ValueError, TypeError, OverflowError):
            out.append(None)
    return out
