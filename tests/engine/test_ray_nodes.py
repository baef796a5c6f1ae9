"""Stages placed on chosen nodes of a three-node Ray cluster made on this machine (a head labelled
``pool=ar``, a worker ``pool=dit`` with two ``dit_slot`` resources, a worker ``pool=spare``): results equal
the single-process run, actors sit where the deploy file put them (Ray's state API), a placement nobody
can satisfy is refused at start-up, a lost node fails only its requests and its replica comes back on a
node that rejoins."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import filelock
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


def pool_of(actor) -> str:
    """The ``pool`` label of the node Ray's state API says the actor runs on."""
    import ray
    from ray.util.state import get_actor

    node_id = get_actor(actor._actor_id.hex()).node_id
    return next(n["Labels"].get("pool") for n in ray.nodes() if n["NodeID"] == node_id)


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
        placed = {sid: [pool_of(r.actor) for r in engine.replicas(sid)] for sid in range(3)}
        assert placed == {0: ["ar"], 1: ["dit", "dit"], 2: ["spare"]}
        for _ in range(2):  # both diffusion-side replicas serve (requests are spread over them)
            for p, e in zip(prompts, expected):
                assert torch.equal((await final_output(engine.generate(p))).latents, e)


@pytest.mark.parametrize(
    "placement, says",
    [
        ({"label_selector": {"pool": "gpu"}}, r"no node.*'pool': 'gpu'"),
        ({"label_selector": {"pool": "ar"}, "resources": {"dit_slot": 1}}, r"no node.*dit_slot"),
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
        assert pool_of(replica.actor) == "dit"
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
        assert engine.is_ready and pool_of(replica.actor) == "dit" and replica.node_id != lost
        out = await final_output(engine.generate("x", sampling_params_list=[{"max_tokens": 3}]))
        assert out.finished and len(out.token_ids) == 3
