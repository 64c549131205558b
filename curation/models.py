"""Curation models: operator labels and their audit, datasets (versioned curation specs) and
review queues with their claims.

The label itself lives on the step (``pool.Step.label``/``note``) so dataset queries filter
it without a join; tags are rows here (``StepTag``) so "steps tagged T" is an indexed
lookup on every database. Every change of a label, a tag or a note is a ``LabelEvent``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from pool.models import Feedback, PromptGroup, Source, Step, Trajectory


class StepTag(models.Model):
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="tags", db_index=False)
    tag = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # One tag once per step; also serves "tags of a step" (the admin, exports).
            models.UniqueConstraint(fields=["step", "tag"], name="steptag_step_tag_uniq"),
        ]
        indexes = [
            # Datasets: "steps tagged T" (EXISTS on tag, step).
            models.Index(fields=["tag", "step"], name="steptag_tag_step"),
        ]

    def __str__(self) -> str:
        return self.tag


class LabelEvent(models.Model):
    """Audit of an operator's change to a step's label, tags or note: who, when, what."""

    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="label_events", db_index=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor = models.CharField(max_length=160)  # username or "key:<source>": kept if the user goes
    # {"label": [old, new], "note": [old, new], "tags_added": [...], "tags_removed": [...]}
    changes = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # Step page and admin: "label history of a step, newest first".
            models.Index(fields=["step", "created_at"], name="labelevent_step_created"),
            # Audit listing: "label changes, newest first".
            models.Index(fields=["created_at"], name="labelevent_created"),
        ]

    def __str__(self) -> str:
        return f"{self.actor}: {self.changes}"


class Dataset(models.Model):
    """A named curation spec. Its versions are immutable; editing adds one."""

    name = models.CharField(max_length=64, unique=True)
    description = models.TextField(blank=True, default="")
    current = models.ForeignKey(
        "DatasetVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.name


class DatasetVersion(models.Model):
    """One immutable version of a dataset's spec (filters and grouping rules, normalised by
    curation/specs.py). What was served under it (batches, snapshots) points here."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions", db_index=False)
    version = models.PositiveIntegerField()
    spec = models.JSONField()
    created_by = models.CharField(max_length=160, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Version numbers of a dataset; also serves "versions of a dataset, in order".
            models.UniqueConstraint(fields=["dataset", "version"], name="datasetversion_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.dataset.name} v{self.version}"


MODE_TRAJECTORY, MODE_GROUP = "trajectory", "group"
MODES = [(MODE_TRAJECTORY, "one trajectory per item"), (MODE_GROUP, "a prompt group's rollouts side by side")]
GROUP_REWARDS = [
    ("none", "feedback only"),
    ("best", "best rollout 1, the others 0"),
    ("rank", "rank r of n: (n - r) / (n - 1)"),
]


class ReviewQueue(models.Model):
    """A review queue: which trajectories (a dataset's, or those matching filters; the
    default queue: every completed trajectory without feedback) and the score schema of
    its form."""

    name = models.CharField(max_length=64, unique=True)
    description = models.TextField(blank=True, default="")
    is_default = models.BooleanField(default=False)
    dataset = models.ForeignKey(Dataset, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    filters = models.JSONField(default=dict, blank=True)  # a dataset filter spec, when no dataset
    rating_min = models.FloatField(default=1.0)
    rating_max = models.FloatField(default=5.0)
    label_choices = models.JSONField(default=list, blank=True)
    ask_correction = models.BooleanField(default=False)
    # The rating, rescaled to [0, 1], becomes the trajectory's human reward (audited).
    sets_reward = models.BooleanField(default=False)
    claim_seconds = models.PositiveIntegerField(default=15 * 60)
    created_at = models.DateTimeField(auto_now_add=True)
    # --- the review workbench (migration 0006) ---
    # Shown beside the item, as Markdown rendered without HTML (curation/markdown.py).
    guidelines = models.TextField(blank=True, default="")
    # "trajectory": an item is one trajectory; "group": an item is a prompt group, whose
    # rollouts are shown side by side and ranked (or the best picked).
    mode = models.CharField(max_length=12, choices=MODES, default=MODE_TRAJECTORY)
    # Group mode: what a ranking writes as the rollouts' human rewards (audited).
    group_reward = models.CharField(max_length=8, choices=GROUP_REWARDS, default="none")
    # An item leaves the queue once this many distinct reviewers reviewed it.
    reviews_per_item = models.PositiveSmallIntegerField(default=1)
    # Several labels per feedback (chips) instead of one (buttons).
    label_multi = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=Q(is_default=True), name="reviewqueue_one_default"
            ),
            models.CheckConstraint(
                condition=Q(rating_min__lt=models.F("rating_max")), name="reviewqueue_rating_range"
            ),
            models.CheckConstraint(condition=Q(reviews_per_item__gte=1), name="reviewqueue_reviews_per_item"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def rating_widget(self) -> str:
        """ "stars" for a small integer range (at most 10 steps), else "slider"."""
        lo, hi = self.rating_min, self.rating_max
        if lo == int(lo) and hi == int(hi) and hi - lo <= 9 and lo >= 0:
            return "stars"
        return "slider"

    @property
    def is_group(self) -> bool:
        return self.mode == MODE_GROUP


class ReviewClaim(models.Model):
    """A reviewer's hold on one trajectory of a queue, until ``expires_at`` or until done.

    The unique (queue, trajectory, slot) row is the lock: an item has ``reviews_per_item``
    slots (0, 1, ...), so never more reviewers than that hold or finish it, on any database;
    an expired claim is taken over by a conditional UPDATE. In group mode ``trajectory`` is
    the group's first rollout (its lowest id) and ``group`` the group."""

    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="claims", db_index=False)
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="+", db_index=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    claimed_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    done_at = models.DateTimeField(null=True, blank=True)
    feedback = models.ForeignKey(Feedback, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    slot = models.PositiveSmallIntegerField(default=0)
    group = models.ForeignKey(
        PromptGroup, null=True, blank=True, on_delete=models.CASCADE, related_name="+", db_index=False
    )

    class Meta:
        constraints = [
            # The claim lock; also serves "is this trajectory claimed or done in this queue".
            models.UniqueConstraint(
                fields=["queue", "trajectory", "slot"], name="reviewclaim_queue_traj_slot_uniq"
            ),
        ]
        indexes = [
            # "My open claim in this queue" (resume) and the progress counts.
            models.Index(fields=["queue", "user", "done_at"], name="reviewclaim_queue_user"),
            # Trajectory page and the cascade of a trajectory delete.
            models.Index(fields=["trajectory"], name="reviewclaim_trajectory"),
            # The cascade of a group delete (group mode claims only).
            models.Index(fields=["group"], condition=Q(group__isnull=False), name="reviewclaim_group"),
        ]

    def __str__(self) -> str:
        return f"{self.queue.name}: {self.trajectory_id} by {self.user_id}"


class Consumer(models.Model):
    """A trainer (or any reader) that pulls batches; it gets each unit of a dataset once.

    Names are per source: the consumer "trainer" of a key is its source's "trainer",
    created on the source's first pull (so every key of that source, a rotated one too, uses
    it), and another source's "trainer" is another consumer, which the first neither
    collides with nor can see (services.consume.consumer_of). Null source: the consumers of
    operator sessions and internal callers (and of before owners existed), one per name."""

    name = models.CharField(max_length=64)
    source = models.ForeignKey(
        "pool.Source", null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # One consumer per (source, name); serves every lookup by name (source first).
            models.UniqueConstraint(fields=["source", "name"], name="consumer_source_name_uniq"),
            # NULLs are distinct in a unique index: one unowned consumer per name, apart.
            models.UniqueConstraint(
                fields=["name"], condition=Q(source__isnull=True), name="consumer_unowned_name_uniq"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Lease(models.Model):
    """One batch handed to one consumer: its units are the consumer's until it acks (then
    for good), nacks or lets the lease expire (then they are deliverable again). The batch
    is kept byte for byte (``body``), so it can be replayed after ack too."""

    class Status(models.TextChoices):
        LEASED = "leased", "leased"
        ACKED = "acked", "acked"
        RELEASED = "released", "released (nack)"
        EXPIRED = "expired", "expired"

    id = models.UUIDField(primary_key=True)
    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="leases", db_index=False)
    dataset_version = models.ForeignKey(DatasetVersion, on_delete=models.PROTECT, related_name="leases")
    unit = models.CharField(max_length=8)  # "groups" or "steps"
    format = models.CharField(max_length=8)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.LEASED)
    n_units = models.PositiveIntegerField()
    n_steps = models.PositiveIntegerField()
    content_hash = models.CharField(max_length=64)  # sha256 of the batch payload
    body = models.BinaryField()  # the response, byte for byte (replay)
    # Past its replay window (CLAW_RETENTION_REPLAY_DAYS) the body keeps the manifest and
    # drops the batch (retention.leases_trim); when that was done.
    batch_dropped_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    acked_at = models.DateTimeField(null=True, blank=True)
    # Lineage: the checkpoint of a training run that took this acked lease (the run's next
    # checkpoint after the ack, services.lineage.checkpoint_record); null until one does.
    # Neither a pull nor an ack writes it: a checkpoint takes its run's consumer's acked
    # leases in one UPDATE.
    checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )

    class Meta:
        indexes = [
            # Pull: "this consumer's leases that expired" (partial: only open ones).
            models.Index(
                fields=["consumer", "expires_at"], condition=Q(status="leased"), name="lease_open_expiry"
            ),
            # Consumption page: "leases, newest first".
            models.Index(fields=["created_at"], name="lease_created"),
            # Retention of the served batches: "leases still holding theirs, oldest first"
            # (partial: a trimmed lease leaves it, so a sweep never reads past the done ones).
            models.Index(
                fields=["created_at"], condition=Q(batch_dropped_at__isnull=True), name="lease_batch_kept"
            ),
            # Checkpoint: "this consumer's acked leases no checkpoint took yet" (partial: an
            # ack adds its lease, the checkpoint that takes it removes it, so it stays small).
            models.Index(
                fields=["consumer", "acked_at"],
                condition=Q(status="acked", checkpoint__isnull=True),
                name="lease_ack_unclaimed",
            ),
            # Lineage: "a checkpoint's leases in ack order" (partial: pulls insert none).
            models.Index(
                fields=["checkpoint", "acked_at", "id"],
                condition=Q(checkpoint__isnull=False),
                name="lease_checkpoint",
            ),
        ]

    def __str__(self) -> str:
        return f"lease {self.id} ({self.status})"


class Delivery(models.Model):
    """A unit (a prompt group, a trajectory without a group, or a step) held by a consumer
    for a dataset: leased or acked, as its ``use_index``-th use. The unique row is what makes
    delivery exactly once per consumer (each use once, under a reuse budget), on every
    database: two pullers can never both insert it."""

    class Kind(models.IntegerChoices):
        GROUP = 1, "group"
        TRAJECTORY = 2, "trajectory"
        STEP = 3, "step"

    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="+", db_index=False)
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="+", db_index=False)
    kind = models.PositiveSmallIntegerField(choices=Kind.choices)
    key = models.BigIntegerField()  # the group, trajectory or step id
    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="deliveries")
    created_at = models.DateTimeField(auto_now_add=True)
    # Which use of the unit by this consumer this is, from 0 (specs.Serving.reuse: a unit
    # may be served up to max_uses times; without reuse it is always 0: exactly once).
    use_index = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            # Each use once per consumer and dataset (one use without reuse: exactly once);
            # also serves "was this unit delivered" and "how many uses" (a prefix).
            models.UniqueConstraint(
                fields=["consumer", "dataset", "kind", "key", "use_index"], name="delivery_use_once"
            ),
        ]
        indexes = [
            # Retention: "the leases that delivered these units, whoever took them" (a pass
            # forgets them once their units are gone: services.retention.leases_forget).
            models.Index(fields=["kind", "key"], name="delivery_unit"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.key} -> consumer {self.consumer_id}"


class PullCursor(models.Model):
    """Where a consumer's oldest-first pull of a dataset starts reading a ready queue
    (services.cursors): every unit of ``kind`` at or before (``at``, ``key``) in ready order
    is taken by this consumer (delivered, or dropped by a drop that still holds under
    ``dataset_version`` and a current policy version of at least ``policy_version``). Without
    it a consumer that has consumed N units re-reads N index entries per pull. ``epoch`` rises
    on every rewind (a nack, an expiry, a restore), so a pull that read the queue before a
    rewind never moves the cursor past what the rewind gave back. ``at`` null: no position
    yet (the queue is read from its head)."""

    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="+", db_index=False)
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="+", db_index=False)
    kind = models.PositiveSmallIntegerField(choices=Delivery.Kind.choices)
    dataset_version = models.ForeignKey(
        DatasetVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    policy_version = models.PositiveBigIntegerField(null=True, blank=True)
    at = models.DateTimeField(null=True, blank=True)
    key = models.BigIntegerField(default=0)
    epoch = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # One per consumer, dataset and queue; serves the pull's read of it.
            models.UniqueConstraint(fields=["consumer", "dataset", "kind"], name="pullcursor_one"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} queue of consumer {self.consumer_id} at {self.at} #{self.key}"


class GroupScore(models.Model):
    """A ready prompt group's serving scores (specs.Serving ``order: priority``), written by
    the effect of ``GroupsReady`` (services.consume.group_scores_refresh) each time the
    group is found ready, so a priority pull orders by an index instead of aggregating
    every waiting group's rewards. The row outlives a group that is no longer ready (the
    pull reads only ready groups) and is rewritten when it is ready again."""

    group = models.OneToOneField(
        "pool.PromptGroup", primary_key=True, on_delete=models.CASCADE, related_name="serving_score"
    )
    # Population standard deviation of its completed rollouts' rewards (0 for fewer than 2).
    reward_std = models.FloatField()
    # The lowest policy version of its completed rollouts' steps (the stalest decides); -1:
    # a step has none (staler than any version, as serving.stale_after counts it).
    policy_version = models.BigIntegerField()
    # The group's ready_at when scored (a copy, so the index orders ties by age too).
    ready_at = models.DateTimeField()

    class Meta:
        indexes = [
            # Pull, order priority/reward_std: "ready groups, highest spread first, oldest first".
            models.Index(fields=["-reward_std", "ready_at", "group"], name="gscore_spread"),
            # Pull, order priority/staleness: "ready groups, newest policy first, oldest first".
            models.Index(fields=["-policy_version", "ready_at", "group"], name="gscore_fresh"),
        ]

    def __str__(self) -> str:
        return f"group {self.group_id}: std {self.reward_std:g}, version {self.policy_version}"


class Skip(models.Model):
    """A ready unit dropped for a consumer when it was offered, and why: the dataset
    version did not admit it (``filtered``), or its serving rules dropped it (``stale``,
    ``capacity``; specs.Serving). It is not evaluated again for that consumer under that
    version (a later version, with other rules, looks at it afresh), which keeps a pull from
    re-reading the same rejected units at the head of the ready queue, except a drop that
    depends on the current policy version, once that version has moved back below
    ``policy_version`` (a stale unit may be fresh again); the rows are also the consumer's
    drop counters (selectors.consumer_status)."""

    class Reason(models.IntegerChoices):
        FILTERED = 1, "filtered"
        STALE = 2, "stale"
        CAPACITY = 3, "capacity"

    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="+", db_index=False)
    dataset_version = models.ForeignKey(
        DatasetVersion, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    kind = models.PositiveSmallIntegerField(choices=Delivery.Kind.choices)
    key = models.BigIntegerField()
    reason = models.PositiveSmallIntegerField(choices=Reason.choices, default=Reason.FILTERED)
    steps = models.PositiveIntegerField(null=True, blank=True)  # the unit's steps, where known
    # The current policy version when the unit was dropped (null: none was current). A drop
    # that depends on it (stale; filtered under filters.max_staleness) holds while the current
    # version is at least this one, and is looked at again once it has moved back.
    policy_version = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            # Also serves the pull's "not skipped" check and the drop counters (a prefix).
            models.UniqueConstraint(fields=["consumer", "dataset_version", "kind", "key"], name="skip_once"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.key} dropped ({self.get_reason_display()}) for consumer {self.consumer_id}"


class Snapshot(models.Model):
    """A frozen export of what a dataset version admitted, as JSONL and Parquet files.

    The admitted step ids are frozen (``step_ids``, ascending) at the first build attempt, so
    a retried build writes the same content. Files are written under a per-attempt folder and
    recorded (``files``) in the same UPDATE that marks the snapshot done: a killed build
    leaves no recorded file, and the next attempt rebuilds from scratch. Immutable once done
    (no service writes a done snapshot)."""

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        BUILDING = "building", "building"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    id = models.UUIDField(primary_key=True)
    dataset_version = models.ForeignKey(DatasetVersion, on_delete=models.PROTECT, related_name="snapshots")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    steps_done = models.PositiveIntegerField(default=0)
    steps_total = models.PositiveIntegerField(null=True, blank=True)  # known once frozen
    # The admitted step ids, ascending, and those served masked; null until the first attempt.
    step_ids = models.JSONField(null=True, blank=True)
    masked_ids = models.JSONField(null=True, blank=True)
    # Whose rows it holds (pool/tenancy.py): the source ids of its steps' trajectories,
    # ascending (null for a trajectory without a source), recorded with the files when done;
    # null until then. A reader restricted to some sources reads it only when this names
    # them alone (curation/selectors/consumption.py, snapshot_get).
    source_ids = models.JSONField(null=True, blank=True)
    # The attempt that may record the result: a stale worker's final UPDATE matches nothing.
    attempt = models.CharField(max_length=32, blank=True, default="")
    manifest = models.JSONField(default=dict, blank=True)
    files = models.JSONField(default=dict, blank=True)  # format -> storage name (once done)
    content_hash = models.CharField(max_length=64, blank=True, default="")  # sha256 of the JSONL
    error = models.TextField(blank=True, default="")
    created_by = models.CharField(max_length=160, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=~Q(status="done") | ~Q(content_hash=""), name="snapshot_done_has_hash"
            ),
        ]
        indexes = [
            # Snapshot listings: "snapshots, newest first".
            models.Index(fields=["created_at"], name="snapshot_created"),
        ]

    def __str__(self) -> str:
        return f"snapshot {self.id} ({self.status})"


class RetentionPolicy(models.Model):
    """What may leave the pool, and how (curation/services/retention.py, docs/operations.md
    "Retention and archives"). Whole prompt groups (or trajectories without a group) go,
    once every rollout has ended and none of them is pinned; a group goes when it matches
    every rule set here (age, beyond the newest steps kept, consumed)."""

    class Action(models.TextChoices):
        DELETE = "delete", "delete"
        ARCHIVE = "archive", "archive, then delete"

    name = models.CharField(max_length=64, unique=True)
    # Scope: one data source's groups (all sources when null), or the groups a dataset's
    # consumers were served (its ``consumed`` rule then counts that dataset's consumers only).
    source = models.ForeignKey(
        "pool.Source", null=True, blank=True, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    dataset = models.ForeignKey(
        Dataset, null=True, blank=True, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    action = models.CharField(max_length=8, choices=Action.choices, default=Action.ARCHIVE)
    older_than_days = models.FloatField(null=True, blank=True)  # the group's newest step older than this
    keep_newest_steps = models.PositiveIntegerField(
        null=True, blank=True
    )  # the newest groups holding these stay
    consumed = models.BooleanField(default=False)  # acked by every consumer of the datasets that served it
    enabled = models.BooleanField(default=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_report = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(older_than_days__isnull=False)
                | Q(keep_newest_steps__isnull=False)
                | Q(consumed=True),
                name="retention_has_a_rule",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Archive(models.Model):
    """Groups a retention pass archived: Parquet files in the archive storage (STORAGES
    "archives"), each recorded with its sha256 when written, and the manifest written beside
    them. ``manage.py archive_restore`` brings them back."""

    id = models.UUIDField(primary_key=True)
    policy = models.ForeignKey(
        RetentionPolicy,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="archives",
        db_index=False,
    )
    policy_name = models.CharField(max_length=64)
    folder = models.CharField(max_length=255)  # storage name of its folder
    files = models.JSONField(default=list)  # [{"name", "sha256", "bytes", "steps", "groups"}], in order
    steps = models.PositiveIntegerField(default=0)
    groups = models.PositiveIntegerField(default=0)
    trajectories = models.PositiveIntegerField(default=0)
    restored_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # The archive list: "newest first".
            models.Index(fields=["created_at"], name="archive_created"),
        ]

    def __str__(self) -> str:
        return f"archive {self.id} ({self.steps} steps)"


# --- lineage: training runs, their checkpoints and the data behind them ---------------------------
class Run(models.Model):
    """A training run (``POST /api/v1/runs``): a trainer reading one dataset as one consumer.
    Each policy version it publishes with ``"run"`` is a ``Checkpoint`` of it, and takes the
    consumer's leases acked since the run's previous checkpoint (services/lineage.py). A
    run is its consumer's source's (``source``, copied: tenancy reads it without a join)."""

    uid = models.CharField(max_length=128, unique=True)  # unique => indexed: lookups by uid
    name = models.CharField(max_length=128, blank=True, default="")
    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="runs", db_index=False)
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="+", db_index=False)
    source = models.ForeignKey(
        Source, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    # The policy whose versions are its checkpoints (pool.models.Policy).
    policy = models.CharField(max_length=64, default="default")
    config = models.JSONField(default=dict, blank=True)  # the trainer's own, as given
    code_version = models.CharField(max_length=128, blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        indexes = [
            # Run listings of a restricted reader: "its sources' runs, newest first" (keyset on id).
            models.Index(fields=["source", "id"], name="run_source"),
            # Consumer deletion cascades here.
            models.Index(fields=["consumer"], name="run_consumer"),
        ]

    def __str__(self) -> str:
        return self.uid


class Checkpoint(models.Model):
    """One policy version a run published: the leases its consumer acked since the run's
    previous checkpoint are this checkpoint's data (Lease.checkpoint, in ack order). Their
    steps are indexed afterwards (``CheckpointStep``, services.lineage.checkpoint_index);
    ``indexed_at`` says when, with the counts it found."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    version = models.PositiveBigIntegerField()
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    indexed_at = models.DateTimeField(null=True, blank=True)
    n_leases = models.PositiveIntegerField(null=True, blank=True)
    n_steps = models.PositiveIntegerField(null=True, blank=True)
    # The mean effective reward (else reward) of the steps behind it, when indexed.
    reward_mean = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [
            # One checkpoint per version of a run; also serves "a run's checkpoints, in order".
            models.UniqueConstraint(fields=["run", "version"], name="checkpoint_run_version_uniq"),
        ]
        indexes = [
            # The indexing sweep: "checkpoints whose steps are not indexed yet" (partial).
            models.Index(fields=["id"], condition=Q(indexed_at__isnull=True), name="checkpoint_unindexed"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}@{self.version}"


class CheckpointStep(models.Model):
    """A step behind a checkpoint, at its ``position`` (ack order of the leases, then each
    batch's own order; a step served twice under a reuse budget is here twice). Written
    from the leases' manifests by services.lineage.checkpoint_index, never on a pull.
    ``step`` is the step's id when indexed (null: removed before) and stays when the step is
    removed later (no constraint: lineage outlives the rows); ``step_uid`` names it either
    way. ``trajectory`` and ``source`` are copied from the step for the reverse lookups."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="+", db_index=False)
    position = models.PositiveIntegerField()
    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="+", db_index=False)
    step = models.ForeignKey(
        Step, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )
    step_uid = models.CharField(max_length=160)
    trajectory = models.ForeignKey(
        Trajectory,
        null=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        db_index=False,
    )
    source = models.ForeignKey(
        Source, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )

    class Meta:
        constraints = [
            # Each position once (indexing is idempotent); also serves "a checkpoint's steps
            # in order" (keyset on position) and its counts.
            models.UniqueConstraint(fields=["checkpoint", "position"], name="ckptstep_position_uniq"),
        ]
        indexes = [
            # "The checkpoints a step trained" (GET /api/v1/steps/{uid}/checkpoints).
            models.Index(fields=["step", "checkpoint"], name="ckptstep_step"),
            # "The checkpoints a trajectory trained".
            models.Index(fields=["trajectory", "checkpoint"], name="ckptstep_trajectory"),
            # "The checkpoints a source's data trained".
            models.Index(fields=["source", "checkpoint"], name="ckptstep_source"),
            # Lease deletion cascades here (a consumer's deletion).
            models.Index(fields=["lease"], name="ckptstep_lease"),
        ]

    def __str__(self) -> str:
        return f"{self.step_uid} -> checkpoint {self.checkpoint_id}"


class StepVerdict(models.Model):
    """What a trainer learnt about a step it trained on (``POST
    /api/v1/leases/{id}/verdicts``): per-step statistics, and optionally per-token ones.
    Stored against the step and the lease it came in; the checkpoint is the lease's
    (Lease.checkpoint). One row per (lease, step): a repost replaces it."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="+", db_index=False)
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="verdicts", db_index=False)
    # exp(mean over the response of training logprob - rollout logprob).
    importance_ratio = models.FloatField(null=True, blank=True)
    # The KL between the rollout and training policies on the response (k3 estimator
    # by default: mean of r - 1 - log r, r = exp(training - rollout)).
    logprob_kl = models.FloatField(null=True, blank=True)
    advantage = models.FloatField(null=True, blank=True)
    clipped_fraction = models.FloatField(null=True, blank=True)
    # Per-token statistics: the names of the rows (``token_stats``: little-endian float32,
    # one row per name, one value per response token).
    token_fields = models.JSONField(default=list, blank=True)
    token_stats = models.BinaryField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # One verdict per step of a lease (a repost replaces it).
            models.UniqueConstraint(fields=["lease", "step"], name="verdict_lease_step_uniq"),
        ]
        indexes = [
            # Step and trace pages: "a step's verdicts" (and the cascade of a step delete).
            models.Index(fields=["step", "id"], name="verdict_step"),
        ]

    def __str__(self) -> str:
        return f"verdict on step {self.step_id} (lease {self.lease_id})"


class PreviewTotals(models.Model):
    """The numbers of a dataset's preview (selectors/specs.py ``SHARES``), kept as totals:
    a whole count's (``DatasetCount``) and one data source's (``DatasetCountSource``)."""

    steps = models.BigIntegerField(default=0)
    masked_steps = models.BigIntegerField(default=0)
    trajectories = models.BigIntegerField(default=0)
    groups = models.BigIntegerField(default=0)
    dropped_groups = models.BigIntegerField(default=0)
    waiting_units = models.BigIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    response_tokens = models.BigIntegerField(default=0)

    class Meta:
        abstract = True


class DatasetCount(PreviewTotals):
    """What a saved dataset version admits, kept as the pool changes (services/counts.py):
    the numbers of its preview, so reading them costs what changed since the last read,
    not the pool's size. One per current version of a dataset whose spec admits ready,
    whole groups (the others are counted at query time). Per unit (a group, or a
    trajectory without one) its share is kept in ``DatasetCountUnit``; what changed a unit
    is a ``DatasetCountChange`` row, written in the changing write's transaction and folded
    into the totals by the next read or the periodic sweep."""

    version = models.OneToOneField(DatasetVersion, on_delete=models.CASCADE, related_name="count")
    built = models.BooleanField(default=False)  # False: the first full count has not run
    # The current policy version (id) of the spec's policy the units were counted against
    # (freshness, filters.max_staleness); null: none was current.
    policy_version = models.BigIntegerField(null=True, blank=True)
    counted_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"count of dataset version {self.version_id}"


class DatasetCountSource(PreviewTotals):
    """A ``DatasetCount``'s totals over the units of one data source (``DatasetCountUnit``
    rows with ``one_source``): what a reader restricted to some sources sums, a row per
    source whatever the pool's size. Moved with the units' shares by every fold."""

    count = models.ForeignKey(DatasetCount, on_delete=models.CASCADE, related_name="+", db_index=False)
    source_id = models.BigIntegerField()

    class Meta:
        constraints = [
            # One row per source; serves a restricted reader's sum and the fold's update.
            models.UniqueConstraint(fields=["count", "source_id"], name="dcountsource_uniq"),
        ]

    def __str__(self) -> str:
        return f"count {self.count_id} of source {self.source_id}"


class DatasetCountUnit(models.Model):
    """One unit's share of a ``DatasetCount`` (the totals are the sum of these rows), and
    the current policy version from which it must be counted again (``recount_at``: a step
    that passed the freshness test fails it from there)."""

    count = models.ForeignKey(DatasetCount, on_delete=models.CASCADE, related_name="+", db_index=False)
    unit = models.BigIntegerField()  # a group's id, or minus the id of a trajectory without one
    # PreviewTotals' numbers for one unit, not inherited: a row per group of the pool, so each
    # in the narrowest type a unit's share fits (a group's trajectories, a 0/1 flag), where the
    # totals need 64 bits.
    steps = models.BigIntegerField(default=0)
    masked_steps = models.BigIntegerField(default=0)
    trajectories = models.IntegerField(default=0)
    groups = models.SmallIntegerField(default=0)
    dropped_groups = models.SmallIntegerField(default=0)
    waiting_units = models.SmallIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    response_tokens = models.BigIntegerField(default=0)
    recount_at = models.BigIntegerField(null=True, blank=True)
    # The data source of every rollout of the unit (``one_source``; None: rollouts without
    # one): its share is a reader's whole or nothing, so a reader restricted to some sources
    # sums the shares of theirs. A unit of several sources (or counted before this was kept)
    # is counted live for such a reader (curation/services/counts.py).
    source_id = models.BigIntegerField(null=True, blank=True)
    one_source = models.BooleanField(default=False)

    class Meta:
        constraints = [
            # One share per unit; serves the fold's read of the changed units' shares.
            models.UniqueConstraint(fields=["count", "unit"], name="dcountunit_uniq"),
        ]
        indexes = [
            # The fold after a new policy version: "the units whose freshness changes now".
            models.Index(
                fields=["count", "recount_at"],
                condition=Q(recount_at__isnull=False),
                name="dcountunit_recount",
            ),
            # A restricted reader's units of several sources (counted live for it).
            models.Index(fields=["count", "unit"], condition=Q(one_source=False), name="dcountunit_several"),
        ]

    def __str__(self) -> str:
        return f"unit {self.unit} of count {self.count_id}"


class DatasetCountChange(models.Model):
    """A unit that changed since its count last read it (services/counts.py). Rows are only
    ever added by writers and taken by the fold: no unique key, so two writers marking the
    same unit never wait for each other (a unit marked twice is counted again once)."""

    count = models.ForeignKey(DatasetCount, on_delete=models.CASCADE, related_name="+", db_index=False)
    unit = models.BigIntegerField()

    class Meta:
        indexes = [
            # The fold: "take this count's changes"; and the cascade of a count's deletion.
            models.Index(fields=["count"], name="dcountchange_count"),
        ]

    def __str__(self) -> str:
        return f"unit {self.unit} changed (count {self.count_id})"
