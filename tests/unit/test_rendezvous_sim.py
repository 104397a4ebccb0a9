"""fsdp_jobs/bench/rendezvous.py drives torch's own c10d rendezvous (DynamicRendezvousHandler over
C10dRendezvousBackend, a TCPStore server on loopback) with simulated agents: 16 of them form one world with
ranks 0..15, and after one is lost the 15 others form the next with ranks 0..14; every thread and store
connection it opened is gone afterwards. About 12 s: torch polls the state once a second, and the lost
node's keep-alive expiry (2 s x 3 attempts) and last_call (1 s) are waited out."""

from __future__ import annotations

import os
import threading

import pytest

from fsdp_jobs.bench.rendezvous import SimConf, simulate_round

# join_timeout bounds a broken round (the test then fails in about 20 s instead of torch's 600); keep-alive
# 2 s x 3: at 1 s x 2 a healthy agent's heartbeat, late behind a loaded machine's other work, was taken for
# a lost node once (beside the real API server's tests starting)
CONF = SimConf(join_timeout_s=20, last_call_s=1, keep_alive_s=2, keep_alive_attempts=3)


def sockets() -> int:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return sum(link.startswith("socket:") for link in links)


@pytest.mark.integration  # 12 s of torch's own polls and waits on loopback sockets: not the quick loop
def test_16_agents_form_one_world_and_15_form_the_next_after_a_loss():
    threads, open_sockets = set(threading.enumerate()), sockets()
    r = simulate_round(16, CONF)

    first = r["first_round"]
    assert sorted(first["ranks"]) == list(range(16)), first["ranks"]  # distinct node descriptors, one rank each
    assert first["world_sizes"] == [16] * 16
    assert r["round_before_loss"]["world_sizes"] == [16] * 16

    again = r["re_round"]
    assert again["nodes"] == 15
    assert sorted(again["ranks"]) == list(range(15)), again["ranks"]
    assert again["world_sizes"] == [15] * 15
    assert again["wall_s"] >= CONF.last_call_s  # 15 < max_nodes 16: the round waited last_call
    assert again["store"]["cas"] >= 2 * 15  # each of the 15 left the old round and joined the new one

    # every simulated agent's threads (its round, its keep-alive timer) and store connections are gone
    assert set(threading.enumerate()) == threads
    assert sockets() <= open_sockets  # <=: a socket an earlier test of this process left may close meanwhile


def test_a_large_torchrun_world_gets_rendezvous_settings_from_the_simulation() -> None:
    """Above 256 nodes in one torchrun world: a join timeout that grows with the nodes, heartbeats that
    survive an all-at-once round (fsdp_jobs/bench/rendezvous.py), one --rdzv-conf (torchrun keeps the last)."""
    from fsdp_jobs.launchers.common import rdzv_conf

    assert rdzv_conf(64, grow=False) == [] and rdzv_conf(256, grow=False) == []
    assert rdzv_conf(2, grow=True) == ["--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=2"]
    assert rdzv_conf(1024, grow=True) == [
        "--rdzv-conf=join_timeout=1624,keep_alive_interval=60,keep_alive_max_attempt=3,last_call_timeout=2"]


def test_a_small_world_drops_a_dead_node_in_3_s_at_no_more_store_load_than_torch_at_64_nodes() -> None:
    """A node that died with its agent (a container killed) held the next round for torch's keep-alive, 5 s x 3:
    every survivor and the node's replacement waited for it to lapse. Below 64 nodes the interval is shorter,
    1 s up to 28 nodes; each keep-alive rewrites the whole state, so the interval grows with the square of the
    nodes and the store's keep-alive load (writes a second x the state's size) stays at most torch's at 64
    (from 64 to 256 nodes it is torch's 5 s)."""
    from fsdp_jobs.launchers.common import keep_alive_s, rdzv_conf

    assert rdzv_conf(2, grow=False) == ["--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=3"]
    assert [keep_alive_s(n) for n in (2, 28, 29, 45, 64, 200, 256)] == [1, 1, 2, 3, 5, 5, 5]
    assert all(n * n / keep_alive_s(n) <= 64 * 64 / 5 for n in range(1, 65))  # beyond: torch's own 5 s


def test_the_1024_node_dry_run_passes_them_to_torchrun(tmp_path) -> None:
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.plan import make_plan
    from fsdp_jobs.launchers.common import torchrun_args

    cfg, _ = compose(["cluster=slurm", "nodes=1024", "gpus_per_node=8", "model=llama3_70b", "dry_run=true",
                      f"run_root={tmp_path}"])
    args = torchrun_args(make_plan(cfg), "n1:29500", 30)
    assert "--rdzv-conf=join_timeout=1624,keep_alive_interval=60,keep_alive_max_attempt=3" in args
    assert "--monitor-interval=5" in args
