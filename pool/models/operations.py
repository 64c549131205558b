"""Bookkeeping of the pool's own work: the task outbox, the audit log, idempotent calls' answers, upstream texts of generated ids, and the pool's counters."""

from __future__ import annotations

from django.db import models

from .access import Source


class OutboxTask(models.Model):
    """A task that a committed write made necessary, kept until the broker has it.

    ``pool.tasks.enqueue_on_commit`` writes the row in the write's own transaction and, once
    it commits, publishes the task and deletes the row. If the broker is down the row stays:
    the process that failed retries the outbox in the background until the broker answers,
    and the periodic ``pool.outbox_relay`` sends what a process that died left behind
    (pool/services/outbox.py). Tasks are idempotent, so a task sent twice is harmless."""

    name = models.CharField(max_length=100)  # the Celery task name
    args = models.JSONField(default=list)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # The relay: "oldest pending tasks first".
            models.Index(fields=["created_at"], name="outbox_created"),
        ]

    def __str__(self) -> str:
        return f"{self.name}{tuple(self.args)!r}"


class AuditEvent(models.Model):
    """One key action, written in the same transaction as the action itself (so an audit row
    exists exactly when the action committed): API keys created, rotated and revoked;
    datasets created and versioned. Review labels have their own history (LabelEvent).

    ``actor`` says who: "user:<username>", "key:<prefix>", or "cli" for manage.py. ``target``
    is the object's natural id (a key prefix, a dataset name).
    """

    class Action(models.TextChoices):
        API_KEY_CREATE = "api_key.create", "API key created"
        API_KEY_ROTATE = "api_key.rotate", "API key rotated"
        API_KEY_REVOKE = "api_key.revoke", "API key revoked"
        DATASET_CREATE = "dataset.create", "dataset created"
        DATASET_VERSION = "dataset.version", "dataset version added"
        POLICY_CURRENT = "policy.current", "current policy version changed"
        LEASE_RELEASE = "lease.release", "lease released by an admin"

    action = models.CharField(max_length=32, choices=Action.choices)
    actor = models.CharField(max_length=160, blank=True, default="")
    target = models.CharField(max_length=200)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # Admin: "what happened to this key / dataset", newest first.
            models.Index(fields=["target", "-created_at"], name="audit_target_created"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.target} by {self.actor or '?'}"


class IdempotentCall(models.Model):
    """A proxied call sent with an ``Idempotency-Key`` header (as OpenAI's and Anthropic's
    clients can send), per source: while it runs a retry is told to wait; once its steps are
    committed the answer is kept here, so a retry gets it back byte for byte and stores nothing
    new (pool/services/idempotency.py, gateway/proxy/runner.py)."""

    class State(models.TextChoices):
        RUNNING = "running", "running"
        DONE = "done", "done"

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)  # sha256 of the door's path and body
    state = models.CharField(max_length=8, choices=State.choices, default=State.RUNNING)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    content_type = models.CharField(max_length=100, blank=True, default="")
    headers = models.JSONField(default=dict, blank=True)
    body = models.BinaryField(default=b"")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # The claim "this source's key" (one row per key: a concurrent retry loses the race).
            models.UniqueConstraint(fields=["source", "key"], name="idemcall_source_key_uniq"),
        ]
        indexes = [
            # Retention: "calls older than CLAW_IDEMPOTENCY_TTL_SECONDS".
            models.Index(fields=["created_at"], name="idemcall_created"),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"


class GenerationText(models.Model):
    """The upstream's text for response ids it generated through the Claw-R1 ``/generate``
    door, keyed by the source and a hash of the ids, so a later ``submit_steps`` or
    ``compute_reward`` of the same ids has the text without a tokenizer."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="+", db_index=False)
    response_hash = models.BinaryField(max_length=16)  # blake2b-128 of the ids as little-endian int32
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # The lookup "text of these ids from this source" (submit_steps, compute_reward).
            models.UniqueConstraint(fields=["source", "response_hash"], name="gentext_source_hash_uniq"),
        ]
        indexes = [
            # Retention: "texts older than T".
            models.Index(fields=["created_at"], name="gentext_created"),
        ]

    def __str__(self) -> str:
        return f"text #{self.pk}"


class Counter(models.Model):
    """A change of one of the pool's counts, kept by PostgreSQL itself: statement-level
    triggers on the counted tables append one row per counter a statement changed, in the
    statement's own transaction (pool/migrations/_counters.py). The count is the sum of its
    rows (``max:`` counters: their maximum), read in the same snapshot as everything else, so
    the dashboard and ``GET /api/v1/stats`` read a few hundred rows instead of scanning the
    pool; ``pool.counters_compact`` folds the rows into one per counter and source.

    ``key`` is what a counter is kept per: the trajectory's source for the per-source
    counters (not a foreign key: a source's counters follow its trajectories, and a deleted
    source's trajectories are set to NULL, which the trigger counts as a move), the minute
    (since the epoch) for the per-minute ones, NULL for the pool-wide ones. SQLite keeps no
    counters: the readers count there (pool/selectors/counters.py)."""

    name = models.CharField(max_length=32)
    key = models.BigIntegerField(null=True, blank=True)
    value = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.name}[{self.key}] {self.value:+d}"
