"""Tiny random-weight Qwen3-TTS checkpoints, built with qwen-tts 0.1.1's own classes (run in the reference
venv that ``setup.sh`` builds, not in omnistage's).

    HF_HUB_OFFLINE=1 /work/refvenv/qwen3_tts/bin/python make_tiny.py OUT [SEED=4]

Writes OUT/{custom_voice,voice_design,base,custom_voice_0b6}/ in the released repos' layout (config.json,
generation_config.json, model.safetensors, preprocessor_config.json, tokenizer_config.json, vocab.json,
merges.txt, speech_tokenizer/{config.json, configuration.json, model.safetensors,
preprocessor_config.json}). The three share the talker, code predictor and speech tokenizer weights;
custom_voice has three preset speakers (one a Beijing-dialect speaker), base the ECAPA speaker encoder.

Why these checkpoints are committed (tests/models/qwen3_tts/tiny/) rather than rebuilt by omnistage:
the classes that define the weight layout exist only in qwen-tts (transformers 4.57), so the honest
way to know the weights the reference ran with is to keep the very files it loaded (under 1 MB each).

Shapes: real layouts in miniature (1.7B-style: code-predictor hidden != talker hidden, so
``small_to_mtp_projection`` is a real Linear; ``custom_voice_0b6`` is the 0.6B style, equal widths, Identity); 4 code groups of 64 codes (real: 16 of 2048), codec
control ids placed where the release puts them relative to the codebook. Weights are O(1)-scale
seeded normals (not the package's tiny init) so logits are far from ties: with seed 4 every greedy
step's top-1/top-2 margin is >= 1e-3.
"""

import json
import math
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from torch import nn
from transformers import EncodecFeatureExtractor, Qwen2TokenizerFast

CODES = 64  # codebook size
GROUPS = 4  # code groups per frame
VOCAB = CODES + 1024  # the talker's vocabulary: codes, then 1024 control ids (all but EOS suppressed)
HIDDEN, CP_HIDDEN, TEXT_HIDDEN = 32, 24, 24
# folder -> (tts_model_type, tts_model_size); the 0.6B layout last, so the others' seeded weights are unchanged
KINDS = {
    "custom_voice": ("custom_voice", "1b7"),
    "voice_design": ("voice_design", "1b7"),
    "base": ("base", "1b7"),
    "custom_voice_0b6": ("custom_voice", "0b6"),
}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|tts_pad|>", "<|tts_text_bos|>", "<|tts_text_eod|>"]
SPEAKERS = {"vivian": 1017, "ryan": 1013, "dylan": 830}  # offsets from CODES
DIALECTS = {"vivian": False, "ryan": False, "dylan": "beijing_dialect"}
LANGUAGES = {
    "chinese": 7,
    "english": 2,
    "german": 5,
    "spanish": 6,
    "japanese": 10,
    "french": 13,
    "korean": 16,
    "russian": 21,
    "italian": 22,
    "portuguese": 23,
    "beijing_dialect": 26,
    "sichuan_dialect": 14,
}
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)  # Qwen2's pre-tokenizer
TEXTS = [
    "assistant\n",
    "user\n",
    "Hello world. This is a tiny test of speech synthesis.",
    "The quick brown fox jumps over the lazy dog.",
    "Speak slowly and clearly, with a warm voice.",
    "She said she would be here by noon.",
    "A calm, deep male voice.",
    "Numbers 0123456789!?,.;:",
    "你好，世界。今天天气很好。",
    "これはテストです。",
]
GENERATION = {
    "do_sample": True,
    "repetition_penalty": 1.05,
    "temperature": 0.9,
    "top_p": 1.0,
    "top_k": 50,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_p": 1.0,
    "subtalker_top_k": 50,
    "max_new_tokens": 8192,
}  # the released generation_config.json


def text_tokenizer(scratch):
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        TEXTS * 20,
        trainers.BpeTrainer(
            vocab_size=400, min_frequency=2, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    os.makedirs(scratch, exist_ok=True)
    bpe.model.save(scratch)
    tok = Qwen2TokenizerFast(
        vocab_file=f"{scratch}/vocab.json",
        merges_file=f"{scratch}/merges.txt",
        unk_token=None,
        bos_token=None,
        eos_token=SPECIAL[0],
        pad_token=SPECIAL[0],
    )
    tok.add_special_tokens({"additional_special_tokens": SPECIAL[1:]})
    tok.model_max_length = 32768
    # the package slices the role (3 tokens) and the closing "<|im_end|>\n<|im_start|>assistant\n" (5)
    ids = tok("<|im_start|>assistant\nHi.<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    assert ids[:3] == tok("<|im_start|>assistant\n")["input_ids"], ids
    assert ids[-5:] == tok("<|im_end|>\n<|im_start|>assistant\n")["input_ids"], ids
    return tok


@torch.no_grad()
def randomize(module, seed):
    """Every floating parameter/buffer -> seeded values of a scale that keeps activations O(1)."""
    g = torch.Generator().manual_seed(seed)
    seen = set()

    def normal(t, std, mean=0.0):
        t.copy_(torch.randn(t.shape, generator=g) * std + mean)

    for mname, mod in module.named_modules():
        tensors = list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False))
        for name, t in tensors:
            key = f"{mname}.{name}"
            if key in seen or not torch.is_floating_point(t):
                continue
            seen.add(key)
            if name == "initialized":
                t.fill_(1.0)
            elif name == "cluster_usage":
                t.copy_(torch.rand(t.shape, generator=g) * 1.5 + 0.5)
            elif name in ("embed_sum", "embedding_sum"):
                normal(t, 1.0)
            elif name in ("alpha", "beta"):  # SnakeBeta, log scale
                normal(t, 0.2)
            elif name in ("scale", "gamma"):  # layer scale / ConvNeXt gamma
                t.copy_(torch.rand(t.shape, generator=g) * 0.4 + 0.1)
            elif t.dim() == 1 and name == "weight":  # norms
                normal(t, 0.1, 1.0)
            elif name == "bias":
                normal(t, 0.05)
            elif isinstance(mod, nn.Embedding):
                normal(t, 1.0)
            elif t.dim() >= 2:
                fan_in = t.shape[1] * (t.shape[2] if t.dim() > 2 else 1)
                if isinstance(mod, nn.ConvTranspose1d):
                    fan_in = t.shape[0] * t.shape[2] / mod.stride[0]
                normal(t, 1.0 / math.sqrt(fan_in))
            else:
                normal(t, 0.1)
    return module


def talker_config(text_vocab, cp_hidden):
    ids = {
        k: CODES + v
        for k, v in {
            "codec_pad_id": 100,
            "codec_bos_id": 101,
            "codec_eos_token_id": 102,
            "codec_think_id": 106,
            "codec_nothink_id": 107,
            "codec_think_bos_id": 108,
            "codec_think_eos_id": 109,
        }.items()
    }
    return dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        hidden_act="silu",
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=10000,
        attention_bias=False,
        rope_scaling={"rope_type": "default", "mrope_section": [2, 1, 1], "interleaved": True},
        num_code_groups=GROUPS,
        text_hidden_size=TEXT_HIDDEN,
        text_vocab_size=text_vocab,
        codec_language_id={k: CODES + v for k, v in LANGUAGES.items()},
        **ids,
        code_predictor_config=dict(
            vocab_size=CODES,
            hidden_size=cp_hidden,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            hidden_act="silu",
            max_position_embeddings=65536,
            rms_norm_eps=1e-6,
            rope_theta=10000,
            num_code_groups=GROUPS,
        ),
    )


def speech_tokenizer(seed):
    cfg = Qwen3TTSTokenizerV2Config(
        encoder_config=dict(  # a transformers MimiConfig
            sampling_rate=24000,
            frame_rate=12.5,
            audio_channels=1,
            hidden_size=16,
            num_filters=4,
            num_residual_layers=1,
            upsampling_ratios=[8, 6, 5, 4],
            kernel_size=7,
            last_kernel_size=3,
            residual_kernel_size=3,
            dilation_growth_rate=2,
            use_causal_conv=True,
            pad_mode="constant",
            compress=2,
            trim_right_ratio=1.0,
            codebook_size=CODES,
            codebook_dim=8,
            num_quantizers=2 * GROUPS,
            vector_quantization_hidden_dimension=8,
            num_semantic_quantizers=1,
            upsample_groups=16,
            num_hidden_layers=1,
            intermediate_size=32,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=8,
            hidden_act="gelu",
            max_position_embeddings=8000,
            norm_eps=1e-5,
            rope_theta=10000.0,
            sliding_window=250,
            layer_scale_initial_scale=0.01,
            use_cache=False,
        ),
        decoder_config=dict(
            codebook_size=CODES,
            codebook_dim=16,
            latent_dim=16,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=72,
            max_position_embeddings=8000,
            rope_theta=10000,
            rms_norm_eps=1e-5,
            layer_scale_initial_scale=0.01,
            num_quantizers=GROUPS,
            upsample_rates=[8, 5, 4, 3],
            upsampling_ratios=[2, 2],
            decoder_dim=32,
            hidden_act="silu",
            attention_bias=False,
        ),
        encoder_valid_num_quantizers=GROUPS,
        input_sample_rate=24000,
        output_sample_rate=24000,
        decode_upsample_rate=1920,
        encode_downsample_rate=1920,
        architectures=["Qwen3TTSTokenizerV2Model"],
    )
    model = randomize(Qwen3TTSTokenizerV2Model(cfg).eval(), seed)
    with torch.no_grad():  # keep the vocoder inside its [-1, 1] clamp
        for m in model.decoder.modules():
            if type(m).__name__ == "Qwen3TTSTokenizerV2DecoderDecoderResidualUnit":
                m.conv2.conv.weight.mul_(0.3)
                m.conv2.conv.bias.mul_(0.3)
        model.decoder.decoder[-1].conv.weight.mul_(0.1)
        model.decoder.decoder[-1].conv.bias.mul_(0.1)
    return model


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)


def main(out, seed):
    torch.manual_seed(seed)
    tok = text_tokenizer(os.path.join(out, "_scratch"))
    special = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}
    text_vocab = int(math.ceil(len(tok) / 64) * 64)
    st = speech_tokenizer(seed + 1)
    fe = EncodecFeatureExtractor(
        feature_size=1,
        sampling_rate=24000,
        padding_value=0.0,
        chunk_length_s=None,
        overlap=None,
        padding_side="right",
        return_attention_mask=True,
    )
    for folder, (kind, size) in KINDS.items():
        d = os.path.join(out, folder)
        shutil.rmtree(d, ignore_errors=True)
        # the 1.7B code predictor is narrower than its talker (a real projection), the 0.6B one is not (Identity)
        tc = talker_config(text_vocab, CP_HIDDEN if size == "1b7" else HIDDEN)
        presets = kind == "custom_voice"
        tc.update(
            spk_id={k: CODES + v for k, v in SPEAKERS.items()} if presets else {},
            spk_is_dialect=DIALECTS if presets else {},
        )
        cfg = Qwen3TTSConfig(
            talker_config=tc,
            speaker_encoder_config=dict(
                mel_dim=128,
                enc_dim=HIDDEN,
                enc_channels=[16, 16, 16, 16, 48],
                enc_kernel_sizes=[5, 3, 3, 3, 1],
                enc_dilations=[1, 2, 3, 4, 1],
                enc_attention_channels=8,
                enc_res2net_scale=4,
                enc_se_channels=8,
                sample_rate=24000,
            ),
            tokenizer_type="qwen3_tts_tokenizer_12hz",
            tts_model_size=size,
            tts_model_type=kind,
            im_start_token_id=special["<|im_start|>"],
            im_end_token_id=special["<|im_end|>"],
            tts_pad_token_id=special["<|tts_pad|>"],
            tts_bos_token_id=special["<|tts_text_bos|>"],
            tts_eos_token_id=special["<|tts_text_eod|>"],
            architectures=["Qwen3TTSForConditionalGeneration"],
        )
        model = Qwen3TTSForConditionalGeneration(cfg).eval()
        randomize(model.talker, seed + 2)
        with torch.no_grad():  # sharper attention: the output depends more on the prompt
            for name, p in model.talker.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    p.mul_(1.6)
        if model.speaker_encoder is not None:
            randomize(model.speaker_encoder, seed + 3)
        model.save_pretrained(d, safe_serialization=True)
        # save_pretrained writes "model_type" into speaker_encoder_config, which that config class then
        # refuses on load; the released config.json has only its plain fields.
        cj = json.load(open(os.path.join(d, "config.json")))
        cj["speaker_encoder_config"].pop("model_type", None)
        write_json(os.path.join(d, "config.json"), cj)
        write_json(os.path.join(d, "generation_config.json"), GENERATION)
        write_json(
            os.path.join(d, "preprocessor_config.json"),
            {
                "padding_side": "left",
                "padding_value": 0.0,
                "processor_class": "Qwen3TTSProcessor",
                "return_attention_mask": True,
            },
        )
        tok.save_pretrained(d)
        for extra in ("tokenizer.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja"):
            if os.path.exists(os.path.join(d, extra)):  # the released repos ship vocab/merges/tokenizer_config
                os.remove(os.path.join(d, extra))
        sd = os.path.join(d, "speech_tokenizer")
        st.save_pretrained(sd, safe_serialization=True)
        fe.save_pretrained(sd)
        write_json(
            os.path.join(sd, "configuration.json"),  # ModelScope's marker file, unused
            {"framework": "pytorch", "task": "feature-extraction", "allow_remote": True},
        )
        print("wrote", d, sorted(os.listdir(d)))
    shutil.rmtree(os.path.join(out, "_scratch"), ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4)
