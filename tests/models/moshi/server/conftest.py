"""One ``omnistage`` server on the tiny Moshi for the duplex WebSocket tests (a real uvicorn server in this
process, the API key enforced, a short resume grace period)."""

from __future__ import annotations

import pytest
import torch

from omnistage import AsyncOmni
from tests.models.moshi.conftest import TINY

KEY = "duplex-key"
GRACE_S = 5.0  # a dropped socket's session waits this long for session.resume (the default is 30 s)


def start(tmp_path_factory, **options):
    from omnistage.config.settings import ServerSettings
    from omnistage.testing.server import serve_engine

    torch.set_num_threads(1)
    settings = ServerSettings(storage={"path": str(tmp_path_factory.mktemp("storage"))})
    return serve_engine(AsyncOmni(model=str(TINY)), settings, api_key=KEY, **options)


@pytest.fixture(scope="package")
def duplex_server(tmp_path_factory):
    # real time is not what these tests check, and the suite shares its CPU cores: a budget no step reaches
    srv = start(tmp_path_factory, duplex_resume_grace_s=GRACE_S, duplex_frame_budget_ms=600_000)
    yield srv
    srv.stop()


@pytest.fixture
def tight_server(tmp_path_factory):
    """A budget every step exceeds (the engine measures its steps at start-up): every session is refused."""
    srv = start(tmp_path_factory, duplex_frame_budget_ms=0.001)
    yield srv
    srv.stop()


@pytest.fixture
def roomy_server(tmp_path_factory):
    """A budget no real step reaches, its own server: a test sets the step times admission decides on."""
    srv = start(tmp_path_factory, duplex_frame_budget_ms=600_000)
    yield srv
    srv.stop()
