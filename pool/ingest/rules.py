"""The rules a step write must satisfy, in one place.

Every door (white-box JSON and MessagePack, Claw-R1's submit_steps, proxied calls, the
trajectory and reward endpoints) checks its input with these functions, so a limit or a
value set is stated once. Each raises ``InvalidInput`` naming the offending field, before
anything is written.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings

from claw_kit.web import guard

from ..errors import InvalidInput
from ..models import Channel

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Trajectory and group uids (CharField(128)); step uids may be longer (CharField(160)) so
# that the default "<trajectory_uid>:<step_index>" always fits.
MAX_UID_LEN = 128
MAX_STEP_UID_LEN = 160
MAX_FINISH_REASON_LEN = 32
CHANNELS: tuple[str, ...] = tuple(Channel.values)


def max_tokens_per_step() -> int:
    """prompt + response ids of one step (CLAW_MAX_TOKENS_PER_STEP). Never truncated."""
    return settings.CLAW_MAX_TOKENS_PER_STEP


def max_steps_per_batch() -> int:
    return settings.CLAW_MAX_STEPS_PER_BATCH


def check_token_count(n_prompt: int, n_response: int, field: str) -> None:
    """A step holds at least one prompt id and at most max_tokens_per_step() ids."""
    if n_prompt == 0:
        raise InvalidInput(
            "prompt_ids must not be empty", field=f"{field}.prompt_ids" if field else "prompt_ids"
        )
    limit = max_tokens_per_step()
    if n_prompt + n_response > limit:
        name = "response_ids" if n_response > limit else "prompt_ids"
        raise InvalidInput(
            f"prompt_ids + response_ids hold {n_prompt + n_response} tokens; the limit is {limit}",
            field=f"{field}.{name}" if field else name,
        )


def check_batch_size(n: int, field: str = "steps") -> None:
    limit = max_steps_per_batch()
    if n > limit:
        raise InvalidInput(f"a batch holds at most {limit} steps; got {n}", field=field)


def reward_abs_max() -> float:
    """The largest reward magnitude taken (CLAW_REWARD_ABS_MAX): a reward of 1e308 is finite,
    and would swamp every mean and advantage computed over it."""
    return settings.CLAW_REWARD_ABS_MAX


# A rating is an opinion on a scale (a review queue's, or the client's own): within this
# bound, which no sane scale leaves.
RATING_ABS_MAX = 1e6


def check_reward(value: float | None, field: str) -> None:
    """A reward is a finite number within +-CLAW_REWARD_ABS_MAX (or absent)."""
    if value is None:
        return
    if isinstance(value, bool) or not math.isfinite(value):
        raise InvalidInput("reward must be a finite number", field=field)
    limit = reward_abs_max()
    if abs(value) > limit:
        raise InvalidInput(f"reward must lie within [-{limit:g}, {limit:g}]; got {value:g}", field=field)


def check_rating(value: float | None, field: str = "rating") -> None:
    """A rating is a finite number within +-RATING_ABS_MAX (or absent)."""
    if value is None:
        return
    if isinstance(value, bool) or not math.isfinite(value):
        raise InvalidInput("rating must be a finite number", field=field)
    if abs(value) > RATING_ABS_MAX:
        raise InvalidInput(
            f"rating must lie within [-{RATING_ABS_MAX:g}, {RATING_ABS_MAX:g}]; got {value:g}", field=field
        )


def check_logprobs(values: Any, field: str) -> None:
    """Log-probabilities (a float64 array, finite already) are at most 0: the log of a
    probability. Names the first that is not."""
    if values is not None and len(values) and float(values.max()) > 0.0:
        i = int((values > 0.0).argmax())
        raise InvalidInput(f"a logprob is at most 0; got {float(values[i]):g}", field=f"{field}[{i}]")


def check_token_rewards(values: Any, field: str) -> None:
    """Token-level rewards (a float64 array, finite already) within +-CLAW_REWARD_ABS_MAX."""
    if values is None or not len(values):
        return
    limit = reward_abs_max()
    if float(abs(values).max()) > limit:
        i = int((abs(values) > limit).argmax())
        raise InvalidInput(f"a token reward must lie within [-{limit:g}, {limit:g}]", field=f"{field}[{i}]")


def check_uid(value: Any, field: str, *, max_len: int = MAX_UID_LEN) -> str:
    """A uid is a non-blank string of at most ``max_len`` characters without NUL."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{field} must be a non-empty string", field=field)
    if len(value) > max_len:
        raise InvalidInput(f"{field} must be at most {max_len} characters; got {len(value)}", field=field)
    if "\x00" in value:
        raise InvalidInput(f"{field} must not contain NUL characters", field=field)
    problem = guard.ident_problem(value)
    if problem:
        raise InvalidInput(f"{field} {problem}", field=field)
    return value


def check_name(value: str | None, field: str) -> None:
    """A name that is no uid but identifies (an event type, a label, a tag, a group's dataset):
    when given, the identifier rule's characters (claw_kit/web/guard.py) are refused in it."""
    if value:
        problem = guard.chars_problem(value)
        if problem:
            raise InvalidInput(f"{field} {problem}", field=field)


def check_channel(value: Any, field: str = "channel") -> str:
    if value not in CHANNELS:
        raise InvalidInput(f"channel must be one of {list(CHANNELS)}; got {value!r}", field=field)
    return value


def check_policy_version(value: Any, field: str = "policy_version") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX:
        raise InvalidInput(f"{field} must be a non-negative 64-bit integer", field=field)
    return value


def check_text(value: str | None, field: str) -> None:
    """Text columns: PostgreSQL cannot store NUL characters."""
    if value is not None and "\x00" in value:
        raise InvalidInput("must not contain NUL characters", field=field)


def check_json(value: Any, field: str, *, depth: int = 1) -> None:
    found = json_problem(value, field, depth=depth)
    if found:
        raise InvalidInput(found[1], field=found[0])


def json_problem(value: Any, path: str = "", *, depth: int = 1) -> tuple[str, str] | None:
    """The first value a JSON column cannot store or the renderer cannot write back, as
    (path inside ``value``, reason), or None: the one rule for every JSON field (step
    metadata and messages, payloads and metadata of the other endpoints).

    The parser accepts NaN/Infinity (so validators can name the field); PostgreSQL's jsonb
    rejects them and NUL characters; jsonb returns an integral float as an integer, and
    orjson renders integers only within 64 bits. Containers are within the guard's shape
    limits (claw_kit/web/guard.py; ``depth``: the level of ``value`` in its body); MessagePack's
    bin and ext values are no JSON."""
    max_depth, max_keys, max_items = guard.limits()
    if _storable(value, depth, max_depth, max_keys, max_items):
        return None
    return guard.shape_problem(value, path, depth=depth) or _named_problem(value, path)


def value_problem(value: Any, path: str = "") -> tuple[str, str] | None:
    """``json_problem`` without the shape limits, for a value the body reader has shaped
    (claw_kit/web/body.py)."""
    if _storable(value, 1, 1 << 62, 1 << 62, 1 << 62):
        return None
    return _named_problem(value, path)


def _storable(value: Any, depth: int, max_depth: int, max_keys: int, max_items: int) -> bool:
    """One pass without paths (a whole relayed body is checked per call, a step's fields per
    step): True when json_problem has nothing to say; a value that fails is walked again,
    naming the path."""
    stack = [(value, depth)]
    pop, push = stack.pop, stack.append
    while stack:
        v, d = pop()
        t = type(v)
        if t is str:
            if "\x00" in v:
                return False
        elif t is dict:
            if d > max_depth or len(v) > max_keys:
                return False
            for k, item in v.items():
                if type(k) is not str or "\x00" in k:
                    return False
                if type(item) is str:
                    if "\x00" in item:
                        return False
                else:
                    push((item, d + 1))
        elif t is list:
            if d > max_depth or len(v) > max_items:
                return False
            for item in v:
                push((item, d + 1))
        elif t is bool or v is None:
            continue
        elif t is int:
            if not -INT64_MAX - 1 <= v <= INT64_MAX:
                return False
        elif t is float:
            if not math.isfinite(v) or (abs(v) >= 2.0**63 and v == int(v)):
                return False
        else:
            return False  # a subclass, bytes, an ext: the named pass says which
    return True


def _named_problem(value: Any, path: str) -> tuple[str, str] | None:
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, dict):
            items = []
            for k, item in v.items():
                sub = f"{at}.{k}" if at else str(k)
                if not isinstance(k, str):  # MessagePack maps may have other keys
                    return (sub, "keys must be strings")
                if "\x00" in k:
                    return (sub, "keys must not contain NUL characters")
                items.append((item, sub))
            stack.extend(reversed(items))
        elif isinstance(v, list):
            stack.extend(reversed([(item, f"{at}[{i}]") for i, item in enumerate(v)]))
        elif isinstance(v, str):
            if "\x00" in v:
                return (at, "must not contain NUL characters")
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if not -INT64_MAX - 1 <= v <= INT64_MAX:
                return (at, "integers must fit in 64 bits")
        elif isinstance(v, float):
            if not math.isfinite(v):
                return (at, "must be a finite number")
            if abs(v) >= 2.0**63 and v == int(v):
                return (at, "integral numbers must lie within 64 bits to be stored exactly")
        else:  # bytes, msgspec.msgpack.Ext, a MessagePack timestamp...
            return (
                at,
                f"must be a JSON value (object, array, string, number, boolean or null), not {type(v).__name__}",
            )
    return None
