"""The policy: a tiny causal LM over the demo's byte tokenizer, and the constraint it decodes
under.

The task (``examples.learning.agent``) is: call the ``lookup`` tool, then answer with the
digit it returned. The policy server decodes under a fixed grammar, as a constrained (guided)
decoder would: a turn whose last message is the user's is the ``lookup`` call (every token
forced), and a turn after a tool result is one sampled answer token out of ``ANSWER_TOKENS``
(the digits 0-5) followed by a forced ``<|end|>``. A forced token has probability 1 under the
constraint, so its logprob is exactly 0.0; a sampled token's logprob is the model's
log-softmax restricted to the allowed tokens. The server and the trainer compute it with the
same function (``answer_logprobs``), so the rollout logprobs the gateway stores are the
trainer's own numbers at the serving policy's weights.

The untrained model answers each digit with probability about 1/6 (reward about 0.17); to
learn, it must copy the tool's digit, three tokens back from where it answers.
"""

from __future__ import annotations

import torch

from claw_site.demo.toy_tokenizer import BYTE_OFFSET, END, ToyTokenizer
from examples.grpo_tiny import TinyLM

TOKENIZER = ToyTokenizer()
VOCAB = 265  # the toy tokenizer's ids: 0..264
DIGITS = "012345"
ANSWER_TOKENS = [BYTE_OFFSET + ord(c) for c in DIGITS]  # the answer turn's allowed tokens
# The model's context window: it reads the last CONTEXT tokens of a prompt (a sliding window,
# the server and the trainer alike). The whole prompt is still what the gateway records; the
# window keeps a CPU step at milliseconds (the toy template renders ~290 tokens per prompt).
CONTEXT = 4


def new_model(seed: int, d: int = 32, layers: int = 2, heads: int = 2) -> TinyLM:
    """The untrained policy, seeded."""
    torch.manual_seed(seed)
    return TinyLM(vocab=VOCAB, d=d, layers=layers, heads=heads)


def answer_logprobs(model: TinyLM, prompts: list[list[int]]) -> torch.Tensor:
    """(B, len(ANSWER_TOKENS)): the log-probabilities of each allowed answer token after each
    prompt, under the constraint (the log-softmax over the allowed tokens only), read through
    the last CONTEXT tokens of each prompt; with gradients when the caller has them on.

    Each prompt is its own forward pass (a batch of one), so a prompt's numbers do not depend
    on the batch it comes in: the server computes one prompt at a time, and a CPU matmul's
    float32 rounding can differ with the batch's shape (2.4e-07 between a batch of 12 and
    batches of one, seen on one machine), which would break "the trainer's own numbers"."""
    return torch.cat([_one(model, p[-CONTEXT:]) for p in prompts])


def _one(model: TinyLM, prompt: list[int]) -> torch.Tensor:
    width = len(prompt)
    ids = torch.as_tensor(prompt, dtype=torch.int64)[None]
    pos = torch.arange(width)[None]
    mask = torch.ones(width, width, dtype=torch.bool).tril()[None]
    logits = model(ids, pos, mask[:, None])[:, -1]  # (1, V): the row that predicts the answer
    return torch.log_softmax(logits[:, ANSWER_TOKENS].double(), dim=-1)


def forced_reply(tool_name: str, call_id: str) -> tuple[list[int], dict]:
    """The ids and the call of the forced tool-call turn (the demo upstream's rendering)."""
    from claw_site.demo.toy_tokenizer import canonical_tool_calls, compact_json

    call = {"id": call_id, "type": "function", "function": {"name": tool_name, "arguments": "{}"}}
    ids = TOKENIZER.encode(compact_json(canonical_tool_calls([call]))) + [END]
    return ids, call
