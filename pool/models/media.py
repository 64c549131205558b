"""Images in steps, stored once by content (issue 24), and which sources hold them."""

from __future__ import annotations

from django.db import models

from .access import Source
from .steps import Step


class Media(models.Model):
    """One distinct image, by the sha256 of its bytes (pool/media.py media_store).

    The bytes live in Django's "default" storage (settings.STORAGES) under
    ``media/<sha[:2]>/<sha>``: the filesystem under MEDIA_ROOT (var/media) unless configured
    otherwise. An S3-compatible store needs settings only (django-storages installed):

        STORAGES["default"] = {"BACKEND": "storages.backends.s3.S3Storage",
                               "OPTIONS": {"bucket_name": "claw-media", "endpoint_url": "https://...",
                                           "access_key": ..., "secret_key": ...}}

    (or the AWS_STORAGE_BUCKET_NAME / AWS_S3_ENDPOINT_URL / AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY settings). The file is written before the row commits, so a crashed
    write can leave an orphan file, never a row without its file.
    """

    sha256 = models.CharField(max_length=64, unique=True)  # hex; the lookup key of every reference
    media_type = models.CharField(max_length=64)  # checked with Pillow: image/png, jpeg, webp, gif
    byte_size = models.PositiveBigIntegerField()
    width = models.PositiveIntegerField()
    height = models.PositiveIntegerField()
    file = models.FileField(max_length=255)  # media/<sha[:2]>/<sha> in the default storage
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # Retention and the overview's "images stored lately".
            models.Index(fields=["created_at"], name="media_created"),
        ]

    def __str__(self) -> str:
        return f"{self.sha256[:12]} ({self.media_type}, {self.width}x{self.height})"


class StepMedia(models.Model):
    """A step's image at ``position`` (its order in the step, from 0): where it sits in the
    prompt (message and part index; the token span of its placeholder run in prompt_ids when
    the upstream's ids show it) and which Media it is. A remote http(s) image an agent sent is
    passed through and never fetched: then ``media`` is NULL, ``kind`` is "url" and
    ``source_url`` keeps the address."""

    class Kind(models.TextChoices):
        STORED = "stored", "stored"
        URL = "url", "url"

    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="media_refs", db_index=False)
    position = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.STORED)
    # PROTECT: an image referenced by a step is never deleted under it. No index of its own
    # beyond stepmedia_media below.
    media = models.ForeignKey(
        Media, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    source_url = models.TextField(null=True, blank=True)  # noqa: DJ001 (NULL: a stored image, not a URL)
    message_index = models.IntegerField(null=True, blank=True)
    part_index = models.IntegerField(null=True, blank=True)
    token_start = models.PositiveIntegerField(null=True, blank=True)  # first placeholder id's index
    token_end = models.PositiveIntegerField(null=True, blank=True)  # one past the last

    class Meta:
        constraints = [
            # Also serves "images of these steps in order" (formats' prefetch, step reads).
            models.UniqueConstraint(fields=["step", "position"], name="stepmedia_step_pos_uniq"),
        ]
        indexes = [
            # "Steps that reference this image" (GET /api/v1/media/<sha> tenancy, the PROTECT check).
            models.Index(fields=["media"], name="stepmedia_media"),
        ]

    def __str__(self) -> str:
        return f"step {self.step_id} image {self.position}"


class MediaSource(models.Model):
    """A source that holds image ``media``: it uploaded the bytes (POST /api/v1/media) or a
    step of it carried them (inline, or by a sha256 it could already see). Possession, not the
    hash, is what lets a source reference an image by sha256 and read it back
    (pool.selectors.media): knowing a hash proves nothing. The bytes stay stored once; each
    source that sent them gets its row."""

    media = models.ForeignKey(Media, on_delete=models.CASCADE, related_name="+", db_index=False)
    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="+", db_index=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Each source holds an image once; also serves "may these sources see this image"
            # (media_visible, media_resolve: media first, then the caller's sources).
            models.UniqueConstraint(fields=["media", "source"], name="mediasource_uniq"),
        ]

    def __str__(self) -> str:
        return f"image {self.media_id} held by source {self.source_id}"
