"""Headless Chromium for browser tests (selenium), shared by every test that drives a page.

tests/e2e/conftest.py provides the ``browser`` fixture to the tests there (elsewhere: import it); mark browser
test modules with ``requires_browser``. Install the browser with ``scripts/install-browser.sh`` (``make test`` runs it).
Without it the tests skip, saying why, except in CI: there a missing browser fails each browser test, so they
cannot pass by skipping (omnistage/testing/requires.py).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from omnistage.testing.requires import missing_modules, requirement

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"  # screenshots (git-ignored)
CHROMIUM = Path("/usr/bin/chromium")
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists() or not Path(DRIVER).exists():
        return f"headless Chromium is not installed ({CHROMIUM}, {DRIVER}; run scripts/install-browser.sh)"
    if missing_modules("selenium"):
        return "selenium is not installed (pip install '.[dev]')"
    return None


requires_browser = requirement(missing_browser())


@pytest.fixture
def browser() -> Iterator[Any]:
    """A fresh headless Chromium per test; its JavaScript console is readable with ``console_errors``."""
    with chromium() as driver:
        yield driver


@contextlib.contextmanager
def chromium(*flags: str) -> Iterator[Any]:
    """Headless Chromium with the ``browser`` fixture's flags plus ``flags`` (e.g. a fake microphone's file)."""
    from selenium import webdriver  # (a dev dependency; requires_browser says when it is missing)
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=900,900",
        # no sound card here: audio goes to a fake output device, and may start without a gesture
        "--use-fake-device-for-media-stream",
        "--autoplay-policy=no-user-gesture-required",
        *flags,
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    """The page's JavaScript errors so far (SEVERE console entries)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(driver: Any, seconds: float, condition: Callable[[Any], Any], what: str) -> Any:
    """``condition``'s first truthy value within ``seconds``; on timeout the test fails quoting the page's
    error box, status line and console errors, so the failure says what the page showed."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, seconds, poll_frequency=0.05).until(condition)
    except TimeoutException:
        error = driver.find_element("id", "error").text
        status = driver.find_element("id", "status").text
        pytest.fail(
            f"timed out waiting for {what}; page error box: {error!r}; status: {status!r}; "
            f"console: {console_errors(driver)}"
        )


def screenshot(driver: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    driver.save_screenshot(str(path))
    return path
