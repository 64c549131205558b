from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from .apis import groups, media, policy, rewards, service_events, stats, steps, tasks, trajectories

app_name = "api"

urlpatterns = [
    path("steps", steps.StepListCreateApi.as_view(), name="steps"),
    re_path(r"^steps/(?P<uid>.+)$", steps.StepDetailApi.as_view(), name="step-detail"),
    path("trajectories", trajectories.TrajectoryListCreateApi.as_view(), name="trajectories"),
    path(
        "trajectory-completions",
        trajectories.TrajectoryCompletionsApi.as_view(),
        name="trajectory-completions",
    ),
    re_path(
        r"^trajectories/(?P<uid>.+)/complete$",
        trajectories.TrajectoryCompleteApi.as_view(),
        name="trajectory-complete",
    ),
    re_path(
        r"^trajectories/(?P<uid>.+)$", trajectories.TrajectoryDetailApi.as_view(), name="trajectory-detail"
    ),
    path("groups", groups.GroupListCreateApi.as_view(), name="groups"),
    re_path(
        r"^groups/(?P<uid>[^/]+)/prefix-tree$", groups.GroupPrefixTreeApi.as_view(), name="group-prefix-tree"
    ),
    re_path(r"^groups/(?P<uid>[^/]+)$", groups.GroupDetailApi.as_view(), name="group-detail"),
    path("rewards", rewards.RewardApi.as_view(), name="rewards"),
    path("events", service_events.EventApi.as_view(), name="events"),
    path("feedback", service_events.FeedbackApi.as_view(), name="feedback"),
    path("policy-versions", policy.PolicyVersionApi.as_view(), name="policy-versions"),
    path("stats", stats.StatsApi.as_view(), name="stats"),
    # Images (issue 24): upload (idempotent by content) and download by sha256.
    path("media", media.MediaUploadApi.as_view(), name="media"),
    re_path(r"^media/(?P<sha256>[0-9a-f]{64})$", media.MediaDetailApi.as_view(), name="media-detail"),
    path("tasks", tasks.TaskListCreateApi.as_view(), name="tasks"),
    path("task-sampler", tasks.TaskSamplerApi.as_view(), name="task-sampler"),
    path("task-sampler/records", tasks.TaskSampleRecordApi.as_view(), name="task-sampler-records"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # Split: Swagger UI's setup script is served as a file (no inline script under the CSP).
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
]
