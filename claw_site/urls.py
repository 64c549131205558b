from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from gateway.apis.stats import healthz

from .ops import metrics_view, readyz

# JSON for API and gateway paths, Django's page elsewhere.
handler404 = "claw_site.ops.not_found"
# JSON for API and gateway paths, templates/500.html elsewhere: never Django's debug page.
handler500 = "claw_site.ops.server_error"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    # Curation's first: its lineage paths (steps/<uid>/checkpoints) are matched before the
    # gateway's step and trajectory uids, which may hold a "/" (curation/api_urls.py).
    path("api/v1/", include("curation.api_urls")),
    path("api/v1/", include("gateway.urls")),
    # OpenAI-compatible gateway for black-box agents: /v1/... and /t/<traj>/<group>/v1/...
    path("", include("gateway.proxy.urls")),
    path("compat/claw-r1/", include("gateway.compat.urls")),
    path("admin/", admin.site.urls),
    path("", include("curation.urls")),
    # Browsers ask for /favicon.ico whatever the page links: the vendored icon, not a 404.
    path("favicon.ico", RedirectView.as_view(url=static("claw/favicon.ico"), permanent=True)),
]
