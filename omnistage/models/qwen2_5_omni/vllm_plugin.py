"""vLLM general plugin (entry point ``vllm.general_plugins``): registers the Qwen2.5-Omni thinker with
transformers' M-RoPE positions (``vllm_thinker.py``) with vLLM's public ``ModelRegistry`` in every vLLM process."""

THINKER_ARCHITECTURE = "OmnistageQwen2_5OmniThinker"


def register() -> None:
    from vllm import ModelRegistry

    if THINKER_ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(THINKER_ARCHITECTURE,
                                     "omnistage.models.qwen2_5_omni.vllm_thinker:Qwen2_5OmniThinkerForVLLM")
