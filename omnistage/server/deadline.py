"""How a running request ends early: ``--request-timeout`` (a 504) and the client's disconnect."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import Request

from omnistage.server.errors import APIError

logger = logging.getLogger("omnistage.server")


class Deadline:
    """Calls ``expire`` (an abort) once ``seconds`` have passed, unless cancelled first."""

    def __init__(self, seconds: float | None, expire: Any):
        self.seconds = seconds
        self.expired = False
        self._task: asyncio.Task | None = None
        self._handle = None
        if seconds:
            self._handle = asyncio.get_running_loop().call_later(seconds, self._fire, expire)

    def _fire(self, expire: Any) -> None:
        self.expired = True
        logger.warning("request exceeded --request-timeout %gs; aborting it", self.seconds)
        self._task = asyncio.get_running_loop().create_task(expire())  # referenced until it ran

    def check(self) -> None:
        if self.expired:
            raise APIError(
                504,
                f"the request did not finish within this server's --request-timeout of {self.seconds:g} s",
                code="request_timeout",
            )

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


async def wait_disconnect(request: Request) -> None:
    """Returns once the client has gone. The route has read the body, so the server's next message is the
    disconnect (waited for as an event, as ``vllm serve`` listens for it: no polling timer per running request)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
