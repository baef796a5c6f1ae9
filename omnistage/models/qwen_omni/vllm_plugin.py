"""vLLM general plugin (entry point ``vllm.general_plugins``): registers the Qwen3-Omni thinker that hands its
hidden states out (``vllm_speaking.py``) with vLLM's public ``ModelRegistry`` in every vLLM process."""

SPEAKING_ARCHITECTURE = "OmnistageQwen3OmniThinkerSpeaking"


def register() -> None:
    from vllm import ModelRegistry

    if SPEAKING_ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(
            SPEAKING_ARCHITECTURE, "omnistage.models.qwen_omni.vllm_speaking:Qwen3OmniThinkerSpeakingForVLLM"
        )
