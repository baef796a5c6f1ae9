import os

import msgspec
import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.speech import SpeechInput, SpeechTurn
from omnistage.stages.base import StageError, StageMetrics, StageOutput, StageRequest
from omnistage.transport.codec import Codec
from omnistage.transport.messages import Command, Event, Generate, Output, Ready


def _payload():
    return {
        "bf16": torch.randn(3, 5, dtype=torch.bfloat16),
        "big": torch.randn(512, 512),  # 1 MiB
        "u8": np.arange(24, dtype=np.uint8).reshape(2, 4, 3),
        "img": Image.fromarray(np.full((8, 6, 3), 7, np.uint8)),
        "pal": Image.new("P", (4, 4)),
        "empty": torch.empty(0, 3),
        "metrics": StageMetrics(queue_time_s=1.5, num_steps=3),
        "tuple": (1, 2),
        "scalar": np.float32(2.5),
    }


@pytest.mark.parametrize("threshold", [None, 1024])
def test_round_trip_is_exact(threshold):
    codec = Codec(shm_threshold=threshold)
    p = _payload()
    got = codec.decode(codec.encode(p))
    assert got["bf16"].dtype == torch.bfloat16 and torch.equal(got["bf16"], p["bf16"])
    assert torch.equal(got["big"], p["big"])
    assert np.array_equal(got["u8"], p["u8"])
    assert np.array_equal(np.asarray(got["img"]), np.asarray(p["img"])) and got["img"].mode == "RGB"
    assert got["pal"].mode == "RGB"
    assert got["empty"].shape == (0, 3)
    assert got["metrics"] == StageMetrics(queue_time_s=1.5, num_steps=3).to_dict()  # untyped: a plain dict
    assert got["tuple"] == [1, 2] and got["scalar"] == 2.5


def test_large_buffers_go_through_shared_memory_and_are_unlinked():
    codec = Codec(shm_threshold=1024)
    msg = codec.encode({"big": torch.randn(512, 512)})
    assert len(msg) < 4096  # the megabyte is not on the wire
    before = set(os.listdir("/dev/shm"))
    codec.decode(msg)
    assert set(os.listdir("/dev/shm")) <= before  # the receiver unlinked the segment
    small = Codec(shm_threshold=None).encode({"big": torch.randn(512, 512)})
    assert len(small) > 1 << 20


def test_messages_decode_into_their_types():
    """A StageOutput crosses as a StageOutput: nested metrics/error typed, progress a tuple, tensors intact."""
    audio = torch.randn(1, 7)
    msg = Output(
        StageOutput(
            "r1",
            1,
            {"audio": audio},
            True,
            metrics=StageMetrics(run_time_s=2.0),
            error=StageError("height: too big", bad_input=True, field="height"),
            progress=(3, 4),
            finish_reason="stop",
        )
    )
    got = Codec(Event).decode(Codec().encode(msg))
    assert isinstance(got, Output) and isinstance(got.output.metrics, StageMetrics)
    assert got.output.error == StageError("height: too big", bad_input=True, field="height")
    assert got.output.progress == (3, 4) and got.output.finish_reason == "stop"
    assert torch.equal(got.output.data["audio"], audio)
    req = Generate(StageRequest("r2", {"prompt": "x"}, {"seed": 1}, stream_inputs=True))
    back = Codec(Command).decode(Codec().encode(req))
    assert back == req
    with pytest.raises(msgspec.ValidationError):  # an event is not a command
        Codec(Command).decode(Codec().encode(Ready()))


def test_unsupported_objects_are_refused_clearly():
    with pytest.raises(TypeError, match="cannot send a Generator"):
        Codec().encode({"g": torch.Generator()})


@pytest.mark.parametrize("threshold", [None, 1024])
def test_a_stage_requests_speech_input_arrives_typed(threshold):
    """The speech input crosses to a stage process as the typed object (its clip's samples exact, through shared
    memory when large), not as a dict the stage would have to re-check."""
    clip = np.linspace(-1, 1, 48000, dtype=np.float32)
    turn = SpeechTurn(speaker="1", text="earlier", audio=(clip[:100], 24000))
    speech = SpeechInput(voice="0", ref_audio=(clip, 24000), ref_text="a clip", speed=1.25, context=(turn,))
    codec = Codec(Command, threshold)
    got = codec.decode(codec.encode(Generate(StageRequest("r", {"prompt": "hi"}, {"temperature": 0}, speech=speech))))
    s = got.request.speech
    assert isinstance(s, SpeechInput) and isinstance(s.context[0], SpeechTurn)
    assert (s.voice, s.ref_text, s.speed, s.ref_audio[1], s.context[0].text) == ("0", "a clip", 1.25, 24000, "earlier")
    assert np.array_equal(s.ref_audio[0], clip) and np.array_equal(s.context[0].audio[0], clip[:100])
    plain = codec.decode(codec.encode(Generate(StageRequest("r", {"prompt": "hi"}, None))))
    assert plain.request.speech is None
