"""media_fetch.py against a real local HTTP origin: the domain allowlist (every redirect hop re-checked),
the overall download deadline (a server that drips bytes forever is cut off), the byte cap (streamed or
declared), and ``file://`` paths kept inside --allowed-local-media-path after resolving symlinks and
``..``. Then the same rules through a route: 4xx naming the field, and the stage never runs."""

from __future__ import annotations

import asyncio
import io
import os

import pytest
from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from omnistage.server.errors import APIError
from omnistage.server.media import MediaLimits, fetch_bytes, fetch_media, load_image
from omnistage.testing.server import serve_app
from tests.server.conftest import error_of, new_engine
from tests.server.pipelines import image_pipeline


def png(size=(8, 6)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 40)).save(buf, format="PNG")
    return buf.getvalue()


async def _img(request: Request) -> Response:
    return Response(png(), media_type="image/png")


async def _drip(request: Request) -> Response:
    async def forever():
        while True:  # one byte every 0.2 s, never ending: only an overall deadline stops it
            yield b"x"
            await asyncio.sleep(0.2)

    return StreamingResponse(forever(), media_type="image/png")


async def _flood(request: Request) -> Response:
    async def forever():
        while True:  # no Content-Length, no end: only a cap counted while streaming stops it
            yield b"\0" * 65536
            await asyncio.sleep(0)

    return StreamingResponse(forever(), media_type="image/png")


async def _declared(request: Request) -> Response:
    return Response(b"\0" * 300_000, media_type="image/png")  # Content-Length: 300000


async def _redirect(request: Request) -> Response:
    return RedirectResponse(request.query_params["to"], status_code=302)


async def _png_as_text(request: Request) -> Response:
    return Response(png(), media_type="text/plain")


async def _missing(request: Request) -> Response:
    return Response(b"gone", status_code=404)


@pytest.fixture(scope="module")
def origin():
    app = Starlette(
        routes=[
            Route("/img.png", _img),
            Route("/drip", _drip),
            Route("/flood", _flood),
            Route("/declared", _declared),
            Route("/redirect", _redirect),
            Route("/missing", _missing),
            Route("/png-as-text", _png_as_text),
        ]
    )
    with serve_app(app) as srv:
        yield srv.url  # http://127.0.0.1:PORT


def other_host(url: str) -> str:
    """The same origin under another host name (localhost), for the allowlist."""
    return url.replace("127.0.0.1", "localhost")


LIMITS = dict(max_download_bytes=100_000, fetch_timeout_s=1.5)


async def fetch_error(url: str, **limits) -> APIError:
    with pytest.raises(APIError) as e:
        await fetch_bytes(url, "image_url", MediaLimits(**{**LIMITS, **limits}))
    assert e.value.param == "image_url"
    return e.value


async def test_allowlist_admits_listed_hosts_only(origin):
    limits = MediaLimits(**LIMITS, allowed_media_domains=frozenset({"127.0.0.1"}))
    assert await fetch_bytes(f"{origin}/img.png", "image_url", limits) == png()
    err = await fetch_error(f"{other_host(origin)}/img.png", allowed_media_domains=frozenset({"127.0.0.1"}))
    assert err.status == 400 and err.code == "media_url_not_allowed" and "localhost" in err.message


async def test_the_declared_type_comes_with_the_bytes_and_is_checked_when_decoding(origin):
    limits = MediaLimits(**LIMITS)
    got = await fetch_media(f"{origin}/img.png", "image_url", limits)  # the response's Content-Type
    assert (got.data, got.mime) == (png(), "image/png")
    got = await fetch_media(f"{origin}/redirect?to=/png-as-text", "image_url", limits)  # the last hop's
    assert got.mime.startswith("text/plain")
    with pytest.raises(APIError) as e:  # a PNG served as text is refused by the decode-limits module's MIME check
        await load_image(f"{origin}/redirect?to=/png-as-text", "image_url", limits)
    assert (e.value.status, e.value.param, e.value.code) == (415, "image_url", "unsupported_media_type")


async def test_every_redirect_hop_is_checked_again(origin):
    to_other = f"{origin}/redirect?to={other_host(origin)}/img.png"
    assert await fetch_bytes(to_other, "image_url", MediaLimits(**LIMITS)) == png()  # no allowlist: followed
    err = await fetch_error(to_other, allowed_media_domains=frozenset({"127.0.0.1"}))
    assert err.code == "media_url_not_allowed"
    err = await fetch_error(f"{origin}/redirect?to=file:///etc/passwd")  # never from http to the file system
    assert err.code == "media_url_not_allowed"
    loop = f"{origin}/redirect?to=/redirect?to=/redirect?to=/redirect?to=/img.png"
    assert "redirects" in (await fetch_error(loop)).message


async def test_a_dripping_server_is_cut_off_at_the_deadline(origin):
    err = await fetch_error(f"{origin}/drip")  # (the origin never ends this response: returning at all is the test)
    assert err.status == 400 and err.code == "media_fetch_timeout"


async def test_downloads_are_capped_while_streaming_and_by_declared_length(origin):
    err = await fetch_error(f"{origin}/flood")
    assert err.status == 413 and "100000" in err.message
    err = await fetch_error(f"{origin}/declared")
    assert err.status == 413 and "300000" in err.message


async def test_error_statuses_and_unreachable_hosts_are_400(origin):
    assert (await fetch_error(f"{origin}/missing")).status == 400
    assert (await fetch_error("http://127.0.0.1:9/x.png")).status == 400  # nothing listens on port 9


async def test_file_urls_stay_inside_the_allowed_folder(tmp_path):
    root, outside = tmp_path / "media", tmp_path / "secret"
    root.mkdir()
    outside.mkdir()
    (root / "ok.png").write_bytes(png())
    (outside / "s.png").write_bytes(png((3, 3)))
    os.symlink(outside / "s.png", root / "escape.png")  # a link inside the folder to a file outside it
    os.symlink(root / "ok.png", root / "alias.png")  # a link that stays inside
    limits = MediaLimits(allowed_local_media_path=root)
    assert (await load_image(f"file://{root}/alias.png", "image_url", limits)).size == (8, 6)
    for url in (f"file://{root}/escape.png", f"file://{root}/../secret/s.png", f"file://{root}/%2E%2E/secret/s.png"):
        with pytest.raises(APIError) as e:
            await fetch_bytes(url, "image_url", limits)
        assert e.value.status == 400 and e.value.code == "local_media_not_allowed", url
        assert str(outside) not in e.value.message  # where a link points is not told
    with pytest.raises(APIError) as e:
        await fetch_bytes(
            f"file://{root}/ok.png", "image_url", MediaLimits(allowed_local_media_path=root, max_bytes=10)
        )
    assert e.value.status == 413


def test_route_refuses_bad_media_before_the_stage_runs(server_factory, origin):
    srv = server_factory(
        new_engine(image_pipeline()),
        allowed_media_domains=["127.0.0.1"],
        max_download_bytes=100_000,
        media_fetch_timeout_s=1.5,
    )
    c = srv.client()

    def edit(url: str):
        return c.post("/v1/images/edits", json={"prompt": "crash: would fail in the stage", "image_url": url})

    for url, status in ((f"{other_host(origin)}/img.png", 400), (f"{origin}/drip", 400), (f"{origin}/flood", 413)):
        r = edit(url)
        assert r.status_code == status and error_of(r)["param"] == "image_url", r.text
    r = c.post("/v1/images/edits", json={"prompt": "fine", "image_url": f"{origin}/img.png", "size": "16x16"})
    assert r.status_code == 200, r.text
