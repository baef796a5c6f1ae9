"""Reading and driving the playground page (GET /) in a selenium driver: the helpers of test_playground.py."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from tests.e2e.browser import wait_for


def open_page(driver, url: str, model: str, tab: str):
    """Load the playground (``url`` is the server, or the page with a query), wait for the model card, and check
    which tab it opened on."""
    driver.get(url if "?" in url else url + "/")
    assert "playground" in driver.title
    wait_for(driver, 30, lambda d: model in d.find_element("id", "model-name").text, "the model card")
    active = driver.find_elements("css selector", ".tab.active")
    assert [t.get_attribute("id") for t in active] == [tab]


def visible_tabs(driver) -> list[str]:
    return [t.get_attribute("id") for t in driver.find_elements("css selector", ".tab") if t.is_displayed()]


def fill(driver, element_id: str, text: str) -> None:
    el = driver.find_element("id", element_id)
    driver.execute_script("const d = arguments[0].closest('details'); if (d) d.open = true;", el)  # "More parameters"
    el.clear()
    if text:
        el.send_keys(text)


def metrics_rows(driver) -> dict[str, dict[str, str]]:
    """The stage metrics table: stage id -> column -> cell text."""
    heads = [th.text for th in driver.find_elements("css selector", "#metrics thead th")]
    rows = {}
    for tr in driver.find_elements("css selector", "#metrics-rows tr"):
        cells = [td.text for td in tr.find_elements("tag name", "td")]
        rows[cells[0].split()[0]] = dict(zip(heads, cells))
    return rows


def element_bytes(driver, element) -> bytes:
    """What an element's src (a data: or blob: URL) holds, read inside the page."""
    b64 = driver.execute_async_script(
        """
        const [el, done] = arguments;
        fetch(el.src).then((r) => r.arrayBuffer()).then((buf) => {
          const u = new Uint8Array(buf); let s = "";
          for (let i = 0; i < u.length; i += 0x8000) s += String.fromCharCode(...u.subarray(i, i + 0x8000));
          done(btoa(s));
        }).catch((e) => done("ERROR " + e));""",
        element,
    )
    assert not b64.startswith("ERROR"), b64
    return base64.b64decode(b64)


def png(color: tuple[int, int, int], size=(64, 64)) -> bytes:
    buf = io.BytesIO()
    im = Image.new("RGB", size, (235, 235, 235))
    im.paste(Image.new("RGB", (size[0] // 2, size[1] // 2), color), (size[0] // 4, size[1] // 4))
    im.save(buf, format="PNG")
    return buf.getvalue()


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def data_url_bytes(url: str) -> bytes:
    assert url.startswith("data:image/png;base64,"), url[:40]
    return base64.b64decode(url.split(",", 1)[1])


def no_error(driver) -> None:
    box = driver.find_element("id", "error")
    assert not box.is_displayed(), box.text
