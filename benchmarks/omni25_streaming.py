"""Qwen2.5-Omni: time to the audio with the talker streamed from the thinker (async chunk on, the default) against
the talker starting once the thinker finished (async chunk off), same prompt, same script.

token2wav decodes the whole code sequence at once (its DiT attends across blocks both ways), so the audio arrives in
one piece at the end either way; what streaming removes is the talker waiting for the thinker's last token. Rounds
alternate the two servers (both in this process, the tiny fixture unless --model); medians and the ratio.

    python benchmarks/omni25_streaming.py [--model DIR] [--rounds 7] [--think 48] [--talk 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni_bench import model_folder, write_result


async def main(args: argparse.Namespace) -> None:
    import torch

    from omnistage import AsyncOmni

    torch.set_num_threads(1)
    folder = model_folder(args.model, "qwen2_5_omni")
    prompt = {"messages": [{"role": "user", "content": "tell me about the weather"}]}
    params = [
        {"temperature": 0, "max_tokens": args.think, "ignore_eos": True},
        {"temperature": 0, "max_tokens": args.talk},
        {"seed": 0},
    ]
    servers = {
        "streamed": AsyncOmni(str(folder), deploy_config={"async_chunk": True}, max_model_len=1024),
        "whole": AsyncOmni(str(folder), deploy_config={"async_chunk": False}, max_model_len=1024),
    }
    for omni in servers.values():
        await omni.start()

    async def once(omni) -> dict[str, float]:
        t = time.perf_counter()
        marks: dict[str, float] = {}
        async for out in omni.generate(prompt, sampling_params_list=params):
            if out.stage_id == 0 and out.finished:
                marks["thinker_ms"] = (time.perf_counter() - t) * 1e3
            if out.stage_id == 2 and out.finished:
                marks["audio_ms"] = (time.perf_counter() - t) * 1e3
        return marks

    try:
        for omni in servers.values():
            await once(omni)  # warm
        times: dict[str, list[dict[str, float]]] = {k: [] for k in servers}
        for r in range(args.rounds):
            for name in list(servers) if r % 2 == 0 else list(servers)[::-1]:
                times[name].append(await once(servers[name]))
    finally:
        for omni in servers.values():
            await omni.shutdown()
    med = {name: {k: round(statistics.median(m[k] for m in runs), 1) for k in runs[0]} for name, runs in times.items()}
    ratio = round(med["streamed"]["audio_ms"] / med["whole"]["audio_ms"], 3)
    result = {
        "model": str(folder),
        "rounds": args.rounds,
        "think": args.think,
        "talk": args.talk,
        "median": med,
        "streamed_over_whole": ratio,
    }
    lines = [
        "# Qwen2.5-Omni: the talker streamed from the thinker vs started when it finished",
        "",
        f"model: `{folder}`; {args.think} thinker tokens (greedy, ignore_eos), {args.talk} talker codes; "
        f"medians of {args.rounds} alternating rounds, one request at a time.",
        "",
        "| async chunk | thinker done ms | audio ms |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {m['thinker_ms']} | {m['audio_ms']} |" for name, m in med.items()]
    lines += [
        "",
        f"Time to the audio, streamed / whole: **{ratio}**.",
        "",
        f"    python benchmarks/omni25_streaming.py --rounds {args.rounds} --think {args.think} --talk {args.talk}",
    ]
    write_result("omni25_streaming", result, lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--think", type=int, default=48)
    p.add_argument("--talk", type=int, default=64)
    asyncio.run(main(p.parse_args()))
