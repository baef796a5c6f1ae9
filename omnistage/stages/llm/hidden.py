"""Per-token hidden states of a prompt: the names of the generating engine's own way out, and a second vLLM engine
in pooling mode.

vLLM's public API returns no hidden states from a generating engine. Qwen3-Omni's thinker hands out its own
(``hidden_connector.py``: a model that writes them into a cache-only layer and a KV connector that writes a
prompt's rows to a file; the constants below). Qwen2.5-Omni, whose talker reads the last layer of the prompt and
of the reply once the thinker finished, still runs a second ``AsyncLLM`` of the same folder with ``runner="pooling"`` and asks it for ``token_embed``
outputs without activation: one vector per prompt token, whatever the (out-of-tree, registered)
architecture named in ``hf_overrides`` returns from its ``forward``. It takes the very engine input
the generating engine got (vLLM's rendered prompt: token ids and processed media), so it sees the same
tokens and pixels.

Cost, per request that asks: one extra prefill of the prompt (encoders included) on this engine;
memory: this engine's weights (the family decides how much of the model it keeps) and a small KV cache.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from omnistage.pipeline import StageContext
from omnistage.stages.llm.threads import engine_closed, engine_env

# The other way, without a second engine (hidden_connector.py): the generating model writes the hidden state into a
# cache-only layer named LAYER.<n>, and a request that sets PATH_KEY in SamplingParams.extra_args["kv_transfer_params"]
# gets its prompt's rows in that file by its first token. CONNECTOR: the engine's kv_transfer_config for it.
PATH_KEY = "omnistage_hidden_path"
LAYER = "omnistage_hidden"
CONNECTOR = {"kv_connector": "PromptHiddenStatesConnector",
             "kv_connector_module_path": "omnistage.stages.llm.hidden_connector", "kv_role": "kv_producer"}


class HiddenStateEngine:
    def __init__(self, ctx: StageContext, engine_args: dict[str, Any], hf_overrides: dict[str, Any]):
        self.ctx = ctx
        keep = {"model", "dtype", "max_model_len", "enforce_eager", "trust_remote_code", "seed",
                "limit_mm_per_prompt", "tensor_parallel_size", "disable_log_stats", "kv_cache_memory_bytes",
                "gpu_memory_utilization", "max_num_batched_tokens"}
        self.args = {k: v for k, v in engine_args.items() if k in keep}
        self.args.update(runner="pooling", convert="embed", hf_overrides=hf_overrides,
                         enable_prefix_caching=False)  # each prompt is encoded once
        self.engine: Any = None
        self._ids = itertools.count()
        self.encoded = 0  # prompts encoded (the extra prefills this engine ran)

    async def start(self) -> None:
        from vllm import AsyncEngineArgs, AsyncLLMEngine
        from vllm.platforms import current_platform

        def build() -> Any:
            with engine_env(self.ctx.devices, self.ctx.deploy.num_threads, self.ctx.deploy.tp_size,
                            current_platform.is_cpu()):
                return AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**self.args))

        self.engine = await asyncio.to_thread(build)

    async def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)
            engine_closed()

    async def encode(self, engine_input: Any, request_id: str):
        """[prompt tokens, D] float tensor for the rendered ``engine_input``."""
        from vllm import PoolingParams

        rid = f"{request_id}-hidden-{next(self._ids)}"
        self.encoded += 1
        out = None
        async for out in self.engine.encode(engine_input, PoolingParams(task="token_embed", use_activation=False),
                                            request_id=rid):
            pass
        if out is None:
            raise RuntimeError(f"the hidden-state engine returned nothing for {request_id!r}")
        return out.outputs.data
