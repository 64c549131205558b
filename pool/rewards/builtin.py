"""Built-in rule rewards: GSM8K's ``#### <number>`` and MATH's ``\\boxed{...}`` answers.

Both score 1.0 for a correct final answer and 0.0 otherwise (also when the response has no
answer in the expected form); ``info`` says what was extracted.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from .base import RewardError, RewardResult, RewardSample, rule

_GSM8K = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?|-?\.[0-9]+)")


@rule
def gsm8k(sample: RewardSample) -> RewardResult:
    """The number after the last ``####`` equals the ground truth (commas, a leading ``$``,
    and trailing zeros after the point ignored: ``1,000.0`` == ``1000``)."""
    truth = _gsm8k_truth(sample.ground_truth)
    found = _GSM8K.findall(sample.response_text)
    if not found:
        return RewardResult(0.0, {"extracted": None, "ground_truth": truth})
    answer = normalise_number(found[-1])
    return RewardResult(1.0 if answer == truth else 0.0, {"extracted": answer, "ground_truth": truth})


def _gsm8k_truth(ground_truth: Any) -> str:
    if isinstance(ground_truth, bool) or ground_truth is None:
        raise RewardError("gsm8k needs a ground truth (reward_model.ground_truth)")
    text = str(ground_truth)
    if "####" in text:  # a full GSM8K solution: its answer line
        found = _GSM8K.findall(text)
        if found:
            text = found[-1]
    value = normalise_number(text)
    if value is None:
        raise RewardError(f"the gsm8k ground truth {str(ground_truth)[:100]!r} is not a number")
    return value


def normalise_number(text: str) -> str | None:
    """A number's canonical text (``"1,000.50"`` -> ``"1000.5"``, ``"42.0"`` -> ``"42"``), or
    None for text that is not a number."""
    cleaned = text.strip().replace(",", "").lstrip("$").rstrip(".")
    try:
        d = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


@rule
def math_boxed(sample: RewardSample) -> RewardResult:
    """The content of the last ``\\boxed{...}`` (nested braces allowed) equals the ground
    truth (itself possibly boxed), after light LaTeX normalisation; numbers compare by value."""
    if sample.ground_truth is None:
        raise RewardError("math_boxed needs a ground truth (reward_model.ground_truth)")
    truth_text = str(sample.ground_truth)
    truth = last_boxed(truth_text)
    truth = normalise_latex(truth if truth is not None else truth_text)
    answer = last_boxed(sample.response_text)
    if answer is None:
        return RewardResult(0.0, {"extracted": None, "ground_truth": truth})
    answer = normalise_latex(answer)
    same = answer == truth
    if not same:
        a, b = normalise_number(answer), normalise_number(truth)
        same = a is not None and a == b
    return RewardResult(1.0 if same else 0.0, {"extracted": answer, "ground_truth": truth})


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` or ``\\fbox{...}``, braces balanced; None if
    there is none (or it is never closed)."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


_LATEX_DROP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\$|\^\{?\\circ\}?|\\%|%")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def normalise_latex(text: str) -> str:
    """Spacing, ``\\left``/``\\right``, ``$``, degrees and percent signs dropped; ``\\dfrac``
    and ``\\tfrac`` as ``\\frac``; ``\\text{x}`` as ``x``; a trailing period removed."""
    s = _TEXT.sub(r"\1", text)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _LATEX_DROP.sub("", s)
    s = "".join(s.split())
    return s.rstrip(".")


@rule
def exact_match(sample: RewardSample) -> RewardResult:
    """The response's text, stripped, equals the ground truth's text (``"4"`` == ``4``): the
    verifier of answers that repeat a value (a tool's result, a word of the prompt)."""
    if sample.ground_truth is None:
        raise RewardError("exact_match needs a ground truth (reward_model.ground_truth)")
    truth = str(sample.ground_truth).strip()
    answer = sample.response_text.strip()
    return RewardResult(1.0 if answer == truth else 0.0, {"extracted": answer, "ground_truth": truth})
