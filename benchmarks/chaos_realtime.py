"""``benchmarks/chaos.py``'s ``realtime`` server: the tiny Qwen3-Omni (thinker on vLLM, the talker in its own
``mp`` AR step engine process, code2wav inline) answering /v1/realtime sessions (the calls:
``omnistage.testing.chaos_realtime``). Load: spoken turns, sessions the client leaves on the first delta, bad
events followed by a turn in the same session. Killed, each round: both vLLM engine cores of the thinker (the
generating engine's, the oldest, and the pooling copy's whose hidden states the talker reads, started after it) and
the talker's process.
The probe: a greedy spoken turn's transcript and audio, before and after.

``SPEC`` is ``chaos.Spec``'s fields (chaos.py builds it: this module cannot import the script)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnistage.bench.utterance import voiced
from omnistage.testing import chaos_realtime as rt
from omnistage.testing import processes as pr

RATE = 16000  # the thinker's feature extractor's: no resampling
CLIP = voiced(1.0, RATE, seed=3)
AUDIO_IN = {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None}}


def session(think: int, talk: int, ignore_eos: bool) -> dict[str, Any]:
    """session.update fields: greedy thinker and talker, ``think`` reply tokens, ``talk`` codec frames."""
    extra = {
        "temperature": 0,
        "ignore_eos": ignore_eos,
        "sampling_params_list": [None, {"temperature": 0, "max_tokens": talk}],
    }
    return {"type": "realtime", "max_output_tokens": think, "extra_body": extra, "audio": AUDIO_IN}


# load turns are long enough (ignore_eos) that a kill lands while some are answering
LOAD: rt.Turn = ("realtime", session(24, 48, True), CLIP, RATE)
GREEDY: rt.Turn = ("realtime", session(12, 20, False), CLIP, RATE)

SPEC: dict[str, Any] = dict(
    name="realtime",
    args=lambda fx: [
        str(Path(fx) / "qwen3_omni"),
        "--served-model-name",
        "realtime",
        "--stage-overrides",
        json.dumps({"0": {"max_model_len": 1024}, "1": {"process": "mp"}}),
    ],
    calls=lambda url: [
        ("turn", rt.spoken_turn(LOAD)),
        ("abandoned", rt.abandoned_turn(LOAD)),
        ("bad_events", rt.bad_events(LOAD)),
        ("turn", rt.spoken_turn(LOAD)),
    ],
    targets=[("vllm_engine_core", pr.engine_cores), ("ar_step_process", pr.stage_children)],
    probes={"realtime_greedy": rt.greedy_turn(GREEDY)},
    threads=3,
)
