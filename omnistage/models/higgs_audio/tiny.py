"""Tiny Higgs Audio v2 folder: the LM (``HiggsAudioV2ForConditionalGeneration``), its tokenizer and chat
template, and the audio tokenizer in ``audio_tokenizer/`` (``HiggsAudioV2TokenizerModel``'s weights).

    python -m omnistage.testing.tiny higgs_audio DIR

The real classes' layouts with random (seeded) float32 weights and a locally trained byte-level BPE
tokenizer holding the release's special tokens. Structure follows the release where it matters: 24 kHz
audio at 25 frames/s (a DAC decoder upsampling 8*5*4*2*3 = 960), codebooks of 1024 codes plus the stream
BOS/EOS ids (1026 LM logits per codebook), the release's chat template. Smaller where it costs nothing
structural: 4 codebooks (the release: 8), a 2-layer LM of width 64, thin DAC/HuBERT parts.

The audio tokenizer's model class imports torchaudio (only its encoder's resampling uses it), which has
no build for this torch: its weights are written here from the parts that import cleanly (transformers'
``DacModel`` and ``HubertModel``) and modules of the same names and shapes for the rest, so that
``HiggsAudioV2TokenizerModel.from_pretrained`` (in the reference environment,
``scripts/reference/higgs_audio/``) loads every key.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

NUM_CODEBOOKS = 4
CODEBOOK_SIZE = 1024  # codes per codebook; the LM adds stream BOS (1024) and EOS (1025)
SAMPLE_RATE = 24000
SEMANTIC = 16  # HuBERT width
ACOUSTIC = 16  # DAC latent width
CODEBOOK_DIM = 8
SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|audio_out_bos|>",
    "<|AUDIO|>",
    "<|AUDIO_OUT|>",
    "<|scene_desc_start|>",
    "<|scene_desc_end|>",
    "<|reserved_special_token_6|>",  # the delay token
]
# The release's chat template (transformers' conversion of bosonai/higgs-audio-v2-generation-3B-base): a
# system turn (an optional "scene" turn is folded into it), user turns of text, assistant turns of one audio
# (a reference clip); the generation prompt opens an audio-out turn.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- if messages[0]['content'] is string %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- else %}{%- set system_message = messages[0]['content'][0]['text']|trim %}{%- endif %}"
    "{%- set messages = messages[1:] %}"
    "{%- else %}{{- raise_exception('A system message is required but not provided!') }}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{{- system_message }}"
    "{%- if messages and messages[0]['role'] == 'scene' %}"
    "{{- '\\n\\n<|scene_desc_start|>\\n' }}"
    "{%- if messages[0]['content'] is string %}{{- messages[0]['content'] | trim }}"
    "{%- else %}{%- for item in messages[0]['content'] %}"
    "{%- if item['type'] == 'text' %}{{- item['text'] | trim }}"
    "{%- if loop.first and not loop.last %}{{- '\\n\\n' }}{%- endif %}"
    "{%- if not loop.first and not loop.last and messages[0]['content'][loop.index]['type'] != 'audio' %}"
    "{{- '\\n' }}{%- endif %}"
    "{%- elif item['type'] == 'audio' %}{{- ' <|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>' }}"
    "{%- if not loop.last %}{{- '\\n' }}{%- endif %}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '\\n<|scene_desc_end|>' }}{%- set messages = messages[1:] %}"
    "{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- if message['content'] is string or message['content'][0]['type'] != 'audio' %}"
    "{{- raise_exception('Assistant messages must contain audio content only!') }}{%- endif %}"
    "{{- '<|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>' }}"
    "{%- else %}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for item in message['content'] %}{%- if item['type'] == 'text' %}{{- item['text'] | trim }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n<|audio_out_bos|>' }}"
    "{%- endif %}"
)
_CORPUS = [
    "generate audio following instruction. audio is recorded from a quiet room.",
    "[SPEAKER0] hello there, how are you today? [SPEAKER1] i am fine, thank you.",
    "the sun rises in the east and sets in the west. a clip of my voice.",
    "system user assistant scene SPEAKER0: feminine SPEAKER1: masculine",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]


def _tokenizer():
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(_CORPUS * 20, vocab_size=320, new_special_tokens=SPECIAL)
    tok.bos_token, tok.eos_token, tok.pad_token = "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>"
    return tok


def _audio_tokenizer_config():
    from transformers.models.higgs_audio_v2_tokenizer.configuration_higgs_audio_v2_tokenizer import (
        HiggsAudioV2TokenizerConfig,
    )

    return HiggsAudioV2TokenizerConfig(
        target_bandwidths=[0.5, 1.0],  # 1 kbps at 25 Hz and 10 bits a code: 4 codebooks
        sample_rate=SAMPLE_RATE,
        codebook_size=CODEBOOK_SIZE,
        codebook_dim=CODEBOOK_DIM,
        acoustic_model_config={
            "encoder_hidden_size": 4,
            "downsampling_ratios": [8, 5, 4, 2, 3],
            "upsampling_ratios": [8, 5, 4, 2, 3],
            "decoder_hidden_size": 32,
            "hidden_size": ACOUSTIC,
            "sampling_rate": SAMPLE_RATE,
        },
        semantic_model_config={
            "hidden_size": SEMANTIC,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "conv_dim": [8] * 7,
            "num_conv_pos_embeddings": 16,
            "num_conv_pos_embedding_groups": 4,
        },
    )


def _audio_tokenizer_weights(cfg) -> dict:
    """Every key ``HiggsAudioV2TokenizerModel`` loads, by the names and shapes of its modules."""
    import torch
    from torch import nn
    from transformers import DacModel, HubertModel

    s, k, uk = cfg.semantic_hidden_size, cfg.kernel_size, cfg.unit_kernel_size

    def unit() -> nn.Module:
        m = nn.Module()
        m.conv1 = nn.Conv1d(s, s, uk, bias=False)
        m.conv2 = nn.Conv1d(s, s, 1, bias=False)
        return m

    def block() -> nn.Module:  # stride 1 everywhere in the release's semantic blocks
        m = nn.Module()
        m.res_units = nn.ModuleList([unit() for _ in cfg.block_dilations])
        m.conv = nn.Conv1d(s, s, 3, bias=True)
        return m

    encoder = nn.Module()
    encoder.conv = nn.Conv1d(s, s, k, bias=False)
    encoder.conv_blocks = nn.ModuleList([block() for _ in cfg.strides])
    decoder = nn.Module()
    decoder.conv1 = nn.Conv1d(s, s, k, bias=False)
    decoder.conv_blocks = nn.ModuleList([block() for _ in cfg.strides])
    decoder.conv2 = nn.Conv1d(s, s, k, bias=False)
    h = cfg.hidden_size
    quantizers = nn.ModuleList()
    for _ in range(cfg.num_quantizers):
        q = nn.Module()
        q.project_in = nn.Linear(h, cfg.codebook_dim)
        q.project_out = nn.Linear(cfg.codebook_dim, h)
        quantizers.append(q)
    acoustic = DacModel(cfg.acoustic_model_config)
    out: dict[str, torch.Tensor] = {}
    for prefix, module in (
        ("acoustic_encoder.", acoustic.encoder),
        ("acoustic_decoder.", acoustic.decoder),
        ("encoder_semantic.", encoder),
        ("decoder_semantic.", decoder),
        ("semantic_model.", HubertModel(cfg.semantic_model_config)),
        ("fc.", nn.Linear(h, h)),
        ("fc1.", nn.Linear(h, s)),
        ("fc2.", nn.Linear(h, cfg.acoustic_model_config.hidden_size)),
        ("quantizer.quantizers.", quantizers),
    ):
        for name, t in module.state_dict().items():
            if name != "masked_spec_embed":
                out[prefix + name] = t.detach().clone().contiguous()
    for i in range(cfg.num_quantizers):
        embed = torch.randn(cfg.codebook_size, cfg.codebook_dim)
        p = f"quantizer.quantizers.{i}.codebook."
        out.update(
            {
                p + "inited": torch.ones(1),
                p + "cluster_size": torch.ones(cfg.codebook_size),
                p + "embed": embed,
                p + "embed_avg": embed.clone(),
            }
        )
    return out


def build(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import (
        DacFeatureExtractor,
        GenerationConfig,
        HiggsAudioV2Config,
        HiggsAudioV2ForConditionalGeneration,
    )

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    tok.save_pretrained(outdir)
    (outdir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    DacFeatureExtractor(
        feature_size=1,
        hop_length=1,
        padding_side="right",
        padding_value=0.0,
        sampling_rate=SAMPLE_RATE,
        return_attention_mask=True,
    ).save_pretrained(outdir)
    ids = tok.convert_tokens_to_ids
    (outdir / "processor_config.json").write_text(
        json.dumps(
            {
                "processor_class": "HiggsAudioV2Processor",
                "audio_token": "<|AUDIO_OUT|>",
                "audio_bos_token": "<|audio_out_bos|>",
                "audio_eos_token": "<|audio_eos|>",
                "audio_delay_token": "<|reserved_special_token_6|>",
                "audio_stream_bos_id": CODEBOOK_SIZE,
                "audio_stream_eos_id": CODEBOOK_SIZE + 1,
                "audio_tokenizer": {
                    "audio_tokenizer_class": "HiggsAudioV2TokenizerModel",
                    "audio_tokenizer_name_or_path": "audio_tokenizer",
                },
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )

    torch.manual_seed(seed)
    config = HiggsAudioV2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        num_codebooks=NUM_CODEBOOKS,
        codebook_size=CODEBOOK_SIZE + 2,
        audio_token_id=ids("<|AUDIO_OUT|>"),
        audio_bos_token_id=ids("<|audio_out_bos|>"),
        audio_delay_token_id=ids("<|reserved_special_token_6|>"),
        audio_stream_bos_id=CODEBOOK_SIZE,
        audio_stream_eos_id=CODEBOOK_SIZE + 1,
        pad_token_id=ids("<|end_of_text|>"),
        bos_token_id=ids("<|begin_of_text|>"),
        eos_token_id=ids("<|eot_id|>"),
    )
    model = HiggsAudioV2ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # every parameter drawn from the seed (norm weights too)
            p.normal_(0.0, 0.5 if p.dim() == 1 else 0.2)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=50,
        top_p=0.95,
        ras_win_len=7,  # the release's repetition-aware sampling window
        ras_win_max_num_repeat=2,
    )
    model.save_pretrained(outdir, safe_serialization=True)

    audio_dir = outdir / "audio_tokenizer"
    audio_dir.mkdir(exist_ok=True)
    cfg = _audio_tokenizer_config()
    cfg.architectures = ["HiggsAudioV2TokenizerModel"]
    cfg.save_pretrained(audio_dir)
    torch.manual_seed(seed + 1)
    save_file(_audio_tokenizer_weights(cfg), str(audio_dir / "model.safetensors"), metadata={"format": "pt"})
