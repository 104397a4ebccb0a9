"""The data order depends only on (seed, global sample index): it survives resumes and resizes."""

from __future__ import annotations

import numpy as np
import torch

from fsdp_jobs.runtime.data import SyntheticTokens, TokenFile, rank_batch


def test_items_depend_only_on_seed_and_index():
    a, b = SyntheticTokens(3, 32, 100), SyntheticTokens(3, 32, 100)
    assert torch.equal(a[12345], b[12345])
    assert not torch.equal(a[1], a[2])
    assert not torch.equal(a[1], SyntheticTokens(4, 32, 100)[1])


def test_ranks_split_the_same_global_batch_whatever_the_world_size():
    ds = SyntheticTokens(0, 16, 64)
    world4 = torch.cat([rank_batch(ds, 320, r, 4)[0] for r in range(4)])
    world2 = torch.cat([rank_batch(ds, 320, r, 8)[0] for r in range(2)])
    assert torch.equal(world4, world2)
    x, y = rank_batch(ds, 0, 0, 2)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one


def test_synthetic_stream_is_learnable():
    ds = SyntheticTokens(0, 64, 512, branching=4)
    seq = ds[0]
    for t in range(64):  # every successor is one of the 4 allowed for its token
        assert int(seq[t + 1]) in set(ds.successors[int(seq[t])].tolist())


def test_token_file_is_memory_mapped_and_deterministic(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    ds = TokenFile(seed=1, seq_len=10, path=str(path))
    item = ds[7]
    assert torch.equal(item, TokenFile(seed=1, seq_len=10, path=str(path))[7])
    assert item.tolist() == list(range(int(item[0]), int(item[0]) + 11))


class Constant:
    """A user's own dataset: any importable class named by data._target_."""

    def __init__(self, seed: int, seq_len: int, value: int = 3) -> None:
        self.seq_len, self.value = seq_len, value

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((self.seq_len + 1,), self.value, dtype=torch.long)


def test_any_importable_dataset_class_through_target():
    from fsdp_jobs.runtime.data import build_dataset

    from fsdp_jobs.planning.config import DataConfig

    ds = build_dataset(DataConfig(_target_="tests.unit.test_data.Constant", seq_len=8, kwargs={"value": 7}),
                       seed=0, vocab_size=100)
    x, y = rank_batch(ds, 0, 0, 2)
    assert x.shape == (2, 8) and int(x[0, 0]) == 7
