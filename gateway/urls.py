from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from . import apis

app_name = "api"

urlpatterns = [
    path("steps", apis.StepListCreateApi.as_view(), name="steps"),
    re_path(r"^steps/(?P<uid>.+)$", apis.StepDetailApi.as_view(), name="step-detail"),
    path("trajectories", apis.TrajectoryListCreateApi.as_view(), name="trajectories"),
    path("trajectory-completions", apis.TrajectoryCompletionsApi.as_view(), name="trajectory-completions"),
    re_path(
        r"^trajectories/(?P<uid>.+)/complete$",
        apis.TrajectoryCompleteApi.as_view(),
        name="trajectory-complete",
    ),
    re_path(r"^trajectories/(?P<uid>.+)$", apis.TrajectoryDetailApi.as_view(), name="trajectory-detail"),
    path("groups", apis.GroupListCreateApi.as_view(), name="groups"),
    re_path(
        r"^groups/(?P<uid>[^/]+)/prefix-tree$", apis.GroupPrefixTreeApi.as_view(), name="group-prefix-tree"
    ),
    re_path(r"^groups/(?P<uid>[^/]+)$", apis.GroupDetailApi.as_view(), name="group-detail"),
    path("rewards", apis.RewardApi.as_view(), name="rewards"),
    path("events", apis.EventApi.as_view(), name="events"),
    path("feedback", apis.FeedbackApi.as_view(), name="feedback"),
    path("policy-versions", apis.PolicyVersionApi.as_view(), name="policy-versions"),
    path("stats", apis.StatsApi.as_view(), name="stats"),
    # Images (issue 24): upload (idempotent by content) and download by sha256.
    path("media", apis.MediaUploadApi.as_view(), name="media"),
    re_path(r"^media/(?P<sha256>[0-9a-f]{64})$", apis.MediaDetailApi.as_view(), name="media-detail"),
    path("tasks", apis.TaskListCreateApi.as_view(), name="tasks"),
    path("task-sampler", apis.TaskSamplerApi.as_view(), name="task-sampler"),
    path("task-sampler/records", apis.TaskSampleRecordApi.as_view(), name="task-sampler-records"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # Split: Swagger UI's setup script is served as a file (no inline script under the CSP).
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
]
