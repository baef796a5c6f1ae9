"""Tiny Qwen3-Omni (``Qwen3OmniMoeForConditionalGeneration``): thinker, talker, code2wav.

The real transformers classes throughout — the thinker with its audio encoder
(AuT), vision encoder (with a deepstack layer) and MoE language model, the MoE
talker with its text/hidden projections and multi-token code predictor, and the
causal code2wav decoder — with random (seeded) float32 weights and a locally
trained tokenizer holding the real special tokens. Structure follows the
released checkpoint: the real codec special ids and speakers (``chelsie``,
``ethan``, ``aiden``), a 3072-entry talker vocabulary of which the last 1024
ids are control codes, code2wav's upsampling (1920 samples per frame at
24 kHz), the talker reading a middle thinker layer (``accept_hidden_layer``),
deepstack visual features added to the first thinker layer. Head size 32 (vLLM's
CPU attention takes 32/64/128). Smaller where it costs nothing structural: 3
thinker layers, 4 experts, 4 code groups (the release has 16). No downloads:

    python -m omnistage.testing.tiny qwen3_omni DIR

The folder also holds the processor's files as the release lays them out
(``preprocessor_config.json`` for the Whisper-style feature extractor and the
image processor, ``video_preprocessor_config.json``, ``chat_template.json``), so
``Qwen3OmniMoeProcessor.from_pretrained`` (the tests' reference) and vLLM load it.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.qwen_omni import (
    QWEN3_AUDIO,
    QWEN3_AUDIO_TOKENS,
    MediaTokens,
    audio_encoder,
    processor_files,
    save_tokenizer,
)
from omnistage.models.shared.tiny.qwen_omni import train_tokenizer as shared_tokenizer
from omnistage.models.shared.tiny.sizes import decoder, qwen_vision

SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}  # the release's talker speaker ids
CODEC = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}
TALKER_VOCAB = 3072
CODEBOOK = 2048
CODE_GROUPS = 4
HEAD_DIM = 32
HIDDEN = 2 * HEAD_DIM
SAMPLE_RATE = 24000
MEL_BINS = 128
N_WINDOW = 50
MOE = {"moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2}

SPECIAL_TOKENS = [
    *QWEN3_AUDIO_TOKENS,
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
]
TOKENS = MediaTokens(
    image="<|image_pad|>",
    audio="<|audio_pad|>",
    video="<|video_pad|>",
    vision_bos="<|vision_start|>",
    vision_eos="<|vision_end|>",
    audio_bos="<|audio_start|>",
    audio_eos="<|audio_end|>",
)
NAMED_TOKENS = TOKENS.named()  # tokenizer attributes the processor reads
CHAT_TEMPLATE = TOKENS.chat_template()


def train_tokenizer(vocab_size: int = 400):
    return shared_tokenizer(SPECIAL_TOKENS, CHAT_TEMPLATE, vocab_size)


def build_config(tok):
    from transformers import Qwen3OmniMoeConfig

    ids = tok.convert_tokens_to_ids

    def role(r):
        return tok.encode(r, add_special_tokens=False)[0]

    rope = {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "mrope_section": [6, 5, 5],
        "interleaved": True,
        "mrope_interleaved": True,
    }
    media = {
        "audio_token_id": ids("<|audio_pad|>"),
        "image_token_id": ids("<|image_pad|>"),
        "video_token_id": ids("<|video_pad|>"),
    }
    eos = ids("<|im_end|>")
    wide = 0.3  # a wide init gives peaked logits, so greedy choices are not near-ties
    parts = (tok, ids, role, rope, media, wide)
    thinker, talker = _thinker_config(*parts), _talker_config(*parts)
    code2wav = _code2wav_config(wide)
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        enable_audio_output=True,
        im_start_token_id=ids("<|im_start|>"),
        im_end_token_id=eos,
        tts_pad_token_id=ids("<tts_pad>"),
        tts_bos_token_id=ids("<tts_text_bos>"),
        tts_eos_token_id=ids("<tts_text_eod>"),
        system_token_id=role("system"),
        user_token_id=role("user"),
        assistant_token_id=role("assistant"),
        torch_dtype="float32",
        architectures=["Qwen3OmniMoeForConditionalGeneration"],
    )


def _moe_lm(vocab_size: int, layers: int, max_positions: int, rope, wide: float, **extra) -> dict:
    """The thinker's and the talker's mixture-of-experts language models."""
    sizes = decoder(vocab_size, HIDDEN, layers=layers, head_dim=HEAD_DIM, max_positions=max_positions)
    return dict(sizes, **MOE, rope_parameters=dict(rope), initializer_range=wide, **extra)


def _thinker_config(tok, ids, role, rope, media, wide):
    eos, pad = ids("<|im_end|>"), ids("<|endoftext|>")
    return dict(
        audio_config=audio_encoder(MEL_BINS, HEAD_DIM, HIDDEN, N_WINDOW, wide, n_window_infer=400, **QWEN3_AUDIO),
        vision_config=dict(
            qwen_vision(HEAD_DIM, HIDDEN, depth=2),
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
            initializer_range=wide,
            # both in the release's config; vLLM's vision tower reads them (transformers does not)
            image_size=8 * 16,
            apply_vit_abs_pos_embed=True,
        ),
        text_config=_moe_lm(
            len(tok),
            3,
            2048,
            rope,
            wide,
            norm_topk_prob=True,
            pad_token_id=pad,
            eos_token_id=eos,
            tie_word_embeddings=False,
        ),
        audio_start_token_id=ids("<|audio_start|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        # in the release's config and read by vLLM's use_audio_in_video processing (transformers does not)
        audio_end_token_id=ids("<|audio_end|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        seconds_per_chunk=2,
        user_token_id=role("user"),
        position_id_per_seconds=13,
        initializer_range=wide,
        **media,
    )


def _talker_config(tok, ids, role, rope, media, wide):
    return dict(
        text_config=_moe_lm(
            TALKER_VOCAB, 2, 4096, rope, wide, norm_topk_prob=False, shared_expert_intermediate_size=32
        ),
        code_predictor_config=dict(
            decoder(CODEBOOK, HIDDEN, layers=1, head_dim=HEAD_DIM, max_positions=64),
            num_code_groups=CODE_GROUPS,
            initializer_range=wide,
        ),
        num_code_groups=CODE_GROUPS,
        thinker_hidden_size=HIDDEN,
        accept_hidden_layer=2,
        speaker_id=dict(SPEAKERS),
        vision_start_token_id=ids("<|vision_start|>"),
        audio_start_token_id=ids("<|audio_start|>"),
        position_id_per_seconds=13,
        spatial_merge_size=2,
        initializer_range=wide,
        **media,
        **CODEC,
    )


def _code2wav_config(wide):
    return dict(
        codebook_size=CODEBOOK,
        hidden_size=HEAD_DIM,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_hidden_layers=1,
        intermediate_size=64,
        sliding_window=72,
        num_quantizers=CODE_GROUPS,
        upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
        decoder_dim=32,
        max_position_embeddings=8000,
        initializer_range=wide,
    )


def build(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration

    outdir = Path(outdir)
    tok = train_tokenizer()
    config = build_config(tok)
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():
        # code2wav's normal(0, 0.02) init shrinks the signal at every convolution (the output would be ~1e-8):
        # PyTorch's own fan-in init and unit code embeddings give speech-level amplitudes (std ~0.08, unclipped),
        # so the waveform comparisons in the tests compare real signal.
        for module in model.code2wav.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                module.reset_parameters()
        model.code2wav.code_embedding.weight.normal_(0.0, 1.0)
        # transformers 5 leaves the talker's fused MoE expert tensors as torch.empty (its _init_weights has
        # no rule for them): the folder held whatever memory was there — different on every build, NaN on a
        # bad day. Give them the config's normal init so the fixture is deterministic.
        std = config.talker_config.text_config.initializer_range
        for name, module in model.talker.named_modules():
            if name.endswith("mlp.experts"):
                for param in module.parameters(recurse=False):
                    param.normal_(0.0, std)
    model.save_pretrained(outdir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad).save_pretrained(outdir)
    save_tokenizer(outdir, tok, NAMED_TOKENS)
    _processor_files(outdir)


def _processor_files(outdir: Path) -> None:
    """The processor's files as the release has them."""
    vision = {
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_pixels": 32 * 32,
        "max_pixels": 64 * 64,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    audio = {"feature_size": MEL_BINS, "sampling_rate": 16000, "hop_length": 160, "chunk_length": 300, "n_fft": 400}
    processor_files(outdir, CHAT_TEMPLATE, "Qwen3OmniMoeProcessor", vision, audio)
