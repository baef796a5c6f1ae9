"""The talker and code2wav stages without vLLM, against transformers' generate() of the whole model:
checkpoint loading, the talker's codes step by step (solo, batched, streamed input), code2wav's
streamed decode, parameter checks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistage.config.schema import StageDeployConfig
from omnistage.errors import InvalidRequestError
from omnistage.models.qwen_omni.code2wav import Code2WavAdapter
from omnistage.models.qwen_omni.config import TALKER_DEFAULTS, load_omni_config
from omnistage.models.qwen_omni.kv import RequestKV
from omnistage.models.qwen_omni.talker_engine import TalkerEngine
from omnistage.models.qwen_omni.talker_model import EOS_TEXT, PAD_TEXT, Qwen3TalkerRow, TalkerModel
from omnistage.models.shared.omni.sampling import Sampling, talker_sampling
from omnistage.pipeline import StageContext, get_pipeline
from omnistage.stages.base import StageRequest
from omnistage.stages.generation.engine import GenerationItem
from omnistage.testing.streams import fed_outputs

HELLO = [{"role": "user", "content": "hello, who are you?"}]
CHAT = [
    {"role": "system", "content": "you are a helpful assistant."},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "i am a voice assistant."},
    {"role": "user", "content": "describe the sound"},
]
THINK, TALK = 12, 20


@pytest.fixture(scope="module")
def talker(omni_dir):
    return TalkerModel(omni_dir)


def context(folder, stage_id: int) -> StageContext:
    return StageContext(get_pipeline("qwen_omni").stage(stage_id), StageDeployConfig(stage_id=stage_id), str(folder))


def greedy_codes(talker: TalkerModel, prompt: list[int], reply: list[int], frames: int) -> torch.Tensor:
    """The talker driven by hand, as transformers' generate() feeds it (reply minus its last token)."""
    start = talker.assistant_start(prompt, talker.config.im_start_token_id, talker.config.assistant_token_id)
    turn = prompt[start:] + reply[:-1]
    row = Qwen3TalkerRow(RequestKV(talker.num_layers), Sampling(temperature=0))
    talker.prefill(row, *talker.prefill_input(prompt, turn[:4], 2302))
    trailing = turn[4:] + [EOS_TEXT]
    out = [talker.step([row], [trailing[s] if s < len(trailing) else PAD_TEXT])[0] for s in range(frames)]
    return torch.stack(out).T


def test_tiny_folder_is_a_speaking_qwen3_omni(omni_dir, reference):
    cfg = load_omni_config(omni_dir)
    assert cfg.enable_audio_output and cfg.voices == ["Aiden", "Chelsie", "Ethan"]
    for role in ("system", "user", "assistant"):  # the talker finds user turns by these single tokens
        assert len(reference.tok.encode(role, add_special_tokens=False)) == 1
    assert (reference.tok.image_token, reference.tok.audio_bos_token) == ("<|image_pad|>", "<|audio_start|>")
    assert reference.tok.eos_token == "<|im_end|>"
    m = reference.model.config
    assert m.talker_config.accept_hidden_layer < m.thinker_config.text_config.num_hidden_layers
    assert len(m.thinker_config.vision_config.deepstack_visual_indexes) >= 1


def test_stage_loaders_read_the_same_weights_as_transformers(talker, reference, omni_dir):
    mine = talker.talker.state_dict()
    ref = reference.model.talker.state_dict()
    assert mine.keys() == ref.keys() and all(torch.equal(mine[k], ref[k]) for k in ref)
    c2w = Code2WavAdapter(context(omni_dir, 2)).model.state_dict()
    ref = reference.model.code2wav.state_dict()
    assert c2w.keys() == ref.keys() and all(torch.equal(c2w[k], ref[k]) for k in ref)


@pytest.mark.parametrize("messages", [HELLO, CHAT], ids=["one-turn", "system+multi-turn"])
def test_talker_codes_equal_transformers_generate(talker, reference, messages):
    ref = reference.run(messages, THINK, TALK)
    codes = greedy_codes(talker, ref.prompt_ids, ref.reply, ref.codes.shape[1])
    assert torch.equal(codes, ref.codes)


def test_talker_batched_prefill_and_rows_equal_transformers(talker, reference):
    """Both prompts' prefills in one right-padded forward (their lengths differ), then batched steps: each row's
    codes are transformers' for that prompt alone."""
    a, b = reference.run(HELLO, THINK, TALK), reference.run(CHAT, THINK, TALK)
    rows, inputs, trailing = [], [], []
    for ref in (a, b):
        start = talker.assistant_start(
            ref.prompt_ids, talker.config.im_start_token_id, talker.config.assistant_token_id
        )
        turn = ref.prompt_ids[start:] + ref.reply[:-1]
        rows.append(Qwen3TalkerRow(RequestKV(talker.num_layers), Sampling(temperature=0)))
        inputs.append(talker.prefill_input(ref.prompt_ids, turn[:4], 2302))
        trailing.append(turn[4:] + [EOS_TEXT])
    assert inputs[0][0].shape[0] != inputs[1][0].shape[0]  # the shorter one is padded
    talker.prefill_batch(rows, inputs)
    assert [r.kv.length for r in rows] == [x[0].shape[0] for x in inputs]  # padding stays out of the caches
    frames = min(a.codes.shape[1], b.codes.shape[1])
    got = [talker.step(rows, [t[s] if s < len(t) else PAD_TEXT for t in trailing]) for s in range(frames)]
    batched = torch.stack(got)  # [frames, 2, G]
    assert torch.equal(batched[:, 0].T, a.codes[:, :frames]) and torch.equal(batched[:, 1].T, b.codes[:, :frames])


def run_engine(folder, requests: list[tuple[str, dict, list[tuple[dict, bool]] | None]]):
    """Run requests through a started TalkerEngine: (id, whole inputs or {} to stream, feeds) -> (outputs,
    step batch sizes, prefill batch sizes)."""

    async def main():
        engine = TalkerEngine(context(folder, 1))
        await engine.start()
        try:
            params = {"temperature": 0, "max_tokens": TALK}
            outs = await asyncio.gather(
                *(fed_outputs(engine, rid, inputs, params, feeds) for rid, inputs, feeds in requests)
            )
            return outs, list(engine.batch_sizes), list(engine.prefill_sizes)
        finally:
            await engine.shutdown()

    return asyncio.run(main())


def frames_of(outputs) -> torch.Tensor:
    assert outputs[-1].finished and outputs[-1].error is None
    return torch.cat([o.data["token_ids"] for o in outputs if o.data.get("token_ids") is not None]).T


def test_talker_engine_streamed_text_equals_whole_text_and_batches(omni_dir, reference):
    a, b = reference.run(HELLO, THINK, TALK), reference.run(CHAT, THINK, TALK)
    whole = {"prompt_token_ids": a.prompt_ids, "token_ids": a.reply, "speaker": "Ethan"}
    first = {"prompt_token_ids": b.prompt_ids, "token_ids": b.reply[:1], "speaker": "ethan"}
    feeds = [(first, False)] + [({"token_ids": [t]}, False) for t in b.reply[1:]] + [({}, True)]
    (out_a, out_b), batches, _ = run_engine(omni_dir, [("a", whole, None), ("b", {}, feeds)])
    assert torch.equal(frames_of(out_a), a.codes) and torch.equal(frames_of(out_b), b.codes)
    assert max(batches) == 2  # the two requests shared steps
    assert out_a[-1].finish_reason == "length" and out_a[-1].metrics.num_tokens == a.codes.shape[1]


def test_talker_reads_tokens_the_thinker_says_are_not_its_last_at_once(omni_dir, reference):
    """``reply_continues`` chunks (what the thinker marks on every output but its last): the first frame comes once
    the thinker's second reply token is there (not its third), and the codes are still transformers'."""
    ref = reference.run(CHAT, THINK, TALK)

    async def main():
        engine = TalkerEngine(context(omni_dir, 1))
        await engine.start()
        try:
            req = StageRequest("r", {}, {"temperature": 0, "max_tokens": TALK}, stream_inputs=True)
            outs = engine.generate(req)
            first = asyncio.ensure_future(outs.__anext__())
            await asyncio.sleep(0.01)  # the request is registered
            await engine.feed(
                "r", {"prompt_token_ids": ref.prompt_ids, "token_ids": ref.reply[:1], "reply_continues": True}, False
            )
            await engine.feed("r", {"token_ids": ref.reply[1:2], "reply_continues": True}, False)
            frame = await asyncio.wait_for(first, 10)  # no third token fed yet
            got = [frame]
            for i, t in enumerate(ref.reply[2:], start=2):
                await engine.feed("r", {"token_ids": [t], "reply_continues": i < len(ref.reply) - 1}, False)
            await engine.feed("r", {}, True)
            got += [out async for out in outs]
            return got
        finally:
            await engine.shutdown()

    got = asyncio.run(main())
    assert got[0].data["token_ids"].shape == (1, 4)
    assert torch.equal(frames_of(got), ref.codes)


def test_talker_engine_prefills_requests_that_arrive_together_in_one_batch(omni_dir, reference):
    a, b = reference.run(HELLO, THINK, TALK), reference.run(CHAT, THINK, TALK)
    whole = [
        (rid, {"prompt_token_ids": r.prompt_ids, "token_ids": r.reply, "speaker": "Ethan"}, None)
        for rid, r in (("a", a), ("b", b), ("c", a))
    ]
    (out_a, out_b, out_c), _, prefills = run_engine(omni_dir, whole)
    assert prefills == [3]  # one batched prefill, not three in a row
    assert torch.equal(frames_of(out_a), a.codes) and torch.equal(frames_of(out_b), b.codes)
    assert torch.equal(frames_of(out_c), a.codes)


def test_code2wav_streamed_pieces_equal_chunked_decode(omni_dir, reference):
    adapter = Code2WavAdapter(context(omni_dir, 2))
    g = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 2048, (4, n), generator=g) for n in (340, 23, 40)]
    with torch.no_grad():
        refs = [
            reference.model.code2wav.chunked_decode(c[None], chunk_size=300, left_context_size=25).reshape(-1)
            for c in codes
        ]
    # crossing and landing on the 300-frame chunk edge; the first pieces (1, 4, 1 frames) share a decode padded to
    # 4 frames and 4 rows, the later ones are too far apart in length to share one
    cuts = [[0, 1, 8, 299, 300, 305, 340], [0, 4, 23], [0, 1, 12, 40]]
    states = [{}, {}, {}]
    got: list[list[torch.Tensor]] = [[], [], []]
    for piece in range(max(len(c) for c in cuts) - 1):
        items = [
            GenerationItem(
                str(i),
                {"codes": codes[i][:, cuts[i][piece] : cuts[i][piece + 1]]},
                {},
                states[i],
                piece + 2 == len(cuts[i]),
            )
            for i in range(3)
            if piece + 1 < len(cuts[i])
        ]
        for item, out in zip(items, adapter.run(items)):
            assert out["sample_rate"] == 24000
            got[int(item.request_id)].append(out["audio"])
    assert adapter.calls[0] == 3  # the three first pieces shared a decode
    for pieces, ref in zip(got, refs):
        audio = torch.cat(pieces)
        assert audio.shape == ref.shape
        assert (audio - ref).abs().max().item() <= 1e-4
        assert ref.abs().max() > 0.05  # real signal, not silence


def test_parameter_checks_name_the_field(omni_dir):
    with pytest.raises(InvalidRequestError, match="min_p: not a parameter of the talker"):
        talker_sampling({"min_p": 0.1}, TALKER_DEFAULTS)
    with pytest.raises(InvalidRequestError, match="top_p"):
        talker_sampling({"top_p": 0}, TALKER_DEFAULTS)
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        talker_sampling({"max_tokens": 0}, TALKER_DEFAULTS)
    with pytest.raises(InvalidRequestError, match="speaker: 'Bob' is not one of this model's speakers"):
        load_omni_config(omni_dir).speaker_id("Bob")
    assert load_omni_config(omni_dir).speaker_id("CHELSIE") == 2301  # case-insensitive, as transformers
