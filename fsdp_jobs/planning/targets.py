"""The import paths every rank calls (`model._target_`, `data._target_`, `fsdp.wrap.transformer_blocks`),
checked while planning without importing them: a path a rank cannot import, or a class that does not take
the arguments the rank passes, failed on every rank after the job had started (hundreds of lines each).

The module is found with importlib's finders (nothing is executed) and its source read with `ast`: the
name must be defined there, and a class's `__init__` (a function's own parameters) must take every
`kwargs` key and need nothing that is not passed. Whatever the source cannot say for sure (a name from a
star import or a module `__getattr__`, an inherited or decorated `__init__`, a compiled module) is let
through: only a path that certainly fails is refused.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional

from fsdp_jobs.planning.errors import UserError

# what the ranks offer a model class (fsdp_jobs/runtime/shard.py build_meta_model): those its signature takes
MODEL_SHAPE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len",
                    "norm_eps", "rope_theta", "tie_embeddings")
# ... and a dataset class (fsdp_jobs/runtime/data.py build_dataset); `kwargs` comes on top of either
DATA_KEYS = ("seed", "seq_len", "vocab_size", "path", "token_dtype")


@dataclass
class Params:
    """What a callable takes by keyword (the ranks pass everything by keyword)."""

    names: set[str] = field(default_factory=set)
    required: list[str] = field(default_factory=list)  # in order: no default, or positional-only
    any_keyword: bool = False  # **kwargs


@dataclass
class Definition:
    kind: str  # "class", "function", or "other" (assigned or imported: its kind is not known)
    params: Optional[Params] = None  # None: not known from the source


def _module_spec(module: str) -> Optional[importlib.machinery.ModuleSpec]:
    """The spec of `module` found the way `import` finds it, without running any package's __init__.
    Raises LookupError naming the first part that is no module."""
    parts = module.split(".")
    spec = importlib.util.find_spec(parts[0])
    for i in range(1, len(parts)):
        if spec is None or spec.submodule_search_locations is None:
            raise LookupError(".".join(parts[:i]) + (" is a module, not a package" if spec else " is not installed"))
        spec = _find_in(".".join(parts[:i + 1]), list(spec.submodule_search_locations))
    if spec is None:
        raise LookupError(f"no module {module}")
    return spec


def _find_in(name: str, locations: list[str]) -> Optional[importlib.machinery.ModuleSpec]:
    """PathFinder's spec of `name` in a package's `locations`, else the file system's own answer. PathFinder
    answers through the finders this process cached for each location (sys.path_importer_cache, each with its
    directory listing), which a long-lived process can hold stale (a listing taken while the directory could
    not be read stays empty until the directory changes): a package that is there is never called missing."""
    spec = importlib.machinery.PathFinder.find_spec(name, locations)
    if spec is not None:
        return spec
    leaf = name.rpartition(".")[2]
    for location in locations:
        package, module = Path(location, leaf, "__init__.py"), Path(location, f"{leaf}.py")
        if package.is_file():
            return importlib.util.spec_from_file_location(name, package, submodule_search_locations=[str(package.parent)])
        if module.is_file():
            return importlib.util.spec_from_file_location(name, module)
    return None


BLOCKS = (ast.If, ast.Try, ast.With, ast.For, ast.While)  # a module's statements inside these run at import too


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run at import (not those inside a function or class)."""
    for node in body:
        yield node
        if isinstance(node, BLOCKS):
            for block in (node.body, node.orelse, getattr(node, "finalbody", [])):
                yield from _top_level(block)
            for handler in getattr(node, "handlers", []):
                yield from _top_level(handler.body)


@functools.lru_cache(maxsize=64)
def _names_in(source: str) -> tuple[dict[str, ast.AST], bool]:
    """_names of a module's source, parsed once per process for the same text: a sweep's members, and a
    process that plans more than once, check the same few modules again and again. Its readers change nothing."""
    return _names(ast.parse(source))


def _names(tree: ast.Module) -> tuple[dict[str, ast.AST], bool]:
    """Top-level name -> its last definition; and whether names can come from elsewhere (a star import, a
    module __getattr__, globals())."""
    found: dict[str, ast.AST] = {}
    open_ended = False
    for node in _top_level(tree.body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = node
            open_ended |= node.name == "__getattr__"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                open_ended |= alias.name == "*"
                found[alias.asname or alias.name.split(".")[0]] = node
        else:  # an assignment, a for or with target, a walrus: any name it stores
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    found.setdefault(n.id, node)
                open_ended |= isinstance(n, ast.Name) and n.id in ("globals", "setattr", "vars")
    return found, open_ended


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef, skip_first: bool) -> Optional[Params]:
    if fn.decorator_list:  # a decorator may change what it takes
        return None
    a = fn.args
    positional = [*a.posonlyargs, *a.args][1 if skip_first else 0:]
    with_default = {p.arg for p in positional[len(positional) - len(a.defaults):]} if a.defaults else set()
    posonly = {p.arg for p in a.posonlyargs}  # cannot be passed by keyword: needed only without a default
    return Params(names={p.arg for p in positional if p.arg not in posonly} | {p.arg for p in a.kwonlyargs},
                  required=[p.arg for p in positional if p.arg not in with_default]
                  + [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None],
                  any_keyword=a.kwarg is not None)


def _class_params(cls: ast.ClassDef, names: dict[str, ast.AST]) -> Optional[Params]:
    """Its __init__'s parameters, following bases defined in the same module; None when unknown."""
    if cls.decorator_list or cls.keywords:  # a dataclass, a metaclass
        return None
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__new__":
            return None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__init__":
            return _params(node, skip_first=True)
    bases = [b for b in cls.bases if not (isinstance(b, ast.Name) and b.id == "object")]
    if not bases:
        return Params()
    if len(bases) == 1 and isinstance(bases[0], ast.Name) and isinstance(names.get(bases[0].id), ast.ClassDef):
        base = names[bases[0].id]
        assert isinstance(base, ast.ClassDef)
        return None if base is cls else _class_params(base, names)
    return None  # inherited from elsewhere (nn.Module's takes nothing, but a mixin's may)


def definition(path: str) -> Optional[Definition]:
    """What `package.module.Name` is, read from the module's source; None when the source cannot tell.
    Raises LookupError when it certainly does not exist."""
    module, _, name = path.rpartition(".")
    spec = _module_spec(module)
    origin = getattr(spec, "origin", None)
    if not isinstance(spec.loader, importlib.machinery.SourceFileLoader) or not origin:
        return None  # compiled, frozen, namespace, or a finder of its own
    try:
        with open(origin, "rb") as f:
            names, open_ended = _names_in(importlib.util.decode_source(f.read()))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None  # the rank's own import says what is wrong with the file
    node = names.get(name)
    if node is None:
        if open_ended:
            return None
        if spec.submodule_search_locations is not None and importlib.machinery.PathFinder.find_spec(
                path, list(spec.submodule_search_locations)) is not None:
            raise LookupError(f"{path} is a module; name the class in it ({path}.ClassName)")
        classes = sorted(n for n, d in names.items() if isinstance(d, ast.ClassDef) and not n.startswith("_"))
        raise LookupError(f"module {module} defines no {name}" + (f" (its classes: {', '.join(classes)})"
                                                                  if classes else ""))
    if isinstance(node, ast.ClassDef):
        return Definition("class", _class_params(node, names))
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return Definition("function", _params(node, skip_first=False))
    return Definition("other")


def check_callable(key: str, path: str, offered: Iterable[str], kwargs: dict[str, Any], kwargs_key: str) -> None:
    """`path` can be imported and called as the ranks call it: with those of `offered` it takes, plus `kwargs`."""
    found = _definition(key, path)
    if found is None or found.params is None:
        return
    p = found.params
    for k in kwargs:
        if k not in p.names and not p.any_keyword:
            raise UserError(f"{kwargs_key}.{k}", kwargs[k], f"{path} takes no argument {k} (it takes: "
                                                            f"{', '.join(sorted(p.names)) or 'none'})")
    passed = {k for k in offered if k in p.names} | set(kwargs)
    missing = [r for r in p.required if r not in passed]
    if missing:
        raise UserError(key, path, f"needs {', '.join(missing)}, which no rank passes; give them in {kwargs_key} "
                                   f"(+{kwargs_key}.{missing[0]}=...)")


def check_class(key: str, path: str) -> None:
    """`path` names a class (FSDP wraps the submodules that are instances of it)."""
    found = _definition(key, path)
    if found is not None and found.kind == "function":
        raise UserError(key, path, "is a function; name a class (each submodule that is an instance of it "
                                   "becomes an FSDP unit)")


def _definition(key: str, path: str) -> Optional[Definition]:
    try:
        return definition(path)
    except LookupError as e:
        raise UserError(key, path, f"cannot be imported: {e}") from None
