"""The playground page in headless Chromium against a real server running the demo:
type a prompt, click Generate, the generated image appears. A screenshot is saved under
test-artifacts/. Install the browser with scripts/install-browser.sh."""

import base64
import io

import pytest
from PIL import Image

from tests.e2e.browser import browser, requires_browser, screenshot, wait_for  # noqa: F401 (browser: a fixture)

pytestmark = [pytest.mark.slow, requires_browser]


def test_generate_in_the_playground(demo_server, browser):
    browser.get(demo_server + "/")
    assert "playground" in browser.title
    wait_for(
        browser,
        30,
        lambda d: "outputs: image" in d.find_element("id", "model-name").text,
        "the model name from /v1/models",
    )

    prompt = browser.find_element("id", "prompt")
    prompt.clear()
    prompt.send_keys("a large yellow square on the right")
    browser.find_element("id", "generate").click()
    img = wait_for(browser, 120, lambda d: d.find_elements("id", "result-image") or False, "the generated image")[0]
    wait_for(
        browser,
        30,
        lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img),
        "the image to decode",
    )

    screenshot(browser, "playground.png")
    src = img.get_attribute("src")
    assert src.startswith("data:image/png;base64,")
    picture = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
    assert picture.size == (64, 64)
    assert browser.find_element("id", "error").is_displayed() is False


def test_playground_shows_api_errors_readably(demo_server, browser):
    browser.get(demo_server + "/")
    wait_for(
        browser,
        30,
        lambda d: "outputs: image" in d.find_element("id", "model-name").text,
        "the model name from /v1/models",
    )
    steps = browser.find_element("id", "steps")
    steps.clear()
    steps.send_keys("0")  # the API rejects num_inference_steps < 1
    browser.find_element("id", "generate").click()
    error = wait_for(
        browser,
        60,
        lambda d: d.find_element("id", "error").is_displayed() and d.find_element("id", "error"),
        "the error box",
    )
    assert "400" in error.text and "num_inference_steps" in error.text, error.text
    screenshot(browser, "playground-error.png")
