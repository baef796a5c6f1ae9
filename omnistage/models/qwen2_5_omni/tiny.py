"""Tiny Qwen2.5-Omni (``Qwen2_5OmniForConditionalGeneration``): thinker, talker, token2wav (DiT + BigVGAN).

The real transformers classes throughout — the thinker with its Whisper-style audio encoder, the
Qwen2.5-VL vision encoder (window attention, full-attention blocks) and the Qwen2 language model with
M-RoPE; the talker (``thinker_to_talker_proj`` + a Qwen2 decoder over the 8448-entry codec vocabulary,
the release's codec control ids 8292..8296); token2wav's DiT (ECAPA speaker encoder, block attention,
RK4 flow sampler) and BigVGAN vocoder (240 samples per mel frame at 24 kHz) — with random (seeded)
float32 weights and a locally trained tokenizer holding the release's special tokens
(``<|AUDIO|>``, ``<|IMAGE|>``, ``<|VIDEO|>``, ``<|audio_bos|>``, ``<|vision_bos|>``, ...). The folder
has the release's layout: ``config.json``, safetensors, tokenizer, the processor's files
(``preprocessor_config.json``, ``video_preprocessor_config.json``, ``chat_template.json``) and
``spk_dict.pt`` (per speaker: ``bos_token`` — the thinker token the talker's text starts with —, ``cond``
[1, enc_emb_dim] and ``ref_mel`` [1, T, 80] for token2wav; speakers ``Chelsie`` and ``Ethan`` as in the
release). Head size 32 (vLLM's CPU attention takes 32/64/128). Smaller where it costs nothing
structural: 2 thinker and talker layers, a 2-layer DiT.

Two deliberate departures, both so random weights run the reference end to end: the DiT's codec
embedding covers the whole talker vocabulary (``num_embeds`` = 8448; the release's 8193 assumes a
trained talker that never emits a control code as speech), and the speaker / TTS token names are this
fixture's own (the release's ids differ; the model reads them by id from the config and ``spk_dict.pt``).

    python -m omnistage.testing.tiny qwen2_5_omni DIR
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.qwen_omni import MediaTokens, audio_encoder, processor_files, save_tokenizer
from omnistage.models.shared.tiny.qwen_omni import train_tokenizer as shared_tokenizer
from omnistage.models.shared.tiny.sizes import decoder, qwen_vision

HEAD_DIM = 32
HIDDEN = 2 * HEAD_DIM
MEL_BINS = 128  # the audio encoder's input (Whisper features)
MEL_DIM = 80  # token2wav's mel spectrogram
PATCH = 14
SPEAKERS = ("Chelsie", "Ethan")
CODEC = {
    "tts_codec_pad_token_id": 8292,
    "tts_codec_start_token_id": 8293,
    "tts_codec_end_token_id": 8294,
    "tts_codec_mask_token_id": 8296,
}
TALKER_VOCAB = 8448

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<|spk_chelsie|>",
    "<|spk_ethan|>",
]
TOKENS = MediaTokens(
    image="<|IMAGE|>",
    audio="<|AUDIO|>",
    video="<|VIDEO|>",
    vision_bos="<|vision_bos|>",
    vision_eos="<|vision_eos|>",
    audio_bos="<|audio_bos|>",
    audio_eos="<|audio_eos|>",
)
NAMED_TOKENS = TOKENS.named()  # tokenizer attributes the processor reads
CHAT_TEMPLATE = TOKENS.chat_template()


def train_tokenizer(vocab_size: int = 400):
    return shared_tokenizer(SPECIAL_TOKENS, CHAT_TEMPLATE, vocab_size)


def build_config(tok):
    from transformers import Qwen2_5OmniConfig

    ids = tok.convert_tokens_to_ids
    wide = 0.3  # a wide init gives peaked logits, so greedy choices are not near-ties
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}  # sums to head_dim / 2
    media = {
        "audio_token_index": ids("<|AUDIO|>"),
        "image_token_index": ids("<|IMAGE|>"),
        "video_token_index": ids("<|VIDEO|>"),
    }
    starts = {"audio_start_token_id": ids("<|audio_bos|>"), "audio_end_token_id": ids("<|audio_eos|>")}
    eos, pad = ids("<|im_end|>"), ids("<|endoftext|>")
    lm = {"rope_parameters": rope, "initializer_range": wide}  # the thinker's and the talker's language models
    thinker = dict(
        audio_config=audio_encoder(MEL_BINS, HIDDEN, HIDDEN, 50, wide),
        vision_config=dict(
            qwen_vision(HIDDEN, HIDDEN, patch=PATCH, depth=2, ffn=64),
            window_size=56,
            fullatt_block_indexes=[1],
            in_channels=3,
            initializer_range=wide,
            # in the release's config; vLLM's use_audio_in_video and M-RoPE read it
            tokens_per_second=25,
        ),
        text_config=dict(
            decoder(len(tok), HIDDEN, max_positions=4096),
            **lm,
            tie_word_embeddings=False,
            pad_token_id=pad,
            eos_token_id=eos,
        ),
        vision_start_token_id=ids("<|vision_bos|>"),
        vision_end_token_id=ids("<|vision_eos|>"),
        position_id_per_seconds=25,
        seconds_per_chunk=2,
        user_token_id=tok.encode("user", add_special_tokens=False)[0],
        initializer_range=wide,
        pad_token_id=pad,
        **media,
        **starts,
    )
    talker = dict(
        decoder(TALKER_VOCAB, HIDDEN, head_dim=HEAD_DIM, max_positions=4096),
        embedding_size=HIDDEN,
        **lm,
        tts_text_start_token_id=ids("<tts_text_bos>"),
        tts_text_end_token_id=ids("<tts_text_eod>"),
        tts_text_pad_token_id=ids("<tts_pad>"),
        vision_start_token_id=ids("<|vision_bos|>"),
        vision_end_token_id=ids("<|vision_eos|>"),
        position_id_per_seconds=25,
        seconds_per_chunk=2,
        spatial_merge_size=2,
        **media,
        **starts,
        **CODEC,
    )
    return Qwen2_5OmniConfig(
        thinker_config=thinker,
        talker_config=talker,
        token2wav_config=_token2wav_config(wide),
        enable_audio_output=True,
        torch_dtype="float32",
        architectures=["Qwen2_5OmniForConditionalGeneration"],
    )


def _token2wav_config(wide):
    """The DiT (ECAPA speaker encoder, block attention) and BigVGAN vocoder, shrunk."""
    dit = dict(
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        ff_mult=2,
        emb_dim=32,
        num_embeds=TALKER_VOCAB,
        mel_dim=MEL_DIM,
        repeats=2,
        block_size=24,
        look_ahead_layers=[1],
        look_backward_layers=[0],
        enc_emb_dim=32,
        enc_dim=32,
        enc_channels=[32, 32, 32, 64],
        enc_kernel_sizes=[5, 3, 3, 1],
        enc_dilations=[1, 2, 3, 1],
        enc_attention_channels=16,
        enc_res2net_scale=2,
        enc_se_channels=16,
        initializer_range=wide,
    )
    bigvgan = dict(
        mel_dim=MEL_DIM,
        upsample_initial_channel=128,
        resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1, 3, 5]],
        upsample_rates=[5, 3, 2, 2, 2, 2],
        upsample_kernel_sizes=[11, 7, 4, 4, 4, 4],
    )
    return {"dit_config": dit, "bigvgan_config": bigvgan}


def build(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2_5OmniForConditionalGeneration

    outdir = Path(outdir)
    tok = train_tokenizer()
    config = build_config(tok)
    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():
        # normal(0, 0.02) convolutions shrink the signal at every layer (BigVGAN's output would be ~0): PyTorch's
        # own fan-in init gives speech-level amplitudes, so the waveform comparisons compare real signal
        for module in model.token2wav.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                module.reset_parameters()
    model.save_pretrained(outdir)
    GenerationConfig(
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>")
    ).save_pretrained(outdir)
    save_tokenizer(outdir, tok, NAMED_TOKENS)
    _speakers(outdir, tok, config, seed)
    _processor_files(outdir)


def _speakers(outdir: Path, tok, config, seed: int) -> None:
    """``spk_dict.pt`` as the release lays it out: per speaker the talker's text bos token and token2wav's
    speaker embedding (``cond``) and reference mel (``ref_mel``)."""
    import torch

    dit = config.token2wav_config.dit_config
    g = torch.Generator().manual_seed(seed + 1)
    speakers = {
        name: {
            "bos_token": tok.convert_tokens_to_ids(f"<|spk_{name.lower()}|>"),
            "cond": torch.randn(1, dit.enc_emb_dim, generator=g),
            "ref_mel": torch.randn(1, 64, dit.mel_dim, generator=g),
        }
        for name in SPEAKERS
    }
    torch.save(speakers, outdir / "spk_dict.pt")


def _processor_files(outdir: Path) -> None:
    """The processor's files as the release has them."""
    vision = {
        "patch_size": PATCH,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_pixels": 28 * 28,
        "max_pixels": 56 * 56,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    }
    audio = {
        "feature_size": MEL_BINS,
        "sampling_rate": 16000,
        "hop_length": 160,
        "chunk_length": 300,
        "n_fft": 400,
        "n_samples": 4800000,
        "nb_max_frames": 30000,
    }
    processor_files(
        outdir,
        CHAT_TEMPLATE,
        "Qwen2_5OmniProcessor",
        vision,
        audio,
        {"size": {"shortest_edge": 28 * 28, "longest_edge": 56 * 56}},
    )
