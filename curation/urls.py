from django.urls import path

from .views import access, collection, consumption, curation, media, optimization, review, tasks

app_name = "curation"

urlpatterns = [
    path("", collection.home, name="home"),
    path("login/", access.login, name="login"),
    path("logout/", access.logout, name="logout"),
    path("collection/", collection.collection, name="collection"),
    path("steps/", collection.steps, name="steps"),
    path("steps/<int:step_id>/", collection.step, name="step"),
    path("optimization/", optimization.optimization, name="optimization"),
    # <path:>: a group uid is any string, slashes included.
    path("optimization/groups/<path:uid>/", optimization.group_tree, name="group_tree"),
    path("consumption/", consumption.consumption, name="consumption"),
    path("consumption/leases/<uuid:lease_id>/batch", consumption.lease_batch, name="lease_batch"),
    path("consumption/snapshots/<uuid:snapshot_id>/diff", consumption.snapshot_diff, name="snapshot_diff"),
    path("runs/", consumption.runs, name="runs"),
    path("runs/<str:uid>/", consumption.run, name="run"),
    path("runs/<str:uid>/checkpoints/<int:version>/", consumption.checkpoint, name="checkpoint"),
    path(
        "runs/<str:uid>/checkpoints/<int:version>/steps.txt",
        consumption.checkpoint_step_uids,
        name="checkpoint_steps",
    ),
    path("trajectories/", collection.trajectories, name="trajectories"),
    # <path:>: a trajectory uid is any string, slashes included.
    path("trajectories/<path:uid>/", collection.trajectory, name="trajectory"),
    path("steps/<int:step_id>/tokens", collection.step_tokens, name="step_tokens"),
    path("curation/", curation.curation, name="curation"),
    path("curation/preview", curation.curation_preview, name="curation_preview"),
    path("curation/datasets/<str:name>/", curation.dataset, name="dataset"),
    path("curation/datasets/<str:name>/diff", consumption.dataset_diff, name="dataset_diff"),
    path("review/", review.review, name="review"),
    path("review/queues/", review.review_queues, name="review_queues"),
    path("review/<str:queue>/", review.review, name="review_queue"),
    # Images (issue 24): a stored image's thumbnail and the image itself, for signed-in users.
    path("images/<str:sha256>/thumb", media.media_thumb, name="media_thumb"),
    path("images/<str:sha256>/", media.media_full, name="media_full"),
    path("tasks/", tasks.tasks, name="tasks"),
]
