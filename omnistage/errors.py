"""Errors that cross component boundaries, typed so nobody parses messages.

``InvalidRequestError`` is the caller's fault (HTTP 400) and names the request field it is
about; engines raise it while validating, the orchestrator passes it on, and
the server maps it to OpenAI's error shape with ``param`` set to the field.
``StageFailedError`` is a stage failing one request (HTTP 500 for that request
only); ``StageUnavailableError`` a stage that cannot take requests right now
(its process died and is being restarted: HTTP 503).
"""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """The caller sent something invalid; ``field`` names it (``None`` when no single field is at fault)."""

    def __init__(self, field: str | None, message: str, context: str = ""):
        super().__init__(field, message, context)
        self.field = field
        self.message = message
        self.context = context  # where it happened, e.g. "stage 1 (dit): "

    def __str__(self) -> str:
        return self.context + (f"{self.field}: {self.message}" if self.field else self.message)

    def within(self, context: str) -> InvalidRequestError:
        return InvalidRequestError(self.field, self.message, context + self.context)


class StageFailedError(RuntimeError):
    """A stage failed this request (other requests are unaffected)."""


class StageUnavailableError(StageFailedError):
    """The stage cannot serve requests right now (e.g. its process died and is restarting)."""
