"""The pool's counts, and the health check."""

from __future__ import annotations

from django.db import connection
from django.http import JsonResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from claw_kit.web.query import KnownQueryParams
from pool.access.auth import (
    ReadScope,
    read_sources_of,
)
from pool.replica import replica_handler
from pool.selectors.stats import pool_stats


class StatsApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        responses=OpenApiResponse(
            description="Pool counts and token economics (a restricted key's: its sources' rows only)"
        )
    )
    @replica_handler
    def get(self, request):
        return Response(pool_stats(read_sources_of(request)))


def healthz(request):
    """Liveness + database reachability. Unauthenticated by design: it reveals nothing."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return JsonResponse({"status": "ok"})
    except Exception:  # noqa: BLE001 - any DB failure means unhealthy
        return JsonResponse({"status": "error", "db": "unreachable"}, status=503)
