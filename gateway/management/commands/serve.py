"""Serve the whole app: the ASGI server (HTTP API, gateway, pages, websockets) and, in demo
mode, the built-in demo upstream and demo traffic. `make run` calls this after migrate and
bootstrap.
"""

import os

import uvicorn
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve Claw-R1 on 127.0.0.1:$PORT (default 8000)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--workers", type=int, default=int(os.environ.get("CLAW_WORKERS", "1")))

    def handle(self, *args, host, port, workers, **options):
        self.stdout.write(f"Claw-R1 listening on http://{host}:{port}/  (API docs: /api/v1/docs/, admin: /admin/)")
        uvicorn.run(
            "claw_site.asgi:application",
            host=host,
            port=port,
            workers=workers,
            log_level=os.environ.get("CLAW_UVICORN_LOG_LEVEL", "warning"),
            lifespan="off",
        )
