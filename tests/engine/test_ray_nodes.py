"""Stages placed on chosen nodes of a three-node Ray cluster made on this machine (a head labelled
``pool=ar``, a worker ``pool=dit`` with two ``dit_slot`` resources, a worker ``pool=spare`` with little
memory): results equal the single-process run (GLM-Image, Qwen3-Omni), actors sit where the deploy file put
them (the raylet that spawned each actor), a placement nobody can satisfy or on nodes too small by the memory
plan is refused at start-up, a lost node fails only its requests and its replica comes back on a node that
still allows it or rejoins, and a session's requests reach the replica holding its state."""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
import time
from pathlib import Path

import filelock
import numpy as np
import pytest
import torch

from omnistage import AsyncOmni, StageFailedError
from omnistage.errors import StageUnavailableError
from omnistage.pipeline import Pipeline, StageSpec
from omnistage.testing import pipelines as tp
from omnistage.testing.streams import all_outputs, final_output, finished_by_stage

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.asyncio(loop_scope="module")]

SMALL = {"num_cpus": 1, "object_store_memory": 80 * 2**20}  # Ray's floor is 75 MiB; two cores shared
# the worker nodes: pool label -> what the node has (the spare node's memory, as Ray's memory resource, is too
# small for any model's weights: the memory-plan check refuses a model stage placed there)
WORKERS = {"dit": {"resources": {"dit_slot": 2}}, "spare": {"memory": 64 * 1024}}


def add_worker(cluster, pool: str) -> None:
    """(Re)join the worker node labelled ``pool``; ``cluster.pools`` keeps its handle."""
    cluster.pools[pool] = cluster.add_node(**SMALL, labels={"pool": pool}, **WORKERS[pool])


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
        cluster.pools = {}
        for pool in WORKERS:
            add_worker(cluster, pool)
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


def actor_states() -> dict[str, str]:
    """Every actor of the cluster and its state, from the GCS's actor table (``ray.util.state`` needs the
    dashboard, which the minimal ``ray`` install lacks)."""
    from ray._private import state

    return {a["ActorID"]: a["State"] for a in state.actors().values()}


async def until_pending(start: asyncio.Task, before: set[str], started: int) -> None:
    """Until Ray holds a new actor pending creation after ``started`` new actors came alive (the stages start in
    order: the one waiting for resources), or ``start`` ends. The deadline stops a hang only."""
    deadline = time.monotonic() + 120
    while not start.done():
        new = [s for a, s in actor_states().items() if a not in before]
        if new.count("ALIVE") >= started and "PENDING_CREATION" in new:
            return
        assert time.monotonic() < deadline, new
        await asyncio.sleep(0.1)


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


async def until(predicate, seconds: float) -> None:
    """Wait until ``predicate()`` holds; the deadline stops a hang (the assert after the wait says what failed)."""
    for _ in range(int(seconds * 10)):
        if predicate():
            return
        await asyncio.sleep(0.1)


async def test_a_lost_node_fails_its_requests_and_its_replica_returns_where_its_placement_allows(nodes):
    """A stage allowed on the ``dit`` or the ``spare`` node. The node its replica runs on is killed (its raylet and
    everything on it) mid-request: that request fails as unavailable (503) naming the stage, the stage's stats
    (/health) name the replica and the node it was on, and the replica comes back on the other allowed node. That
    node lost too, no node can take it: its restarts fail saying so and run out; the first node rejoins and the
    replica is back on it."""
    p = Pipeline(
        "test_lost_node",
        [StageSpec(0, kind="llm", engine=tp.TokenStreamEngine, output="token_ids", final=True)],
    )
    deploy = ray_deploy({"stage_id": 0, "placement": {"label_selector": {"pool": "in(dit,spare)"}}})
    three = [{"max_tokens": 3}]
    try:
        async with AsyncOmni(pipeline=p, deploy_config=deploy) as engine:
            replica = engine.replicas(0)[0]
            first = await pool_of(nodes, replica)
            other = {"dit": "spare", "spare": "dit"}[first]
            slow = [{"max_tokens": 1000, "extra_args": {"delay": 0.01}}]
            task = asyncio.create_task(final_output(engine.generate("x", sampling_params_list=slow)))
            await asyncio.sleep(0.5)
            lost = replica.node_id
            nodes.remove_node(nodes.pools.pop(first), allow_graceful=False)
            with pytest.raises(StageFailedError, match="stage 0 Ray actor died") as err:
                await asyncio.wait_for(task, 60)
            assert isinstance(err.value, StageUnavailableError)  # the server answers 503
            stats = engine.stage_stats()[0]
            assert not stats.healthy and lost in stats.detail and "replica 0" in stats.detail
            # back on the node that still satisfies the placement
            await until(lambda: engine.is_ready, 60)
            assert engine.is_ready and await pool_of(nodes, replica) == other
            assert len((await final_output(engine.generate("x", sampling_params_list=three))).token_ids) == 3
            # that node lost as well: no node takes the placement, every restart is refused saying so
            nodes.remove_node(nodes.pools.pop(other), allow_graceful=False)
            await until(lambda: "restarts failed" in engine.stage_stats()[0].detail, 120)
            detail = engine.stage_stats()[0].detail
            assert "restarts failed" in detail and "no node" in detail, detail
            # the first node rejoins: the replica, down after its restarts ran out, is back on it
            add_worker(nodes, first)
            await until(lambda: engine.is_ready, 60)
            assert engine.is_ready and await pool_of(nodes, replica) == first
            assert len((await final_output(engine.generate("x", sampling_params_list=three))).token_ids) == 3
    finally:
        for pool in WORKERS:  # the cluster as the other tests expect it
            if pool not in nodes.pools:
                add_worker(nodes, pool)
        nodes.wait_for_nodes()


async def test_a_sessions_turns_go_to_the_replica_holding_its_state_across_nodes(nodes):
    """Two replicas of a stage that keeps per-session state, one on each worker node: every turn of a session,
    the sessions interleaved, reaches the replica that served its first (each counts 1, 2, 3); requests naming no
    session still alternate over both replicas; an ended session is placed afresh."""
    one_per_node = {"runtime": {"num_cpus": 1}, "placement": {"label_selector": {"pool": "!ar"}}}
    deploy = ray_deploy({"stage_id": 0, "num_replicas": 2, **one_per_node})
    async with AsyncOmni(pipeline=tp.session_turns(), deploy_config=deploy) as engine:
        assert sorted([await pool_of(nodes, r) for r in engine.replicas(0)]) == ["dit", "spare"]

        async def turn(session):
            return (await final_output(engine.generate("hi", session_id=session))).token_ids[0]

        sessions = ["a", "b", "c"]  # a and c start on one replica, b on the other
        got: dict[str, list[int]] = {s: [] for s in sessions}
        for _ in range(3):
            for s in sessions:
                got[s].append(await turn(s))
        assert got == {s: [1, 2, 3] for s in sessions}
        assert [await turn(None) for _ in range(4)] == [1, 1, 2, 2]  # no session: round-robin
        engine.end_session("a")
        assert await turn("a") == 1  # ended: the next replica in turn (b's), which never served it


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
            before = set(actor_states())
            engine = AsyncOmni(pipeline=tp.chain(), deploy_config=waiter)
            start = asyncio.create_task(engine.start())
            await until_pending(start, before, started=1)  # stage 0 is up, stage 1's actor waits in Ray
            assert not start.done()  # both dit slots are taken: it waits
            nodes.remove_node(nodes.pools.pop("dit"), allow_graceful=False)
            # Ray fails an actor queued on the lost node itself; one still pending cluster-wide is refused by
            # the placement re-check
            with pytest.raises(Exception, match=r"(?s)stage 1.*(node has died|dit_slot.*no node)"):
                await asyncio.wait_for(start, 60)
            await engine.shutdown()
    finally:
        add_worker(nodes, "dit")


async def test_a_node_too_small_for_the_stage_by_the_memory_plan_is_refused_at_start_up(nodes, tiny_model):
    """The chat model's vLLM stage placed on the spare node, whose memory (Ray's ``memory`` resource, 64 KiB) is
    below the stage's weights: refused at start-up naming the stage and what it needs (the weights, as vLLM
    loads them: bfloat16, two bytes per value), before any actor or engine starts."""
    from safetensors import safe_open

    folder = tiny_model("chat")
    values = 0
    for f in folder.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            values += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    need = f"{values * 2 / 2**20:.2f} MiB"
    deploy = ray_deploy({"stage_id": 0, "placement": {"label_selector": {"pool": "spare"}}})
    engine = AsyncOmni(str(folder), deploy_config=deploy)
    with pytest.raises(Exception, match=r"stage 0: needs ") as err:
        await asyncio.wait_for(engine.start(), 120)
    assert err.match(rf"stage 0: needs {need} per node \(Ray's memory resource\) by the memory plan"), err.value
    await engine.shutdown()


@pytest.mark.vllm
async def test_glm_image_ar_on_one_node_and_two_dit_replicas_on_another(nodes, tiny_model):
    """GLM-Image (tiny): the vLLM AR stage on the ``ar`` node, two diffusion replicas on the ``dit`` node;
    the images equal the single-process run's (prior tokens and latents cross nodes through Ray)."""
    folder = str(tiny_model("glm_image"))
    params = [{}, {"num_inference_steps": 3, "guidance_scale": 1.5, "seed": 5}]
    prompts = [{"prompt": p, "image_size": (64, 96)} for p in ("a red cat", "a dog")]
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


@pytest.mark.vllm
async def test_qwen3_omni_thinker_on_one_node_talker_and_code2wav_on_another(nodes, tiny_model):
    """Qwen3-Omni (tiny), an audio prompt: the thinker (vLLM) on the ``ar`` node, talker and code2wav on the
    ``dit`` node. The talker reads the thinker's hidden-state rows at the audio positions: its engine's connector
    writes them into a file on the thinker's own node, and the thinker stage hands them on as tensors in its
    output, which cross to the talker's node through Ray. Text and waveform equal the single-process run."""
    from tests.models import omni_media as media

    folder = str(tiny_model("qwen3_omni"))
    clip = {"type": "input_audio", "input_audio": {"data": media.wav_base64(media.clip(1.0, 0)), "format": "wav"}}
    prompt = {"messages": [{"role": "user", "content": [clip, {"type": "text", "text": "what did i say?"}]}]}
    greedy = [{"temperature": 0, "max_tokens": 8}, {"temperature": 0, "max_tokens": 12}]

    async def run(engine):
        finals = finished_by_stage(await all_outputs(engine.generate(prompt, sampling_params_list=greedy)))
        return finals[0].token_ids, finals[2].audio

    async with AsyncOmni(folder, max_model_len=1024) as inline:
        want_ids, want_audio = await run(inline)
    on_dit = {"placement": {"label_selector": {"pool": "dit"}, "resources": {"dit_slot": 1}}}
    deploy = ray_deploy(
        {"stage_id": 0, "placement": {"label_selector": {"pool": "ar"}}},
        {"stage_id": 1, **on_dit},
        {"stage_id": 2, **on_dit},
    )
    async with AsyncOmni(folder, deploy_config=deploy, max_model_len=1024) as engine:
        placed = {sid: [await pool_of(nodes, r) for r in engine.replicas(sid)] for sid in range(3)}
        assert placed == {0: ["ar"], 1: ["dit"], 2: ["dit"]}
        ids, audio = await run(engine)
    assert ids == want_ids and len(ids) > 0
    assert want_audio.size > 0 and np.array_equal(audio, want_audio)
