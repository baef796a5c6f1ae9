"""A codec-token speech LM (vLLM) streaming codes into a codec decoder: the stages of ``codec_tts``, which
``speech_chat`` speaks with, and the codecs, decoder and config that ``csm`` and ``qwen3_tts`` decode with."""
