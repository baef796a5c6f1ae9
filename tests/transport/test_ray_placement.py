"""A stage's ``placement`` (Ray label selector and custom resources): the deploy file's rules, and the
start-up check of it against node records shaped as ``ray.nodes()`` returns them (the check on a live
three-node cluster: tests/engine/test_ray_nodes.py)."""

from __future__ import annotations

import pytest

from omnistage.config import ConfigError, load_deploy_config
from omnistage.transport.ray_placement import check_placement, label_matches


def node(pool: str | None, alive: bool = True, **resources: float) -> dict:
    labels = {"ray.io/node-id": "abc"} | ({"pool": pool} if pool else {})
    return {"NodeID": "abcdef0123", "Alive": alive, "Labels": labels, "Resources": {"CPU": 2.0, **resources}}


@pytest.mark.parametrize(
    "selector, value, matches",
    [
        ("dit", "dit", True),
        ("dit", "ar", False),
        ("dit", None, False),
        ("!dit", "ar", True),
        ("!dit", None, True),
        ("!dit", "dit", False),
        ("in(ar,dit)", "dit", True),
        ("in(ar, dit)", "dit", True),
        ("in(ar,dit)", "spare", False),
        ("!in(ar,dit)", "spare", True),
        ("!in(ar,dit)", "ar", False),
    ],
)
def test_label_selector_values_as_ray_reads_them(selector, value, matches):
    assert label_matches(selector, value) is matches


def test_capacity_counts_resource_totals_of_matching_live_nodes():
    nodes = [node("dit", dit_slot=2), node("dit", alive=False, dit_slot=4), node("ar", dit_slot=8)]
    check_placement("stage 1", 2, {"pool": "dit"}, {"dit_slot": 1}, nodes)
    with pytest.raises(RuntimeError, match=r"stage 1: placement .*the matching nodes hold only 2 of 3 replicas"):
        check_placement("stage 1", 3, {"pool": "dit"}, {"dit_slot": 1}, nodes)
    # a fractional request: 0.1 x 20 fits 2.0 despite float sums
    check_placement("stage 1", 20, {"pool": "dit"}, {"dit_slot": 0.1}, nodes)
    with pytest.raises(RuntimeError, match=r"'GPU': 1.*no node.*abcdef01 labels=\{'pool': 'dit'\}"):
        check_placement("stage 2", 1, {}, {"GPU": 1, "CPU": 0}, nodes)
    check_placement("stage 0", 5, {"pool": "ar"}, {"CPU": 0}, nodes)  # no resources asked: any count fits


def test_nodes_too_small_for_the_stage_by_the_memory_plan_are_refused():
    gib = 1 << 30
    big, small = node("dit", GPU=1, memory=64 * gib), node("dit", GPU=1, memory=64 * gib)
    big["Labels"]["device_memory"], small["Labels"]["device_memory"] = "80GiB", "24GB"
    need = (30 * gib, "27 GiB of weights within 0.9 of it")
    gpu = {"GPU": 1, "CPU": 0}
    check_placement("stage 0", 1, {"pool": "dit"}, gpu, [big, small], need)
    with pytest.raises(RuntimeError, match=r"stage 0: needs 30.00 GiB per GPU .*27 GiB of weights.* 1 of 2 repl"):
        check_placement("stage 0", 2, {"pool": "dit"}, gpu, [big, small], need)
    unlabelled = node("dit", GPU=1)  # says nothing of its GPUs: taken to fit
    check_placement("stage 0", 2, {"pool": "dit"}, gpu, [big, unlabelled], need)
    # a CPU stage: the node's own memory (Ray's memory resource)
    cpu = {"CPU": 0}
    check_placement("stage 1", 1, {}, cpu, [node("ar", memory=64 * gib)], need)
    with pytest.raises(RuntimeError, match=r"stage 1: needs 30.00 GiB per node \(Ray's memory resource\)"):
        check_placement("stage 1", 1, {}, cpu, [node("ar", memory=8 * gib)], need)


def test_placement_in_the_deploy_file_and_overrides():
    cfg = load_deploy_config(
        {"distributed_executor_backend": "ray", "stages": [{"stage_id": 1, "placement": {"resources": {"x": 1}}}]},
        '{"1": {"placement": {"label_selector": {"pool": "dit"}}}}',
    )
    assert cfg.stage(1).placement.label_selector == {"pool": "dit"}
    cfg = load_deploy_config({"stages": [{"stage_id": 0, "process": "ray", "placement": {}}]})
    assert cfg.stage(0).placement.resources == {}


@pytest.mark.parametrize(
    "stage, message",
    [
        ({"placement": {"label_selector": {"pool": "dit"}}}, r"stage 0: placement applies to Ray stages only"),
        (
            {"process": "ray", "placement": {"resources": {"dit_slot": 0}}},
            r"placement\.resources.*resources\.dit_slot: expected an amount > 0",
        ),
        ({"process": "ray", "placement": {"pool": "dit"}}, r"placement\.pool: unknown key"),
    ],
)
def test_bad_placements_are_refused_naming_the_field(stage, message):
    with pytest.raises(ConfigError, match=message):
        load_deploy_config({"stages": [{"stage_id": 0, **stage}]})
