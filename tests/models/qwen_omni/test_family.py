"""Family wiring without engines: folder resolution (speaking vs text-only checkpoints), the shipped
deploy YAMLs, the voices the server lists, the edges' chunking."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from omnistage.engine.builder import resolve_deploy
from omnistage.models.qwen_omni import edges
from omnistage.pipeline import resolve_pipeline
from omnistage.speech import SpeechInput

DEPLOY = Path(__file__).parents[3] / "omnistage" / "models" / "qwen_omni" / "deploy"


def test_speaking_folder_resolves_to_qwen_omni_with_its_voices(omni_dir):
    pipeline = resolve_pipeline(omni_dir)
    assert pipeline.name == "qwen_omni"  # not "chat", although vLLM knows the architecture
    assert [s.name for s in pipeline.stages] == ["thinker", "talker", "code2wav"]
    assert pipeline.for_model(omni_dir).info.speech.voices == ("Aiden", "Chelsie", "Ethan")
    assert set(pipeline.output_modalities.names()) >= {"text", "audio"}


def test_text_only_folder_resolves_to_the_thinker_alone(omni_dir, tmp_path):
    folder = tmp_path / "thinking"
    shutil.copytree(omni_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["enable_audio_output"] = False
    (folder / "config.json").write_text(json.dumps(config))
    pipeline = resolve_pipeline(folder)
    assert pipeline.name == "qwen_omni_thinker" and len(pipeline.stages) == 1
    assert "audio" not in pipeline.output_modalities.names()


@pytest.mark.parametrize("name, replicas", [("one_device.yaml", [1, 1, 1]), ("replicated.yaml", [1, 2, 2])])
def test_shipped_deploy_configs_validate(name, replicas):
    deploy = resolve_deploy(resolve_pipeline(None, "qwen_omni"), DEPLOY / name)
    assert deploy.async_chunk is True
    assert [deploy.stage(i).num_replicas for i in range(3)] == replicas


@pytest.mark.parametrize(
    "params, pieces",
    [
        ({"chunk_frames": 3}, [True, False, False, True, False, False, True]),  # the first frame at once, then 3 by 3
        ({"chunk_frames": 3, "initial_codec_chunk_frames": 2}, [False, True, False, False, True, False, False]),
    ],
)
def test_code_chunks_first_piece_then_every_n_frames_and_the_rest_at_the_end(params, pieces):
    class Req:
        sampling_params = (None, None, params)

    state: dict = {"finished": False}
    frames = [torch.full((1, 4), i) for i in range(7)]
    sent = [edges.talker_to_code2wav_chunks({"token_ids": f}, Req, state) for f in frames]
    assert [s is not None for s in sent] == pieces
    state["finished"] = True
    tail = edges.talker_to_code2wav_chunks({}, Req, state)
    assert (tail is not None) == (not pieces[-1])
    got = torch.cat([s["codes"] for s in [*sent, tail] if s is not None], dim=1)
    assert torch.equal(got, torch.cat(frames).T)  # [G, frames], nothing lost or repeated


def test_code2wav_decodes_in_few_shapes_and_keeps_short_pieces_off_long_windows():
    from omnistage.models.qwen_omni.code2wav import decode_batches

    # (padded length, batch rows, window indices): similar lengths share a decode, padded to the next of LENGTHS
    assert decode_batches([1, 4]) == [(4, 2, [0, 1])]
    assert decode_batches([1, 1, 1]) == [(1, 4, [0, 1, 2])]  # one padding row rather than a second decode
    assert decode_batches([1] * 6) == [(1, 4, [0, 1, 2, 3]), (1, 2, [4, 5])]
    assert decode_batches([200, 1, 5]) == [(8, 2, [1, 2]), (256, 1, [0])]  # a new request's first frame alone
    assert decode_batches([325, 300]) == [(325, 2, [1, 0])]  # a whole chunk with its context: no more


def test_a_talker_that_ends_before_its_first_frame_hands_code2wav_no_codes():
    """The thinker stopped on its first token, so the talker had no turn to speak: code2wav gets no codes (its
    empty last input, streamed or whole) and the reply is its text without audio, not an error."""

    class Req:
        sampling_params = (None, None, None)

    assert edges.talker_to_code2wav_chunks({}, Req, {"finished": True}) is None  # the feed's last input is {}
    assert edges.talker_to_code2wav({"token_ids": []}, Req) == {}


def test_reply_chunks_carry_the_prompt_and_the_voice_once():
    class Req:
        prompt: ClassVar = {"messages": [], "speech": SpeechInput(voice="Chelsie")}

    state: dict = {"finished": False}
    first = edges.thinker_to_talker_chunks({"prompt_token_ids": [1, 2], "token_ids": [5], "text": "a"}, Req, state)
    assert first == {"prompt_token_ids": [1, 2], "speaker": "Chelsie", "token_ids": [5]}
    assert edges.thinker_to_talker_chunks({"token_ids": [6], "text": "b"}, Req, state) == {"token_ids": [6]}
    assert edges.thinker_to_talker_chunks({"text": ""}, Req, state) is None
    more = edges.thinker_to_talker_chunks({"token_ids": [7], "reply_continues": True}, Req, state)
    assert more == {"token_ids": [7], "reply_continues": True}  # not the thinker's last tokens (thinker.py)


def test_sampling_defaults_come_from_the_checkpoint_generation_config(omni_dir, tmp_path):
    from omnistage.models.qwen_omni.config import TALKER_DEFAULTS, load_omni_config

    folder = tmp_path / "gen"
    shutil.copytree(omni_dir, folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    gen.update(temperature=0.7, top_p=0.8, talker_temperature=0.6, talker_max_new_tokens=100, talker_do_sample=True)
    (folder / "generation_config.json").write_text(json.dumps(gen))
    cfg = load_omni_config(folder)
    assert cfg.sampling_defaults("thinker") == {"temperature": 0.7, "top_p": 0.8}
    assert cfg.sampling_defaults("talker") == {**TALKER_DEFAULTS, "temperature": 0.6, "max_tokens": 100}
    assert load_omni_config(omni_dir).sampling_defaults("talker") == TALKER_DEFAULTS  # transformers' generate()
