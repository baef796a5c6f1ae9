"""A tiny random-weight VibeVoice folder (transformers' classes, seeded, float32), built in a few seconds offline:

    python -m omnistage.testing.tiny vibevoice DIR

The tokenizer is trained locally and its chat template is this fixture's own (the releases ship theirs with
the checkpoint): a ``Voice input:`` block when turns carry voice clips (the processor's voice prompts), one
``Speaker N:`` line per turn, then ``<|vision_start|>`` (VibeVoice's start of speech).
Random weights rarely choose VibeVoice's speech tokens, so the LM head keeps only random rows for the speech
token and (smaller) the end: the tiny model speaks several frames, starts a new speech segment (audio_bos) on
the way and ends, as a trained one does; the acoustic decoder's last convolution is scaled up so that its audio
is loud enough to survive 16-bit output.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.sizes import decoder

AUDIO_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"]  # audio bos / eos / diffusion token
HEAD_SEED = 7  # rows under which the tests' scripts (noise seed 3) speak 5 frames with audio_bos restarts
DECODER_GAIN = 2e4  # the acoustic decoder's last convolution, scaled: audio peaks near 0.15 (the same tokens)
# a "Voice input" block first when some turn carries an audio part (one placeholder per voiced speaker, which the
# processor widens to the clip's frames); string contents (the tokenizer's path) render as they always did
CHAT_TEMPLATE = (
    "{% set ns = namespace(voiced=[]) %}{% for m in messages %}{% if m['content'] is not string %}"
    "{% for item in m['content'] %}{% if item['type'] == 'audio' and m['role'] not in ns.voiced %}"
    "{% set ns.voiced = ns.voiced + [m['role']] %}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if ns.voiced %}Voice input:{{ '\\n' }}{% for s in ns.voiced %}"
    " Speaker {{ s }}:<|vision_start|><|vision_pad|><|vision_end|>{{ '\\n' }}{% endfor %}{% endif %}"
    "Text input:\n{% for m in messages %} Speaker {{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for item in m['content'] if item['type'] == 'text' %}{{ item['text'] }}{% endfor %}{% endif %}"
    "{{ '\\n' }}{% endfor %}Speech output:\n<|vision_start|>"
)


def build(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        VibeVoiceAcousticTokenizerFeatureExtractor,
        VibeVoiceConfig,
        VibeVoiceForConditionalGeneration,
        VibeVoiceProcessor,
    )

    from omnistage.models.shared.tiny.chat import train_tokenizer

    outdir = Path(outdir)
    tok = train_tokenizer(extra_special_tokens=AUDIO_TOKENS)
    tok.chat_template = CHAT_TEMPLATE
    ids = {t: tok.convert_tokens_to_ids(t) for t in ["<|endoftext|>", *AUDIO_TOKENS]}
    hidden = 64
    codec = dict(hidden_size=8, num_filters=4, downsampling_ratios=[2, 4], depths=[1, 1, 1], kernel_size=3)
    config = VibeVoiceConfig(
        text_config=dict(decoder(len(tok), hidden, head_dim=32, ffn=96), model_type="qwen2", tie_word_embeddings=False),
        audio_config=codec,
        semantic_model_config=dict(codec),
        diffusion_head_config=dict(
            hidden_size=hidden, latent_size=8, num_hidden_layers=1, intermediate_size=96, frequency_embedding_size=32
        ),
        pad_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
        audio_bos_token_id=ids["<|vision_start|>"],
        audio_eos_token_id=ids["<|vision_end|>"],
        audio_token_id=ids["<|vision_pad|>"],
        architectures=["VibeVoiceForConditionalGeneration"],
    )
    torch.manual_seed(seed)
    model = VibeVoiceForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():  # the other rows stay 0: audio_bos wins when both turn negative (a new speech segment)
        g = torch.Generator().manual_seed(HEAD_SEED)
        model.lm_head.weight.zero_()
        model.lm_head.weight[config.audio_token_id] = torch.randn(hidden, generator=g)
        model.lm_head.weight[config.eos_token_id] = 0.1 * torch.randn(hidden, generator=g)  # the end: rarer
        for p in model.model.audio_tower.decoder.head.parameters():  # random weights speak at ~1e-5, which 16-bit
            p.mul_(DECODER_GAIN)  # output rounds to silence: louder, the HTTP tests compare real samples
    model.save_pretrained(outdir)
    GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_new_tokens=64,
        guidance_scale=1.3,
        num_diffusion_steps=4,
        noise_scheduler_class="DPMSolverMultistepScheduler",
        noise_scheduler_config={"beta_schedule": "squaredcos_cap_v2", "prediction_type": "v_prediction"},
    ).save_pretrained(outdir)
    # voice prompts: the processor pads a clip to whole frames of the acoustic encoder (its hop)
    features = VibeVoiceAcousticTokenizerFeatureExtractor(pad_to_multiple_of=config.audio_config.hop_length)
    VibeVoiceProcessor(features, tok, chat_template=CHAT_TEMPLATE).save_pretrained(outdir)
