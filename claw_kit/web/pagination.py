"""Keyset (cursor) pagination on the primary key: stable under inserts, O(page) per page."""

from rest_framework.pagination import CursorPagination


class IdCursorPagination(CursorPagination):
    ordering = "id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000
