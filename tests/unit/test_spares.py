"""cluster.spare_nodes (issue 30, hot spares) in the plan and cluster=local's dry run; the refusals in one line.
The real-agent proof that a spare replaces a killed node: tests/integration/test_spares.py."""

from __future__ import annotations

import pytest

from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.plan import Plan, make_plan


def local_dryrun(*overrides: str):
    from launchers.local.backend import BACKEND

    cfg, _ = compose(["nodes=2", "gpus_per_node=1", "cluster.device=cpu", *overrides])
    return BACKEND.dryrun(make_plan(cfg), cfg)


def test_local_starts_n_plus_k_agents_with_a_rendezvous_of_n():
    """The spare's agent is the same torchrun command (--nnodes=2): beyond max_nodes, torch keeps it in the
    rendezvous' redundancy list, so the job stays 2 nodes and the spare does not grow it."""
    dry = local_dryrun("cluster.spare_nodes=1")
    assert dry.plan.spare_nodes == 1 and dry.plan.rendezvous.max_nodes == 2
    assert len(dry.request.agents) == 3 and dry.request.spares == []  # all started with the job
    assert all("--nnodes=2" in a.argv for a in dry.request.agents)
    assert [a.env["FSDP_JOBS_NODE"] for a in dry.request.agents] == ["node0", "node1", "node2"]
    assert "# node2 (hot spare: cluster.spare_nodes)" in dry.request.render()


def test_no_spares_leaves_the_plan_record_as_it_was():
    """Golden dry runs unchanged: the key is written only when spares are configured, and read back."""
    plan = make_plan(compose(["nodes=2"])[0])
    assert "spare_nodes" not in plan.to_dict()
    spared = make_plan(compose(["nodes=2", "cluster.spare_nodes=2"])[0])
    assert Plan.from_dict(spared.to_dict()).spare_nodes == 2


@pytest.mark.parametrize("overrides, says", [
    (("cluster=docker",), "cluster=docker does not start spare nodes yet; allowed with cluster=local, or 0"),
    (("cluster=slurm",), "cluster=slurm does not start spare nodes yet"),
    (("cluster=kubernetes",), "cluster=kubernetes does not start spare nodes yet"),
    (("cluster.max_nodes=3",), "spares need cluster.max_nodes unset or = nodes=2"),
    (("fault_tolerance=replica",), "not with fault_tolerance=replica"),
])
def test_spares_where_they_cannot_work_are_refused_in_one_line(overrides, says):
    with pytest.raises(UserError) as e:
        make_plan(compose(["nodes=2", "cluster.spare_nodes=1", *overrides])[0])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_negative_spare_count_is_refused():
    with pytest.raises(UserError, match="cluster.spare_nodes=-1: must be an integer from 0"):
        make_plan(compose(["nodes=2", "cluster.spare_nodes=-1"])[0])
