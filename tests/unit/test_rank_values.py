"""Values no rank can run with are refused while planning: otherwise each passes the dry run and the job then
fails on every rank after its start-up, hundreds of lines. The refusals themselves, one line and
exit 2 with nothing written, are rows of tests/unit/test_bad_inputs.py; here: the values beside them that
must still plan, the import-path reader (fsdp_jobs/planning/targets.py) case by case, and that each refused
value really fails where a rank uses it (a rule that refuses more than fails is a rule to loosen)."""

from __future__ import annotations

import datetime
import importlib.util
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fsdp_jobs.planning import targets
from fsdp_jobs.planning.errors import UserError

# next to a refused value, the nearest that runs: each must compose and plan
ACCEPTED = [
    ["train.seed=0"],
    ["train.seed=9223372036854775807"],
    ["model.dim=136"],  # 34 channels per head: even
    ["train.lr=1"],
    ["train.collective_timeout_s=86400"],
    ["train.steps=9223372036854775807"],
    ["fsdp.wrap.transformer_blocks=[torch.nn.Linear]"],  # torch.nn's names come from star imports: let through
    ["fsdp.wrap.transformer_blocks=[fsdp_jobs.models.llama.RMSNorm]"],
    ["data.kwargs.branching=8"],
    ["model._target_=userpkg.models.Wide", "+model.kwargs.width=3"],  # takes **kwargs
    ["model._target_=userpkg.models.Child"],  # __init__ from a base in the same module
    ["model._target_=userpkg.models.Decorated"],  # a decorator may change what it takes: let through
]

USER_MODELS = """
    import dataclasses
    from torch import nn


    class Base(nn.Module):
        def __init__(self, dim, vocab_size, tie_embeddings=False):
            super().__init__()


    class Child(Base):
        pass


    class Wide(nn.Module):
        def __init__(self, dim, **kwargs):
            super().__init__()


    @dataclasses.dataclass
    class Decorated:
        anything: int = 0


    def factory(dim, head_dim, /, *, n_layers=2):
        return Base(dim, 1)


    try:
        from userpkg.missing import Guarded
    except ImportError:
        Guarded = None
"""


@pytest.fixture
def userpkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's package on sys.path; importing any of it raises, so a check that imported it would fail."""
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('planning imported the package')\n")
    (pkg / "models.py").write_text("raise RuntimeError('planning imported the module')\n" + textwrap.dedent(USER_MODELS))
    (pkg / "star.py").write_text("from userpkg.models import *\n")
    (pkg / "lazy.py").write_text("def __getattr__(name):\n    return name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return pkg


@pytest.mark.parametrize("args", ACCEPTED, ids=[" ".join(a) for a in ACCEPTED])
def test_the_nearest_values_that_run_still_plan(userpkg, run_root, args):
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.plan import make_plan

    cfg, _ = compose(["cluster=local", "nodes=2", "gpus_per_node=1", f"run_root={run_root}", *args])
    make_plan(cfg)
    assert not any(m.startswith("userpkg") for m in sys.modules)


def test_a_token_file_within_the_vocabulary_plans(tmp_path, run_root):
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.inputs import check_inputs

    f = tmp_path / "tokens.bin"
    (np.arange(5000) % 512).astype(np.uint16).tofile(f)
    cfg, _ = compose(["cluster=local", f"run_root={run_root}", "data=token_file", f"data.path={f}"])
    check_inputs(cfg)


# path -> (kind, accepted names, required names), None where the source cannot tell, or the LookupError's words
DEFINITIONS = [
    ("userpkg.models.Base", ("class", {"dim", "vocab_size", "tie_embeddings"}, ["dim", "vocab_size"])),
    ("userpkg.models.Child", ("class", {"dim", "vocab_size", "tie_embeddings"}, ["dim", "vocab_size"])),
    ("userpkg.models.Decorated", ("class", None, None)),
    ("userpkg.models.factory", ("function", {"n_layers"}, ["dim", "head_dim"])),  # positional-only: never by keyword
    ("userpkg.models.Guarded", ("other", None, None)),  # assigned in an except block
    ("userpkg.models.nn", ("other", None, None)),  # imported
    ("userpkg.star.Base", None),  # a star import: any name may come from it
    ("userpkg.lazy.Anything", None),  # a module __getattr__
    ("torch.nn.Linear", None),
    ("userpkg.models.Nope", "module userpkg.models defines no Nope (its classes: Base, Child, Decorated, Wide)"),
    ("userpkg.nope.Model", "no module userpkg.nope"),
    ("userpkg.models.deeper.Model", "userpkg.models is a module, not a package"),
    ("userpkg.models", "userpkg.models is a module; name the class in it"),
    ("nopkg_surely.models.Model", "nopkg_surely is not installed"),
]


@pytest.mark.parametrize("path, expected", DEFINITIONS, ids=[d[0] for d in DEFINITIONS])
def test_an_import_path_is_read_from_its_source_without_importing_it(userpkg, path, expected):
    if isinstance(expected, str):
        with pytest.raises(LookupError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            targets.definition(path)
    else:
        found = targets.definition(path)
        if expected is None:
            assert found is None or found.params is None and found.kind == "other", found
        else:
            kind, names, required = expected
            assert found is not None and found.kind == kind
            assert (found.params.names, found.params.required) == (names, required) if names is not None \
                else found.params is None
    assert not any(m.startswith("userpkg") for m in sys.modules)


def test_a_class_is_checked_as_the_ranks_call_it(userpkg):
    """kwargs a class does not take, and what it needs that nothing passes, are refused; **kwargs takes all."""
    with pytest.raises(UserError, match=r"model.kwargs.width=3: userpkg.models.Base takes no argument width"):
        targets.check_callable("model._target_", "userpkg.models.Base", targets.MODEL_SHAPE_KEYS, {"width": 3},
                               "model.kwargs")
    with pytest.raises(UserError, match=r"needs dim, head_dim, which no rank passes; give them in model.kwargs"):
        targets.check_callable("model._target_", "userpkg.models.factory", ("dim", "n_layers"), {}, "model.kwargs")
    targets.check_callable("model._target_", "userpkg.models.Wide", targets.MODEL_SHAPE_KEYS, {"width": 3},
                           "model.kwargs")
    with pytest.raises(UserError, match="is a function; name a class"):
        targets.check_class("fsdp.wrap.transformer_blocks", "userpkg.models.factory")
    targets.check_class("fsdp.wrap.transformer_blocks", "userpkg.models.Guarded")  # unknown: let through


def test_a_module_is_parsed_once_for_the_same_text_and_again_once_edited(userpkg, monkeypatch):
    """A sweep's members (a process that plans again and again) check the same modules: each text is parsed
    once; a module edited since is read as it is now."""
    parsed = []
    real = targets.ast.parse
    monkeypatch.setattr(targets.ast, "parse", lambda source, *a, **k: parsed.append(source) or real(source, *a, **k))
    targets._names_in.cache_clear()
    for _ in range(3):
        assert targets.definition("userpkg.models.Base").kind == "class"
        assert targets.definition("userpkg.models.factory").kind == "function"
    assert len(parsed) == 1
    models = userpkg / "models.py"
    models.write_text(models.read_text() + "\nclass Later:\n    pass\n")
    assert targets.definition("userpkg.models.Later").kind == "class"
    assert len(parsed) == 2


def test_the_planning_readers_agree_with_what_the_ranks_pass():
    """The ranks' calls offer exactly the names planning checks against (fsdp_jobs/runtime/shard.py, data.py)."""
    import inspect

    from fsdp_jobs.runtime import data, shard

    assert shard.MODEL_SHAPE_KEYS is targets.MODEL_SHAPE_KEYS
    assert "DATA_KEYS" in inspect.getsource(data.build_dataset)
    for name in targets.MODEL_SHAPE_KEYS:
        assert name in inspect.signature(importlib.import_module("fsdp_jobs.models.llama").Transformer).parameters


def test_each_refused_value_fails_where_a_rank_uses_it():
    """What the rules stand on, seen on this torch and numpy (cheap: no job)."""
    import torch

    from fsdp_jobs.models.llama import Transformer
    from fsdp_jobs.runtime.data import SyntheticTokens

    model = Transformer(dim=132, n_layers=1, n_heads=4, ffn_dim=8, vocab_size=16, max_seq_len=8)  # 33 per head
    with pytest.raises(RuntimeError):
        model(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError):
        SyntheticTokens(seed=-8, seq_len=4, vocab_size=16)
    with pytest.raises((ValueError, RuntimeError, OverflowError)):
        torch.manual_seed(2**64)
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    with pytest.raises(RuntimeError, match="overflow"):
        torch.optim.AdamW([p], lr=3.5e37, betas=(0.9, 0.95), foreach=True).step()
    torch.optim.AdamW([p], lr=3.3e37, betas=(0.9, 0.95), foreach=True).step()  # just inside: steps
    with pytest.raises(OverflowError):
        datetime.timedelta(seconds=1e300)
    assert importlib.util.find_spec("fsdp_jobs.models.nope") is None


def test_a_package_behind_a_stale_finder_cache_is_still_found(tmp_path, monkeypatch):
    """The import system's cached directory listing of a package (sys.path_importer_cache) may be stale in a
    long-lived process; the check reads the file system then, and never calls an installed package missing."""
    import importlib.machinery

    sub = tmp_path / "stalepkg" / "models"
    sub.mkdir(parents=True)
    (tmp_path / "stalepkg" / "__init__.py").write_text("raise RuntimeError('planning imported the package')\n")
    (sub / "__init__.py").write_text("class Model:\n    def __init__(self, dim: int = 1):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stale = importlib.machinery.FileFinder(str(tmp_path / "stalepkg"),
                                           (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES))
    stale._path_cache, stale._path_mtime = set(), (tmp_path / "stalepkg").stat().st_mtime  # listed empty
    monkeypatch.setitem(sys.path_importer_cache, str(tmp_path / "stalepkg"), stale)
    found = targets.definition("stalepkg.models.Model")
    assert found is not None and found.kind == "class"
