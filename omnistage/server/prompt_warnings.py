"""The warnings about what a model cannot draw (omnistage/drawable.py), as the routes send them: one
``X-Omnistage-Warning`` header per warning (ASCII) and, where the response body has room, a ``warnings`` list
(docs/server.md).
"""

from __future__ import annotations

import re

from omnistage.drawable import drawn_size, prompt_warnings

__all__ = ["HEADER", "drawn_size", "prompt_warnings", "warning_headers"]  # the routes' one import

HEADER = "X-Omnistage-Warning"


def warning_headers(warnings: list[str]) -> list[tuple[str, str]]:
    """``(name, value)`` header pairs: HTTP header values are printable ASCII here, so other characters (and
    control characters, e.g. from a key name the caller sent) are escaped."""
    return [(HEADER, _CONTROL.sub(_escape, w.encode("ascii", "backslashreplace").decode("ascii"))) for w in warnings]


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _escape(m: re.Match) -> str:
    return f"\\x{ord(m.group()):02x}"
