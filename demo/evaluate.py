"""Judge a trained demo folder on the *selection* prompts: the set used to compare training runs
and to choose the demo's guidance and step count. The accuracy test
(``tests/e2e/test_demo_accuracy.py``) measures on a different set (other seeds, sizes, backgrounds),
so the figure it reports is not tuned on itself.

    python demo/evaluate.py omnistage/models/demo/weights --guidance 1.5,2,3,4,5 --steps 20

Prints one JSON line per (guidance, steps): the share of pictures whose shape, colour, position
and size the analyser (``tests/models/demo/analyser.py``, independent from the training code) reads as
asked. ``--sheet DIR`` saves the pictures as a contact sheet per setting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.models.demo.analyser import PALETTE, SHAPES, analyse  # noqa: E402

POSITIONS = {"left": "on the left", "center": "in the center", "right": "on the right"}
BACKGROUNDS = ("black", "white", "gray", "brown")
FIELDS = ("shape", "colour", "position", "size")


def selection_prompts() -> list[dict]:
    """72 prompts, every colour x shape x position once; size, background phrase and seed differ
    from the accuracy test's set (seeds 5000+ here, 1000+ there)."""
    out = []
    for i, colour in enumerate(PALETTE):
        for j, shape in enumerate(SHAPES):
            for m, position in enumerate(POSITIONS):
                k = len(out)
                size = ("small", "large")[(i + j + m + 1) % 2]
                text = f"a {size} {colour} {shape} {POSITIONS[position]}"
                if k % 2:
                    text += f" on a {BACKGROUNDS[(i + 2 * j + m) % 4]} background"
                out.append(
                    {
                        "prompt": text,
                        "shape": shape,
                        "colour": colour,
                        "position": position,
                        "size": size,
                        "seed": 5000 + k,
                    }
                )
    return out


def generate(pipe, cases: list[dict], guidance: float, steps: int, chunk: int = 36) -> list[np.ndarray]:
    images: list[np.ndarray] = []
    for s in range(0, len(cases), chunk):
        part = cases[s : s + chunk]
        with torch.no_grad():
            out = pipe(
                [c["prompt"] for c in part],
                generator=[torch.Generator().manual_seed(c["seed"]) for c in part],
                guidance_scale=guidance,
                num_inference_steps=steps,
                height=64,
                width=64,
                max_sequence_length=16,
                output_type="np",
            ).images
        images += list((out * 255).round().astype(np.uint8))
    return images


def score(cases: list[dict], images: list[np.ndarray]) -> dict[str, float]:
    got = [analyse(im) for im in images]
    return {f: sum(g[f] == c[f] for g, c in zip(got, cases)) / len(cases) for f in FIELDS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("weights")
    p.add_argument("--guidance", default="1.5,2,3,4,5")
    p.add_argument("--steps", default="20")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sheet", default=None, help="folder for one contact sheet per setting")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(args.weights, text_encoder_3=None, tokenizer_3=None).to(args.device)
    pipe.set_progress_bar_config(disable=True)
    cases = selection_prompts()
    for steps in (int(s) for s in args.steps.split(",")):
        for guidance in (float(g) for g in args.guidance.split(",")):
            images = generate(pipe, cases, guidance, steps)
            print(
                json.dumps({"weights": args.weights, "guidance": guidance, "steps": steps, **score(cases, images)}),
                flush=True,
            )
            if args.sheet:
                from PIL import Image

                Path(args.sheet).mkdir(parents=True, exist_ok=True)
                rows = [np.concatenate(images[r : r + 9], axis=1) for r in range(0, len(images), 9)]
                Image.fromarray(np.concatenate(rows, axis=0)).save(Path(args.sheet) / f"g{guidance}_s{steps}.png")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
