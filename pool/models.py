"""Pool models: the step-level MDP (state = prompt ids, action = response ids, reward) and
everything that gives it context: sources, policy versions, prompt groups, trajectories,
rewards, feedback, events and prefix-tree merge results.

Token storage (see pool/tokens.py and docs/architecture.md): a step's full sequence
(prompt_ids + response_ids) is stored as a *delta against a parent step*:

    full(step) = full(step.seq_parent)[:step.seq_shared] + step.seq_delta

The parent is the previous step of the same trajectory or the group's anchor step, chosen at
ingest by longest common prefix. Shared prefixes (earlier turns, the group prompt) are thus
stored once and reconstruction is exact.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from .flags import TRAINABLE_VALUES, Readiness
from .querysets import StepQuerySet


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


class PolicyVersion(models.Model):
    """A version of the policy being trained. The version number is the primary key, so a
    step's ``policy_version_id`` *is* the number and freshness filters need no join."""

    version = models.PositiveBigIntegerField(primary_key=True)
    is_current = models.BooleanField(default=False)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # At most one current version; set_current flips it inside one transaction.
            models.UniqueConstraint(
                fields=["is_current"], condition=Q(is_current=True), name="policy_one_current"
            ),
        ]

    def __str__(self) -> str:
        return f"v{self.version}{' (current)' if self.is_current else ''}"


class Policy(models.Model):
    """A named policy being trained, with its own current version (pool/services/policy.py).

    ``default`` is the one policy of before named policies: its current version is also
    marked on PolicyVersion.is_current, which the pool's overview, stats and defaults read.
    Version numbers are one space (PolicyVersion, the number a step carries); each policy
    has its current one here, and a dataset follows one policy's freshness
    (curation.specs.Filters.policy). Owned by sources (PolicyOwner): a policy key moves only
    the policies of its sources; the first one to move an unowned policy owns it."""

    name = models.CharField(max_length=64, unique=True)
    current_version = models.PositiveBigIntegerField(null=True, blank=True)
    # The window that bounds how far the current version moves per minute
    # (CLAW_POLICY_MAX_ADVANCE_PER_MINUTE): its start and the versions advanced in it.
    window_started_at = models.DateTimeField(null=True, blank=True)
    window_advance = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    DEFAULT = "default"

    class Meta:
        verbose_name_plural = "policies"

    def __str__(self) -> str:
        return f"{self.name} (v{self.current_version})"


class PolicyOwner(models.Model):
    """A source that owns a policy: its policy keys move that policy's versions."""

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="owners", db_index=False)
    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="+", db_index=False)

    class Meta:
        constraints = [
            # One row per (policy, source); serves "may these sources move this policy".
            models.UniqueConstraint(fields=["policy", "source"], name="policyowner_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.policy_id} owned by source {self.source_id}"


class PromptGroup(models.Model):
    """The rollouts of one prompt (a GRPO group), with the dataset fields of that prompt."""

    class Status(models.TextChoices):
        OPEN = "open", "open"
        COMPLETE = "complete", "complete"

    uid = models.CharField(max_length=128, unique=True)
    # The source that created it: only that source's writers join trajectories to it or
    # change it. NULL (created by an admin key, an operator or before migration 0012): a
    # shared group, that every source's trajectories may join (pool/tenancy.py).
    source = models.ForeignKey(
        Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    expected_rollouts = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    dataset = models.CharField(max_length=128, blank=True, default="")
    ground_truth = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # First step-0 stored in this group: the parent candidate for the other rollouts' first
    # steps, which share the group prompt. Denormalised so ingest needs no search. Indexed
    # by group_anchor (partial) for deletes of steps (the SET_NULL of this key).
    anchor_step = models.ForeignKey(
        "Step", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # Set when the group is complete and every step of its completed rollouts has a final
    # reward; cleared if a reward goes back to pending (pool/services/readiness.py).
    ready_at = models.DateTimeField(null=True, blank=True)
    # The task (dataset row) the group rolled out, if it named one (pool/services/task_catalog.py),
    # and when its rollouts were counted into the task's statistics (pool/services/task_stats.py:
    # set once, by the UPDATE that claims the group, so a group is counted exactly once).
    task = models.ForeignKey(
        "Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="groups", db_index=False
    )
    task_counted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # Curation and merge queue: "open groups, oldest first" and "complete groups".
            models.Index(fields=["status", "created_at"], name="group_status_created"),
            # Consumption: "ready groups, oldest-ready first" (partial: most groups in flight are not).
            models.Index(fields=["ready_at"], condition=Q(ready_at__isnull=False), name="group_ready"),
            # Deleting steps (retention): "the group this step anchors", the SET_NULL of
            # anchor_step, which PostgreSQL asks for each deleted step.
            models.Index(fields=["anchor_step"], condition=Q(anchor_step__isnull=False), name="group_anchor"),
        ]

    def __str__(self) -> str:
        return self.uid


class Channel(models.TextChoices):
    TRAIN = "train", "train"
    VAL = "val", "val"


class Trajectory(models.Model):
    """One episode of an agent: an ordered list of steps."""

    class Status(models.TextChoices):
        RUNNING = "running", "running"
        COMPLETED = "completed", "completed"
        FAILED = "failed", "failed"
        ABANDONED = "abandoned", "abandoned"

    uid = models.CharField(max_length=128, unique=True)
    group = models.ForeignKey(
        PromptGroup, null=True, blank=True, on_delete=models.PROTECT, related_name="trajectories"
    )
    source = models.ForeignKey(
        Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="trajectories"
    )
    channel = models.CharField(max_length=8, choices=Channel.choices, default=Channel.TRAIN)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    reward = models.FloatField(null=True, blank=True)
    # Who gave ``reward`` (NULL while there is none): the source a step served with its
    # trajectory's reward says it came from (pool/services/effective_reward.py).
    reward_source = models.CharField(max_length=8, null=True, blank=True)  # noqa: DJ001
    # Next free step_index. Only ever raised: by the claim of a proxied call (step_count + n,
    # under the row lock) and by the batch effects (the max of stored and written), both in
    # pool/sql.py, so concurrent writers never lose or reuse an index.
    step_count = models.PositiveIntegerField(default=0)
    # First step_index of the latest append: the steps one call wrote together (the n choices
    # of one prompt). The gateway checks a next call's continuity (drift) against them, so
    # [tail_index, step_count) is "the previous call" without reading step metadata.
    tail_index = models.PositiveIntegerField(default=0)
    policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # When some of its steps were first handed out: leased to a consumer (even if the lease
    # was later nacked or expired: the trainer saw them) or frozen into a snapshot. From then
    # on its rewards, and its steps', are frozen (pool.errors.RewardDelivered; set by
    # pool/services/delivery.py, under the row lock every reward writer takes).
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "trajectories"
        indexes = [
            # "Rollouts of a group" (group detail, group-complete check, merge input).
            models.Index(fields=["group", "status"], name="traj_group_status"),
            # Readiness: "completed trajectories, oldest first" / "running ones gone stale".
            models.Index(fields=["status", "updated_at"], name="traj_status_updated"),
            # Time-ordered listings and retention.
            models.Index(fields=["created_at"], name="traj_created"),
            # Pull: "completed trajectories without a group, oldest (newest) first" (curation
            # consume's lone-unit queue, as group_ready serves the groups'): a pull reads the
            # first few entries, however many are ready.
            models.Index(
                fields=["completed_at", "id"],
                condition=Q(group__isnull=True, status="completed"),
                name="traj_lone_ready",
            ),
        ]

    def __str__(self) -> str:
        return self.uid


class Step(models.Model):
    """One agent step: state (prompt ids), action (response ids), reward."""

    class Label(models.TextChoices):
        NONE = "", "none"
        ACCEPTED = "accepted", "accepted"
        REJECTED = "rejected", "rejected"
        QUARANTINED = "quarantined", "quarantined"

    class RewardStatus(models.TextChoices):
        PENDING = "pending", "pending"
        FINAL = "final", "final"

    class RewardSource(models.TextChoices):
        ENV = "env", "env"
        RULE = "rule", "rule"
        MODEL = "model", "model"
        HUMAN = "human", "human"

    class RewardScope(models.TextChoices):
        STEP = "step", "step"  # the step's own reward
        BRANCH = "branch", "branch"  # the outcome reward on its branch's final step
        TRAJECTORY = "trajectory", "trajectory"  # its trajectory's reward
        # (a dataset with reward_assignment "last_step" serves the other steps 0 with
        # scope "none", one with "discounted_return" every step its return with scope
        # "return"; neither is stored)

    class TokenSource(models.TextChoices):
        CLIENT = "client", "client"  # white-box agent submitted the ids
        UPSTREAM = "upstream", "upstream"  # inference server returned them (exact)
        RETOKENIZED = "retokenized", "retokenized"  # local tokenizer re-encoded text (may drift)
        NONE = "none", "none"

    uid = models.CharField(max_length=160, unique=True)  # client idempotency key
    # No index of its own: "steps of a trajectory" is served by step_traj_index_uniq
    # (trajectory, step_index) and step_curation (trajectory, covering).
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="steps", db_index=False)
    step_index = models.PositiveIntegerField()

    # --- token storage (see module docstring and pool/tokens.py) ---
    # Indexed by step_seq_children (partial), for deletes: see there.
    seq_parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    seq_shared = models.PositiveIntegerField(default=0)  # tokens taken from the parent
    seq_delta = models.BinaryField()  # little-endian int32 token ids after the shared prefix
    seq_len = models.PositiveIntegerField()  # len(prompt_ids) + len(response_ids)
    prompt_len = models.PositiveIntegerField()
    seq_depth = models.PositiveIntegerField(default=0)  # parent-chain length, bounded at ingest
    seq_hash = models.BinaryField(max_length=16)  # blake2b-128 of the full sequence bytes
    rollout_logprobs = models.BinaryField(null=True, blank=True)  # little-endian float64, one per response id
    # Token-level rewards, as the logprobs: little-endian float64, one per response id.
    token_rewards = models.BinaryField(null=True, blank=True)
    # The policy version of each response id (a partial rollout spans versions), run-length
    # encoded as little-endian int64 (version, count) pairs: a few pairs whatever the length.
    token_versions = models.BinaryField(null=True, blank=True)
    content_hash = models.BinaryField(max_length=16)  # fingerprint of the submission, for idempotency

    # --- reward ---
    reward = models.FloatField(null=True, blank=True)
    reward_status = models.CharField(max_length=8, choices=RewardStatus.choices, default=RewardStatus.PENDING)
    # NULL (not "") = no reward source yet; the API distinguishes null from a value.
    reward_source = models.CharField(max_length=8, choices=RewardSource.choices, null=True, blank=True)  # noqa: DJ001
    # The effective reward: what every reader serves (datasets, formats, snapshots, the API,
    # pages), defined once in pool/services/effective_reward.py: the step's own reward, else
    # its branch's outcome (the own final reward of the branch's final step, else its
    # trajectory's reward); NULL while there is none. Denormalised (kept by the write pipeline's
    # effects, rewards and completions) so a filter or a batch reads one column, no join.
    effective_reward = models.FloatField(null=True, blank=True)
    reward_scope = models.CharField(max_length=10, choices=RewardScope.choices, null=True, blank=True)  # noqa: DJ001
    effective_reward_source = models.CharField(  # noqa: DJ001 - null = no effective reward
        max_length=8, choices=RewardSource.choices, null=True, blank=True
    )
    # The two kinds of reward a step can be served (pool/services/effective_reward.py), kept
    # with the effective reward by the same refresh: ``outcome_reward`` is its branch's
    # outcome (the own final reward of the branch's final step, else the trajectory's
    # reward; NULL while there is none), the same on every step of the branch;
    # ``process_reward`` is the step's own reward when the step is not its branch's final
    # one (a rule that checked one tool call), else NULL.
    outcome_reward = models.FloatField(null=True, blank=True)
    process_reward = models.FloatField(null=True, blank=True)

    policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    is_last = models.BooleanField(default=False)
    finish_reason = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001 - null = unknown
    token_source = models.CharField(max_length=12, choices=TokenSource.choices, default=TokenSource.CLIENT)
    # Retokenisation drift: the prompt did not extend the previous step's prompt + response.
    drift = models.BooleanField(default=False)
    drift_offset = models.PositiveIntegerField(null=True, blank=True)  # first mismatching prompt position
    # Branches (gateway/proxy/branches.py): a proxied call whose messages do not extend the
    # conversation of any earlier call of its trajectory (a compaction, a sub-agent, an edited
    # history) starts a new branch, linked to the step it shares the longest message prefix
    # with; a call that extends one continues that step's branch. 0 is the first branch.
    branch = models.PositiveSmallIntegerField(default=0)
    # Read along with its step (rendered as parent_step_uid); indexed by step_branch_children
    # (partial) for deletes only. SET_NULL: a step outlives nothing it links to only by history.
    parent_step = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )

    # --- curation (pool/flags.py) ---
    readiness = models.PositiveSmallIntegerField(default=0)  # Readiness bits
    quality_flags = models.PositiveIntegerField(default=0)  # Quality bits
    response_hash = models.BinaryField(max_length=8, null=True, blank=True)  # duplicate responses
    # Operator label and note (curation/services/labels.py, audited as LabelEvents).
    label = models.CharField(max_length=12, choices=Label.choices, blank=True, default=Label.NONE)
    note = models.TextField(blank=True, default="")

    # --- text form, where known ---
    messages = models.JSONField(null=True, blank=True)
    response_text = models.TextField(null=True, blank=True)  # noqa: DJ001 - null = text form unknown
    metadata = models.JSONField(default=dict, blank=True)
    source = models.ForeignKey(
        Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = StepQuerySet.as_manager()

    class Meta:
        constraints = [
            # Trajectory + step_index: the step order. Also serves "steps of a trajectory in order".
            models.UniqueConstraint(fields=["trajectory", "step_index"], name="step_traj_index_uniq"),
            models.CheckConstraint(
                condition=Q(prompt_len__lte=models.F("seq_len")), name="step_prompt_within_seq"
            ),
            models.CheckConstraint(
                condition=Q(seq_shared__lte=models.F("seq_len")), name="step_shared_within_seq"
            ),
            models.CheckConstraint(
                condition=Q(seq_parent__isnull=False) | Q(seq_shared=0), name="step_shared_needs_parent"
            ),
            models.CheckConstraint(
                condition=Q(reward_status="pending") | Q(reward__isnull=False), name="step_final_reward_set"
            ),
        ]
        indexes = [
            # Token-sequence hash: "steps with exactly this sequence" (dedup, merge cache keys).
            models.Index(fields=["seq_hash"], name="step_seq_hash"),
            # Reward queue: "steps still waiting for a reward", oldest first (partial index).
            models.Index(
                fields=["created_at"], condition=Q(reward_status="pending"), name="step_reward_pending"
            ),
            # Policy freshness: "steps generated by version >= v" and per-version counts.
            models.Index(fields=["policy_version", "created_at"], name="step_policy_created"),
            # Time-ordered listings, retention and stats windows.
            models.Index(fields=["created_at"], name="step_created"),
            # Drift review: "steps whose tokens did not extend the previous step" (partial).
            models.Index(fields=["trajectory"], condition=Q(drift=True), name="step_drift"),
            # Admin and step-unit datasets: "ready steps, in id order" (readiness = READY, or
            # READY_ANY_TOKENS where retokenized ids are allowed; a group-whole dataset asks for
            # the values without GROUP_COMPLETE too). Partial: only steps whose reward is final
            # and whose trajectory completed, the values those queries list.
            models.Index(
                fields=["readiness", "id"],
                condition=Q(readiness__in=TRAINABLE_VALUES),
                name="step_ready",
            ),
            # Dataset previews and admission (curation/selectors/specs.py): steps aggregated per
            # trajectory read only this narrow index (an index-only scan in trajectory order),
            # never the wide rows with their token deltas. PostgreSQL; elsewhere a plain index.
            models.Index(
                fields=["trajectory"],
                include=[
                    "id",
                    "readiness",
                    "quality_flags",
                    "policy_version",
                    "label",
                    "reward",
                    "reward_status",
                    "effective_reward",
                    "token_source",
                    "prompt_len",
                    "seq_len",
                    "created_at",
                    "source",
                ],
                name="step_curation",
            ),
            # Curation: "steps an operator labelled L" (partial: most steps carry no label).
            models.Index(fields=["label", "created_at"], condition=~Q(label=""), name="step_labelled"),
            # Deleting steps (retention): "steps whose token parent is this step", which
            # PostgreSQL asks for each deleted step to check the PROTECT foreign key (without
            # it, a scan of the whole step table per deleted step: 77 s of commit for 6,400
            # steps of a 20k-step pool, bench/growth.py), and which re-basing a kept child
            # asks too. Partial: a chain's first steps have no parent.
            models.Index(
                fields=["seq_parent"], condition=Q(seq_parent__isnull=False), name="step_seq_children"
            ),
            # Deleting steps: "steps branched from this step" (the SET_NULL of parent_step).
            # Partial: only the steps a proxied call branched have one.
            models.Index(
                fields=["parent_step"], condition=Q(parent_step__isnull=False), name="step_branch_children"
            ),
        ]

    def __str__(self) -> str:
        return self.uid

    @property
    def response_len(self) -> int:
        return self.seq_len - self.prompt_len

    @property
    def effective_reward_status(self) -> str:
        """ "final" when the effective reward is final (the REWARD_FINAL readiness bit:
        pool/services/effective_reward.py), else "pending"."""
        return "final" if self.readiness & Readiness.REWARD_FINAL else "pending"


class RewardEvent(models.Model):
    """Audit trail: every reward set or changed, on a step or a trajectory."""

    step = models.ForeignKey(
        Step, null=True, blank=True, on_delete=models.CASCADE, related_name="reward_events"
    )
    trajectory = models.ForeignKey(
        Trajectory, null=True, blank=True, on_delete=models.CASCADE, related_name="reward_events"
    )
    old_reward = models.FloatField(null=True, blank=True)
    new_reward = models.FloatField()
    reward_source = models.CharField(max_length=8, choices=Step.RewardSource.choices)
    final = models.BooleanField(default=True)
    source = models.ForeignKey(Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(step__isnull=False) | Q(trajectory__isnull=False), name="reward_event_has_target"
            )
        ]
        indexes = [
            # Audit listing: "reward history, newest first".
            models.Index(fields=["created_at"], name="reward_event_created"),
        ]

    def __str__(self) -> str:
        return f"{self.old_reward} -> {self.new_reward} ({self.reward_source})"


class Event(models.Model):
    """A raw event from a black-box service (or the gateway itself: upstream faults)."""

    type = models.CharField(max_length=64)
    source = models.ForeignKey(Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    trajectory = models.ForeignKey(
        Trajectory, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    payload = models.JSONField(default=dict, blank=True)
    occurred_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # Event feed: "events of type T, newest first".
            models.Index(fields=["type", "created_at"], name="event_type_created"),
            # Live feed and retention.
            models.Index(fields=["created_at"], name="event_created"),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.pk}"


class Feedback(models.Model):
    """Human or service feedback on a step or a trajectory."""

    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.CASCADE, related_name="feedback")
    trajectory = models.ForeignKey(
        Trajectory, null=True, blank=True, on_delete=models.CASCADE, related_name="feedback"
    )
    rating = models.FloatField(null=True, blank=True)
    label = models.CharField(max_length=64, blank=True, default="")
    correction = models.TextField(blank=True, default="")
    comment = models.TextField(blank=True, default="")
    author = models.CharField(max_length=128, blank=True, default="")
    source = models.ForeignKey(Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "feedback"
        constraints = [
            models.CheckConstraint(
                condition=Q(step__isnull=False) | Q(trajectory__isnull=False), name="feedback_has_target"
            )
        ]
        indexes = [
            # Review queue: "feedback with label L, newest first".
            models.Index(fields=["label", "created_at"], name="feedback_label_created"),
        ]

    def __str__(self) -> str:
        return f"feedback #{self.pk} {self.label}".strip()


class MergeResult(models.Model):
    """A prefix-tree merge of a set of steps (a prompt group, or a batch/snapshot).

    ``input_hash`` fingerprints the ordered (step id, seq_hash) inputs, so recomputation of an
    unchanged input is skipped (the merge task is idempotent). ``layout`` holds the packed
    layout (compressed numpy arrays) or is empty when it is cheaper to rebuild.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        RUNNING = "running", "running"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    key = models.CharField(max_length=200, unique=True)  # "group:<uid>" or "batch:<id>"
    group = models.ForeignKey(
        PromptGroup, null=True, blank=True, on_delete=models.CASCADE, related_name="merges"
    )
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    input_hash = models.BinaryField(max_length=16, null=True, blank=True)
    n_sequences = models.PositiveIntegerField(default=0)
    total_tokens = models.PositiveBigIntegerField(default=0)
    unique_tokens = models.PositiveBigIntegerField(default=0)
    layout = models.BinaryField(null=True, blank=True)
    stats = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            # Dashboard: "latest merges" and the savings total.
            models.Index(fields=["status", "updated_at"], name="merge_status_updated"),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def ratio(self) -> float:
        return self.unique_tokens / self.total_tokens if self.total_tokens else 1.0

    @property
    def savings(self) -> float:
        """Share of step tokens a tree-packed forward does not recompute: 1 - ratio."""
        return 1.0 - self.ratio


class TrajectoryCapability(models.Model):
    """The secret of a trajectory capability URL (gateway/compat, gateway/proxy): it alone
    authorises the calls of ONE trajectory (record its steps, register it, complete it) for
    the source of the API key that issued it, and nothing else. It stops working when the
    trajectory ends (status not running), when ``expires_at`` passes, or when the issuing
    key is revoked or deleted.

    Only the SHA-256 of the token is stored, as for ApiKey (tokens are 192-bit random, so a
    slow hash adds nothing); the clear token is handed out once, inside the base URL.
    """

    trajectory = models.ForeignKey(
        Trajectory, on_delete=models.CASCADE, related_name="capabilities", db_index=False
    )
    # The issuing key: its source is the token's source; revoking or deleting it ends the token.
    # No index: keys are deleted rarely (an admin action), so that cascade may scan.
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="+", db_index=False)
    token_hash = models.CharField(max_length=64, unique=True)  # unique => indexed: every call's lookup
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "trajectory capabilities"
        indexes = [
            # "Tokens of a trajectory": the cascade of a trajectory delete (retention) and the admin.
            models.Index(fields=["trajectory"], name="trajcap_trajectory"),
        ]

    def __str__(self) -> str:
        return f"capability #{self.pk} of {self.trajectory_id}"


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


class RewardFunction(models.Model):
    """A reward function the pool computes itself (pool/rewards/), named by a data source or
    a dataset. Rows here override settings.CLAW_REWARD_FUNCTIONS for the same name; a
    disabled row switches the name off (also one that settings define)."""

    name = models.CharField(max_length=128, unique=True, help_text="A data source or dataset name.")
    path = models.CharField(
        max_length=255, help_text="Dotted path of the function, e.g. pool.rewards.builtin.gsm8k."
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} -> {self.path}{'' if self.enabled else ' (disabled)'}"


class RewardFailure(models.Model):
    """A computed reward that could not be made (the function raised, the text is unknown,
    the judge failed). One row per trajectory and data source, updated on a retry and removed
    once the reward is made; the trajectory's other rewards are unaffected."""

    trajectory = models.ForeignKey(
        Trajectory, on_delete=models.CASCADE, related_name="reward_failures", db_index=False
    )
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    data_source = models.CharField(max_length=128)
    function = models.CharField(max_length=255, blank=True, default="")
    error = models.TextField()
    attempts = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # Also serves "failures of a trajectory" (the upsert and its removal on success).
            models.UniqueConstraint(fields=["trajectory", "data_source"], name="reward_failure_traj_uniq"),
        ]
        indexes = [
            # Admin listing: "latest failures first".
            models.Index(fields=["updated_at"], name="reward_failure_updated"),
        ]

    def __str__(self) -> str:
        return f"{self.data_source} on {self.trajectory_id}: {self.error[:60]}"


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


# --- Media (issue 24): images in steps, stored once by content --------------------------------


class Media(models.Model):
    """One distinct image, by the sha256 of its bytes (pool/services/media.py media_store).

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


# --- tasks: what prompt groups sample, their statistics, and the sampler's audit -------------------
class TaskSet(models.Model):
    """The tasks registered under one ``set`` name (a dataset split), with the thresholds of
    their statistics (pool/services/task_stats.py). Created on first sight of its name, with
    the defaults below; an operator changes them in the admin (they apply to later groups)."""

    DEFAULT_PASS_THRESHOLD = 1.0  # a pass is full marks: the verifiable 0/1 rewards of math and code
    DEFAULT_WINDOW = 16  # policy versions: the half-life of the recent counts

    name = models.CharField(max_length=128, unique=True)  # unique => indexed: lookup by name
    pass_threshold = models.FloatField(default=DEFAULT_PASS_THRESHOLD)
    # The recent window, as the half-life in policy versions of the recent counts: a group of
    # version v decays what the task had seen at version u by 0.5 ** ((v - u) / window).
    window = models.PositiveIntegerField(default=DEFAULT_WINDOW)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Task(models.Model):
    """A dataset row to roll out (a math problem, a repository issue, a web goal), and the
    statistics of every group that rolled it out, kept by one effect of the write pipeline
    (pool/services/task_stats.py: one UPDATE per task with F() expressions).

    A task belongs to a source like a prompt group does (pool/tenancy.py): its uid is unique
    per source (and among the shared tasks without one)."""

    uid = models.CharField(max_length=128)
    source = models.ForeignKey(
        Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    set_name = models.CharField(max_length=128, blank=True, default="")
    prompt = models.JSONField(null=True, blank=True)  # text or chat messages; null: named by a group only
    ground_truth = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # A random key fixed at creation: uniform sampling walks it (pool/selectors/task_sampler.py)
    # and it breaks ties of every order, so equal scores do not always favour old tasks.
    rand_key = models.FloatField(default=0.0)
    created_at = models.DateTimeField(auto_now_add=True)
    # --- statistics, all time: rollouts of counted groups ---
    attempted = models.PositiveIntegerField(default=0)  # rollouts (trajectories) of counted groups
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)  # failed or abandoned
    rewarded = models.PositiveIntegerField(default=0)  # completed rollouts with a reward
    reward_sum = models.FloatField(default=0.0)
    reward_sumsq = models.FloatField(default=0.0)  # mean and variance exact and incremental
    passes = models.PositiveIntegerField(default=0)  # rewards >= the set's pass_threshold
    pass_rate = models.FloatField(null=True, blank=True)  # passes / rewarded; null: never rewarded
    seen = models.PositiveIntegerField(default=0)  # counted groups
    informative_groups = models.PositiveIntegerField(default=0)  # groups whose rewards differ
    last_policy_version = models.PositiveBigIntegerField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # --- the recent window: counts decayed by policy version (TaskSet.window) ---
    recent_rewarded = models.FloatField(default=0.0)
    recent_passes = models.FloatField(default=0.0)
    # (recent_passes + 1) / (recent_rewarded + 2): the recent pass rate under a Beta(1, 1)
    # prior (0.5 for an unseen task), and the sampler's informative score p(1 - p).
    recent_pass_rate = models.FloatField(default=0.5)
    score = models.FloatField(default=0.25)

    class Meta:
        constraints = [
            # Registration and groups naming a task: "this source's task uid".
            models.UniqueConstraint(
                fields=["source", "uid"], condition=Q(source__isnull=False), name="task_source_uid_uniq"
            ),
            # The same for shared tasks (registered by an admin key or an operator).
            models.UniqueConstraint(
                fields=["uid"], condition=Q(source__isnull=True), name="task_shared_uid_uniq"
            ),
        ]
        indexes = [
            # Sampler "informative": best score first within a set (ties by rand_key).
            models.Index(fields=["set_name", "-score", "rand_key"], name="task_set_score"),
            # Sampler "least_seen" and every strategy's exploration: least seen first within a set.
            models.Index(fields=["set_name", "seen", "rand_key"], name="task_set_seen"),
            # Sampler "easy_to_hard": recent pass rate nearest the target (two range scans).
            models.Index(fields=["set_name", "recent_pass_rate"], name="task_set_recent"),
            # Sampler "uniform": the successor of a random point on rand_key within a set.
            models.Index(fields=["set_name", "rand_key"], name="task_set_rand"),
            # GET /api/v1/tasks?set=...&pass_rate_min=...: a set's tasks by pass rate.
            models.Index(fields=["set_name", "pass_rate"], name="task_set_pass"),
        ]

    def __str__(self) -> str:
        return self.uid


class TaskSampleRecord(models.Model):
    """One answer of the task sampler (POST /api/v1/task-sampler), kept so a run can be
    audited: who asked, with which strategy and parameters, and which tasks came back why."""

    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    source = models.ForeignKey(Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    strategy = models.CharField(max_length=16)
    params = models.JSONField(default=dict, blank=True)  # the request, with the seed it used
    task_uids = models.JSONField(default=list)
    reasons = models.JSONField(default=list)  # one per task uid, in order
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # GET /api/v1/task-sampler/records of a source, newest first.
            models.Index(fields=["source", "-created_at"], name="tasksample_source_created"),
        ]

    def __str__(self) -> str:
        return f"{self.strategy} #{self.pk}"
