"""Stages placed on chosen nodes of a three-node Ray cluster made on this machine (a head labelled
``pool=ar``, a worker ``pool=dit`` with two ``dit_slot`` resources, a worker ``pool=spare``): results equal
the single-process run, actors sit where the deploy file put them (the raylet that spawned each
actor), a placement nobody can satisfy is refused at start-up, a lost node fails only its requests and its replica comes back on a
node that rejoins."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import filelock
import numpy as np
import pytest
import torch

from omnistage import AsyncOmni, StageFailedError
from omnistage.errors import StageUnavailableError
from omnistage.pipeline import Pipeline, StageSpec
from omnistage.testing import pipelines as tp
from omnistage.testing.streams import final_output

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.asyncio(loop_scope="module")]

SMALL = {"num_cpus": 1, "object_store_memory": 80 * 2**20}  # Ray's floor is 75 MiB; two cores shared


@pytest.fixture(scope="module")
def nodes():
    """Three raylets on this machine (ray.cluster_utils.Cluster); the test process joins as a driver.
    Yields the cluster; torn down by its own handle only."""
    from ray.cluster_utils import Cluster

    # one cluster on the machine at a time: the single-node Ray module ends with `ray stop --force`
    lock = filelock.FileLock(Path(tempfile.gettempdir()) / "omnistage-tests-ray-cluster.lock")
    lock.acquire()
    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_USAGE_STATS_ENABLED", "RAY_AUTH_MODE")}
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                **SMALL,
                "labels": {"pool": "ar"},
                "include_dashboard": False,
                # a killed node is declared dead after ~1.5 s instead of the default ~15 s
                "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
            },
        )
        cluster.dit = cluster.add_node(**SMALL, labels={"pool": "dit"}, resources={"dit_slot": 2})
        cluster.add_node(**SMALL, labels={"pool": "spare"})
        cluster.wait_for_nodes()
        os.environ["RAY_ADDRESS"] = cluster.address
        yield cluster
    finally:
        import ray

        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        lock.release()


async def pool_of(nodes, replica) -> str:
    """The ``pool`` label of the node whose raylet spawned the replica's actor process (Ray's state API
    needs the dashboard, which the minimal ``ray`` install lacks: the process tree says it as well)."""
    import psutil
    import ray

    parent = psutil.Process(await replica.pid()).ppid()
    node = next(n for n in [nodes.head_node, *nodes.worker_nodes] if raylet_pid(n) == parent)
    return next(n["Labels"]["pool"] for n in ray.nodes() if n["NodeID"] == node.node_id)


def raylet_pid(node) -> int:
    from ray._private import ray_constants

    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


def ray_deploy(*stages: dict) -> dict:
    return {"distributed_executor_backend": "ray", "stages": list(stages)}


async def test_stages_run_on_the_nodes_their_placement_names(nodes):
    prompts = ["one", "two two", "three three three"]
    async with AsyncOmni(pipeline=tp.chain()) as inline:
        expected = [(await final_output(inline.generate(p))).latents for p in prompts]
    deploy = ray_deploy(
        {"stage_id": 0, "placement": {"label_selector": {"pool": "ar"}}},
        {
            "stage_id": 1,
            "num_replicas": 2,
            "placement": {"label_selector": {"pool": "dit"}, "resources": {"dit_slot": 1}},
        },
    )
    # the third stage through --stage-overrides, with a selector operator: neither ar nor dit
    overrides = {"2": {"placement": {"label_selector": {"pool": "!in(ar,dit)"}}}}
    async with AsyncOmni(pipeline=tp.chain(), deploy_config=deploy, stage_overrides=overrides) as engine:
        placed = {sid: [await pool_of(nodes, r) for r in engine.replicas(sid)] for sid in range(3)}
        assert placed == {0: ["ar"], 1: ["dit", "dit"], 2: ["spare"]}
        for _ in range(2):  # both diffusion-side replicas serve (requests are spread over them)
            for p, e in zip(prompts, expected):
                assert torch.equal((await final_output(engine.generate(p))).latents, e)


@pytest.mark.parametrize(
    "placement, says",
    [
        ({"label_selector": {"pool": "gpu"}}, r"'pool': 'gpu'.*no node"),
        ({"label_selector": {"pool": "ar"}, "resources": {"dit_slot": 1}}, r"dit_slot.*no node"),
        ({"resources": {"dit_slot": 1}}, r"hold only 2 of 3 replicas"),
    ],
)
async def test_a_placement_no_node_can_satisfy_is_refused_at_start_up(nodes, placement, says):
    deploy = ray_deploy({"stage_id": 1, "num_replicas": 3, "placement": placement})
    engine = AsyncOmni(pipeline=tp.chain(), deploy_config=deploy)
    # the deadline stops a hang (what Ray alone does: the actor waits for resources forever)
    with pytest.raises(Exception, match="stage 1") as err:
        await asyncio.wait_for(engine.start(), 120)
    assert err.match(says)
    await engine.shutdown()


async def test_a_lost_node_fails_its_requests_and_its_replica_returns_on_a_node_that_joins(nodes):
    """The slow stage on the dit node, the other on the head: the dit node's raylet and everything on it
    are killed mid-request; that request fails as unavailable (503) naming the stage, the replica's stats
    (/health) say where it was, and it comes back on a dit node that joins."""
    p = Pipeline(
        "test_lost_node",
        [StageSpec(0, kind="llm", engine=tp.TokenStreamEngine, output="token_ids", final=True)],
    )
    deploy = ray_deploy({"stage_id": 0, "placement": {"label_selector": {"pool": "dit"}}})
    async with AsyncOmni(pipeline=p, deploy_config=deploy) as engine:
        replica = engine.replicas(0)[0]
        assert await pool_of(nodes, replica) == "dit"
        slow = [{"max_tokens": 1000, "delay": 0.01}]
        task = asyncio.create_task(final_output(engine.generate("x", sampling_params_list=slow)))
        await asyncio.sleep(0.5)
        lost = replica.node_id
        nodes.remove_node(nodes.dit, allow_graceful=False)
        with pytest.raises(StageFailedError, match="stage 0 Ray actor died") as err:
            await asyncio.wait_for(task, 60)
        assert isinstance(err.value, StageUnavailableError)  # the server answers 503
        stats = engine.stage_stats()[0]
        assert not stats.healthy and lost in stats.detail and "replica 0" in stats.detail
        # no node takes the placement now: the restart is refused, and the stats say so
        for _ in range(300):
            if "restart failed" in engine.stage_stats()[0].detail:
                break
            await asyncio.sleep(0.1)
        assert "no node" in engine.stage_stats()[0].detail
        nodes.dit = nodes.add_node(**SMALL, labels={"pool": "dit"}, resources={"dit_slot": 2})
        for _ in range(600):  # the next restart attempt finds the new node
            if engine.is_ready:
                break
            await asyncio.sleep(0.1)
        assert engine.is_ready and await pool_of(nodes, replica) == "dit" and replica.node_id != lost
        out = await final_output(engine.generate("x", sampling_params_list=[{"max_tokens": 3}]))
        assert out.finished and len(out.token_ids) == 3


async def test_a_replica_waiting_for_resources_is_refused_once_its_node_is_gone(nodes):
    """Resources held by another engine: the replica waits (Ray's own behaviour) until the only node that could
    take it is lost, then its start fails naming the placement instead of pending forever."""
    holder = ray_deploy({"stage_id": 1, "num_replicas": 2, "placement": {"resources": {"dit_slot": 1}}})
    on_head = {"placement": {"label_selector": {"pool": "ar"}}}  # the other stages: not on the node removed
    waiter = ray_deploy(
        {"stage_id": 0, **on_head},
        {"stage_id": 1, "placement": {"resources": {"dit_slot": 1}}},
        {"stage_id": 2, **on_head},
    )
    try:
        async with AsyncOmni(pipeline=tp.chain(), deploy_config=holder):
            engine = AsyncOmni(pipeline=tp.chain(), deploy_config=waiter)
            start = asyncio.create_task(engine.start())
            await asyncio.sleep(3)
            assert not start.done()  # both dit slots are taken: it waits
            nodes.remove_node(nodes.dit, allow_graceful=False)
            # Ray fails an actor queued on the lost node itself; one still pending cluster-wide is refused by
            # the placement re-check
            with pytest.raises(Exception, match=r"(?s)stage 1.*(node has died|dit_slot.*no node)"):
                await asyncio.wait_for(start, 60)
            await engine.shutdown()
    finally:
        nodes.dit = nodes.add_node(**SMALL, labels={"pool": "dit"}, resources={"dit_slot": 2})


@pytest.mark.vllm
async def test_glm_image_ar_on_one_node_and_two_dit_replicas_on_another(nodes, tiny_model):
    """GLM-Image (tiny): the vLLM AR stage on the ``ar`` node, two diffusion replicas on the ``dit`` node;
    the images equal the single-process run's (prior tokens and latents cross nodes through Ray)."""
    folder = str(tiny_model("glm_image"))
    params = [{}, {"num_inference_steps": 3, "guidance_scale": 1.5, "seed": 5}]
    prompts = [{"prompt": p, "additional_information": {"height": 64, "width": 96}} for p in ("a red cat", "a dog")]
    async with AsyncOmni(folder, dtype="float32") as inline:
        expected = [(await final_output(inline.generate(p, sampling_params_list=params))).images[0] for p in prompts]
    deploy = ray_deploy(
        {"stage_id": 0, "placement": {"label_selector": {"pool": "ar"}}},
        {
            "stage_id": 1,
            "num_replicas": 2,
            "placement": {"label_selector": {"pool": "dit"}, "resources": {"dit_slot": 1}},
        },
    )
    async with AsyncOmni(folder, deploy_config=deploy, dtype="float32") as engine:
        placed = {sid: [await pool_of(nodes, r) for r in engine.replicas(sid)] for sid in (0, 1)}
        assert placed == {0: ["ar"], 1: ["dit", "dit"]}
        for _ in range(2):  # requests spread over both diffusion replicas
            for p, e in zip(prompts, expected):
                got = (await final_output(engine.generate(p, sampling_params_list=params))).images[0]
                assert np.array_equal(np.asarray(got), np.asarray(e))
