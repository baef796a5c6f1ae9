import io
import json

import pytest
from PIL import Image

from omnistage.bench.datasets import DatasetDefaults, load_dataset, random_dataset


def test_random_dataset_is_seeded_and_complete():
    d = DatasetDefaults(width=32, height=48, num_inference_steps=4, seed=7)
    a = load_dataset("random", "i2i", 3, d)
    b = load_dataset("random", "i2i", 3, d)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert [r.seed for r in a] == [7, 8, 9]
    assert a[0].image == b[0].image
    assert Image.open(io.BytesIO(a[0].image)).size == (32, 48)
    assert all(r.num_inference_steps == 4 and r.width == 32 for r in a)


def test_random_chat_prompt_length():
    reqs = load_dataset("random", "chat", 2, DatasetDefaults(input_len=5, max_tokens=12))
    assert len(reqs[0].prompt.split()) == 5 and reqs[0].max_tokens == 12


def test_custom_jsonl_overrides_defaults(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "in.png")
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"prompt": "a cat", "seed": 5, "num_inference_steps": 3, "image": "in.png"}),
                "",
                json.dumps({"prompt": "a dog", "slo_s": 1.5, "extra": {"guidance_scale": 2.0}, "image": "in.png"}),
                json.dumps({"prompt": "unused", "image": "in.png"}),
            ]
        )
    )
    reqs = load_dataset("custom", "i2i", 2, DatasetDefaults(num_inference_steps=8, seed=100), str(path))
    assert [r.prompt for r in reqs] == ["a cat", "a dog"]
    assert reqs[0].seed == 5 and reqs[0].num_inference_steps == 3
    assert reqs[1].num_inference_steps == 8 and reqs[1].slo_s == 1.5 and reqs[1].extra == {"guidance_scale": 2.0}
    assert reqs[1].image == (tmp_path / "in.png").read_bytes()


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "x", "stepz": 3}', "unknown key"),
        ('{"seed": 3}', "'prompt'"),
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"prompt": "x", "image": "missing.png"}', "not found"),
    ],
)
def test_custom_jsonl_errors_name_the_line_and_field(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message) as e:
        load_dataset("custom", "t2i", 1, DatasetDefaults(), str(path))
    assert "p.jsonl:1" in str(e.value)


def test_bad_dataset_arguments():
    with pytest.raises(ValueError, match="--dataset-path"):
        load_dataset("custom", "t2i", 1, DatasetDefaults())
    with pytest.raises(ValueError, match="task"):
        load_dataset("random", "t2x", 1, DatasetDefaults())
    with pytest.raises(ValueError, match="num-prompts"):
        load_dataset("random", "t2i", 0, DatasetDefaults())


def test_chat_audio_clips_are_seeded_wavs_that_decode_to_the_same_samples(tmp_path):
    import numpy as np
    import soundfile

    from omnistage.bench.datasets import AUDIO_RATE, random_audio

    d = DatasetDefaults(seed=3, chat_audio_s=0.5)
    a, b = load_dataset("random", "omni", 2, d), load_dataset("random", "omni", 2, d)
    assert a[0].audio == b[0].audio and a[0].audio != a[1].audio
    samples, rate = soundfile.read(io.BytesIO(a[0].audio), dtype="float32")  # an independent WAV reader
    assert rate == AUDIO_RATE and samples.shape == (AUDIO_RATE // 2,)
    assert np.array_equal(samples, random_audio(0.5, 3))  # lossless: a baseline can take the array itself
    assert load_dataset("random", "t2i", 1, d)[0].audio is None  # only chat / omni carry a clip
    (tmp_path / "q.wav").write_bytes(a[1].audio)
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "what did i say?", "audio": "q.wav"}) + "\n")
    assert load_dataset("custom", "omni", 1, DatasetDefaults(), str(path))[0].audio == a[1].audio
    with pytest.raises(ValueError, match="'audio' is for tasks"):
        load_dataset("custom", "t2i", 1, DatasetDefaults(), str(path))


def test_asr_requests_always_carry_a_clip():
    import soundfile

    from omnistage.bench.datasets import ASR_DEFAULT_AUDIO_S

    (req,) = random_dataset("asr", 1, DatasetDefaults(seed=3))
    samples, rate = soundfile.read(io.BytesIO(req.audio))
    assert rate == 16000 and samples.size == int(ASR_DEFAULT_AUDIO_S * 16000)
