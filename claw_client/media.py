"""Images of steps, fetched by sha256 and cached on disk (issue 24).

A row of the ``steps`` / ``padded`` formats, of a lease's batch or of a snapshot's JSONL
carries its images in order as references (``{"sha256", "media_type", "width", "height",
"url", ...}``); the bytes are ``GET /api/v1/media/<sha256>``, the same forever. ``MediaCache``
keeps each image once on disk under its sha256, so a trainer downloads each image once
however many steps (and epochs) reference it. Pillow is optional (the ``images`` extra):
bytes need nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Overrides the default cache folder when ClawClient is given none.
CACHE_ENV = "CLAW_CLIENT_MEDIA_CACHE"


def default_cache_dir() -> Path:
    """$CLAW_CLIENT_MEDIA_CACHE, else $XDG_CACHE_HOME/claw_client/media, else
    ~/.cache/claw_client/media."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "claw_client" / "media"


def check_sha256(sha256: Any) -> str:
    if not isinstance(sha256, str) or not _SHA256.match(sha256):
        raise ValueError(f"sha256 must be 64 lowercase hex digits, got {sha256!r}")
    return sha256


class MediaCache:
    """Images on disk by sha256 (``<dir>/<sha[:2]>/<sha>``). A read checks the bytes against
    their name (a corrupted or truncated file counts as a miss and is removed); a write goes
    to a temporary file in the same folder, then is renamed over, so a reader never sees a
    partial file and concurrent writers of the same image are harmless."""

    def __init__(self, directory: str | os.PathLike[str] | None = None):
        self.directory = Path(directory).expanduser() if directory is not None else default_cache_dir()

    def path(self, sha256: str) -> Path:
        return self.directory / sha256[:2] / sha256

    def get(self, sha256: str) -> bytes | None:
        path = self.path(check_sha256(sha256))
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if hashlib.sha256(data).hexdigest() != sha256:
            path.unlink(missing_ok=True)
            return None
        return data

    def put(self, sha256: str, data: bytes) -> Path:
        path = self.path(check_sha256(sha256))
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError(f"bytes do not hash to {sha256}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{sha256[:12]}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def image_refs(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A row's stored images in order: its ``images`` list (formats, snapshots), else its
    ``multi_modal_data["images"]`` (a step read). Remote images (``kind`` "url": passed
    through by the gateway and never fetched, so no bytes are stored) are left out."""
    refs = row.get("images")
    if refs is None:
        refs = (row.get("multi_modal_data") or {}).get("images") or []
    return [dict(r) for r in refs if isinstance(r, Mapping) and r.get("sha256")]


def to_pil(data: Iterable[bytes]) -> list[Any]:
    """Bytes -> loaded PIL images (Pillow: ``pip install claw-client[images]``)."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "ClawClient.images needs Pillow: pip install 'claw-client[images]' (bytes need nothing: media_bytes)"
        ) from exc
    import io

    out = []
    for raw in data:
        image = Image.open(io.BytesIO(raw))
        image.load()
        out.append(image)
    return out
