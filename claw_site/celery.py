"""The Celery application.

With REDIS_URL set, tasks go to a real broker and run on `celery -A claw_site worker`.
Without it (the embedded default) tasks run in-process when they are enqueued; see
settings.base, section "Tasks".
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "claw_site.settings.local")

app = Celery("claw_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
