"""The rows the thinker engine hands the talker (models/qwen_omni/vllm_speaking.py + stages/llm/hidden_connector.py),
against transformers' own thinker: ``hidden_states[accept_hidden_layer]`` of the processor's inputs, for a prompt
whose prefill vLLM splits over several steps (``max_num_batched_tokens`` below the prompt) and several KV blocks, and
for the same prompt plus a reply decoded into another block, so the connector must follow the request's blocks
across steps and write each step's rows at their place (a row from a wrong block is off by the rows' own size, ~10).
Qwen2.5-Omni's thinker uses the same connector for prompt + reply (tests/models/qwen2_5_omni/)."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from omnistage.models.qwen_omni.config import load_omni_config
from omnistage.models.qwen_omni.vllm_plugin import SPEAKING_ARCHITECTURE
from omnistage.stages.llm.hidden import CONNECTOR, PATH_KEY, REPLY_KEY, read_rows
from tests.models import omni_media as media
from tests.models.qwen_omni.test_omni_media_vllm import audio_part, image_part, template_messages, text

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CHUNK = 8  # tokens per prefill step: the prompt below (53 tokens) takes seven
BLOCK = 32  # KV-cache block size (the CPU backend's smallest): its second block comes in a later step than its first
CLIP, IMAGE = media.clip(2.0, 0), media.image(0)
MESSAGES = [{"role": "user", "content": [image_part(IMAGE), audio_part(CLIP), text("what is this?")]}]


REPLY = 20  # tokens generated in reply mode: prompt + reply crosses into a third block during decoding


def test_rows_of_a_prefill_split_over_steps_and_of_the_reply_equal_transformers(omni_dir, reference, tmp_path):
    """The prompt's rows when the prefill takes seven steps over two blocks; then the same prompt again (now a
    cached prefix: its rows come from the cached blocks) asking for the reply's rows too, 20 tokens decoded into a
    third block — all equal transformers' thinker run on the prompt + the reply fed back."""
    from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams
    from vllm.renderers.params import ChatParams

    torch.set_num_threads(1)
    messages, mm = MESSAGES, {"images": [IMAGE], "audio": [CLIP]}
    config = load_omni_config(omni_dir)
    prompt_path, reply_path = str(tmp_path / "prompt.rows"), str(tmp_path / "reply.rows")

    async def rows():
        engine = AsyncLLMEngine.from_engine_args(
            AsyncEngineArgs(
                model=str(omni_dir),
                dtype="float32",
                max_model_len=1024,
                enforce_eager=True,
                kv_cache_memory_bytes=64 << 20,
                mm_processor_cache_gb=0,
                disable_log_stats=True,
                max_num_batched_tokens=CHUNK,
                block_size=BLOCK,
                hf_overrides={"architectures": [SPEAKING_ARCHITECTURE]},
                kv_transfer_config=CONNECTOR,
            )
        )
        try:
            tok = engine.renderer.default_chat_tok_params.with_kwargs(add_special_tokens=False)
            chat = ChatParams(chat_template_kwargs={"add_generation_prompt": True, "tokenize": False})
            _, (ei,) = await engine.renderer.render_chat_async([messages], chat, tok)
            ids = list(ei["prompt_token_ids"])
            params = SamplingParams(
                max_tokens=1, temperature=0, extra_args={"kv_transfer_params": {PATH_KEY: prompt_path}}
            )
            async for _ in engine.generate(ei, params, request_id="split"):
                assert os.path.exists(prompt_path)  # written before the first token left the engine
            prompt_rows = read_rows(prompt_path, len(ids))
            params = SamplingParams(
                max_tokens=REPLY,
                temperature=0,
                ignore_eos=True,
                extra_args={"kv_transfer_params": {PATH_KEY: reply_path, REPLY_KEY: True}},
            )
            async for out in engine.generate(ei, params, request_id="reply"):
                pass
            reply = list(out.outputs[0].token_ids)
            assert out.num_cached_tokens >= BLOCK  # the prompt's first block came from the cache
            return ids, prompt_rows, reply, read_rows(reply_path, len(ids) + len(reply) - 1)
        finally:
            engine.shutdown()

    ids, got, reply, got_reply = asyncio.run(rows())
    prompt = reference.processor.apply_chat_template(
        template_messages(messages), add_generation_prompt=True, tokenize=False
    )
    inputs = reference.processor(text=prompt, return_tensors="pt", **mm)
    assert inputs["input_ids"][0].tolist() == ids and len(ids) > BLOCK and len(ids) + REPLY > 2 * BLOCK
    with torch.no_grad():
        want = reference.model.thinker(**inputs, output_hidden_states=True).hidden_states[config.accept_hidden_layer][0]
        fed = torch.tensor([ids + reply[:-1]])
        longer = dict(inputs, input_ids=fed, attention_mask=torch.ones_like(fed))
        want_reply = reference.model.thinker(**longer, output_hidden_states=True).hidden_states[
            config.accept_hidden_layer
        ][0]
    assert got.shape == want.shape and got_reply.shape == want_reply.shape
    # float32 rounding through the encoders: measured up to 1.3e-4 at |x| up to ~30; a wrong row is ~10 off
    torch.testing.assert_close(got, want, rtol=1e-5, atol=5e-4)
    torch.testing.assert_close(got_reply, want_reply, rtol=1e-5, atol=5e-4)
