"""A step's images, as the pipeline writes them (issue 24).

A door puts a step's images on ``StepIn.images`` as ``ImageIn``s, in order: bytes it decoded
(base64, a ``data:`` URL), the sha256 of an image already stored (``POST /api/v1/media``), or
a remote http(s) URL the agent chose, which is kept as a reference and never fetched.
White-box steps carry them in Claw-R1's ``multi_modal_data`` (``images_from_multi_modal_data``).

The pipeline (pipeline.py) calls ``media_prepare`` inside the write's transaction before the
step rows go in (the images are checked and stored by pool.media.media_store, so a
bad image refuses the whole write before any step row), and ``media_link`` right after them
(one bulk_create of StepMedia rows for the whole write). Both do nothing, and query nothing,
for a write without images.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.conf import settings

from .. import sql
from ..errors import InvalidInput
from ..media import (
    max_per_step,
    media_data_url_parts,
    media_decode_base64,
    media_hold,
    media_resolve,
    media_store_many,
)
from ..models import Media, StepMedia
from ..tenancy import Sources

# The functions below take contract.StepIns (typed Any here: contract.py imports this module).
StepIn = Any


@dataclass(slots=True)
class ImageIn:
    """One image of a step, in order. Exactly one of ``data`` (with its sha256 computed
    here), ``sha256`` (a stored image's) or ``url`` (a remote reference) says what it is.
    ``message_index`` / ``part_index``: where it sits in the step's ``messages``."""

    field: str  # how errors name it (steps[0].multi_modal_data.images[2])
    data: bytes | None = None
    # Base64 text whose sha256 is known already (``_from_base64``): decoded only if needed.
    b64: str | None = None
    declared_type: str | None = None
    sha256: str | None = None
    url: str | None = None
    message_index: int | None = None
    part_index: int | None = None

    def __post_init__(self) -> None:
        if self.data is not None and self.sha256 is None:
            self.sha256 = hashlib.sha256(self.data).hexdigest()

    def payload(self) -> bytes:
        """The image's bytes (decoding its base64 text the first time)."""
        if self.data is None and self.b64 is not None:
            self.data = media_decode_base64(self.b64, field=self.field)
        assert self.data is not None, "a stored or remote image has no payload here"
        return self.data

    @property
    def inline(self) -> bool:
        """Sent with its bytes (not a sha256 reference, not a remote URL)."""
        return self.data is not None or self.b64 is not None

    def key(self) -> list[Any]:
        """What the idempotency fingerprint covers (plan.content_hash)."""
        return [self.sha256, self.url, self.message_index, self.part_index]


def images_from_multi_modal_data(mmd: Any, where: str) -> list[ImageIn]:
    """Claw-R1's ``multi_modal_data`` (``{"images": [...], "videos": [...]}``) -> ImageIns.
    Each image: base64 text (optionally a ``data:`` URL), raw bytes (MessagePack bin), or
    ``{"sha256": "..."}`` of an uploaded image (other keys, as a read returns them, are
    ignored). Videos are refused for now."""
    if mmd is None:
        return []
    if not isinstance(mmd, dict):
        raise InvalidInput('must be an object {"images": [...]}', field=where)
    unknown = sorted(set(mmd) - {"images", "videos"})
    if unknown:
        raise InvalidInput(
            f"unknown key {unknown[0]!r}; expected images (and videos)", field=f"{where}.{unknown[0]}"
        )
    if mmd.get("videos"):
        raise InvalidInput("videos are not accepted yet; send frames as images", field=f"{where}.videos")
    images = mmd.get("images") or []
    if not isinstance(images, list):
        raise InvalidInput("must be a list of images", field=f"{where}.images")
    check_count(len(images), f"{where}.images")
    out = []
    for i, item in enumerate(images):
        at = f"{where}.images[{i}]"
        if isinstance(item, bytes):
            out.append(ImageIn(field=at, data=item))
        elif isinstance(item, str):
            text, declared = (
                media_data_url_parts(item, field=at) if item.startswith("data:") else (item, None)
            )
            out.append(_from_base64(text, at, declared))
        elif isinstance(item, dict) and isinstance(item.get("sha256"), str):
            out.append(ImageIn(field=f"{at}.sha256", sha256=item["sha256"]))
        else:
            raise InvalidInput('an image is base64 text, a data URL or {"sha256": "..."}', field=at)
    return out


# Base64 texts decoded lately: blake2b-128 of the text -> the sha256 of its bytes, so an image
# a client sends again (a screenshot agent re-sends its last screenshots in every step) is
# not decoded and hashed again when it is stored already. Only texts that decoded are kept;
# an image not stored yet is decoded (and checked) all the same. Per process, bounded.
_SEEN: OrderedDict[bytes, str] = OrderedDict()
_SEEN_MAX = 4096
_SEEN_LOCK = threading.Lock()


def _from_base64(text: str, at: str, declared: str | None) -> ImageIn:
    key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    with _SEEN_LOCK:
        sha = _SEEN.get(key)
        if sha is not None:
            _SEEN.move_to_end(key)
    if sha is not None:
        return ImageIn(field=at, b64=text, sha256=sha, declared_type=declared)
    im = ImageIn(field=at, data=media_decode_base64(text, field=at), declared_type=declared)
    with _SEEN_LOCK:
        _SEEN[key] = im.sha256  # type: ignore[assignment]
        if len(_SEEN) > _SEEN_MAX:
            _SEEN.popitem(last=False)
    return im


def check_count(n: int, where: str) -> None:
    limit = max_per_step()
    if n > limit:
        raise InvalidInput(f"{n} images in one step; at most {limit} (CLAW_MEDIA_MAX_PER_STEP)", field=where)


def media_prepare(steps: Sequence[StepIn], *, sources: Sources = None) -> dict[str, Media]:
    """Check and store the images of ``steps`` (inside the write's transaction): the Media of
    each sha256 they name. Bytes seen twice in the write are checked and stored once, those
    stored already are found in one query (pool.media.media_store_many); sha256
    references are resolved in one query, among the images the writer's ``sources`` may see
    (an image only another source holds answers as an unknown hash: its bytes must be sent).
    Raises InvalidInput naming the image's field."""
    inline: dict[str, tuple[Callable[[], bytes], str | None, str]] = {}
    refs: dict[str, str] = {}
    for s in steps:
        if not s.images:
            continue
        check_count(len(s.images), s.at("multi_modal_data.images"))
        for im in s.images:
            if im.inline:
                seen = inline.get(im.sha256)
                if seen is None or (im.declared_type and not seen[1]):
                    inline[im.sha256] = (im.payload, im.declared_type, im.field)
                elif im.declared_type and im.declared_type != seen[1]:
                    # the same bytes declared as two types: at most one is right
                    media_store_many({im.sha256: (im.payload, im.declared_type, im.field)})
            elif im.url is None and im.sha256 is not None:
                refs.setdefault(im.sha256, im.field)
    found = media_store_many(inline)
    missing = {sha: f for sha, f in refs.items() if sha not in found}
    if missing:
        found.update(media_resolve(missing, sources=sources))
    return found


def media_link(
    steps: Sequence[StepIn], row_ids: Sequence[int], media: dict[str, Media], *, source_id: int | None
) -> None:
    """The StepMedia rows of the written steps (``row_ids`` in the order of ``steps``), one
    bulk_create; each image's placeholder span from its step's prompt ids when they show one
    run of placeholder ids per image (CLAW_MEDIA_PLACEHOLDER_TOKEN_IDS). Then the steps'
    source holds their stored images (pool.media.media_hold: one more statement)."""
    rows = []
    for s, step_id in zip(steps, row_ids, strict=True):
        if not s.images:
            continue
        spans = placeholder_spans(s.prompt_ids, len(s.images))
        for pos, im in enumerate(s.images):
            start, end = spans[pos] if spans else (None, None)
            stored = im.url is None
            rows.append(
                StepMedia(
                    step_id=step_id,
                    position=pos,
                    kind=StepMedia.Kind.STORED if stored else StepMedia.Kind.URL,
                    media_id=media[im.sha256].id if stored else None,  # type: ignore[index]
                    source_url=None if stored else im.url,
                    message_index=im.message_index,
                    part_index=im.part_index,
                    token_start=start,
                    token_end=end,
                )
            )
    # The pool's bulk insert (pool/sql.py): bulk_create, binary COPY on PostgreSQL.
    sql.rows_insert(rows)
    media_hold(media_ids=[r.media_id for r in rows if r.media_id is not None], source_id=source_id)


def placeholder_spans(prompt_ids: np.ndarray, n_images: int) -> list[tuple[int, int]] | None:
    """[(start, end)] of the runs of placeholder ids in ``prompt_ids``, one per image in
    order, or None when their number is not ``n_images`` (then no span is recorded: a guess
    would point a trainer at the wrong tokens)."""
    ids = getattr(settings, "CLAW_MEDIA_PLACEHOLDER_TOKEN_IDS", [])
    if not ids or not len(prompt_ids):
        return None
    mask = np.isin(prompt_ids, np.asarray(ids, dtype=prompt_ids.dtype)).astype(np.int8)
    edges = np.diff(np.concatenate(([0], mask, [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    if len(starts) != n_images:
        return None
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]
