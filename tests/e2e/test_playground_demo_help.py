"""The playground on the demo server helps a newcomer, in headless Chromium: the page is titled with
the model's name, lists the demo's example prompts (a click puts one in the prompt box) and its words, offers the
sizes the card lists (the native one chosen), shows the server's warnings about words and sizes the demo cannot
draw, drops the token column for a model with no llm stage, prefills the chat box with a prompt the model can
draw, and clears the metrics panel when a request fails."""

from __future__ import annotations

import httpx
import pytest
from selenium.webdriver.support.ui import Select

from tests.e2e.browser import requires_browser, screenshot, wait_for
from tests.e2e.playground_page import fill, metrics_rows, no_error, open_page

pytestmark = [pytest.mark.slow, requires_browser]


def test_the_demo_page_says_what_it_can_draw(demo_server, browser):
    card = httpx.get(f"{demo_server}/v1/models").json()["data"][0]
    open_page(browser, demo_server, "omnistage-demo", "tab-image")
    assert "omnistage-demo" in browser.title

    buttons = browser.find_elements("css selector", "#example-prompts button")
    assert [b.text for b in buttons] == card["example_prompts"] and len(buttons) > 2
    fill(browser, "prompt", "")
    buttons[2].click()
    assert browser.find_element("id", "prompt").get_attribute("value") == card["example_prompts"][2]
    words = browser.find_element("id", "vocabulary").text
    assert all(w in words for kind in card["vocabulary"].values() for w in kind), words

    size = Select(browser.find_element("id", "size"))
    assert [o.get_attribute("value") for o in size.options] == card["image_sizes"]["choices"]
    assert size.first_selected_option.get_attribute("value") == card["image_sizes"]["native"] == "64x64"

    # the chat box starts with something the demo draws, not a question it cannot answer
    assert browser.find_element("id", "chat-input").get_attribute("value") == card["example_prompts"][0]
    assert [th.get_attribute("textContent") for th in browser.find_elements("css selector", "#metrics thead th")] == [
        "Stage",
        "Kind",
        "Queue (s)",
        "Run (s)",
        "Steps",
        "Peak MB",
    ]  # no llm stage: no token counts


def test_a_size_and_a_background_it_cannot_draw_are_said_beside_the_picture(demo_server, browser):
    """256x256 (the size list offers it) and "yellow background": the picture comes, and the warnings box says
    both, as the API's headers do."""
    open_page(browser, demo_server, "omnistage-demo", "tab-image")
    prompt = "a red circle on a yellow background"
    fill(browser, "prompt", prompt)
    fill(browser, "steps", "1")
    Select(browser.find_element("id", "size")).select_by_value("256x256")
    browser.find_element("id", "generate").click()
    wait_for(browser, 120, lambda d: d.find_elements("id", "result-image"), "the generated image")
    no_error(browser)
    with httpx.Client(base_url=demo_server, timeout=120) as c:
        want = c.post(
            "/v1/images/generations", json={"prompt": prompt, "size": "256x256", "num_inference_steps": 1}
        ).headers.get_list("x-omnistage-warning")
    shown = browser.find_element("id", "warnings")
    assert shown.is_displayed() and shown.text.split("\n") == want and len(want) == 2
    assert "'yellow background'" in want[0] and "at 256x256" in want[1]
    screenshot(browser, "playground-demo-size-warning.png")


def test_warnings_show_and_metrics_clear_after_an_error(demo_server, browser):
    open_page(browser, demo_server, "omnistage-demo", "tab-image")
    fill(browser, "prompt", "a yellow circle at the top")
    fill(browser, "steps", "2")
    browser.find_element("id", "generate").click()
    wait_for(browser, 120, lambda d: d.find_elements("id", "result-image"), "the generated image")
    no_error(browser)
    with httpx.Client(base_url=demo_server, timeout=120) as c:
        want = c.post(
            "/v1/images/generations",
            json={"prompt": "a yellow circle at the top", "size": "64x64", "num_inference_steps": 2},
        ).headers["x-omnistage-warning"]
    shown = browser.find_element("id", "warnings")
    assert shown.is_displayed() and shown.text == want and "'top'" in want
    assert list(metrics_rows(browser)) == ["0"] and metrics_rows(browser)["0"]["Steps"] == "2"
    screenshot(browser, "playground-demo-warning.png")

    fill(browser, "steps", "0")  # the API refuses num_inference_steps < 1
    browser.find_element("id", "generate").click()
    error = wait_for(
        browser,
        60,
        lambda d: d.find_element("id", "error").is_displayed() and d.find_element("id", "error"),
        "the error box",
    )
    assert "num_inference_steps" in error.text
    assert not browser.find_element("id", "metrics").is_displayed()
    assert browser.find_elements("css selector", "#metrics-rows tr") == []
    assert browser.find_element("id", "metrics-summary").get_attribute("textContent") == ""
    screenshot(browser, "playground-demo-error.png")
