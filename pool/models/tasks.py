"""Tasks: what prompt groups roll out, their statistics, and the sampler's audit."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .access import ApiKey, Source


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
