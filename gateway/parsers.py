"""The step batch parsers of POST /api/v1/steps: the body decoded and validated in one pass
(gateway/validation.py), over the site's body reader (claw_kit/web/parsers.py)."""

from __future__ import annotations

from claw_kit.web.parsers import LimitedBodyParser

from .validation import parse_step_batch_json, parse_step_batch_msgpack


class StepBatchParser(LimitedBodyParser):
    """application/json -> list[StepIn], decoded and validated in one pass
    (gateway.validation.parse_step_batch_json)."""

    media_type = "application/json"

    def decode(self, data: bytes):
        return parse_step_batch_json(data)


class StepBatchMsgpackParser(LimitedBodyParser):
    """application/msgpack -> list[StepIn]; token arrays may be packed int32 bins."""

    media_type = "application/msgpack"

    def decode(self, data: bytes):
        return parse_step_batch_msgpack(data)
