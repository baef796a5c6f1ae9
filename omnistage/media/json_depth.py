"""JSON nested too deep, found before parsing: the stdlib parser would raise ``RecursionError`` on a
100 000-deep body, and anything a little shallower would still blow the stack later, in ``deepcopy``."""

from __future__ import annotations

import re
from typing import Any

from omnistage.errors import bad_request

MAX_JSON_DEPTH = 64

_SPECIAL = re.compile(rb'["\[\]{}]')
_COLON = re.compile(rb"\s*:")


def _string_end(raw: bytes, start: int) -> int:
    """The index of the quote closing the JSON string opened at ``start`` (-1: unterminated). Jumps from quote
    to quote (memchr speed over a base64 payload), skipping those escaped by an odd run of backslashes."""
    end = start + 1
    while True:
        end = raw.find(b'"', end)
        if end < 0:
            return -1
        k = end - 1
        while raw[k] == 0x5C:  # backslash
            k -= 1
        if (end - 1 - k) % 2 == 0:
            return end
        end += 1


def json_too_deep(body: bytes | str, limit: int = MAX_JSON_DEPTH) -> str | None:
    """``None`` when ``body`` nests at most ``limit`` arrays/objects deep; else the top-level key under which
    it goes deeper (``""`` when it is not under one). Scans brackets and strings, without parsing."""
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    if raw.count(b"[") + raw.count(b"{") <= limit:  # the common case, at C speed
        return None
    depth, key, top_object, pos = 0, "", False, 0
    while (m := _SPECIAL.search(raw, pos)) is not None:
        at, tok = m.start(), raw[m.start()]
        pos = at + 1
        if tok == 0x22:  # a string
            end = _string_end(raw, at)
            if end < 0:
                return None  # unterminated: the parser's error to report
            if depth == 1 and top_object and _COLON.match(raw, end + 1):
                key = raw[at + 1 : end].decode("utf-8", "replace")
            pos = end + 1
        elif tok in (0x5B, 0x7B):  # [ {
            top_object = top_object or (depth == 0 and tok == 0x7B)
            depth += 1
            if depth > limit:
                return key
        else:
            depth -= 1
    return None


def check_json_depth(body: bytes | str, limit: int = MAX_JSON_DEPTH, where: str = "request body") -> None:
    key = json_too_deep(body, limit)
    if key is not None:
        field = key or None
        raise bad_request(f"{key or where}: JSON nested more than {limit} levels deep", field, code="json_too_deep")


def loads(text: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` of a JSON string a client sent inside a form field, depth-checked first."""
    import json

    if json_too_deep(text, limit) is not None:
        raise ValueError(f"JSON nested more than {limit} levels deep")
    return json.loads(text)
