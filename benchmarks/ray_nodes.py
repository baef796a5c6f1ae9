"""What crossing Ray nodes adds, on a three-node Ray cluster made on this machine (the cluster of
tests/engine/test_ray_nodes.py), for two pipelines:

- tiny GLM-Image: both stages on the driver's node, against the AR stage there and the diffusion stage on another;
- tiny Qwen3-Omni, an audio prompt: all three stages on the driver's node, against the thinker there and talker +
  code2wav on another (the Omni edge: the thinker's token ids and its hidden-state rows at the audio positions).

Both engines of a pipeline run at once and requests alternate between them, so a busy machine hits both sides
alike; medians over ``--runs``, and their ratio (what to compare across machines). Bytes per request per stage:
what each stage's actor sends back to the driver (its outputs, pickled as Ray ships them) and what the driver sends
it (the request, and the streamed chunks of an async-chunk edge), counted at the engine's handles of one
across-nodes request. Every edge crosses actor -> driver -> actor, so an edge's bytes are its source's ``out``
plus its target's ``in``. On one machine the "network" between nodes is loopback TCP between the object stores.

    python benchmarks/ray_nodes.py [--runs 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SMALL = {"num_cpus": 1, "object_store_memory": 80 * 2**20}


def deploy(pools: list[str]) -> dict:
    """Stage i on the node labelled pools[i]."""
    stages = [{"stage_id": i, "placement": {"label_selector": {"pool": p}}} for i, p in enumerate(pools)]
    return {"distributed_executor_backend": "ray", "stages": stages}


def count_bytes(engine: Any) -> dict[int, dict[str, int]]:
    """Per stage: bytes its actors send back (``out``) and are sent (``in``), from now on. Wraps the handles of
    this engine's own replicas (RemoteStageEngine's ``_deliver`` / ``_submit`` / ``_send_feed``)."""
    seen: dict[int, dict[str, int]] = {}
    for sid in range(len(engine.pipeline.stages)):
        counts = seen.setdefault(sid, {"in": 0, "out": 0})
        for r in engine.replicas(sid):

            def wrap(fn, key, counts=counts):
                def counted(*args):
                    counts[key] += len(pickle.dumps(args))
                    return fn(*args)

                return counted

            r._deliver = wrap(r._deliver, "out")
            r._submit = wrap(r._submit, "in")
            r._send_feed = wrap(r._send_feed, "in")
    return seen


async def measure(folder: str, prompt: Any, params: list, pools: dict[str, list[str]], runs: int, **kw) -> dict:
    from omnistage import AsyncOmni
    from omnistage.testing.streams import all_outputs, finished_by_stage

    engines = {name: AsyncOmni(folder, deploy_config=deploy(p), **kw) for name, p in pools.items()}
    for e in engines.values():
        await e.start()
    try:
        times: dict[str, list[float]] = {k: [] for k in engines}
        finals: dict[str, dict] = {}
        for i in range(runs + 1):
            for name, e in engines.items():
                t0 = time.perf_counter()
                finals[name] = finished_by_stage(await all_outputs(e.generate(prompt, sampling_params_list=params)))
                if i:  # the first request of each warms its engines
                    times[name].append(time.perf_counter() - t0)
        counts = count_bytes(engines["across_nodes"])
        await all_outputs(engines["across_nodes"].generate(prompt, sampling_params_list=params))
    finally:
        for e in engines.values():
            await e.shutdown()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "placement": pools,
        "median_s": med,
        "across_over_one_node": med["across_nodes"] / med["one_node"],
        "bytes_per_request_by_stage": {str(k): v for k, v in counts.items()},
        "finals": finals,
    }


async def glm_image(folder: str, runs: int) -> dict:
    import numpy as np

    params = [{}, {"num_inference_steps": 3, "guidance_scale": 1.5, "seed": 5}]
    prompt = {"prompt": "a red cat", "image_size": (64, 96)}
    pools = {"one_node": ["ar", "ar"], "across_nodes": ["ar", "dit"]}
    out = await measure(folder, prompt, params, pools, runs, dtype="float32")
    images = {k: np.asarray(f[1].images[0]) for k, f in out.pop("finals").items()}
    return {**out, "same_output": bool(np.array_equal(images["one_node"], images["across_nodes"]))}


async def qwen3_omni(folder: str, runs: int) -> dict:
    import numpy as np

    from tests.models import omni_media as media

    clip = {"type": "input_audio", "input_audio": {"data": media.wav_base64(media.clip(1.0, 0)), "format": "wav"}}
    prompt = {"messages": [{"role": "user", "content": [clip, {"type": "text", "text": "what did i say?"}]}]}
    params = [{"temperature": 0, "max_tokens": 8}, {"temperature": 0, "max_tokens": 12}]
    pools = {"one_node": ["ar", "ar", "ar"], "across_nodes": ["ar", "dit", "dit"]}
    out = await measure(folder, prompt, params, pools, runs, max_model_len=1024)
    one, across = out.pop("finals").values()
    same = one[0].token_ids == across[0].token_ids and np.array_equal(one[2].audio, across[2].audio)
    return {**out, "same_output": bool(same)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    args = ap.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    from omnistage.testing.tiny import build

    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    tmp = Path(tempfile.mkdtemp(prefix="ray-nodes-bench-"))
    folders = {f: str(build(f, tmp / f)) for f in ("glm_image", "qwen3_omni")}
    cluster = Cluster(
        initialize_head=True, head_node_args={**SMALL, "labels": {"pool": "ar"}, "include_dashboard": False}
    )
    try:
        cluster.add_node(**SMALL, labels={"pool": "dit"})
        cluster.add_node(**SMALL, labels={"pool": "spare"})
        cluster.wait_for_nodes()
        os.environ["RAY_ADDRESS"] = cluster.address
        result = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores shared by three Ray nodes, CPU",
            "runs": args.runs,
            "glm_image": asyncio.run(glm_image(folders["glm_image"], args.runs)),
            "qwen3_omni": asyncio.run(qwen3_omni(folders["qwen3_omni"], args.runs)),
        }
    finally:
        ray.shutdown()
        cluster.shutdown()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ray_nodes.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
