"""Silent data corruption (fsdp_jobs/runtime/sdc.py): the fingerprint that replicas of a shard compare, and who a
mismatch names. The jobs that find a flipped bit and roll back: tests/integration/test_sdc.py."""

from __future__ import annotations

import torch

from fsdp_jobs.runtime.sdc import disagreeing, fingerprint, flip_a_bit


def test_the_majority_names_the_replica_that_differs_and_two_replicas_name_both():
    assert disagreeing([(1, 2), (1, 2), (1, 2)]) == []
    assert disagreeing([(1, 2), (9, 9), (1, 2)]) == [1]
    assert disagreeing([(1, 2), (9, 9), (1, 2), (1, 2)]) == [1]
    assert disagreeing([(1, 2), (9, 9)]) == [0, 1]  # no majority: neither is trusted over the other
    assert disagreeing([(1, 2), (9, 9), (1, 2), (9, 9)]) == [0, 1, 2, 3]  # a tie is none either


def test_any_one_flipped_bit_changes_the_fingerprint_and_equal_bytes_give_equal_ones():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4).to(torch.bfloat16))
    tensors = [p.detach() for p in model.parameters()]
    before = fingerprint(tensors, torch.device("cpu"))
    assert torch.equal(before, fingerprint([t.clone() for t in tensors], torch.device("cpu")))
    for t in tensors:
        ints = t.reshape(-1).view({4: torch.int32, 2: torch.int16}[t.element_size()])
        for bit in (0, 7, t.element_size() * 8 - 1):  # the lowest, a middle and the sign bit
            for i in (0, ints.numel() - 1):
                ints[i] ^= 1 << bit if bit < t.element_size() * 8 - 1 else -(1 << bit)
                assert not torch.equal(fingerprint(tensors, torch.device("cpu")), before), (t.shape, bit, i)
                ints[i] ^= 1 << bit if bit < t.element_size() * 8 - 1 else -(1 << bit)
    assert torch.equal(fingerprint(tensors, torch.device("cpu")), before)


def test_two_changes_that_cancel_in_the_sum_show_in_the_weighted_one():
    a, b = torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    before = fingerprint([a, b], torch.device("cpu"))
    a[0], b[0] = 5, -5
    after = fingerprint([a, b], torch.device("cpu"))
    assert after[0] == before[0] and after[1] != before[1]


def test_the_test_fault_flips_one_bit_of_the_first_parameter_and_nothing_else():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    before = [p.detach().clone() for p in model.parameters()]
    flip_a_bit(model)
    after = list(model.parameters())
    changed = (before[0] != after[0].detach()).nonzero().tolist()
    assert changed == [[0, 0]] and torch.isfinite(after[0]).all() and torch.equal(before[1], after[1].detach())


def test_a_chaos_request_is_a_real_time_signal_whose_number_says_the_bit():
    """`fsdp-jobs chaos RUN corrupt-rank R --bit K` sends SIGRTMIN + K (launchers/chaos/inject.py); the rank notes K
    and the step loop takes it once."""
    import os
    import signal

    from fsdp_jobs.runtime.sdc import CorruptRequests

    requests = CorruptRequests()
    try:
        assert requests.take() is None
        os.kill(os.getpid(), signal.SIGRTMIN + 7)
        assert requests.take() == 7 and requests.take() is None
    finally:
        for bit in range(31):
            signal.signal(signal.SIGRTMIN + bit, signal.SIG_DFL)


def agreement(monkeypatch, world_size=4, shard=2):
    from fsdp_jobs.runtime import sdc

    monkeypatch.setattr(sdc.dist, "get_world_size", lambda: world_size)
    return sdc.ReplicaAgreement({"replicate": world_size // shard, "shard": shard}, "auto", "auto", torch.device("cpu"))


def test_two_replicas_are_told_apart_by_which_one_reproduces_its_own_state(monkeypatch):
    """2 x 2: ranks 1 and 3 hold one shard and disagreed at step 12 (rank 3's bit flipped). Recomputed from step
    11, the rank whose fingerprint moved is the corrupted one; both moved (the corruption reached both) names
    no one; a second disagreement at that step is a fault that reproduces and names both."""
    from fsdp_jobs.runtime.sdc import Mismatch

    healthy, flipped, other = (5, 50), (7, 70), (1, 10)
    pair = Mismatch(12, 11, [1, 3], "pair", [other, healthy, other, flipped])
    judge = agreement(monkeypatch)
    assert judge.due(12, keeping=False) is False
    judge.recompute(pair, 11)
    assert judge.agreed_step == 11 and judge.due(12, keeping=False)  # the step to judge is checked, kept or not
    named = judge.judge(12, [other, healthy, other, healthy], [], pair)
    assert (named.how, named.ranks, named.agreed_step) == ("recomputation", [3], 12)
    spread = judge.judge(12, [other, (9, 9), other, (9, 9)], [], pair)
    assert (spread.how, spread.ranks) == ("unresolved", [1, 3]) and not spread.names_nodes
    again = judge.judge(12, [other, healthy, other, flipped], [1, 3], pair)
    assert (again.how, again.ranks) == ("repeated", [1, 3]) and again.names_nodes


def test_a_tensor_is_read_in_64_bit_words_where_its_bytes_allow_and_every_replica_reads_it_alike():
    from fsdp_jobs.runtime.sdc import words

    assert words(torch.zeros(6)).dtype == torch.int64 and words(torch.zeros(6)).numel() == 3
    assert words(torch.zeros(5)).dtype == torch.int32  # 20 bytes: no whole words
    assert words(torch.zeros(7)[1:]).dtype == torch.int32  # 24 bytes, but starting 4 bytes into a word
    assert words(torch.zeros(4, dtype=torch.bfloat16)).dtype == torch.int64
    assert words(torch.zeros((), dtype=torch.float32)).dtype == torch.int32  # an optimizer's step


def test_the_chaos_command_says_what_the_job_will_do_about_the_flip(tmp_path):
    """`fsdp-jobs chaos RUN corrupt-rank R` answers from the job's plan and record: nothing notices without replica
    groups; two are told apart by recomputing, three by majority; a spare takes the node's place, else the job
    stops there (rehearsing it on a job without spares ends that job)."""
    from fsdp_jobs.launchers.chaos.inject import what_the_check_does
    from fsdp_jobs.rundir import runs

    def said(replicate: int, spares: int, **job) -> str:
        run_dir = tmp_path / f"r{replicate}-{spares}-{len(job)}"
        runs.prepare(run_dir, {"name": "r", "cluster": {"backend": "local", "spare_nodes": spares}, **job},
                     {"mesh": {"replicate": replicate, "shard": 2}})
        return what_the_check_does(run_dir)

    assert "nothing will notice it (fault.sdc_recompute_interval=N takes every Nth step again" in said(1, 1)
    assert said(1, 1, fault={"sdc_recompute_interval": 10}).endswith(  # fsdp_jobs/runtime/recheck.py
        "no replica groups to compare (hybrid_shard on 2+ nodes has); the step recheck "
        "(fault.sdc_recompute_interval=10) finds it only if its step is one taken again (1 in 10)")
    assert "the replica agreement check is off" in said(3, 1, fault={"sdc_check_interval": 0})
    assert "the replica agreement check is off" in said(3, 1, checkpoint={"memory_interval": 0})
    assert said(2, 0).endswith("recomputing the steps since names its node if its step was a checked one (else the "
                               "job goes on from the recomputed state, naming none), and with no hot spare "
                               "(cluster.spare_nodes) the job stops there")
    assert said(3, 1).endswith("the majority names its node, and a hot spare takes its place")
