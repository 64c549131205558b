"""Reads of stored images (issue 24): one image by its sha256, within what the caller may see.

An image is visible to a set of sources when one of them holds it (pool.models.MediaSource:
it uploaded the bytes, or a step of it carried them) or a step of one of them references it.
Unrestricted callers (``sources`` None) see every image. An image the caller may not see
answers exactly as an unknown hash does, everywhere (reads 404, a step's sha256 reference
400 "no stored image"), so a hash is no oracle for what other sources hold.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Exists, OuterRef, Q, QuerySet

from ..models import Media, MediaSource, StepMedia
from ..tenancy import Sources


def media_visible_to(sources: Sources) -> QuerySet[Media]:
    """The stored images ``sources`` may see (every one when None). Served by
    mediasource_uniq and stepmedia_media (media first in both)."""
    qs = Media.objects.all()
    if sources is None:
        return qs
    ids = sorted(sources)
    held = MediaSource.objects.filter(media_id=OuterRef("pk"), source_id__in=ids)
    referenced = StepMedia.objects.filter(media_id=OuterRef("pk"), step__source_id__in=ids)
    return qs.filter(Q(Exists(held)) | Q(Exists(referenced)))


def media_get(*, sha256: str, sources: Sources) -> Media | None:
    """The stored image ``sha256``, or None when there is none or ``sources`` may not see it
    (the same None: a caller cannot tell the two apart). One query.

    Who passes what: the API passes the key's read sources (None for read and admin keys,
    and for consume keys: trainers download what their pulls reference, from any source);
    the curation pages pass None (operator accounts are unrestricted)."""
    return media_visible_to(sources).filter(sha256=sha256).first()


def media_by_sha(shas: Iterable[str], *, sources: Sources) -> dict[str, Media]:
    """The images among ``shas`` that ``sources`` may see, by sha256. One query."""
    return {m.sha256: m for m in media_visible_to(sources).filter(sha256__in=sorted(set(shas)))}
