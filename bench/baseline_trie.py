"""The baseline for bench.prefix: a plain per-token dict trie, the obvious Python way.

Same input (int32 bytes as the pool stores them) and the same packed pre-order layout as
claw_client.build_prefix_tree (input ids, position ids, parent, subtree end). It does not
map each sequence's response tokens, so it does less work than ours: the measured speedup
is conservative.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class TrieLayout:
    input_ids: list[int]
    position_ids: list[int]
    parent: list[int]
    subtree_end: list[int]

    @property
    def unique_tokens(self) -> int:
        return len(self.input_ids)


def dict_trie_layout(sequences: Sequence[bytes]) -> TrieLayout:
    """Insert every token into nested dicts, then lay the trie out depth first."""
    root: dict[int, dict] = {}
    for raw in sequences:
        node = root
        for tok in np.frombuffer(raw, dtype="<i4").tolist():
            child = node.get(tok)
            if child is None:
                child = node[tok] = {}
            node = child

    input_ids: list[int] = []
    position_ids: list[int] = []
    parent: list[int] = []
    stack: list[tuple[int, dict, int, int]] = [(tok, child, -1, 0) for tok, child in reversed(root.items())]
    while stack:
        tok, node, par, depth = stack.pop()
        q = len(input_ids)
        input_ids.append(tok)
        position_ids.append(depth)
        parent.append(par)
        for ctok, child in reversed(node.items()):
            stack.append((ctok, child, q, depth + 1))
    subtree_end = list(range(len(input_ids)))
    for q in range(len(input_ids) - 1, -1, -1):
        p = parent[q]
        if p >= 0 and subtree_end[q] > subtree_end[p]:
            subtree_end[p] = subtree_end[q]
    return TrieLayout(input_ids, position_ids, parent, subtree_end)
