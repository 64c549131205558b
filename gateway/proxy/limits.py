"""The size limits of a proxied call, on both sides of the upstream.

Before: a call whose body could never be one step is refused before any byte of it goes
upstream (``call_problem``, from the envelope's ``Call.body``, which every door that calls
the upstream reads its body through): an array of more than CLAW_MAX_TOKENS_PER_STEP token
ids (a completions ``prompt``; Claw-R1's ``/generate`` checks its ``prompt_ids`` itself), or
more than CLAW_MAX_PROMPT_CHARS characters of text in all the body's strings together
(images' data and URLs not counted). Without it a 25 MB message went upstream, came back as
26 million prompt ids, and was parsed whole (seconds of the event loop, gigabytes) before the
step limit refused it.

After: an upstream answer (or stream event) is checked before it is parsed
(``answer_problem``): an id array (``prompt_token_ids``, ``token_ids``, at the top or in a
choice) longer than CLAW_MAX_TOKENS_PER_STEP can never be stored, so the answer is refused
unparsed. The check skims the answer with msgspec's ``Raw`` (no Python object per id) and
counts an array's ids by its commas; it runs only on answers of more than two bytes per id
of the limit, the smallest that can hold such an array.
"""

from __future__ import annotations

from typing import Any

import msgspec
from django.conf import settings

from claw_kit.web.errors import HttpError

# The keys whose strings are an image's bytes or address, not prompt text (chat's
# image_url.url, Anthropic's source.data, Responses' image_url / file_data).
_NOT_TEXT = frozenset({"url", "image_url", "data", "file_data"})
_ID_FIELDS = ("prompt_token_ids", "token_ids")

_top = msgspec.json.Decoder(dict[str, msgspec.Raw])
_choices = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])


def check_call(body: dict[str, Any]) -> None:
    """Raise HttpError 400 naming the field when ``body`` breaks ``call_problem``."""
    found = call_problem(body)
    if found is not None:
        field, message = found
        raise HttpError(400, message, code="too_large", param=field)


def call_problem(body: dict[str, Any]) -> tuple[str, str] | None:
    """(the field, why) of the first limit ``body`` breaks (module docstring), else None."""
    max_ids = settings.CLAW_MAX_TOKENS_PER_STEP
    max_chars = settings.CLAW_MAX_PROMPT_CHARS
    chars = 0
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, path = stack.pop()
        if type(value) is dict:
            # Pushed last first, so that strings are counted in the body's order.
            for k, v in reversed(value.items()):
                if k in _NOT_TEXT and type(v) is str:
                    continue
                stack.append((v, f"{path}.{k}" if path else k))
        elif type(value) is list:
            if len(value) > max_ids and all(type(i) is int for i in value):
                return (
                    path,
                    f"{path} has {len(value)} token ids; a step holds at most {max_ids} (CLAW_MAX_TOKENS_PER_STEP)",
                )
            stack.extend(
                (value[i], f"{path}[{i}]")
                for i in range(len(value) - 1, -1, -1)
                if type(value[i]) in (dict, list, str)
            )
        elif type(value) is str:
            chars += len(value)
            if max_chars and chars > max_chars:
                return path, (
                    f"the call's text passes {max_chars} characters (CLAW_MAX_PROMPT_CHARS) at {path}: "
                    f"more than the {max_ids} tokens a step holds"
                )
    return None


def answer_problem(raw: bytes) -> tuple[str, str] | None:
    """(why, the answer's field) when the upstream answer (or stream event) ``raw`` can never
    be stored (an id array past CLAW_MAX_TOKENS_PER_STEP), checked without parsing it; None
    when it may be parsed (a malformed answer too: its parser says why)."""
    limit = settings.CLAW_MAX_TOKENS_PER_STEP
    if len(raw) <= 2 * limit:  # each id takes two bytes at least ("1,")
        return None
    try:
        top = _top.decode(raw)
        found = _too_many(top, "", limit)
        if found is None and "choices" in top:
            for i, choice in enumerate(_choices.decode(top["choices"])):
                found = _too_many(choice, f"choices[{i}].", limit)
                if found is not None:
                    break
    except msgspec.DecodeError:
        return None
    if found is None:
        return None
    field, n = found
    return (
        f"the upstream answered {n} ids in {field}; a step holds at most {limit} (CLAW_MAX_TOKENS_PER_STEP)",
        field,
    )


def _too_many(obj: dict[str, msgspec.Raw], at: str, limit: int) -> tuple[str, int] | None:
    for name in _ID_FIELDS:
        raw = obj.get(name)
        if raw is None:
            continue
        ids = bytes(raw).strip()
        if len(ids) <= 2 * limit or not ids.startswith(b"["):
            continue
        n = ids.count(b",") + 1  # a flat array of integers: one comma between two ids
        if n > limit:
            return f"{at}{name}", n
    return None
