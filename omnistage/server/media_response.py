"""A stored file as an HTTP answer, honouring ``Range: bytes=...`` (a video player seeks with it), from any media
store: only the bytes asked for are read."""

from __future__ import annotations

import re

from fastapi import Request
from fastapi.responses import Response

from omnistage.server.errors import APIError
from omnistage.server.storage import MediaStore

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``[start, end)`` of a single-range header, None for the whole file (no header, or one this answer
    ignores as RFC 9110 allows: several ranges, another unit); 416 for a range past the end."""
    if not header:
        return None
    m = _RANGE.match(header.strip())
    if m is None or m.group(0) == "bytes=-":
        return None
    first, last = m.groups()
    if first == "":  # the last N bytes
        start, end = max(0, size - int(last)), size
    else:
        start = int(first)
        end = size if last == "" else min(size, int(last) + 1)
    if start >= size or start >= end:
        raise APIError(
            416,
            f"range {header!r} is outside the file ({size} bytes)",
            code="range_not_satisfiable",
            headers={"Content-Range": f"bytes */{size}"},
        )
    return start, end


async def stored_file(request: Request, store: MediaStore, name: str, size: int, media_type: str) -> Response:
    """The file (200), or the range asked for (206 with ``Content-Range``)."""
    headers = {"Accept-Ranges": "bytes", "Content-Disposition": f'attachment; filename="{name}"'}
    span = byte_range(request.headers.get("range"), size)
    if span is None:
        return Response(await store.read(name), media_type=media_type, headers=headers)
    start, end = span
    headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    return Response(await store.read(name, start, end), status_code=206, media_type=media_type, headers=headers)
