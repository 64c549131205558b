"""claw_client.prefix_tree: the merge and its packed layout, against a brute-force trie.

Pure numpy, no database. Random cases are seeded loops (no hypothesis): small vocabularies
force sharing, and token values are chosen so that little-endian byte prefixes can agree
while whole tokens differ (1 vs 257, 0 vs 2**31 - 1 ...).

README: "Steps that share token prefixes are merged into one packed pre-order tree (sort +
LCP, O(N) memory, never an N×N mask): per packed token the input id, position id, parent
index and subtree end, so query q may attend key k iff k <= q <= subtree_end[k]."
(check_layout and the attention rule against brute force; the memory bound below)
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from claw_client import PrefixTree, build_prefix_tree

# Byte-level traps: 1 = 01 00 00 00, 257 = 01 01 00 00, 65537 = 01 00 01 00, -1 = ff ff ff ff.
TRAP_TOKENS = [0, 1, 257, 65537, 256, 2**31 - 1, -1, 7]


def brute_trie(seqs: list[list[int]]) -> dict[tuple[int, ...], int]:
    """Every distinct non-empty prefix is one trie node (per-token, the obvious way)."""
    nodes: dict[tuple[int, ...], int] = {}
    for s in seqs:
        for d in range(len(s)):
            nodes.setdefault(tuple(s[: d + 1]), len(nodes))
    return nodes


def random_case(rng: random.Random) -> tuple[list[list[int]], list[int]]:
    vocab = rng.choice([TRAP_TOKENS[:2], TRAP_TOKENS[:4], TRAP_TOKENS, list(range(50))])
    seqs: list[list[int]] = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        prev = rng.choice(seqs) if seqs else []
        if kind < 0.15 and seqs:
            s = list(prev)  # identical
        elif kind < 0.3 and seqs:
            s = prev[: rng.randint(0, len(prev))]  # a prefix of another
        elif kind < 0.55 and seqs:
            s = prev[: rng.randint(0, len(prev))] + [rng.choice(vocab) for _ in range(rng.randint(0, 6))]
        else:
            s = [rng.choice(vocab) for _ in range(rng.randint(0, 10))]
        seqs.append(s)
    plens = [rng.randint(0, len(s)) for s in seqs]
    return seqs, plens


def check_layout(tree: PrefixTree, seqs: list[list[int]], plens: list[int]) -> None:
    """Assert everything the layout promises, from first principles."""
    nodes = brute_trie(seqs)
    u = len(tree.input_ids)
    # unique tokens: exactly the trie's node count
    assert u == len(nodes)
    assert tree.stats.unique_tokens == len(nodes)
    assert tree.stats.total_tokens == sum(map(len, seqs))
    # each trie node is exactly one packed index, the same for every sequence through it
    packed_of: dict[tuple[int, ...], int] = {}
    for i, s in enumerate(seqs):
        idx = tree.sequence_indices(i)
        assert len(idx) == len(s)
        assert tree.input_ids[idx].tolist() == s
        assert tree.position_ids[idx].tolist() == list(range(len(s)))
        if s:
            assert tree.parent[idx[0]] == -1
            assert tree.parent[idx[1:]].tolist() == idx[:-1].tolist()
        for d in range(len(s)):
            assert packed_of.setdefault(tuple(s[: d + 1]), int(idx[d])) == idx[d]
        assert tree.response_indices(i).tolist() == idx[plens[i] :].tolist()
    assert sorted(packed_of.values()) == list(range(u))
    # pre-order: a parent comes before its children; subtree_end from the parent pointers
    assert all(tree.parent[q] < q for q in range(u))
    end = list(range(u))
    size = [1] * u
    for q in range(u - 1, -1, -1):
        p = int(tree.parent[q])
        if p >= 0:
            end[p] = max(end[p], end[q])
            size[p] += size[q]
    assert tree.subtree_end.tolist() == end
    assert all(end[q] - q + 1 == size[q] for q in range(u))  # subtrees are contiguous
    # loss mask and owner
    owner = [-1] * u
    for i in range(len(seqs) - 1, -1, -1):
        for q in tree.response_indices(i).tolist():
            owner[q] = i
    assert tree.response_owner().tolist() == owner
    assert tree.loss_mask.tolist() == [o >= 0 for o in owner]


def brute_attention(tree: PrefixTree) -> np.ndarray:
    """mask[q, k]: k is an ancestor of q, or q itself, found by walking parent pointers."""
    u = len(tree.input_ids)
    mask = np.zeros((u, u), dtype=bool)
    for q in range(u):
        k = q
        while k >= 0:
            mask[q, k] = True
            k = int(tree.parent[k])
    return mask


def test_random_cases_match_brute_force_trie():
    rng = random.Random(20240601)
    for _ in range(300):
        # given a random set of sequences with shared prefixes, duplicates and prefixes
        seqs, plens = random_case(rng)
        # when they are merged
        tree = build_prefix_tree([np.array(s, dtype="<i4").tobytes() for s in seqs], plens)
        # then the layout is the brute-force trie, laid out in pre-order
        check_layout(tree, seqs, plens)


@pytest.mark.parametrize(
    "seqs",
    [
        pytest.param([[5, 6, 7], [5, 6, 7], [5, 6, 7]], id="identical"),
        pytest.param([[1, 2, 3, 4, 5], [1, 2], [1, 2, 3]], id="prefix-of-another"),
        pytest.param([[9, 8, 7, 6]], id="single"),
        pytest.param([[1] * 7, [2] * 3, [3] * 11, [4]], id="disjoint-different-lengths"),
        pytest.param([[], [1, 2], []], id="empty-sequences"),
        pytest.param([[1, 257], [1, 65537], [257, 1], [-1, 0], [2**31 - 1]], id="byte-prefix-traps"),
    ],
)
def test_edge_cases(seqs):
    # given sequences whose responses are empty (prompt_len == len)
    plens = [len(s) for s in seqs]
    # when merged
    tree = build_prefix_tree(seqs, plens)
    # then it matches the brute force and no token is a loss token
    check_layout(tree, seqs, plens)
    assert not tree.loss_mask.any()
    assert tree.response_offsets.tolist() == [0] * (len(seqs) + 1)


def test_unique_count_and_savings_of_an_agentic_group():
    # given 3 rollouts x 3 turns with a 50-token shared prompt, 5-token answers, 7-token observations
    rng = random.Random(3)
    system = [rng.randrange(150_000) for _ in range(50)]
    seqs, plens = [], []
    for _ in range(3):
        ctx = list(system)
        for _ in range(3):
            resp = [rng.randrange(150_000) for _ in range(5)]
            seqs.append(ctx + resp)
            plens.append(len(ctx))
            ctx = ctx + resp + [rng.randrange(150_000) for _ in range(7)]
    # when merged
    tree = build_prefix_tree(seqs, plens)
    # then unique = prompt + per rollout (3 answers + 2 observations), exactly
    assert tree.stats.unique_tokens == 50 + 3 * (3 * 5 + 2 * 7)
    assert tree.stats.total_tokens == sum(map(len, seqs))
    assert tree.stats.savings == pytest.approx(1 - tree.stats.unique_tokens / tree.stats.total_tokens)
    # and a step's response tokens are its own, while the next turn sees them as prompt
    check_layout(tree, seqs, plens)


def test_input_forms_give_identical_layouts():
    rng = random.Random(11)
    seqs, plens = random_case(rng)
    as_bytes = build_prefix_tree([np.array(s, dtype="<i4").tobytes() for s in seqs], plens)
    as_arrays = build_prefix_tree([np.array(s, dtype=np.int64) for s in seqs], plens)
    as_lists = build_prefix_tree(seqs, plens)
    for other in (as_arrays, as_lists):
        for name in ("input_ids", "position_ids", "parent", "subtree_end", "response_index", "order"):
            assert np.array_equal(getattr(as_bytes, name), getattr(other, name)), name


def test_attention_rule_is_ancestor_or_self():
    rng = random.Random(5)
    for _ in range(60):
        # given a random tree
        seqs, plens = random_case(rng)
        tree = build_prefix_tree(seqs, plens)
        u = len(tree.input_ids)
        # when the O(U) rule k <= q <= subtree_end[k] is expanded
        q = np.arange(u)[:, None]
        k = np.arange(u)[None, :]
        rule = (k <= q) & (q <= tree.subtree_end[None, :])
        # then it is exactly "k is an ancestor of q or q itself"
        assert np.array_equal(rule, brute_attention(tree))


def test_round_trip_through_bytes():
    rng = random.Random(8)
    for _ in range(30):
        seqs, plens = random_case(rng)
        tree = build_prefix_tree(seqs, plens)
        # when stored and reloaded with an extra array
        blob = tree.to_bytes(extra={"step_ids": np.arange(len(seqs)) + 100})
        back, extra = PrefixTree.from_bytes(blob)
        # then the layout is identical and the extra came along
        for name in PrefixTree.__dataclass_fields__:
            assert np.array_equal(getattr(tree, name), getattr(back, name)), name
        assert extra["step_ids"].tolist() == list(range(100, 100 + len(seqs)))


def test_radix_nodes_compress_chains_and_list_sequences():
    rng = random.Random(13)
    for _ in range(150):
        seqs, plens = random_case(rng)
        tree = build_prefix_tree(seqs, plens)
        nodes = tree.nodes()
        trie = brute_trie(seqs)
        children: dict[tuple[int, ...], int] = {}
        for key in trie:
            children[key[:-1]] = children.get(key[:-1], 0) + 1
        ends = {tuple(s) for s in seqs}
        covered = 0
        for node in nodes:
            span = range(node["start"], node["start"] + node["length"])
            covered += node["length"]
            # a node's tokens form a chain...
            assert all(tree.parent[q] == q - 1 for q in list(span)[1:])
            # ...that no branch or sequence end interrupts, and that ends at one
            for q in span:
                d = int(tree.position_ids[q])
                # the trie key of packed token q: any sequence listed on the node has it
                s = seqs[node["sequences"][0]]
                key = tuple(s[: d + 1])
                inner = q < span[-1]
                assert (children.get(key, 0) == 1 and key not in ends) == inner
            # the sequences through it are exactly those whose path contains its first token
            through = [i for i in range(len(seqs)) if node["start"] in tree.sequence_indices(i).tolist()]
            assert node["sequences"] == through
            assert node["size"] == int(tree.subtree_end[node["start"]]) - node["start"] + 1
            if node["parent"] is not None:
                par = nodes[node["parent"]]
                assert par["start"] + par["length"] - 1 == tree.parent[node["start"]]
        assert covered == len(tree.input_ids)


def test_rejects_malformed_input():
    with pytest.raises(ValueError, match="whole number"):
        build_prefix_tree([b"\x00\x01\x02"])
    with pytest.raises(ValueError, match="int32"):
        build_prefix_tree([[1, 2**40]])
    with pytest.raises(ValueError, match="integers"):
        build_prefix_tree([np.array([1.5])])
    with pytest.raises(ValueError, match="prompt length"):
        build_prefix_tree([[1, 2, 3]], [4])
    with pytest.raises(ValueError, match="prompt lengths"):
        build_prefix_tree([[1, 2, 3]], [1, 2])


def test_no_sequences():
    tree = build_prefix_tree([])
    assert tree.stats.as_dict() == {
        "n_sequences": 0,
        "total_tokens": 0,
        "unique_tokens": 0,
        "ratio": 1.0,
        "savings": 0.0,
    }
    assert tree.nodes() == []


def test_the_merge_takes_memory_linear_in_the_tokens_never_an_n_by_n_mask():
    """README: "Steps that share token prefixes are merged into one packed pre-order tree
    (sort + LCP, O(N) memory, never an N×N mask): ..." (the memory: the peak of the merge of
    N sequences grows with N, and stays far below even a bit-packed N×N mask)"""
    import tracemalloc

    def peak(n: int) -> tuple[int, int]:
        rng = np.random.default_rng(0)
        shared = rng.integers(0, 50, 16).astype("<i4")
        seqs = [
            np.concatenate([shared[: rng.integers(0, 17)], rng.integers(0, 4, 8).astype("<i4")])
            for _ in range(n)
        ]
        tracemalloc.start()
        try:
            tree = build_prefix_tree(seqs, prompt_lens=[len(s) // 2 for s in seqs])
            _, top = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert tree.stats.n_sequences == n
        return top, sum(len(s) for s in seqs)

    small, small_tokens = peak(2_000)
    large, large_tokens = peak(20_000)
    # ten times the sequences: about ten times the memory (an N×N mask would be 100 times)
    assert large / small < 2 * large_tokens / small_tokens
    assert large < 20_000 * 20_000 / 8  # even bit-packed, a 20k x 20k mask is 50 MB
