"""The live dashboard's event types: what the websocket (curation/consumers.py) delivers.

Each event is ``{"kind": <Literal>, "data": <payload>}``, as it appears in a ``live.batch``
message (pool/live.py coalesces events of one kind per tick). Events are built and
published only by the effects registered for the pool's writes (pool/live.py,
curation/events.py), never by a service.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict


class TrajectoryItem(TypedDict):
    """A trajectory of ``steps`` and ``trajectories.completed``. ``group``: its prompt
    group's uid, named by the flusher (the builder leaves the id under live.GROUP_ID)."""

    uid: str
    source: str
    channel: str
    status: str
    step_count: int
    group: NotRequired[str | None]


class StepItem(TypedDict):
    id: int
    uid: str
    trajectory: str
    step_index: int
    source: str
    token_source: str
    drift: bool
    prompt_len: int
    response_len: int


class StepsData(TypedDict):
    count: int
    by_source: dict[str, int]
    drift: int
    trajectories: list[TrajectoryItem]
    recent: list[StepItem]


class CompletedData(TypedDict):
    count: int
    items: list[TrajectoryItem]


class CountData(TypedDict):
    count: int


class ReadinessData(TypedDict):
    ready_steps: int
    ready_groups: int


class MergeItem(TypedDict):
    group: str
    group_id: int
    tokens: int
    tokens_saved: int


class MergeData(TypedDict):
    items: list[MergeItem]


class SnapshotData(TypedDict):
    id: str
    status: str
    progress: float
    steps: int


class LeaseItem(TypedDict):
    id: str
    consumer: str
    dataset: str
    status: str
    steps: int


class LeaseData(TypedDict):
    taken: int
    acked: int
    items: list[LeaseItem]


class RateData(TypedDict):
    steps_per_s: float


class StepsEvent(TypedDict):
    kind: Literal["steps"]
    data: StepsData


class CompletedEvent(TypedDict):
    kind: Literal["trajectories.completed"]
    data: CompletedData


class RewardsEvent(TypedDict):
    kind: Literal["rewards"]
    data: CountData


class FeedbackEvent(TypedDict):
    kind: Literal["feedback"]
    data: CountData


class ReadinessEvent(TypedDict):
    kind: Literal["readiness"]
    data: ReadinessData


class MergeEvent(TypedDict):
    kind: Literal["merge"]
    data: MergeData


class SnapshotEvent(TypedDict):
    kind: Literal["snapshot"]
    data: SnapshotData


class LeaseEvent(TypedDict):
    kind: Literal["lease"]
    data: LeaseData


class RateEvent(TypedDict):
    kind: Literal["rate"]
    data: RateData


LiveEvent = (
    StepsEvent
    | CompletedEvent
    | RewardsEvent
    | FeedbackEvent
    | ReadinessEvent
    | MergeEvent
    | SnapshotEvent
    | LeaseEvent
    | RateEvent
)
