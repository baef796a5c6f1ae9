"""The Qwen2.5-Omni talker engine fed as the thinker streams (async chunk on, the default) against the same inputs
whole: the same codes, bit for bit, while it shares steps with another request; the whole and the chunk edges hand it
the same inputs. The rows are the tiny thinker's last hidden layer of the prompt + reply (one transformers forward:
what they are does not matter here, only that both ways read the same ones); tests/models/qwen2_5_omni/
test_omni25_vllm.py checks the whole pipeline, streamed, against transformers' generate."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, Qwen2_5OmniThinkerForConditionalGeneration

from omnistage.config.schema import StageDeployConfig
from omnistage.modality import OutputAccumulator
from omnistage.models.qwen2_5_omni.edges import talker_to_token2wav, thinker_to_talker, thinker_to_talker_chunks
from omnistage.models.qwen2_5_omni.talker_engine import TalkerEngine
from omnistage.pipeline import StageContext, get_pipeline
from omnistage.speech import SpeechInput
from omnistage.testing.streams import fed_outputs

TALK = 12
PROMPT, REPLY = [11, 40, 7, 93, 5, 61], [17, 29, 3, 88, 52, 14, 70]


@pytest.fixture(scope="module")
def rows(omni25_dir):
    """[prompt + reply - 1, D]: the thinker's last layer, as the thinker stage hands it out."""
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(omni25_dir).thinker_config
    thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(omni25_dir, config=config).eval()
    with torch.no_grad():
        out = thinker(input_ids=torch.tensor([PROMPT + REPLY[:-1]]), output_hidden_states=True)
    return out.hidden_states[-1][0].float()


def run(folder, requests):
    """(request id, first inputs, later feeds or None for whole) -> outputs per request, step batch sizes."""

    async def main():
        engine = TalkerEngine(
            StageContext(get_pipeline("qwen2_5_omni").stage(1), StageDeployConfig(stage_id=1), str(folder))
        )
        await engine.start()
        try:
            params = {"temperature": 0, "max_tokens": TALK}
            outs = await asyncio.gather(
                *(fed_outputs(engine, rid, inputs, params, feeds) for rid, inputs, feeds in requests)
            )
            return outs, list(engine.batch_sizes)
        finally:
            await engine.shutdown()

    return asyncio.run(main())


def codes(outputs) -> list[int]:
    assert outputs[-1].finished and outputs[-1].error is None, outputs[-1].error
    return [t for o in outputs for t in (o.data.get("token_ids") or [])]


def streamed(rows, reply=REPLY, voice="ethan") -> tuple[dict, list]:
    """As the thinker's outputs come: the prompt's rows with the first token (and the request's voice), then each
    token with the row of the token before it (fed back), then the end."""
    n = len(PROMPT)
    first = {"prompt_token_ids": PROMPT, "token_ids": reply[:1], "rows": rows[:n], "speaker": voice}
    feeds = [({"token_ids": [t], "rows": rows[n + j : n + j + 1]}, False) for j, t in enumerate(reply[1:])]
    return first, feeds + [({}, True)]


def test_streamed_inputs_give_the_codes_of_whole_inputs_while_sharing_steps(omni25_dir, rows):
    whole = {"prompt_token_ids": PROMPT, "token_ids": REPLY, "rows": rows, "media": None, "speaker": "Ethan"}
    first, feeds = streamed(rows)
    (a, b, c), batches = run(
        omni25_dir, [("whole", whole, None), ("chelsie", {**whole, "speaker": None}, None), ("streamed", first, feeds)]
    )
    assert codes(c) == codes(a) and len(codes(a)) > len(REPLY)  # it read every reply row, then the end and pads
    assert codes(b) != codes(a)  # (the voice the first chunk names matters: the default speaks otherwise)
    assert max(batches) >= 2


def test_a_one_token_reply_ends_without_a_code_and_an_unknown_voice_fails_that_request(omni25_dir, rows):
    """A thinker that stopped on its first token leaves the talker nothing to say: it finishes with no code (the
    reply is its text without audio), and the edge hands token2wav no codes; a voice it lacks is that request's
    error alone."""
    short, _ = streamed(rows, reply=REPLY[:1])
    bad, feeds = streamed(rows, voice="bob")
    (one, unknown), _ = run(omni25_dir, [("short", short, [({}, True)]), ("bob", bad, feeds)])
    assert codes(one) == [] and one[-1].finish_reason == "stop"
    assert talker_to_token2wav({"token_ids": []}, SimpleNamespace(prompt={}, sampling_params=[])) == {}
    assert unknown[-1].error is not None and unknown[-1].error.field == "speaker", unknown[-1].error


def test_the_whole_edge_joins_the_thinkers_outputs_as_the_streamed_one_forwards_them(rows):
    """Async chunk off: the thinker's outputs accumulated as the orchestrator keeps them, then the whole edge; on:
    each output through the chunk edge. Both hand the talker the same prompt ids, reply, rows, media and voice."""
    n = len(PROMPT)
    media = {"image_grid_thw": None, "use_audio_in_video": False}
    outputs = [{"prompt_token_ids": PROMPT, "token_ids": REPLY[:1], "talker_rows": rows[:n], "talker_media": media}]
    outputs += [{"token_ids": [t], "talker_rows": rows[n + j : n + j + 1]} for j, t in enumerate(REPLY[1:])]
    request = SimpleNamespace(prompt={"speech": SpeechInput(voice="ethan")}, sampling_params=[None, None])
    acc = OutputAccumulator()
    for out in outputs:
        acc.add(out)
    whole = thinker_to_talker(acc.whole(), request)
    state: dict = {}
    chunks = [thinker_to_talker_chunks(out, request, state) for out in outputs]
    assert whole["prompt_token_ids"] == chunks[0]["prompt_token_ids"] == PROMPT
    assert whole["token_ids"] == [t for c in chunks for t in c["token_ids"]] == REPLY
    assert torch.equal(whole["rows"], torch.cat([c["rows"] for c in chunks])) and torch.equal(whole["rows"], rows)
    assert whole["media"] == chunks[0]["media"] == media and all("media" not in c for c in chunks[1:])
    assert whole["speaker"] == chunks[0]["speaker"] == "ethan" and all("speaker" not in c for c in chunks[1:])
