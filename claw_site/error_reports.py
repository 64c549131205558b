"""Django error reports (the DEBUG 500 page, the mails of AdminEmailHandler) with the secrets
of gateway and capability URL paths masked (see claw_site/redaction.py)."""

from __future__ import annotations

from django.views.debug import ExceptionReporter

from .redaction import redact


class RedactingExceptionReporter(ExceptionReporter):
    """Django's reporter; its rendered text and HTML have URL-path secrets masked (the
    request URL, META such as PATH_INFO, and any traceback line that holds a path)."""

    def get_traceback_html(self) -> str:
        return redact(str(super().get_traceback_html()))

    def get_traceback_text(self) -> str:
        return redact(str(super().get_traceback_text()))
