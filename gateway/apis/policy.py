"""Policy versions: published by trainers, listed for readers."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, generics, serializers
from rest_framework.response import Response

from claw_kit.web.query import KnownQueryParams
from pool.access.auth import (
    PolicyWriteScope,
    principal_has_scope,
    source_id_of,
    user_id_of,
    write_sources_of,
)
from pool.models import Scope
from pool.selectors.policy import policy_version_render, policy_versions_list, policy_versions_listed
from pool.services.policy import policy_version_set

from .. import serializers as s
from .common import _methods_scope


class PolicyVersionApi(KnownQueryParams, generics.GenericAPIView):
    pagination_class = None

    def get_queryset(self):
        return policy_versions_listed()

    def get_permissions(self):
        return _methods_scope(self.request, write=PolicyWriteScope)

    @extend_schema(
        request=s.PolicyVersionSerializer,
        responses=inline_serializer(
            "PolicyVersionOut",
            {
                "version": serializers.IntegerField(),
                "is_current": serializers.BooleanField(),
                "policy": serializers.CharField(),
                "checkpoint": serializers.DictField(
                    required=False,
                    help_text='with "run": the checkpoint recorded (run, version, leases taken)',
                ),
            },
        ),
    )
    def post(self, request):
        ser = s.PolicyVersionSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        d = ser.validated_data
        if d["force"] and not principal_has_scope(request.user, Scope.ADMIN):
            raise exceptions.PermissionDenied(
                {"force": "\"force\" is for admins: this API key lacks the 'admin' scope"}
            )
        if user_id_of(request) is not None:
            actor, details = f"user:{request.user.get_username()}", {}
        else:
            key = request.user.key
            actor, details = f"key:{key.source_name}", {"key_id": key.key_id, "source": key.source_name}
        pv = policy_version_set(
            version=d["version"],
            current=d["current"],
            metadata=d.get("metadata"),
            force=d["force"],
            actor=actor,
            details=details,
            policy=d["policy"],
            source_id=source_id_of(request),
            sources=write_sources_of(request),
            run=d.get("run"),
        )
        # is_current: whether it is now the named policy's current version; ``policy`` is
        # answered for a named one only (the default's answer is as it always was).
        named = {} if pv.policy == "default" else {"policy": pv.policy, "is_current": pv.policy_current}
        # With "run": the checkpoint it recorded (curation/services/lineage.py).
        checkpoint = {} if pv.checkpoint is None else {"checkpoint": pv.checkpoint}
        return Response({**policy_version_render(pv), **named, **checkpoint})

    @extend_schema(
        responses=s.PolicyVersionReadSerializer(many=True), summary="Policy versions, newest first"
    )
    def get(self, request):
        return Response([policy_version_render(p) for p in policy_versions_list()])
