"""Query parameters: a GET of the REST API answers to the ones its endpoint documents, and
refuses any other with a 400 naming it (a misspelt filter, ``?trajectory=`` for
``?trajectory_uid=``, would otherwise be ignored and answer every row).

What an endpoint documents is what its OpenAPI operation lists (drf-spectacular), read from
the same declarations the schema is built from, so the two cannot drift apart:

* its django-filter FilterSet's filters (``filterset_class``);
* its paginator's ``cursor`` and ``page_size`` (a paginated list view);
* the query parameters of its ``@extend_schema(parameters=[...])``;
* and DRF's ``format`` (the renderer override), which every endpoint takes.

tests/test_query_params.py walks every GET of the API's URL confs: an unknown parameter is a
400 naming it, each parameter the schema lists is not, and the schema lists exactly what is
accepted.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter
from rest_framework.generics import GenericAPIView
from rest_framework.settings import api_settings

from .errors import ClientError

CHECKED_METHODS = ("GET", "HEAD")
# Computed once per view class and method: the declarations are class attributes.
_KNOWN: dict[tuple[type, str], frozenset[str]] = {}


class UnknownQueryParameter(ClientError):
    status_code = 400
    code = "unknown_parameter"


class KnownQueryParams:
    """Mixin for the API's views (before APIView in the bases): a GET or HEAD with a query
    parameter the endpoint does not document is a 400 naming the first such (in sorted
    order), after authentication and permissions (a caller without access learns nothing
    more than its 401 or 403)."""

    def initial(self, request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        if request.method in CHECKED_METHODS:
            unknown = sorted(set(request.query_params) - known_query_params(self, "GET"))
            if unknown:
                known = sorted(known_query_params(self, "GET"))
                raise UnknownQueryParameter(
                    f"unknown query parameter {unknown[0]!r}; this endpoint takes {known}",
                    field=unknown[0],
                )


def known_query_params(view: Any, method: str) -> frozenset[str]:
    """The query parameters ``view`` (an instance, with its request) documents for
    ``method``: its filters, its paginator's, its schema's and ``format``."""
    key = (type(view), method)
    if key not in _KNOWN:
        _KNOWN[key] = frozenset(
            {api_settings.URL_FORMAT_OVERRIDE, *_filters(view), *_pagination(view), *_schema(view, method)}
            - {None}
        )
    return _KNOWN[key]


def _filters(view: Any) -> list[str]:
    filterset = getattr(view, "filterset_class", None)
    return list(filterset.base_filters) if filterset is not None else []


def _pagination(view: Any) -> list[str]:
    if not isinstance(view, GenericAPIView) or view.paginator is None:
        return []
    paginator = view.paginator
    return [
        name
        for name in (
            getattr(paginator, "cursor_query_param", None),
            getattr(paginator, "page_query_param", None),
            getattr(paginator, "page_size_query_param", None),
        )
        if name
    ]


def _schema(view: Any, method: str) -> list[str]:
    """The query parameters of the handler's ``@extend_schema``: drf-spectacular keeps the
    schema class it made in the handler's ``kwargs`` (as DRF does for actions), whose
    ``get_override_parameters()`` lists them for a view and method."""
    handler = getattr(type(view), method.lower(), None)
    schema_class = getattr(handler, "kwargs", {}).get("schema")
    if schema_class is None:
        return []
    schema = schema_class()
    schema.view = view
    schema.method = method
    schema.path = ""
    return [
        p.name
        for p in schema.get_override_parameters()
        if isinstance(p, OpenApiParameter) and p.location == OpenApiParameter.QUERY
    ]


def decimal(raw: str | None, *, max_digits: int = 18) -> int | None:
    """``raw`` as a non-negative integer when it is ASCII digits only (at most ``max_digits``),
    else None. ``str.isdigit`` is not enough: it holds for "²" and "٣", which ``int`` refuses
    (a 500), and for a 5,000-digit number, which ``int`` refuses past its digit limit."""
    if raw is None or not (0 < len(raw) <= max_digits) or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)
