"""Token storage: exact, prefix-deduplicated token sequences.

Layout
------
A step's full sequence is ``prompt_ids + response_ids`` as little-endian int32 bytes. It is
stored as a delta against a parent step (see pool.models.Step)::

    full(step) = full(parent)[:seq_shared] + seq_delta

The parent is picked at ingest as the candidate with the longest common prefix (LCP): the
previous step of the trajectory (its prompt extends the previous prompt + response) or the
group anchor (the rollouts of a group share the prompt). Each shared prefix is therefore
stored once, every write is a single row (no block table to maintain) and a read is one
recursive query that returns exactly the bytes the step's ancestry holds.

Why not hash-chained fixed blocks (vLLM's prefix cache)? Blocks only share whole blocks,
duplicate every partial tail, and each step must list all of its blocks (O(L/B) references
per step, which grows quadratically with turns again). The delta chain stores each unique
token once and one reference per step; MAX_CHAIN_DEPTH bounds the read cost.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .models import Step
from .replica import read_connection

TOKEN_DTYPE = np.dtype("<i4")
LOGPROB_DTYPE = np.dtype("<f8")
VERSION_DTYPE = np.dtype("<i8")  # Step.token_versions: (version, count) pairs
TOKEN_BYTES = TOKEN_DTYPE.itemsize

# Below this many shared tokens a parent link costs more (one more row on every read) than
# it saves (64 bytes).
MIN_SHARED_TOKENS = 16
# Bounds reconstruction: a step is rebuilt from at most this many rows. A step whose parent
# is this deep is stored whole and starts a new chain.
MAX_CHAIN_DEPTH = 64
# SQLite's and PostgreSQL's parameter limits are far above this; keeps statements small.
_LOAD_CHUNK = 2_000
# Up to this many steps are loaded with their chains by one recursive query (load_sequences).
_RECURSIVE_MAX = 100

EMPTY_IDS = np.zeros(0, dtype=TOKEN_DTYPE)


def ids_to_bytes(ids: np.ndarray) -> bytes:
    return np.ascontiguousarray(ids, dtype=TOKEN_DTYPE).tobytes()


def bytes_to_ids(raw: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(raw, dtype=TOKEN_DTYPE)


def runs_to_bytes(runs: list[tuple[int, int]]) -> bytes:
    """token_policy_versions runs as stored (Step.token_versions)."""
    return np.asarray(runs, dtype=VERSION_DTYPE).reshape(-1, 2).tobytes()


def bytes_to_runs(raw: bytes | memoryview) -> list[list[int]]:
    """The stored runs as the API writes them: [[version, count], ...]."""
    return np.frombuffer(raw, dtype=VERSION_DTYPE).reshape(-1, 2).tolist()


def runs_expand(runs: list[list[int]] | list[tuple[int, int]]) -> np.ndarray:
    """One policy version per response id (int64) from its runs."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    a = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
    return np.repeat(a[:, 0], a[:, 1])


def seq_hash(full: bytes) -> bytes:
    return hashlib.blake2b(full, digest_size=16).digest()


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays (vectorised)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


@dataclass(slots=True)
class Encoded:
    """How one sequence is stored: against ``parent`` (or nothing) with ``shared`` tokens."""

    shared: int
    delta: bytes
    depth: int


def encode_against(full: np.ndarray, parent: np.ndarray | None, parent_depth: int) -> Encoded:
    """Encode ``full`` as a delta against ``parent`` if it shares enough, else whole."""
    if parent is not None and parent_depth + 1 <= MAX_CHAIN_DEPTH:
        shared = common_prefix_len(full, parent)
        if shared >= MIN_SHARED_TOKENS:
            return Encoded(shared=shared, delta=ids_to_bytes(full[shared:]), depth=parent_depth + 1)
    return Encoded(shared=0, delta=ids_to_bytes(full), depth=0)


def load_sequences(step_ids: Iterable[int]) -> dict[int, bytes]:
    """Full sequence bytes of each step, rebuilt exactly from the delta chains. Every
    ancestor is read once and materialised once (memoised), so loading a whole prompt group
    costs O(stored bytes + output bytes).

    A few steps (up to _RECURSIVE_MAX: a proxied call's parent, a step page) are read with
    their whole chains in ONE recursive query, however deep (a long agentic trajectory's
    chain is up to MAX_CHAIN_DEPTH steps). Many steps (a pull's batch, a snapshot's chunk)
    are read level by level: the steps asked for, then the parents not read yet, and so on,
    each level one lookup by primary key per chunk. For 1,000 steps PostgreSQL joined the
    recursive query's step by hashing every step that has a parent: 100-130 ms at 200k
    steps and growing with the pool, against ~12 ms for W-pool's two or three levels (the
    recursive query has looked its parents up by key since; see _fetch_chains).
    """
    wanted = list(dict.fromkeys(step_ids))
    nodes: dict[int, tuple[int | None, int, bytes]] = {}
    if len(wanted) <= _RECURSIVE_MAX:
        nodes.update(_fetch_chains(wanted) if wanted else {})
    else:
        todo = wanted
        while todo:
            level: dict[int, tuple[int | None, int, bytes]] = {}
            for start in range(0, len(todo), _LOAD_CHUNK):
                level.update(_fetch_nodes(todo[start : start + _LOAD_CHUNK]))
            nodes.update(level)
            todo = sorted({p for p, _, _ in level.values() if p is not None and p not in nodes})
    memo: dict[int, bytes] = {}
    for target in wanted:
        _materialise(target, nodes, memo)
    return {t: memo[t] for t in wanted}


def _members(connection, ids: list[int]) -> tuple[str, list]:
    """``= ANY(%s)`` with one array parameter on PostgreSQL (pool/lookups.py says why), an
    ``IN`` list elsewhere; and the parameters."""
    if connection.vendor == "postgresql":
        return "= ANY(%s)", [ids]
    return f"IN ({','.join(['%s'] * len(ids))})", list(ids)


def _fetch_chains(ids: list[int]) -> dict[int, tuple[int | None, int, bytes]]:
    """(parent, shared, delta) of these steps and of all their ancestors, in one query."""
    connection = read_connection()  # the primary, except on a read path that reads the replica
    table = connection.ops.quote_name(Step._meta.db_table)
    members, params = _members(connection, ids)
    if connection.vendor == "postgresql":
        # Each level's parents by primary key, one lookup per chain row (the LATERAL
        # subquery's OFFSET 0 keeps the planner from flattening it into a join): as a join,
        # PostgreSQL hashed every step that has a parent (the whole step_seq_children index)
        # for each query, 3.4 of the 3.7 ms of a pull's 64 chains on a 20k-step W-pool, and
        # growing with the pool until its estimate switched plans; 0.26 ms this way.
        parents = f"""SELECT p.pid FROM chain c CROSS JOIN LATERAL (
                SELECT s.seq_parent_id AS pid FROM {table} s
                WHERE s.id = c.id AND s.seq_parent_id IS NOT NULL OFFSET 0) p"""
    else:  # SQLite has no LATERAL; its planner looks each parent up by key already
        parents = f"""SELECT s.seq_parent_id FROM {table} s JOIN chain c ON s.id = c.id
            WHERE s.seq_parent_id IS NOT NULL"""
    sql = f"""
        WITH RECURSIVE chain(id) AS (
            SELECT id FROM {table} WHERE id {members}
            UNION
            {parents}
        )
        SELECT s.id, s.seq_parent_id, s.seq_shared, s.seq_delta FROM {table} s
        WHERE s.id IN (SELECT id FROM chain)
    """
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return {row[0]: (row[1], row[2], bytes(row[3])) for row in cur.fetchall()}


def _fetch_nodes(ids: list[int]) -> dict[int, tuple[int | None, int, bytes]]:
    """(parent, shared, delta) of these steps, by primary key."""
    connection = read_connection()  # the primary, except on a read path that reads the replica
    table = connection.ops.quote_name(Step._meta.db_table)
    members, params = _members(connection, ids)
    sql = f"SELECT id, seq_parent_id, seq_shared, seq_delta FROM {table} WHERE id {members}"
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return {row[0]: (row[1], row[2], bytes(row[3])) for row in cur.fetchall()}


def _materialise(
    target: int, nodes: dict[int, tuple[int | None, int, bytes]], memo: dict[int, bytes]
) -> bytes:
    chain: list[int] = []
    cur: int | None = target
    while cur is not None and cur not in memo:
        chain.append(cur)
        cur = nodes[cur][0]
    full = memo[cur] if cur is not None else b""
    for node_id in reversed(chain):
        _parent, shared, delta = nodes[node_id]
        full = full[: shared * TOKEN_BYTES] + delta
        memo[node_id] = full
    return full
