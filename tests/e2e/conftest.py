"""The headless ``browser`` fixture for the browser tests here (the servers several folders share are in
tests/shared_servers.py)."""

from tests.e2e.browser import browser  # noqa: F401 (headless Chromium for every browser test here)
