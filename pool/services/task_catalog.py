"""Tasks: bulk registration (idempotent by uid) and the task a prompt group names.

A task is what a prompt group samples (a dataset row). It belongs to a source like a group
does (pool/tenancy.py): a restricted writer registers and names its own source's tasks, and
may name the shared ones (registered by an admin key, an operator or ``manage.py
import_tasks``); an unrestricted writer registers shared tasks.

Choices (README, Tasks):

* re-registering a uid with the same content changes nothing (``unchanged``); with other
  content the task is updated (``updated``: a corrected dataset is re-imported), and its
  statistics are kept;
* a group naming an unknown task uid creates it, with no prompt, in the set ``""``
  (black-box agents name tasks by a header and need no registration step); registering it
  later fills it in.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Q

from ..bus import GroupsReady, emit
from ..errors import Conflict, InvalidInput
from ..ingest import rules
from ..models import PromptGroup, Task, TaskSampleRecord, TaskSet
from ..selectors.task_sampler import DEFAULTS, STRATEGIES, tasks_pick
from ..selectors.tasks import tasks_filtered, tasks_listed
from ..tenancy import OWN, allowed

MAX_TASKS_PER_REQUEST = 10_000
# Rows per bulk statement: 7 parameters a row stays within SQLite's parameter limit.
CHUNK = 2_000
CONTENT_FIELDS = ("set_name", "prompt", "ground_truth", "metadata")


@dataclass(slots=True)
class TaskIn:
    uid: str
    set_name: str = ""
    prompt: Any = None
    ground_truth: Any = None
    metadata: dict = field(default_factory=dict)
    field_prefix: str = ""


@dataclass(slots=True)
class RegisterResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def status_of(self) -> dict[str, str]:
        out = {u: "created" for u in self.created}
        out.update({u: "updated" for u in self.updated})
        out.update({u: "unchanged" for u in self.unchanged})
        return out


@transaction.atomic
def tasks_register(
    *, tasks: Sequence[TaskIn], source_id: int | None = None, sources: object = OWN
) -> RegisterResult:
    """Register tasks in bulk, atomically (all or none). Idempotent by uid within the
    writer's source: same content is ``unchanged``, other content ``updated`` (statistics
    kept). A uid given twice in one request is a 400 naming the second. The task sets named
    are created with their defaults (pool.models.TaskSet)."""
    owner = _owner(source_id, sources)
    seen: dict[str, int] = {}
    for i, t in enumerate(tasks):
        p = t.field_prefix
        rules.check_uid(t.uid, f"{p}uid")
        if len(t.set_name) > 128:
            raise InvalidInput("set must be at most 128 characters", field=f"{p}set")
        rules.check_json(t.prompt, f"{p}prompt")
        rules.check_json(t.ground_truth, f"{p}ground_truth")
        rules.check_json(t.metadata, f"{p}metadata")
        if t.uid in seen:
            raise InvalidInput(f"task uid {t.uid!r} is given twice", field=f"{p}uid")
        seen[t.uid] = i
    result = RegisterResult()
    if not tasks:
        return result
    task_sets_ensure({t.set_name for t in tasks})
    by_uid = {t.uid: t for t in tasks}
    uids = sorted(by_uid)
    for start in range(0, len(uids), CHUNK):
        chunk = uids[start : start + CHUNK]
        existing = _by_uid(_owned(chunk, owner).select_for_update().order_by("id"))
        missing = [u for u in chunk if u not in existing]
        if missing:
            Task.objects.bulk_create(
                [_new_task(by_uid[u], owner) for u in missing], batch_size=500, ignore_conflicts=True
            )
            # A concurrent registration may have inserted some first: those that differ are updated.
            raced = {
                u: row
                for u, row in _by_uid(_owned(missing, owner).select_for_update().order_by("id")).items()
                if _content(row) != _content_in(by_uid[u])
            }
            result.created.extend(u for u in missing if u not in raced)
            existing.update(raced)
        changed = []
        for u, row in existing.items():
            want = _content_in(by_uid[u])
            if _content(row) == want:
                result.unchanged.append(u)
                continue
            row.set_name, row.prompt, row.ground_truth, row.metadata = want
            changed.append(row)
            result.updated.append(u)
        Task.objects.bulk_update(changed, list(CONTENT_FIELDS), batch_size=500)
    return result


def task_resolve(
    *, uid: str, source_id: int | None = None, sources: object = OWN, field: str = "task"
) -> Task:
    """The task a group names: the writer's own source's, else a shared one, else one of the
    other sources it may write; created when none exists (no prompt, set ``""``), race-safe.
    Call inside the writer's transaction."""
    rules.check_uid(uid, field)
    mine = allowed(source_id, sources)
    owner = _owner(source_id, sources)
    found = _visible(uid, mine, owner)
    if found is not None:
        return found
    task_sets_ensure({""})
    Task.objects.bulk_create([_new_task(TaskIn(uid=uid), owner)], ignore_conflicts=True)
    found = _visible(uid, mine, owner)
    assert found is not None  # inserted here or by a concurrent writer
    return found


def group_task_set(
    *, group: PromptGroup, uid: str, source_id: int | None, sources: object, field: str
) -> None:
    """Bind ``group`` to the task ``uid`` names (task_resolve). A group bound to another task
    is a 409 naming ``field``; binding the same task again changes nothing. A group that was
    ready already is counted into the task's statistics now (``GroupsReady``: once)."""
    task = task_resolve(uid=uid, source_id=source_id, sources=sources, field=field)
    if group.task_id == task.id:
        return
    if group.task_id is not None:
        raise Conflict(f"prompt group {group.uid!r} names another task", field=field)
    if not PromptGroup.objects.filter(id=group.id, task__isnull=True).update(task_id=task.id):
        current = PromptGroup.objects.filter(id=group.id).values_list("task_id", flat=True)[0]
        if current != task.id:
            raise Conflict(f"prompt group {group.uid!r} names another task", field=field)
    group.task_id = task.id
    if group.ready_at is not None:  # ready before it named its task: counted now, once
        emit(GroupsReady(group_ids=frozenset((group.id,)), uncounted=frozenset((group.id,))))


def task_sets_ensure(names: Iterable[str]) -> None:
    """The task sets of these names exist (created with the defaults). Idempotent."""
    names = set(names)
    have = set(TaskSet.objects.filter(name__in=names).values_list("name", flat=True))
    if names - have:
        TaskSet.objects.bulk_create([TaskSet(name=n) for n in sorted(names - have)], ignore_conflicts=True)


# --- helpers ---------------------------------------------------------------------------------------
def _owner(source_id: int | None, sources: object) -> int | None:
    """The source that owns what the writer creates: its own, or none when unrestricted."""
    return source_id if allowed(source_id, sources) is not None else None


def _owned(uids: Iterable[str], owner: int | None):
    uids = list(uids)
    if owner is None:
        return Task.objects.filter(uid__in=uids, source__isnull=True)
    return Task.objects.filter(uid__in=uids, source_id=owner)


def _visible(uid: str, mine: frozenset[int] | None, owner: int | None) -> Task | None:
    """The task of ``uid`` a writer names: its own source's first, then a shared one, then
    another of its sources' (an unrestricted writer: the shared one, else the oldest)."""
    rows = Task.objects.filter(uid=uid)
    if mine is not None:
        rows = rows.filter(Q(source__isnull=True) | Q(source_id__in=sorted(mine)))
    found = sorted(rows, key=lambda t: (t.source_id != owner, t.source_id is not None, t.id))
    return found[0] if found else None


def _by_uid(rows) -> dict[str, Task]:
    return {t.uid: t for t in rows}


def _new_task(t: TaskIn, owner: int | None) -> Task:
    return Task(
        uid=t.uid,
        source_id=owner,
        set_name=t.set_name,
        prompt=t.prompt,
        ground_truth=t.ground_truth,
        metadata=t.metadata or {},
        rand_key=random.random(),  # noqa: S311 - a sampling key, not a secret
    )


def _content(row: Task) -> tuple:
    return (row.set_name, row.prompt, row.ground_truth, row.metadata)


def _content_in(t: TaskIn) -> tuple:
    return (t.set_name, t.prompt, t.ground_truth, t.metadata or {})


# --- the sampler's answers ---------------------------------------------------------------------------
MAX_SAMPLE = 1_000


@dataclass(slots=True)
class SampleResult:
    picks: list  # pool.selectors.task_sampler.Pick
    record: TaskSampleRecord


@transaction.atomic
def tasks_sample(
    *,
    n: int,
    strategy: str,
    tasks: Any = None,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    api_key_id: int | None = None,
    source_id: int | None = None,
    read_sources: Any = None,
) -> SampleResult:
    """Pick the tasks to roll out next (pool/selectors/task_sampler.py) among those the
    caller may read (``read_sources``; pool/tenancy.py) that match the filter ``tasks``, and
    record the answer (TaskSampleRecord: who asked, the parameters with the seed used, the
    uids and reasons). Not idempotent: each call is one more record. A bad parameter is a
    400 naming it."""
    if strategy not in STRATEGIES:
        raise InvalidInput(f"strategy must be one of {list(STRATEGIES)}", field="strategy")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLE:
        raise InvalidInput(f"n must be an integer from 1 to {MAX_SAMPLE}", field="n")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise InvalidInput("seed must be a non-negative integer below 2**63", field="seed")
    opts = dict(DEFAULTS)
    for name, value in (options or {}).items():
        if value is None:
            continue
        if name not in DEFAULTS:
            raise InvalidInput(f"unknown option {name!r}", field=name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise InvalidInput(f"{name} must be a number", field=name)
        lo, hi = {
            "explore_below": (0, 1e9),
            "explore_fraction": (0, 1),
            "temperature": (0, 100),
            "target": (0, 1),
        }[name]
        if not lo <= value <= hi:
            raise InvalidInput(f"{name} must be between {lo:g} and {hi:g}", field=name)
        opts[name] = int(value) if name == "explore_below" else float(value)
    if seed is None:
        seed = random.SystemRandom().randrange(2**63)
    qs = tasks_filtered(tasks_listed(read_sources), tasks)
    picks = tasks_pick(qs, n=n, strategy=strategy, seed=seed, **opts)
    record = TaskSampleRecord.objects.create(
        api_key_id=api_key_id,
        source_id=source_id,
        strategy=strategy,
        params={"n": n, "tasks": tasks, "seed": seed, **opts},
        task_uids=[p.task.uid for p in picks],
        reasons=[p.reason for p in picks],
    )
    return SampleResult(picks=picks, record=record)
