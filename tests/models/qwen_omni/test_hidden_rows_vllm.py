"""The rows the thinker engine hands the talker (models/qwen_omni/vllm_speaking.py + stages/llm/hidden_connector.py),
against transformers' own thinker: ``hidden_states[accept_hidden_layer]`` of the processor's inputs, for a prompt
whose prefill vLLM splits over several steps (``max_num_batched_tokens`` below the prompt) and several KV blocks, so
the connector must follow the request's blocks across steps and write once, when the last piece of the prompt is
computed (rows read too early, or from a wrong block, are off by the rows' own size, ~10)."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from omnistage.models.qwen_omni.config import load_omni_config
from omnistage.models.qwen_omni.vllm_plugin import SPEAKING_ARCHITECTURE
from omnistage.stages.llm.hidden import CONNECTOR, PATH_KEY
from tests.models.qwen_omni import media
from tests.models.qwen_omni.test_omni_media_vllm import audio_part, image_part, template_messages, text

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CHUNK = 8  # tokens per prefill step: the prompt below (53 tokens) takes seven
BLOCK = 32  # KV-cache block size (the CPU backend's smallest): its second block comes in a later step than its first
CLIP, IMAGE = media.clip(2.0, 0), media.image(0)
MESSAGES = [{"role": "user", "content": [image_part(IMAGE), audio_part(CLIP), text("what is this?")]}]


def test_rows_of_a_prefill_split_over_steps_equal_transformers(omni_dir, reference, tmp_path):
    from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams
    from vllm.renderers.params import ChatParams

    torch.set_num_threads(1)
    messages, mm = MESSAGES, {"images": [IMAGE], "audio": [CLIP]}
    config = load_omni_config(omni_dir)
    path = str(tmp_path / "rows.pt")

    async def rows():
        engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(
            model=str(omni_dir), dtype="float32", max_model_len=1024, enforce_eager=True,
            kv_cache_memory_bytes=64 << 20, mm_processor_cache_gb=0, disable_log_stats=True,
            max_num_batched_tokens=CHUNK, block_size=BLOCK, hf_overrides={"architectures": [SPEAKING_ARCHITECTURE]},
            kv_transfer_config=CONNECTOR))
        try:
            tok = engine.renderer.default_chat_tok_params.with_kwargs(add_special_tokens=False)
            chat = ChatParams(chat_template_kwargs={"add_generation_prompt": True, "tokenize": False})
            _, (ei,) = await engine.renderer.render_chat_async([messages], chat, tok)
            params = SamplingParams(max_tokens=1, temperature=0, extra_args={"kv_transfer_params": {PATH_KEY: path}})
            async for _ in engine.generate(ei, params, request_id="split"):
                assert os.path.exists(path)  # written before the first token left the engine
            return list(ei["prompt_token_ids"]), torch.load(path)
        finally:
            engine.shutdown()

    ids, got = asyncio.run(rows())
    prompt = reference.processor.apply_chat_template(template_messages(messages), add_generation_prompt=True,
                                                     tokenize=False)
    inputs = reference.processor(text=prompt, return_tensors="pt", **mm)
    assert inputs["input_ids"][0].tolist() == ids and len(ids) > BLOCK
    with torch.no_grad():
        out = reference.model.thinker(**inputs, output_hidden_states=True)
    want = out.hidden_states[config.accept_hidden_layer][0]
    assert got.shape == want.shape
    # float32 rounding through the encoders: measured up to 1.3e-4 at |x| up to ~30; a wrong row is ~10 off
    torch.testing.assert_close(got, want, rtol=1e-5, atol=5e-4)
