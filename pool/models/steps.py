"""The step-level MDP (state = prompt ids, action = response ids, reward) and its frame: prompt
groups, trajectories, steps, prefix-tree merge results and the capabilities of proxied
trajectories.

Token storage (see pool/tokens.py and docs/architecture.md): a step's full sequence
(prompt_ids + response_ids) is stored as a *delta against a parent step*:

    full(step) = full(step.seq_parent)[:step.seq_shared] + step.seq_delta

The parent is the previous step of the same trajectory or the group's anchor step, chosen at
ingest by longest common prefix. Shared prefixes (earlier turns, the group prompt) are thus
stored once and reconstruction is exact.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ..flags import TRAINABLE_VALUES, Readiness
from ..querysets import StepQuerySet
from .access import ApiKey, Source
from .constraints import CoveringUniqueConstraint
from .policy import PolicyVersion


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


# The columns curation reads per step without its wide row (step_traj_index_uniq covers them).
CURATION_COLUMNS = [
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
]


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

    # Client idempotency key. Unique by the constraint pool_step_uid_key (Meta), not unique=True,
    # which on PostgreSQL adds a second, pattern-ops index nothing uses (migration 0026).
    uid = models.CharField(max_length=160)
    # No index of its own: "steps of a trajectory" is served by step_traj_index_uniq
    # (trajectory, step_index; covering on PostgreSQL).
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
            # Trajectory + step_index: the step order. Also serves "steps of a trajectory in order",
            # and (PostgreSQL: it covers CURATION_COLUMNS) dataset previews and admission
            # (curation/selectors/specs.py): steps aggregated per trajectory read only this
            # narrow index (an index-only scan in trajectory order), never the wide rows with
            # their token deltas. One index for both: every written row (an insert, and each
            # settle of readiness, whose columns it covers) adds one index entry, not two
            # (migration 0027: an UPDATE of 1,000 step rows 3-6% faster; bench.curation's
            # readiness a tie within its noise). Elsewhere a plain unique constraint
            # (pool/models/constraints.py).
            CoveringUniqueConstraint(
                fields=["trajectory", "step_index"], include=CURATION_COLUMNS, name="step_traj_index_uniq"
            ),
            models.UniqueConstraint(fields=["uid"], name="pool_step_uid_key"),
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
