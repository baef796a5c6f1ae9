"""vLLM general plugin (entry point ``vllm.general_plugins``): registers the Qwen3-Omni thinker's
language model (``vllm_thinker.py``) with vLLM's public ``ModelRegistry`` in every vLLM process."""

ARCHITECTURE = "OmnistageQwen3OmniThinkerText"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE,
                                     "omnistage.models.qwen_omni.vllm_thinker:Qwen3OmniThinkerTextForVLLM")
