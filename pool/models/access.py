"""Who writes: data sources (tenants), their API keys and scopes."""

from __future__ import annotations

from django.db import models


class Scope(models.TextChoices):
    INGEST = "ingest", "ingest"
    CONSUME = "consume", "consume"
    READ = "read", "read"
    # Setting the current policy version (POST /api/v1/policy-versions): trainers' keys hold
    # it next to consume; a consume key alone does not.
    POLICY = "policy", "policy"
    ADMIN = "admin", "admin"


class Source(models.Model):
    """Who produced data: an agent runtime, a service, a trainer. API keys belong to a source."""

    class Kind(models.TextChoices):
        AGENT = "agent", "agent"
        SERVICE = "service", "service"
        TRAINER = "trainer", "trainer"
        OPERATOR = "operator", "operator"

    name = models.CharField(max_length=128, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.AGENT)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class ApiKey(models.Model):
    """A hashed bearer key. The clear key is shown once, at creation.

    Keys look like ``claw_<prefix>_<secret>``; the prefix is stored in clear to find the row,
    the whole key only as SHA-256 (keys are 256-bit random, so a slow hash adds nothing).
    """

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="api_keys")
    # Ids of more sources the key may write and read as its own (pool/tenancy.py), granted
    # by an admin (create_api_key --extra-source, or the admin site). A list in the row, not
    # a join table: the key's verification stays one read.
    extra_source_ids = models.JSONField(default=list, blank=True)
    name = models.CharField(max_length=128)
    prefix = models.CharField(max_length=16, unique=True)  # unique => indexed: the auth lookup
    key_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}, {','.join(self.scopes)})"

    def has_scope(self, scope: str) -> bool:
        return Scope.ADMIN in self.scopes or scope in self.scopes
