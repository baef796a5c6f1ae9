"""vLLM general plugin (entry point ``vllm.general_plugins``): registers the Qwen3-Omni thinker's hidden-state
model (``vllm_hidden.py``) with vLLM's public ``ModelRegistry`` in every vLLM process."""

HIDDEN_ARCHITECTURE = "OmnistageQwen3OmniThinkerHidden"


def register() -> None:
    from vllm import ModelRegistry

    if HIDDEN_ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(HIDDEN_ARCHITECTURE,
                                     "omnistage.models.qwen_omni.vllm_hidden:Qwen3OmniThinkerHiddenForVLLM")
