"""The demo's toy tokenizer behind the Hugging Face calls the pool makes (``CLAW_TOKENIZER=demo``,
registered in claw_site/apps.py): the keyword arguments of ``encode``, ``decode`` and
``apply_chat_template`` that claw_kit/llm/tokenizer.py and the reward code pass, accepted and
mapped onto toy_tokenizer's byte-level ids (which are what the demo upstream generates)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .toy_tokenizer import SPECIAL_TOKENS, ToyTokenizer


class HFToyTokenizer(ToyTokenizer):
    name_or_path = "demo"

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:  # type: ignore[override]
        return super().encode(text)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True, **_: Any) -> str:  # type: ignore[override]
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            return super().decode(ids)
        return "".join(SPECIAL_TOKENS.get(i) or super(HFToyTokenizer, self).decode([i]) for i in ids)

    def apply_chat_template(  # type: ignore[override]
        self,
        messages: Sequence[dict[str, Any]],
        tools: list | None = None,
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        return_dict: bool = False,
        **_: Any,
    ) -> Any:
        ids = super().apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt)
        if not tokenize:
            return self.decode(ids, skip_special_tokens=False)
        return {"input_ids": ids} if return_dict else ids
