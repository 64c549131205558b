"""Django error reports (the DEBUG 500 page, the mails of AdminEmailHandler) with the secrets
of gateway and capability URL paths masked (see claw_kit/redaction.py)."""

from __future__ import annotations

from django.utils.safestring import SafeString, mark_safe
from django.views.debug import ExceptionReporter

from claw_kit.redaction import redact


class RedactingExceptionReporter(ExceptionReporter):
    """Django's reporter; its rendered text and HTML have URL-path secrets masked (the
    request URL, META such as PATH_INFO, and any traceback line that holds a path). Masking
    only replaces a path segment of URL-safe characters by ``***``, so safe HTML stays safe."""

    def get_traceback_html(self) -> SafeString:
        return mark_safe(redact(super().get_traceback_html()))

    def get_traceback_text(self) -> SafeString:
        return mark_safe(redact(super().get_traceback_text()))
