"""Exact prefix-tree merge of token sequences, and its packed pre-order layout.

Given N token sequences (each a step's ``prompt_ids + response_ids``), :func:`build_prefix_tree`
builds the token trie that stores each shared prefix once and lays it out in pre-order
(depth first), so that a trainer can run ONE forward over the unique tokens instead of N
forwards over the repeated ones.

Layout (``U`` = unique tokens, arrays indexed by packed position ``q``):

* ``input_ids[q]``     the token id;
* ``position_ids[q]``  its index inside its own sequence (its depth in the trie);
* ``parent[q]``        the packed index of the previous token of the sequence, -1 at a root;
* ``subtree_end[q]``   the last packed index of ``q``'s subtree. Because the layout is
  pre-order, query ``q`` may attend key ``k`` iff ``k <= q <= subtree_end[k]`` (``k`` is an
  ancestor of ``q`` or ``q`` itself): O(U) integers describe the whole tree attention mask.

Per input sequence ``i``: :meth:`PrefixTree.sequence_indices` gives the packed index of each
of its tokens, :meth:`PrefixTree.response_indices` those of its response (loss) tokens.
``response_offsets``/``response_index`` hold the latter for all sequences at once (CSR, in
input order). Shared tokens are shared packed positions: a step's response token that is also
in a later step's prompt, or the tokens of two identical steps, map to the same index.

Construction (see "Prefix-tree merge" in the project notes): sort the sequences, take each
one's longest common prefix (LCP) with its predecessor, append the suffixes after the LCP in
sorted order. Sorting raw little-endian int32 bytes (memcmp order) is not numeric order but
keeps every set of sequences sharing a token prefix contiguous, which is all pre-order
needs; LCPs are compared whole tokens at a time. Everything after the sort is O(U + N) numpy
plus one O(N) Python pass over the sequences; nothing is N x N or U x U.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TOKEN_DTYPE = np.dtype("<i4")
TOKEN_BYTES = TOKEN_DTYPE.itemsize
INDEX_DTYPE = np.dtype(np.int32)  # packed indices; a layout is far below 2**31 tokens

SequenceLike = bytes | bytearray | memoryview | np.ndarray | Sequence[int]

_LAYOUT_FORMAT = 1  # bump when the serialised arrays change meaning


@dataclass(frozen=True, slots=True)
class PrefixTreeStats:
    """Token economics of a merge: ``ratio`` = unique/total, ``savings`` = 1 - ratio."""

    n_sequences: int
    total_tokens: int
    unique_tokens: int

    @property
    def ratio(self) -> float:
        return self.unique_tokens / self.total_tokens if self.total_tokens else 1.0

    @property
    def savings(self) -> float:
        return 1.0 - self.ratio

    def as_dict(self) -> dict[str, float | int]:
        return {
            "n_sequences": self.n_sequences,
            "total_tokens": self.total_tokens,
            "unique_tokens": self.unique_tokens,
            "ratio": self.ratio,
            "savings": self.savings,
        }


def build_prefix_tree(
    sequences: Sequence[SequenceLike], prompt_lens: Sequence[int] | np.ndarray | None = None
) -> PrefixTree:
    """Merge ``sequences`` into a prefix tree and return its packed layout.

    ``sequences[i]`` is little-endian int32 ``bytes`` (the pool's storage form; zero-copy) or
    an integer array/list. ``prompt_lens[i]`` says where sequence i's response starts; tokens
    from there on are its loss tokens. Without ``prompt_lens`` no token is a response token.

    Deterministic: equal inputs give identical layouts. Raises ValueError on a byte string
    whose length is not a multiple of 4, ids that are not int32 integers, or a prompt length
    outside ``[0, len]``.
    """
    raw = [_as_bytes(s, i) for i, s in enumerate(sequences)]
    n = len(raw)
    lengths = np.fromiter((len(b) for b in raw), dtype=np.int64, count=n) // TOKEN_BYTES
    plens = _prompt_lens(prompt_lens, lengths)
    # memcmp order of the raw bytes; stable, so identical sequences keep their input order.
    order_l = sorted(range(n), key=raw.__getitem__)
    order = np.array(order_l, dtype=np.int64)
    lcp = _adjacent_lcp(raw, order_l, lengths[order])
    new_len = lengths[order] - lcp
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(new_len, out=starts[1:])
    input_ids = np.frombuffer(
        b"".join([memoryview(raw[o])[TOKEN_BYTES * c :] for o, c in zip(order_l, lcp.tolist(), strict=True)]),
        dtype=TOKEN_DTYPE,
    )
    return PrefixTree._assemble(input_ids, order, lcp, lengths, plens, starts)


@dataclass(eq=False, slots=True)
class PrefixTree:
    """The packed pre-order layout of a merged set of sequences (see module docstring).

    Build it with :func:`build_prefix_tree`; store and reload it with :meth:`to_bytes` /
    :meth:`from_bytes`. Arrays are read-only views shared by every caller.
    """

    input_ids: np.ndarray  # (U,) int32
    position_ids: np.ndarray  # (U,) int32
    parent: np.ndarray  # (U,) int32, -1 at roots
    subtree_end: np.ndarray  # (U,) int32
    loss_mask: np.ndarray  # (U,) bool: a response token of at least one sequence
    lengths: np.ndarray  # (N,) int64, tokens per input sequence
    prompt_lens: np.ndarray  # (N,) int64
    response_offsets: np.ndarray  # (N+1,) int64: sequence i's response tokens are
    response_index: np.ndarray  # response_index[response_offsets[i]:response_offsets[i+1]]
    order: np.ndarray  # (N,) int64: input index of the k-th sequence in sorted order
    lcp: np.ndarray  # (N,) int64: LCP of the k-th sorted sequence with the (k-1)-th
    _path_offsets: np.ndarray  # (N+1,) CSR over path pieces, input order
    _path_depth: np.ndarray  # first depth covered by each piece
    _path_start: np.ndarray  # packed index of that first depth

    # --- construction -----------------------------------------------------------------
    @classmethod
    def _assemble(
        cls,
        input_ids: np.ndarray,
        order: np.ndarray,
        lcp: np.ndarray,
        lengths: np.ndarray,
        prompt_lens: np.ndarray,
        starts: np.ndarray,
    ) -> PrefixTree:
        """Everything after the sort: O(U + N) numpy plus one O(N) pass (see module doc)."""
        n = len(order)
        u = int(starts[-1])
        new_len = starts[1:] - starts[:-1]
        arange_u = np.arange(u, dtype=INDEX_DTYPE)

        parent_first, pieces = _walk_paths(lcp, new_len, starts, lengths[order])

        # In place where possible: at W-agentic-64 sizes each packed array is ~9 MB.
        position_ids = np.repeat((starts[:-1] - lcp).astype(INDEX_DTYPE), new_len)
        np.subtract(arange_u, position_ids, out=position_ids)
        parent = np.subtract(arange_u, 1, out=arange_u)
        nonempty = new_len > 0
        parent[starts[:-1][nonempty]] = parent_first[nonempty]

        subtree_end = _subtree_end(lcp, new_len, starts, parent_first, u)

        path_offsets, path_depth, path_start = _paths_in_input_order(pieces, order, n)
        response_offsets, response_index = _response_csr(
            path_offsets, path_depth, path_start, lengths, prompt_lens
        )
        loss_mask = np.zeros(u, dtype=bool)
        loss_mask[response_index] = True

        tree = cls(
            input_ids=input_ids,
            position_ids=position_ids,
            parent=parent,
            subtree_end=subtree_end,
            loss_mask=loss_mask,
            lengths=lengths,
            prompt_lens=prompt_lens,
            response_offsets=response_offsets,
            response_index=response_index,
            order=order,
            lcp=lcp,
            _path_offsets=path_offsets,
            _path_depth=path_depth,
            _path_start=path_start,
        )
        for name in cls.__dataclass_fields__:
            getattr(tree, name).flags.writeable = False
        return tree

    # --- per sequence ---------------------------------------------------------------------
    @property
    def n_sequences(self) -> int:
        return len(self.lengths)

    @property
    def stats(self) -> PrefixTreeStats:
        return PrefixTreeStats(
            n_sequences=self.n_sequences,
            total_tokens=int(self.lengths.sum()),
            unique_tokens=len(self.input_ids),
        )

    def sequence_indices(self, i: int) -> np.ndarray:
        """Packed index of each token of input sequence ``i``, in sequence order (so
        ``input_ids[sequence_indices(i)]`` is sequence i and ``position_ids`` of it is 0..L-1)."""
        lo, hi = int(self._path_offsets[i]), int(self._path_offsets[i + 1])
        depth = self._path_depth[lo:hi]
        ends = np.append(depth[1:], self.lengths[i])
        return _concat_ranges(self._path_start[lo:hi], ends - depth)

    def response_indices(self, i: int) -> np.ndarray:
        """Packed indices of input sequence ``i``'s response (loss) tokens, in order."""
        return self.response_index[self.response_offsets[i] : self.response_offsets[i + 1]]

    def response_owner(self) -> np.ndarray:
        """(U,) int: for each packed token, the lowest input index of a sequence whose
        response contains it, or -1 (context only)."""
        owner = np.full(len(self.input_ids), np.iinfo(np.int64).max, dtype=np.int64)
        seq = np.repeat(np.arange(self.n_sequences), np.diff(self.response_offsets))
        np.minimum.at(owner, self.response_index, seq)
        owner[owner == np.iinfo(np.int64).max] = -1
        return owner

    # --- visualisation --------------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        """The compressed (radix) tree: maximal token chains without a branch.

        Each node: ``id`` (pre-order), ``parent`` (node id or None), ``start``/``length`` (its
        packed span), ``sequences`` (input indices of the sequences passing through it) and
        ``size`` (tokens in its subtree, itself included).
        """
        u = len(self.input_ids)
        if u == 0:
            return []
        new_len = self.lengths[self.order] - self.lcp
        seg_start = (np.cumsum(new_len) - new_len)[new_len > 0]
        bounds = np.zeros(u + 1, dtype=bool)
        # A node starts at every segment start (a root, a branch, or the token after a
        # sequence that is a prefix of this one ends) and right after every attach point.
        bounds[seg_start] = True
        attach = self.parent[seg_start]
        bounds[attach[attach >= 0] + 1] = True
        node_start = np.flatnonzero(bounds[:u])
        node_len = np.diff(np.append(node_start, u))
        node_of = np.repeat(np.arange(len(node_start)), node_len)
        first_parent = self.parent[node_start]
        node_parent = np.where(first_parent >= 0, node_of[np.maximum(first_parent, 0)], -1)
        node_end = self.subtree_end[node_start]
        # The sequences through a node are those whose last token lies in its subtree.
        has = self.lengths > 0
        last_piece = self._path_offsets[1:][has] - 1
        last = np.full(self.n_sequences, -1, dtype=np.int64)
        last[has] = self._path_start[last_piece] + self.lengths[has] - 1 - self._path_depth[last_piece]
        by_last = np.argsort(last, kind="stable")
        sorted_last = last[by_last]
        lo = np.searchsorted(sorted_last, node_start, side="left")
        hi = np.searchsorted(sorted_last, node_end, side="right")
        return [
            {
                "id": k,
                "parent": int(node_parent[k]) if node_parent[k] >= 0 else None,
                "start": int(node_start[k]),
                "length": int(node_len[k]),
                "sequences": sorted(by_last[lo[k] : hi[k]].tolist()),
                "size": int(node_end[k] - node_start[k] + 1),
            }
            for k in range(len(node_start))
        ]

    # --- storage --------------------------------------------------------------------------
    def to_bytes(self, extra: dict[str, np.ndarray] | None = None) -> bytes:
        """A compact serialised form: the unique tokens plus O(N) integers (the rest is
        rebuilt in O(U + N) by :meth:`from_bytes`, no sort). ``extra`` arrays ride along
        (e.g. the pool's step ids) under their own names."""
        arrays: dict[str, Any] = {
            "format": np.array([_LAYOUT_FORMAT]),
            "input_ids": self.input_ids,
            "order": self.order,
            "lcp": self.lcp,
            "lengths": self.lengths,
            "prompt_lens": self.prompt_lens,
        }
        for name, value in (extra or {}).items():
            arrays[f"extra_{name}"] = np.asarray(value)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> tuple[PrefixTree, dict[str, np.ndarray]]:
        """Inverse of :meth:`to_bytes`: the identical layout and the ``extra`` arrays."""
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            if int(z["format"][0]) != _LAYOUT_FORMAT:
                raise ValueError(f"unsupported prefix-tree layout format {int(z['format'][0])}")
            order, lcp, lengths = z["order"], z["lcp"], z["lengths"]
            input_ids = z["input_ids"].astype(TOKEN_DTYPE, copy=False)
            starts = np.zeros(len(order) + 1, dtype=np.int64)
            np.cumsum(lengths[order] - lcp, out=starts[1:])
            tree = cls._assemble(input_ids, order, lcp, lengths, z["prompt_lens"], starts)
            extra = {k[len("extra_") :]: z[k] for k in z.files if k.startswith("extra_")}
        return tree, extra


# --- construction helpers (module private) ----------------------------------------------------
def _as_bytes(seq: SequenceLike, i: int) -> bytes:
    if isinstance(seq, bytes):
        if len(seq) % TOKEN_BYTES:
            raise ValueError(f"sequence {i}: {len(seq)} bytes is not a whole number of int32 tokens")
        return seq
    if isinstance(seq, bytearray | memoryview):
        return _as_bytes(bytes(seq), i)
    arr = np.asarray(seq)
    if arr.ndim != 1:
        raise ValueError(f"sequence {i}: expected a 1-D array of token ids")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"sequence {i}: token ids must be integers")
    if arr.size and arr.dtype != TOKEN_DTYPE and (arr.min() < -(2**31) or arr.max() > 2**31 - 1):
        raise ValueError(f"sequence {i}: token ids must fit in int32")
    return np.ascontiguousarray(arr, dtype=TOKEN_DTYPE).tobytes()


def _prompt_lens(prompt_lens: Sequence[int] | np.ndarray | None, lengths: np.ndarray) -> np.ndarray:
    if prompt_lens is None:
        return lengths.copy()
    plens = np.asarray(prompt_lens, dtype=np.int64).reshape(-1)
    if len(plens) != len(lengths):
        raise ValueError(f"{len(plens)} prompt lengths for {len(lengths)} sequences")
    bad = np.flatnonzero((plens < 0) | (plens > lengths))
    if len(bad):
        raise ValueError(f"sequence {int(bad[0])}: prompt length outside [0, sequence length]")
    return plens


def _adjacent_lcp(raw: list[bytes], order: list[int], sorted_len: np.ndarray) -> np.ndarray:
    """LCP in whole tokens of each sorted sequence with its predecessor (0 for the first).

    Galloping memcmp (``bytes.startswith`` on zero-copy memoryview slices): chunks of
    doubling size are compared until one differs, then numpy finds the first differing token
    inside that chunk. O(LCP) bytes compared per pair, O(total tokens) in all, and
    O(log LCP) Python calls per pair. The common agentic case (the previous step is a
    prefix of the next one) is a single memcmp.
    """
    n = len(order)
    lcp = np.zeros(n, dtype=np.int64)
    seq_len = sorted_len.tolist()
    for k in range(1, n):
        prev, cur = raw[order[k - 1]], raw[order[k]]
        m = min(seq_len[k - 1], seq_len[k])
        if m == 0 or prev[:TOKEN_BYTES] != cur[:TOKEN_BYTES]:
            continue
        if seq_len[k - 1] <= seq_len[k] and cur.startswith(prev):
            lcp[k] = m
            continue
        view = memoryview(prev)
        lo, chunk = 1, _GALLOP_FIRST
        while lo < m:
            hi = min(lo + chunk, m)
            if not cur.startswith(view[lo * TOKEN_BYTES : hi * TOKEN_BYTES], lo * TOKEN_BYTES):
                a = np.frombuffer(prev, dtype=TOKEN_DTYPE, count=hi - lo, offset=lo * TOKEN_BYTES)
                b = np.frombuffer(cur, dtype=TOKEN_DTYPE, count=hi - lo, offset=lo * TOKEN_BYTES)
                lo += int((a != b).argmax())
                break
            lo, chunk = hi, chunk * 2
        lcp[k] = lo
    return lcp


_GALLOP_FIRST = 256  # tokens in the first galloping chunk: below this numpy's overhead dominates


def _walk_paths(
    lcp: np.ndarray, new_len: np.ndarray, starts: np.ndarray, sorted_len: np.ndarray
) -> tuple[np.ndarray, tuple[list[int], list[int], list[int]]]:
    """One pass over the sorted sequences, keeping the current root path as a stack of
    pieces (first depth, packed start). Returns each segment's parent (packed index of the
    token before its first new token, -1 at a root) and every sequence's path pieces.

    O(N + total pieces); a piece holds >= 1 token, so pieces <= tokens.
    """
    n = len(lcp)
    parent_first = np.full(n, -1, dtype=np.int64)
    depth_stack: list[int] = []
    start_stack: list[int] = []
    piece_seq: list[int] = []
    piece_depth: list[int] = []
    piece_start: list[int] = []
    lcp_l, new_l, start_l = lcp.tolist(), new_len.tolist(), starts.tolist()
    for k in range(n):
        c = lcp_l[k]
        while depth_stack and depth_stack[-1] >= c:
            depth_stack.pop()
            start_stack.pop()
        if c > 0:
            parent_first[k] = start_stack[-1] + (c - 1 - depth_stack[-1])
        if new_l[k] > 0:
            depth_stack.append(c)
            start_stack.append(start_l[k])
        if sorted_len[k]:
            piece_seq.extend([k] * len(depth_stack))
            piece_depth.extend(depth_stack)
            piece_start.extend(start_stack)
    return parent_first, (piece_seq, piece_depth, piece_start)


def _subtree_end(
    lcp: np.ndarray, new_len: np.ndarray, starts: np.ndarray, parent_first: np.ndarray, u: int
) -> np.ndarray:
    """The last packed index of each token's subtree, O(N log N) work plus one O(U) repeat.

    A segment's first token (depth lcp[k]) ends its subtree right before the first later
    segment whose LCP is <= lcp[k] (next smaller-or-equal value: one stack pass). A token
    inside a segment covers the rest of its segment and the subtrees of the segments that
    attach at or below it. Those attached deeper are visited first and end earlier, so the
    value is that of the next attach point at or after the token: constant on each run of
    tokens between attach points, one np.repeat.
    """
    n = len(lcp)
    if u == 0:
        return np.zeros(0, dtype=INDEX_DTYPE)
    nse = np.full(n, n, dtype=np.int64)
    stack: list[int] = []
    lcp_l = lcp.tolist()
    for k in range(n):
        c = lcp_l[k]
        while stack and c <= lcp_l[stack[-1]]:
            nse[stack.pop()] = k
        stack.append(k)
    seg_end = starts[nse] - 1  # subtree end of each segment's first token
    attached = np.flatnonzero((new_len > 0) & (parent_first >= 0))
    point = parent_first[attached]
    by_point = np.argsort(point, kind="stable")
    point, value = point[by_point], seg_end[attached][by_point]
    points, first = np.unique(point, return_index=True)
    point_value = np.maximum.reduceat(value, first) if len(first) else value
    # Runs start at every segment start and right after every attach point.
    run_start = np.union1d(starts[:-1][new_len > 0], points + 1)
    run_start = run_start[run_start < u]
    run_last = np.append(run_start[1:], u) - 1
    run_value = run_last.copy()  # a run ending at its segment's end reaches that end...
    at = np.searchsorted(points, run_last)
    hit = at < len(points)
    hit[hit] = points[at[hit]] == run_last[hit]
    run_value[hit] = point_value[at[hit]]  # ...one ending at an attach point reaches further
    return np.repeat(run_value.astype(INDEX_DTYPE), np.diff(np.append(run_start, u)))


def _paths_in_input_order(
    pieces: tuple[list[int], list[int], list[int]], order: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    piece_seq = order[np.asarray(pieces[0], dtype=np.int64)] if pieces[0] else np.zeros(0, dtype=np.int64)
    by_input = np.argsort(piece_seq, kind="stable")  # keeps each path's depth order
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(piece_seq, minlength=n), out=offsets[1:])
    depth = np.asarray(pieces[1], dtype=np.int64)[by_input]
    start = np.asarray(pieces[2], dtype=np.int64)[by_input]
    return offsets, depth, start


def _response_csr(
    offsets: np.ndarray, depth: np.ndarray, start: np.ndarray, lengths: np.ndarray, prompt_lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Clip every path piece to its sequence's response range [prompt_len, len)."""
    n = len(lengths)
    piece_seq = np.repeat(np.arange(n), np.diff(offsets))
    piece_hi = depth.copy()
    if len(depth):
        piece_hi[:-1] = depth[1:]
        last_piece = offsets[1:][np.diff(offsets) > 0] - 1
        piece_hi[last_piece] = lengths[np.diff(offsets) > 0]
    lo = np.maximum(depth, prompt_lens[piece_seq])
    hi = np.minimum(piece_hi, lengths[piece_seq])
    count = np.maximum(hi - lo, 0)
    response_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(piece_seq, weights=count, minlength=n).astype(np.int64), out=response_offsets[1:])
    return response_offsets, _concat_ranges(start + (lo - depth), count)


def _concat_ranges(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """concatenate(arange(f, f + c) for f, c in zip(first, count)) without a Python loop."""
    count = np.asarray(count, dtype=np.int64)
    total = int(count.sum())
    if total == 0:
        return np.zeros(0, dtype=INDEX_DTYPE)
    keep = count > 0
    first, count = np.asarray(first, dtype=np.int64)[keep], count[keep]
    step = np.ones(total, dtype=np.int64)
    heads = np.zeros(len(count), dtype=np.int64)
    np.cumsum(count[:-1], out=heads[1:])
    step[0] = first[0]
    step[heads[1:]] = first[1:] - (first[:-1] + count[:-1] - 1)
    return np.cumsum(step).astype(INDEX_DTYPE)
