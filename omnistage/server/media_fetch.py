"""Fetching the bytes of a media input a client names: ``data:`` URLs, base64,
``http(s)://`` downloads and ``file://`` paths, each bounded before it can
cost the server much.

- http(s): an overall deadline (not just per read, so a server dripping one
  byte a second is cut off), a byte cap enforced while streaming (and at once
  from ``Content-Length``), an optional host allowlist
  (``--allowed-media-domains``, vLLM's flag: exact host names), and redirects
  followed by hand so every hop is checked again (scheme and host);
- ``file://``: only with ``--allowed-local-media-path``; the path is resolved
  (symlinks, ``..``) and must stay inside that folder; regular files only;
- everything: the decoded size is capped.

``fetch_media`` also returns the MIME type the source declares (a ``data:`` URL's, an http(s) response's
``Content-Type``), which the decoders in media/decode.py check against the kind of media the field takes.

Problems with the URL are 400s naming the field; oversized inputs 413s.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlparse

from omnistage.errors import APIError, bad_request
from omnistage.media.limits import MediaLimits

MAX_REDIRECTS = 3
_REDIRECTS = {301, 302, 303, 307, 308}


@dataclass(frozen=True)
class Fetched:
    data: bytes
    mime: str | None  # as declared by a data: URL or an http(s) response; None: nothing was declared


def data_url_mime(url: Any) -> str | None:
    """The MIME type a ``data:`` URL declares (None for other URLs)."""
    if isinstance(url, str) and url[:5].lower() == "data:":
        return url[5:].split(",", 1)[0].split(";", 1)[0]
    return None


def too_large(field: str, size: int, limit: int) -> APIError:
    return APIError(
        413, f"{field}: {size} bytes exceeds the limit of {limit} bytes", param=field, code="payload_too_large"
    )


def decode_data_url(url: str, field: str, limits: MediaLimits) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.startswith("data:"):
        raise bad_request(f"{field}: malformed data: URL (expected data:<mime>;base64,<payload>)", field)
    if len(payload) * 3 // 4 > limits.max_bytes:
        raise too_large(field, len(payload) * 3 // 4, limits.max_bytes)
    if header.endswith(";base64"):
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"{field}: data: URL payload is not valid base64", field) from None
    return unquote(payload).encode("latin-1", errors="replace")


def decode_base64(data: str, field: str, limits: MediaLimits) -> bytes:
    if not isinstance(data, str):
        raise bad_request(f"{field}: expected a base64 string", field)
    if data.startswith("data:"):
        return decode_data_url(data, field, limits)
    if len(data) * 3 // 4 > limits.max_bytes:
        raise too_large(field, len(data) * 3 // 4, limits.max_bytes)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{field}: not valid base64", field) from None


def local_path(url: str, field: str, limits: MediaLimits) -> Path:
    """``file://`` URLs resolve (symlinks and ``..`` included) strictly inside the allowed folder."""
    root = limits.allowed_local_media_path
    if root is None:
        raise bad_request(
            f"{field}: file:// URLs are disabled (start the server with --allowed-local-media-path)",
            field,
            code="local_media_not_allowed",
        )
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise bad_request(
            f"{field}: file:// URL with a remote host is not allowed", field, code="local_media_not_allowed"
        )
    path = Path(unquote(parsed.path)).resolve()
    if not path.is_relative_to(Path(root).resolve()):
        # the resolved path is not echoed: it would tell the caller where a symlink points
        raise bad_request(
            f"{field}: the file is outside the allowed local media path", field, code="local_media_not_allowed"
        )
    if not path.is_file():
        raise bad_request(f"{field}: no such file under the allowed local media path", field)
    return path


def _read_capped(path: Path, field: str, limit: int) -> bytes:
    with path.open("rb") as f:  # read at most limit + 1 bytes: the size may change after any stat
        data = f.read(limit + 1)
    if len(data) > limit:
        raise too_large(field, len(data), limit)
    return data


async def fetch_media(url: Any, field: str, limits: MediaLimits) -> Fetched:
    if not isinstance(url, str) or not url:
        raise bad_request(f"{field}: expected a URL string", field)
    scheme = urlparse(url).scheme.lower()
    if scheme == "data":
        return Fetched(decode_data_url(url, field, limits), data_url_mime(url))
    if scheme == "file":
        path = local_path(url, field, limits)
        return Fetched(await asyncio.to_thread(_read_capped, path, field, limits.max_bytes), None)
    if scheme in ("http", "https"):
        return await download(url, field, limits)
    raise bad_request(
        f"{field}: unsupported URL scheme {scheme or '(none)'!r}; use data:, http(s):// or file://", field
    )


async def fetch_bytes(url: Any, field: str, limits: MediaLimits) -> bytes:
    return (await fetch_media(url, field, limits)).data


def check_remote_url(url: str, field: str, limits: MediaLimits) -> None:
    """A URL the server may fetch: http(s), and a host on the allowlist when there is one."""
    parsed = urlparse(url)
    if parsed.scheme.lower() not in ("http", "https"):
        raise bad_request(
            f"{field}: refusing to fetch a {parsed.scheme or '(no scheme)'} URL", field, code="media_url_not_allowed"
        )
    host = (parsed.hostname or "").lower()
    if not host:
        raise bad_request(f"{field}: the URL has no host", field)
    allowed = limits.allowed_media_domains
    if allowed is not None and host not in allowed:
        raise bad_request(
            f"{field}: host {host!r} is not in this server's --allowed-media-domains",
            field,
            code="media_url_not_allowed",
        )


async def download(url: str, field: str, limits: MediaLimits) -> Fetched:
    """GET ``url`` within ``limits.fetch_timeout_s`` in all, at most ``limits.max_download_bytes``."""
    try:
        async with asyncio.timeout(limits.fetch_timeout_s):
            return await _download(url, field, limits)
    except TimeoutError:
        raise bad_request(
            f"{field}: fetching the URL took longer than {limits.fetch_timeout_s:g} s",
            field,
            code="media_fetch_timeout",
        ) from None


async def _download(url: str, field: str, limits: MediaLimits) -> Fetched:
    import httpx

    cap = limits.max_download_bytes
    async with httpx.AsyncClient(timeout=limits.fetch_timeout_s, follow_redirects=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            check_remote_url(url, field, limits)
            try:
                async with client.stream("GET", url) as resp:
                    if resp.status_code in _REDIRECTS and "location" in resp.headers:
                        url = urljoin(url, resp.headers["location"])  # checked again at the top of the loop
                        continue
                    if resp.status_code != 200:
                        raise bad_request(f"{field}: fetching the URL answered HTTP {resp.status_code}", field)
                    declared = resp.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > cap:
                        raise too_large(field, int(declared), cap)
                    buf = bytearray()
                    async for chunk in resp.aiter_bytes():
                        buf += chunk
                        if len(buf) > cap:
                            raise too_large(field, len(buf), cap)
                    return Fetched(bytes(buf), resp.headers.get("content-type"))
            except httpx.HTTPError as e:
                raise bad_request(f"{field}: fetching the URL failed: {type(e).__name__}", field) from None
    raise bad_request(f"{field}: more than {MAX_REDIRECTS} redirects", field)
