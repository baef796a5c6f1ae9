"""Which process or thread state moves a tiny video family's frames: diffusers' pipeline on the tiny folder, run once
clean and then after each candidate change (undone before the next), in the main thread and in a fresh thread,
and omnistage's ``Omni`` on the same folder after changes of the global RNGs; optionally after a vLLM engine
ran in this process (``--vllm``: vLLM's offline ``LLM`` on the tiny chat model, in-process, as the family tests'
references run it; its CPU worker replaces ``torch.set_num_threads`` with a no-op for the rest of the process).

Prints, per candidate, the largest difference from the clean run (floats in [0, 1]) and the mean in 8-bit levels.

    python scripts/numerics_probe.py helios|ltx2 [--vllm]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as tests/conftest.py: the engine in this process
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

STG = {"spatio_temporal_guidance_blocks": [1]}
CALLS = {  # the HTTP tests' requests (tests/e2e/test_video_families_http.py, tests/models/ltx2/test_http.py)
    "helios": ("HeliosPipeline", dict(height=32, width=48, num_frames=65, num_inference_steps=2), {}),
    "ltx2": (
        "LTX2Pipeline",
        dict(
            height=32,
            width=64,
            num_frames=9,
            frame_rate=25.0,
            num_inference_steps=3,
            guidance_scale=3.0,
            negative_prompt="blurry",
            max_sequence_length=16,
            **STG,
        ),
        dict(fps=25, **STG),
    ),
}


def in_thread(fn: Callable[[], np.ndarray]) -> np.ndarray:
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(v=fn()))
    t.start()
    t.join()
    return box["v"]


def candidates() -> list[tuple[str, Callable[[], None], Callable[[], None]]]:
    mk = torch.backends.mkldnn
    return [
        ("nothing (run again)", lambda: None, lambda: None),
        ("torch.set_num_threads(2)", lambda: torch.set_num_threads(2), lambda: torch.set_num_threads(1)),
        (
            "torch.set_flush_denormal(True)",
            lambda: torch.set_flush_denormal(True),
            lambda: torch.set_flush_denormal(False),
        ),
        (
            "use_deterministic_algorithms(True)",
            lambda: torch.use_deterministic_algorithms(True),
            lambda: torch.use_deterministic_algorithms(False),
        ),
        ("mkldnn disabled", lambda: setattr(mk, "enabled", False), lambda: setattr(mk, "enabled", True)),
        (
            "float32 matmul precision 'high'",
            lambda: torch.set_float32_matmul_precision("high"),
            lambda: torch.set_float32_matmul_precision("highest"),
        ),
        (
            "float32 matmul precision 'medium'",
            lambda: torch.set_float32_matmul_precision("medium"),
            lambda: torch.set_float32_matmul_precision("highest"),
        ),
        ("global torch RNG reseeded and drawn", lambda: (torch.manual_seed(123), torch.rand(1000)), lambda: None),
        ("grad mode on", lambda: torch.set_grad_enabled(True), lambda: None),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", choices=sorted(CALLS))
    ap.add_argument("--vllm", action="store_true", help="run vLLM's offline LLM in this process first")
    args = ap.parse_args()
    torch.set_num_threads(1)  # what tests/conftest.py does

    import diffusers

    from omnistage import Omni
    from omnistage.testing.tiny import build

    tmp = Path(tempfile.mkdtemp())
    folder = str(build(args.family, tmp / args.family))
    name, call_kw, omni_kw = CALLS[args.family]
    pipe = getattr(diffusers, name).from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)

    def reference() -> np.ndarray:
        out = pipe("a red cat", generator=torch.Generator().manual_seed(4), output_type="np", **call_kw)
        return np.asarray(out.frames[0])

    def report(what: str, base: np.ndarray, got: np.ndarray) -> None:
        d = np.abs(got.astype(np.float64) - base.astype(np.float64))
        scale = 255.0 if base.dtype != np.uint8 else 1.0
        print(f"{what:55s} max {d.max():.3g}  mean {d.mean() * scale:.3g} levels", flush=True)

    clean = reference()
    if args.vllm:
        from tests.models.offline_llm import offline_llm

        with offline_llm(build("chat", tmp / "chat"), max_model_len=256, enforce_eager=True, dtype="float32") as llm:
            llm.generate(["hello"])
        print(f"after vLLM: torch.set_num_threads is {torch.set_num_threads.__qualname__}", flush=True)
        report("diffusers, main thread, after vLLM", clean, reference())
    report("diffusers, fresh thread", clean, in_thread(reference))
    for what, change, undo in candidates():
        change()
        try:
            report(f"diffusers, main thread, {what}", clean, reference())
            report(f"diffusers, fresh thread, {what}", clean, in_thread(reference))
        finally:
            undo()

    params = {"height": call_kw["height"], "width": call_kw["width"], "num_frames": call_kw["num_frames"], "seed": 4}
    params.update({k: v for k, v in call_kw.items() if k not in ("frame_rate", *STG)}, **omni_kw)
    with Omni(folder) as omni:

        def served() -> np.ndarray:
            (out,) = omni.generate("a red cat", [params], use_tqdm=False)
            assert out.error is None, out.error
            return out.video

        first = served()
        report("Omni vs diffusers (uint8 vs PIL rounding)", (clean * 255).round().astype(np.uint8), first)
        for what, change in (
            ("Omni, torch RNG reseeded", lambda: torch.manual_seed(1)),
            ("Omni, numpy and random reseeded", lambda: (np.random.seed(5), random.seed(7))),
        ):
            change()
            report(what, first, served())


if __name__ == "__main__":
    main()
