"""Every route of a tiny server of each kind (image: SD3, chat: a vLLM causal LM, speech: codec_tts, video:
Wan, audio: Stable Audio) fuzzed from the server's own OpenAPI document with schemathesis: valid and invalid
requests alike, and no answer may be a 5xx, or a status, content type, header or body the document does not
declare. The server must still be healthy afterwards.

Bounded: a few examples per route and server caps that keep every generated request tiny
(--max-image-pixels, --max-num-frames, --max-inference-steps, --max-tokens), so the whole module runs in
a few minutes on two cores.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode

from omnistage import AsyncOmni
from omnistage.config.settings import ServerSettings
from omnistage.testing.server import ServerThread, serve_engine

pytestmark = pytest.mark.slow

EXAMPLES = 12  # per route and server (positive and negative examples)
FAMILIES = {"image": "sd3", "chat": "chat", "speech": "codec_tts", "video": "wan", "audio": "stable_audio"}
# the route that runs the model: generated requests must reach it, not all be refused at the door
MODEL_ROUTE = {
    "image": "/v1/images/generations",
    "chat": "/v1/chat/completions",
    "speech": "/v1/audio/speech",
    "video": "/v1/videos/sync",
    "audio": "/v1/audio/generate",
}
CAPS = dict(max_image_pixels=64 * 64, max_num_frames=9, max_inference_steps=3, max_tokens=8, max_n=2)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
FUZZ_PHASES = [Phase.explicit, Phase.generate]  # no shrinking: a failure is reported as first found


@pytest.fixture(scope="module", params=list(FAMILIES), ids=list(FAMILIES))
def fuzz_server(request, tiny_model, tmp_path_factory) -> Iterator[tuple[str, ServerThread]]:
    """(kind, a running server of that kind)"""
    folder = tiny_model(FAMILIES[request.param])
    if request.param in ("image", "video", "audio"):  # diffusion: no token budget to cap
        engine = AsyncOmni(str(folder))
    else:  # a short default for the speech LM too (its own is 1024 codec tokens; deploy defaults are not capped)
        engine = AsyncOmni(
            str(folder), enforce_eager=True, stage_overrides={"0": {"default_sampling_params": {"max_tokens": 16}}}
        )
    settings_ = ServerSettings(storage={"path": str(tmp_path_factory.mktemp(f"fuzz-{request.param}"))})
    with serve_engine(engine, settings_, ready_timeout=600, **CAPS) as srv:
        yield request.param, srv


def fuzz_operation(operation, strategy, statuses: Counter, examples: int = EXAMPLES) -> None:
    """``examples`` requests drawn from ``strategy`` to one route, every answer checked (raises on the first
    failure)."""

    @given(case=strategy)
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=FUZZ_PHASES,
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
        response = case.call_and_validate(checks=CHECKS, timeout=300)
        statuses[(operation.path, response.status_code)] += 1

    run()


def test_every_route_answers_as_documented(fuzz_server):
    kind, srv = fuzz_server
    # (schemathesis's own pytest plugin needs an older pytest: its Python API drives hypothesis here)
    schema = schemathesis.openapi.from_url(f"{srv.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10  # every /v1 route of the API, and /health
    failures = []
    statuses: Counter = Counter()
    for operation in operations:
        # the document's own request examples first, then generated valid and invalid requests
        runs = [("example", s, 1) for s in operation.get_strategies_from_examples()]
        runs += [
            (mode.value, operation.as_strategy(generation_mode=mode), EXAMPLES)
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
        for what, strategy, count in runs:
            try:
                fuzz_operation(operation, strategy, statuses, count)
            except Unsatisfiable:  # nothing in the route's declaration can be made invalid (e.g. GET /health)
                assert what == "negative", operation.path
            except Exception as e:  # noqa: BLE001 - collected: one report naming every failing route
                failures.append(f"{operation.method.upper()} {operation.path} ({what}): {e}")
    assert not failures, "\n\n".join(failures)
    route = MODEL_ROUTE[kind]
    assert any(path == route and status == 200 for path, status in statuses), sorted(statuses.items())


def test_still_healthy_after_fuzzing(fuzz_server):
    _, srv = fuzz_server
    r = httpx.get(f"{srv.url}/health", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
