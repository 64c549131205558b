"""What every snapshot file writer shares: the chunk of rendered steps it is given, the
protocol it follows, and an image's file name."""

from __future__ import annotations

from typing import IO, Any, ClassVar, Protocol


class Chunk:
    """One chunk of rendered steps: the JSONL rows (token columns as numpy arrays, which
    orjson writes exactly as the lists they hold) and the raw token bytes per row, from
    which the Parquet list columns are built in bulk."""

    __slots__ = (
        "rows",
        "prompts",
        "responses",
        "logprobs",
        "token_rewards",
        "token_versions",
        "ids",
        "branches",
        "media",
        "source_ids",
    )

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.ids: list[int] = []
        self.branches: list[int] = []
        self.prompts: list[bytes] = []
        self.responses: list[bytes] = []
        self.logprobs: list[bytes | None] = []
        self.token_rewards: list[bytes | None] = []
        self.token_versions: list[bytes | None] = []  # one little-endian int64 per response id
        self.source_ids: set[int | None] = set()  # of the chunk's trajectories (Snapshot.source_ids)
        # The stored bytes of each image the chunk's rows reference (sha256 -> bytes), read once.
        self.media: dict[str, bytes] = {}


class SnapshotFile(Protocol):
    """A writer of one file of a snapshot, into ``tmp`` (an unnamed temporary file)."""

    name: ClassVar[str]  # the format's name: the file is snapshot.<name>
    content_type: ClassVar[str]

    def __init__(self, tmp: IO[bytes]) -> None: ...

    def add(self, chunk: Chunk) -> None:
        """Write one chunk of rows (in id order)."""

    def finish(self, files: dict[str, IO[bytes]]) -> bool:
        """Complete the file (``files``: every writer's temporary file, by name); False when
        this snapshot has no such file (the tar of a snapshot without images)."""

    def summary(self) -> dict[str, Any]:
        """What the manifest says of this file beyond its size ({} for nothing)."""


def media_name(sha256: str, media_type: str) -> str:
    """An image's file name in the tar's media/ folder and its Parquet ``path``."""
    return f"{sha256}.{media_type.split('/')[-1]}"
