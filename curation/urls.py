from django.urls import path

from . import views

app_name = "curation"

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.login, name="login"),
    path("logout/", views.logout, name="logout"),
    path("collection/", views.collection, name="collection"),
    path("steps/", views.steps, name="steps"),
    path("steps/<int:step_id>/", views.step, name="step"),
    path("optimization/", views.optimization, name="optimization"),
    # <path:>: a group uid is any string, slashes included.
    path("optimization/groups/<path:uid>/", views.group_tree, name="group_tree"),
    path("consumption/", views.consumption, name="consumption"),
    path("consumption/leases/<uuid:lease_id>/batch", views.lease_batch, name="lease_batch"),
    path("consumption/snapshots/<uuid:snapshot_id>/diff", views.snapshot_diff, name="snapshot_diff"),
    path("runs/", views.runs, name="runs"),
    path("runs/<str:uid>/", views.run, name="run"),
    path("runs/<str:uid>/checkpoints/<int:version>/", views.checkpoint, name="checkpoint"),
    path(
        "runs/<str:uid>/checkpoints/<int:version>/steps.txt",
        views.checkpoint_step_uids,
        name="checkpoint_steps",
    ),
    path("trajectories/", views.trajectories, name="trajectories"),
    # <path:>: a trajectory uid is any string, slashes included.
    path("trajectories/<path:uid>/", views.trajectory, name="trajectory"),
    path("steps/<int:step_id>/tokens", views.step_tokens, name="step_tokens"),
    path("curation/", views.curation, name="curation"),
    path("curation/preview", views.curation_preview, name="curation_preview"),
    path("curation/datasets/<str:name>/", views.dataset, name="dataset"),
    path("curation/datasets/<str:name>/diff", views.dataset_diff, name="dataset_diff"),
    path("review/", views.review, name="review"),
    path("review/queues/", views.review_queues, name="review_queues"),
    path("review/<str:queue>/", views.review, name="review_queue"),
    # Images (issue 24): a stored image's thumbnail and the image itself, for signed-in users.
    path("images/<str:sha256>/thumb", views.media_thumb, name="media_thumb"),
    path("images/<str:sha256>/", views.media_full, name="media_full"),
    path("tasks/", views.tasks, name="tasks"),
]
