"""snapshot.parquet: the same rows as the JSONL, one Arrow column per field (token arrays as
list columns built from their raw bytes in bulk), images inline as Hugging Face datasets'
Image feature, readable by ``datasets.load_dataset("parquet", ...)`` and pyarrow."""

from __future__ import annotations

from typing import IO, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from pool import tokens

from .base import Chunk, media_name

# The columns of both files, in this order (the JSONL lines have sorted keys).
COLUMNS = (
    "uid",
    "trajectory_uid",
    "prompt_group_uid",
    "step_index",
    "prompt_ids",
    "response_ids",
    "rollout_logprobs",
    "token_rewards",
    "token_versions",
    "reward",
    "reward_source",
    "reward_scope",
    "outcome_reward",
    "process_reward",
    "policy_version",
    "token_source",
    "drift",
    "quality_flags",
    "readiness",
    "label",
    "tags",
    "feedback",
    "mask",
    "metadata",
    "images",
)
FEEDBACK_TYPE = pa.struct(
    [("rating", pa.float64()), ("label", pa.string()), ("correction", pa.string()), ("comment", pa.string())]
)
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
# The Parquet schema's "huggingface" metadata: the features datasets reads (only the images
# column needs one; the others are read from their Arrow types). "Sequence" of "Image" reads
# as a list of images in datasets 3 and later.
HF_FEATURES = {"info": {"features": {"images": {"_type": "Sequence", "feature": {"_type": "Image"}}}}}

# metadata is free-form JSON: a JSON string column in Parquet (an object in the JSONL).
PARQUET_SCHEMA = pa.schema(
    [
        ("uid", pa.string()),
        ("trajectory_uid", pa.string()),
        ("prompt_group_uid", pa.string()),
        ("step_index", pa.int32()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("rollout_logprobs", pa.list_(pa.float64())),
        # Per response token, as sent: the step's token_rewards, and its policy versions
        # (token_policy_versions' runs expanded, one version per response id); null for a
        # step without them.
        ("token_rewards", pa.list_(pa.float64())),
        ("token_versions", pa.list_(pa.int64())),
        ("reward", pa.float64()),
        ("reward_source", pa.string()),
        ("reward_scope", pa.string()),
        ("outcome_reward", pa.float64()),
        ("process_reward", pa.float64()),
        ("policy_version", pa.int64()),
        ("token_source", pa.string()),
        ("drift", pa.bool_()),
        ("quality_flags", pa.list_(pa.string())),
        ("readiness", pa.list_(pa.string())),
        ("label", pa.string()),
        ("tags", pa.list_(pa.string())),
        ("feedback", pa.list_(FEEDBACK_TYPE)),
        ("mask", pa.bool_()),
        ("metadata", pa.string()),
        # A step's images in order, as Hugging Face datasets' Image feature stores them
        # (struct {bytes, path}; the schema's "huggingface" metadata below names the feature,
        # so datasets.load_dataset("parquet", ...) gives PIL images). ``path`` is
        # "<sha256>.<ext>", the bytes inline. A remote image (passed through, never fetched)
        # has no bytes here and is left out of this column; the JSONL keeps its reference.
        ("images", pa.list_(IMAGE_TYPE)),
    ],
    metadata={b"huggingface": orjson.dumps(HF_FEATURES)},
)


class ParquetFile:
    name = "parquet"
    content_type = "application/vnd.apache.parquet"

    def __init__(self, tmp: IO[bytes]) -> None:
        self.writer = pq.ParquetWriter(tmp, PARQUET_SCHEMA)  # leaves the handle open

    def add(self, chunk: Chunk) -> None:
        self.writer.write_table(table(chunk))

    def finish(self, files: dict[str, IO[bytes]]) -> bool:
        self.close()
        return True

    def close(self) -> None:
        """Idempotent: a build that fails closes the writer too."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def summary(self) -> dict[str, Any]:
        return {}


def _list_column(parts: list[bytes | None], dtype: np.dtype, value_type: pa.DataType) -> pa.Array:
    """A list column from each row's raw little-endian values (None: a null list), built
    from one buffer and its offsets instead of a Python list per row."""
    lengths = np.fromiter(
        (len(p) // dtype.itemsize if p is not None else 0 for p in parts), dtype=np.int32, count=len(parts)
    )
    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(
        np.frombuffer(b"".join(p for p in parts if p is not None), dtype=dtype), type=value_type
    )
    nulls = [p is None for p in parts]
    mask = pa.array(nulls, type=pa.bool_()) if any(nulls) else None
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=pa.list_(value_type), mask=mask)


def table(chunk: Chunk) -> pa.Table:
    rows = chunk.rows
    vectors = {
        "prompt_ids": _list_column(chunk.prompts, tokens.TOKEN_DTYPE, pa.int32()),
        "response_ids": _list_column(chunk.responses, tokens.TOKEN_DTYPE, pa.int32()),
        "rollout_logprobs": _list_column(chunk.logprobs, tokens.LOGPROB_DTYPE, pa.float64()),
        "token_rewards": _list_column(chunk.token_rewards, tokens.LOGPROB_DTYPE, pa.float64()),
        "token_versions": _list_column(chunk.token_versions, tokens.VERSION_DTYPE, pa.int64()),
    }
    arrays = []
    for field in PARQUET_SCHEMA:
        c = field.name
        if c in vectors:
            arrays.append(vectors[c])
        elif c == "metadata":
            arrays.append(pa.array([orjson.dumps(r[c]).decode() for r in rows], type=field.type))
        elif c == "images":
            arrays.append(_images_column(rows, chunk.media))
        else:
            arrays.append(pa.array([r[c] for r in rows], type=field.type))
    return pa.Table.from_arrays(arrays, schema=PARQUET_SCHEMA)


def _images_column(rows: list[dict[str, Any]], media: dict[str, bytes]) -> pa.Array:
    values = []
    for r in rows:
        values.append(
            [
                {"bytes": media[i["sha256"]], "path": media_name(i["sha256"], i["media_type"])}
                for i in r["images"]
                if i["sha256"]
            ]
        )
    return pa.array(values, type=pa.list_(IMAGE_TYPE))
