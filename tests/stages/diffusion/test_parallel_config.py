"""A multi-device diffusion replica's configuration: the degrees checked against the devices, the layout
``omnistage serve`` reports, and models that cannot be split over the sequence refused before any rank starts."""

from __future__ import annotations

import pytest

from omnistage import AsyncOmni
from omnistage.config import load_deploy_config
from omnistage.stages.diffusion.parallel.layout import Layout, replica_lines


def stage(**fields):
    return {"stages": [{"stage_id": 0, **fields}]}


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            dict(parallel_config={"cfg_parallel_size": 2, "ulysses_degree": 2, "world_size": 2}),
            r"cfg_parallel_size \(2\) x ulysses_degree \(2\) = 4 does not equal world_size \(2\)",
        ),
        (dict(parallel_config={"cfg_parallel_size": 3}), r"cfg_parallel_size"),
        (dict(parallel_config={"ulysses_degree": 0}), r"ulysses_degree"),
        (
            dict(parallel_config={"cfg_parallel_size": 2, "tensor_parallel_size": 2}),
            r"do not combine with tensor_parallel_size",
        ),
        (
            dict(parallel_config={"cfg_parallel_size": 2, "ulysses_degree": 2}, devices="0,1,2"),
            r"devices .* has 3 entries; expected num_replicas \(1\) x devices_per_replica \(4\) = 4",
        ),
    ],
)
def test_degrees_are_checked_against_the_devices(fields, message):
    with pytest.raises(ValueError, match=message):
        load_deploy_config(stage(**fields))


def test_layout_of_the_degrees():
    s = load_deploy_config(
        stage(parallel_config={"cfg_parallel_size": 2, "ulysses_degree": 2}, num_replicas=2, devices="0,1,2,3,4,5,6,7")
    ).stage(0)
    assert s.devices_per_replica == 4 and s.replica_devices() == [["0", "1", "2", "3"], ["4", "5", "6", "7"]]
    layout = Layout.of_deploy(s)
    assert (layout.cfg, layout.ulysses, layout.world) == (2, 2, 4)
    assert [layout.coords(r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # world_size alone: every device in sequence parallelism (it speeds up every request, CFG or not)
    only_world = Layout.of_deploy(load_deploy_config(stage(parallel_config={"world_size": 2})).stage(0))
    assert (only_world.cfg, only_world.ulysses) == (1, 2)


def test_replica_lines_name_the_chosen_layout():
    from omnistage.models.sd3 import PIPELINE

    omni = AsyncOmni(pipeline=PIPELINE, deploy_config=stage(parallel_config={"world_size": 2}))
    assert replica_lines(omni.pipeline, omni.deploy) == [
        "stage 0 replica 0: 2 ranks, cfg_parallel_size=1 x ulysses_degree=2, devices cpu,cpu, backend cpu:gloo"
    ]


async def test_a_model_without_a_sequence_plan_is_refused_before_any_rank_starts(tiny_model):
    """Stable Diffusion's UNet has no sequence-parallel plan: the error names the field, the pipeline and
    the model class, and comes from the launcher (no process was started)."""
    omni = AsyncOmni(str(tiny_model("sd15")), deploy_config=stage(parallel_config={"ulysses_degree": 2}))
    with pytest.raises(
        ValueError,
        match=r"stages\[0\]\.parallel_config\.ulysses_degree: pipeline 'sd' runs "
        r"UNet2DConditionModel, which has no sequence-parallel plan",
    ):
        await omni.start()
    assert not omni.started
