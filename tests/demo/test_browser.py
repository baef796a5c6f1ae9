"""The playground page in headless Chromium against a real server running the demo:
type a prompt, click Generate, the generated image appears. A screenshot is saved under
test-artifacts/. Install the browser with scripts/install-browser.sh."""

import base64
import io
import shutil
from pathlib import Path

import pytest
from PIL import Image

from tests.demo.conftest import ARTIFACTS

CHROMIUM = Path("/usr/bin/chromium")
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists() or not Path(DRIVER).exists(),
                       reason="headless Chromium is not installed (run scripts/install-browser.sh)"),
]


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install '.[dev]')")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--window-size=900,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait(driver, seconds, condition, what):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, seconds).until(condition)
    except TimeoutException:
        error = driver.find_element("id", "error").text
        pytest.fail(f"timed out waiting for {what}; page error box: {error!r}")


def test_generate_in_the_playground(demo_server, browser):
    browser.get(demo_server + "/")
    assert "playground" in browser.title
    _wait(browser, 30, lambda d: "outputs: image" in d.find_element("id", "model-name").text, "the model name from /v1/models")

    prompt = browser.find_element("id", "prompt")
    prompt.clear()
    prompt.send_keys("a large yellow square on the right")
    browser.find_element("id", "generate").click()
    img = _wait(browser, 120, lambda d: d.find_elements("id", "result-image") or False, "the generated image")[0]
    _wait(browser, 30, lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img),
          "the image to decode")

    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "playground.png"))
    src = img.get_attribute("src")
    assert src.startswith("data:image/png;base64,")
    picture = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
    assert picture.size == (64, 64)
    assert browser.find_element("id", "error").is_displayed() is False


def test_playground_shows_api_errors_readably(demo_server, browser):
    browser.get(demo_server + "/")
    _wait(browser, 30, lambda d: "outputs: image" in d.find_element("id", "model-name").text, "the model name from /v1/models")
    steps = browser.find_element("id", "steps")
    steps.clear()
    steps.send_keys("0")  # the API rejects num_inference_steps < 1
    browser.find_element("id", "generate").click()
    error = _wait(browser, 60, lambda d: d.find_element("id", "error").is_displayed() and d.find_element("id", "error"),
                  "the error box")
    assert "400" in error.text and "num_inference_steps" in error.text, error.text
    browser.save_screenshot(str(ARTIFACTS / "playground-error.png"))
