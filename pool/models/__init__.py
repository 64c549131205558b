"""The pool's models, one module per topic; Django loads them from here (``pool.models``), and
the house imports them from here too:

* ``access``: sources (tenants), API keys and their scopes;
* ``policy``: policies and their versions;
* ``steps``: prompt groups, trajectories, steps (token storage as prefix deltas), merges and
  trajectory capabilities;
* ``rewards``: reward audit, reward functions, failed computations;
* ``service_events``: black-box services' events and feedback;
* ``operations``: the task outbox, the audit log, idempotent calls, upstream texts, the
  pool's counters;
* ``media``: images stored once by content, and who holds them;
* ``tasks``: tasks, their statistics and the sampler's audit.
"""

from .access import ApiKey, Scope, Source
from .media import Media, MediaSource, StepMedia
from .operations import AuditEvent, Counter, GenerationText, IdempotentCall, OutboxTask
from .policy import Policy, PolicyOwner, PolicyVersion
from .rewards import RewardEvent, RewardFailure, RewardFunction
from .service_events import Event, Feedback
from .steps import Channel, MergeResult, PromptGroup, Step, Trajectory, TrajectoryCapability
from .tasks import Task, TaskSampleRecord, TaskSet

__all__ = [
    "ApiKey",
    "AuditEvent",
    "Channel",
    "Counter",
    "Event",
    "Feedback",
    "GenerationText",
    "IdempotentCall",
    "Media",
    "MediaSource",
    "MergeResult",
    "OutboxTask",
    "Policy",
    "PolicyOwner",
    "PolicyVersion",
    "PromptGroup",
    "RewardEvent",
    "RewardFailure",
    "RewardFunction",
    "Scope",
    "Source",
    "Step",
    "StepMedia",
    "Task",
    "TaskSampleRecord",
    "TaskSet",
    "Trajectory",
    "TrajectoryCapability",
]
