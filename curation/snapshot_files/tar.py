"""snapshot.tar: the JSONL with its images (media/<sha256>.<ext>, each image once), in one
uncompressed tar (the images are compressed already). Built only for a snapshot with images."""

from __future__ import annotations

import io
import tarfile
from typing import IO, Any

from .base import Chunk


class TarFile:
    """The tar of the JSONL and its images: each image the snapshot references added once
    (media/<sha256>.<ext>) as chunks come, snapshot.jsonl last. Opened at the first image."""

    name = "tar"
    content_type = "application/x-tar"

    def __init__(self, fileobj: IO[bytes]) -> None:
        self.fileobj = fileobj
        self.tar: tarfile.TarFile | None = None
        self.seen: set[str] = set()
        self.bytes = self.references = 0

    def add(self, chunk: Chunk) -> None:
        for row in chunk.rows:
            for image in row["images"]:
                sha = image["sha256"]
                if not sha:
                    continue
                self.references += 1
                if sha in self.seen:
                    continue
                self.seen.add(sha)
                data = chunk.media[sha]
                self.bytes += len(data)
                if self.tar is None:
                    self.tar = tarfile.open(fileobj=self.fileobj, mode="w", format=tarfile.PAX_FORMAT)
                self._add(image["file"], len(data), io.BytesIO(data))

    def finish(self, files: dict[str, IO[bytes]]) -> bool:
        """Add snapshot.jsonl and close; False (nothing written) for a snapshot without images."""
        if self.tar is None:
            return False
        jsonl = files["jsonl"]
        jsonl.flush()
        size = jsonl.tell()
        jsonl.seek(0)
        self._add("snapshot.jsonl", size, jsonl)
        self.tar.close()  # the fileobj stays open
        return True

    def summary(self) -> dict[str, Any]:
        return {"images": len(self.seen), "references": self.references, "bytes": self.bytes}

    def _add(self, name: str, size: int, fileobj) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = size, 0o644, 0  # fixed: the same content, the same tar
        assert self.tar is not None
        self.tar.addfile(info, fileobj)
