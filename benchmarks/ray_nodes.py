"""What crossing Ray nodes adds: tiny GLM-Image with both stages on the driver's node, against the AR stage there
and the diffusion stage on another node, on a three-node Ray cluster made on this machine (the cluster of
tests/engine/test_ray_nodes.py).

Both engines run at once and requests alternate between them, so a busy machine hits both sides alike; medians
over ``--runs``, and their ratio (what to compare across machines). Bytes per edge per request: the AR stage's
token ids (int64) into the diffusion stage, the image back to the server (raw uint8 and as pickled for Ray).
On one machine the "network" between nodes is loopback TCP between the nodes' object stores.

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

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SMALL = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
PARAMS = [{}, {"num_inference_steps": 3, "guidance_scale": 1.5, "seed": 5}]
PROMPT = {"prompt": "a red cat", "additional_information": {"height": 64, "width": 96}}


def deploy(dit_pool: str) -> dict:
    return {
        "distributed_executor_backend": "ray",
        "stages": [
            {"stage_id": 0, "placement": {"label_selector": {"pool": "ar"}}},
            {"stage_id": 1, "placement": {"label_selector": {"pool": dit_pool}}},
        ],
    }


async def measure(folder: str, runs: int) -> dict:
    from omnistage import AsyncOmni
    from omnistage.testing.streams import final_output

    engines = {"one_node": AsyncOmni(folder, deploy_config=deploy("ar"), dtype="float32")}
    engines["across_nodes"] = AsyncOmni(folder, deploy_config=deploy("dit"), dtype="float32")
    for e in engines.values():
        await e.start()
    try:
        times: dict[str, list[float]] = {k: [] for k in engines}
        last = {}
        for i in range(runs + 1):
            for name, e in engines.items():
                t0 = time.perf_counter()
                last[name] = await final_output(e.generate(PROMPT, sampling_params_list=PARAMS))
                if i:  # the first request of each warms its engines
                    times[name].append(time.perf_counter() - t0)
    finally:
        for e in engines.values():
            await e.shutdown()
    out = last["across_nodes"]
    image = out.images[0]
    import numpy as np

    arr = np.asarray(image)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "median_s": med,
        "across_over_one_node": med["across_nodes"] / med["one_node"],
        "bytes_per_request": {
            "ar_to_dit_token_ids": int(out.metrics[0]["num_tokens"]) * 8,
            "dit_to_server_image_raw": int(arr.nbytes),
            "dit_to_server_image_pickled": len(pickle.dumps(image)),
        },
        "same_image": bool(np.array_equal(arr, np.asarray(last["one_node"].images[0]))),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    args = ap.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    from omnistage.testing.tiny import build

    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    folder = str(build("glm_image", Path(tempfile.mkdtemp(prefix="ray-nodes-bench-"))))
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
            **asyncio.run(measure(folder, args.runs)),
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
