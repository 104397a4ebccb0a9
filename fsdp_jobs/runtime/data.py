"""Datasets whose item i depends only on (seed, i), and the sampler that hands each rank its slice.

The data position is one integer, the number of samples consumed so far (over all ranks). It is
checkpointed, so a resumed run continues at the same sample, whatever the new world size.
"""

from __future__ import annotations

from typing import Protocol, TYPE_CHECKING

import numpy as np
import torch

from fsdp_jobs.planning.targets import DATA_KEYS

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import DataConfig

_MIX = 0x9E3779B97F4A7C15  # splitmix64 increment: decorrelates (seed, index) pairs


def sample_generator(seed: int, index: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(key=(seed * _MIX + index) % 2**64))


class TokenDataset(Protocol):
    seq_len: int

    def __getitem__(self, index: int) -> torch.Tensor:  # int64 tokens, shape (seq_len + 1,)
        ...


class SyntheticTokens:
    """A sparse random Markov chain over the vocabulary: each token has `branching` possible
    successors. Learnable (the best loss is about ln(branching)), unlike uniform noise."""

    def __init__(self, seed: int, seq_len: int, vocab_size: int, branching: int = 4) -> None:
        self.seed, self.seq_len, self.vocab_size = seed, seq_len, vocab_size
        table_rng = np.random.Generator(np.random.Philox(key=seed + 7))
        self.successors = table_rng.integers(0, vocab_size, size=(vocab_size, branching))

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = sample_generator(self.seed, index)
        choices = rng.integers(0, self.successors.shape[1], size=self.seq_len)
        tokens = np.empty(self.seq_len + 1, dtype=np.int64)
        tokens[0] = rng.integers(0, self.vocab_size)
        for t in range(self.seq_len):
            tokens[t + 1] = self.successors[tokens[t], choices[t]]
        return torch.from_numpy(tokens)


class TokenFile:
    """A flat binary file of token ids, memory-mapped; window i starts at a position drawn from
    (seed, i), so nothing is read until used and no index file is needed."""

    def __init__(self, seed: int, seq_len: int, path: str, token_dtype: str = "uint16",
                 vocab_size: int | None = None) -> None:
        self.seed, self.seq_len, self.path, self.vocab_size = seed, seq_len, path, vocab_size
        self.tokens = np.memmap(path, dtype=np.dtype(token_dtype), mode="r")
        self.windows = len(self.tokens) - seq_len - 1
        if self.windows < 1:
            raise ValueError(f"{path}: {len(self.tokens)} tokens, fewer than data.seq_len+2={seq_len + 2}")

    def __getitem__(self, index: int) -> torch.Tensor:
        start = int(sample_generator(self.seed, index).integers(0, self.windows + 1))
        window = self.tokens[start:start + self.seq_len + 1].astype(np.int64)
        # an id past the embedding table would be an opaque index error deep in the model
        if self.vocab_size is not None and (window.max() >= self.vocab_size or window.min() < 0):
            bad = int(np.argmax((window >= self.vocab_size) | (window < 0)))
            raise ValueError(f"{self.path}: token id {int(window[bad])} at position {start + bad} is outside "
                             f"model.vocab_size={self.vocab_size} (0 to {self.vocab_size - 1}); wrong "
                             "data.token_dtype or tokenizer?")
        return torch.from_numpy(window)


def rank_batch(dataset: TokenDataset, position: int, rank: int, per_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of this rank at global sample `position` (samples before this step)."""
    first = position + rank * per_rank
    rows = torch.stack([dataset[first + i] for i in range(per_rank)])
    return rows[:, :-1], rows[:, 1:]


def build_dataset(data_cfg: DataConfig, seed: int, vocab_size: int) -> TokenDataset:
    import inspect

    from fsdp_jobs.runtime.imports import import_object

    cls = import_object(data_cfg._target_)
    # planning checks the class's signature against these names (fsdp_jobs/planning/targets.py)
    offered = dict(zip(DATA_KEYS, (seed, data_cfg.seq_len, vocab_size, data_cfg.path, data_cfg.token_dtype)))
    params = inspect.signature(cls).parameters
    kwargs = {k: v for k, v in offered.items() if k in params}
    kwargs.update(data_cfg.kwargs or {})
    return cls(**kwargs)
