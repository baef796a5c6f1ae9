"""The one restart policy for stage engines that die (an mp child, a Ray actor, a vLLM engine core).

A dead engine is rebuilt at once; a rebuild that fails is retried after a
growing pause, a bounded number of times in a row, and every failure is
logged with its traceback. After the last failed attempt the replica stays
down (unhealthy on /health) rather than retrying forever in a tight loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

RESTART_ATTEMPTS = 5  # consecutive failed restarts before the replica stays down
RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0)  # pause after the n-th failed attempt


async def restart_with_backoff(
    what: str,
    rebuild: Callable[[], Awaitable[None]],
    attempts: int = RESTART_ATTEMPTS,
    backoff_s: tuple[float, ...] = RESTART_BACKOFF_S,
) -> bool:
    """Call ``rebuild`` until it returns without raising; False once ``attempts`` calls in a row failed.
    ``what`` names the engine in the log (``"stage 0 (llm) vLLM engine"``)."""
    for attempt in range(attempts):
        try:
            await rebuild()
        except Exception:  # logged with its traceback; retried after a pause
            logger.exception("%s: restart %d of %d failed", what, attempt + 1, attempts)
            await asyncio.sleep(backoff_s[min(attempt, len(backoff_s) - 1)])
            continue
        logger.warning("%s: restarted (attempt %d of %d)", what, attempt + 1, attempts)
        return True
    logger.error("%s: %d restarts in a row failed; it stays down", what, attempts)
    return False
