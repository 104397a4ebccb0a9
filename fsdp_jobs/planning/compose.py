"""Hydra composition of conf/ + overrides, with every failure turned into one UserError line."""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
from pathlib import Path
from typing import Any, Union

from omegaconf import DictConfig, OmegaConf

from fsdp_jobs.planning import backends
from fsdp_jobs.planning.config import JobConfig
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.input_rules import check_numbers, check_text, check_utf8
from fsdp_jobs.planning.validation import register_schemas, validate

CONF_DIR = Path(os.environ.get("FSDP_JOBS_CONF", Path(__file__).resolve().parents[2] / "conf"))


def _options(group: str) -> list[str]:
    if group == "cluster":  # a backend outside this tree has no yaml here: its register() stores the option
        return sorted(backends.names())
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _translate(exc: BaseException, overrides: list[str]) -> UserError:
    """Hydra/OmegaConf errors are multi-line and name internals; say key, value, allowed."""
    text = str(exc)
    m = re.search(r"Could not find '([^'/]+)/([^']+)'", text)
    if m:
        group, value = m.groups()
        return UserError(group, value, "allowed: " + ", ".join(_options(group)))
    m = re.search(r"Could not (?:override|append to) '([^']+)'", text) or re.search(r"Key '([^']+)' is not in struct", text)
    if m:
        key = m.group(1)
        value = _given(key, overrides)
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        if _is_map(key, overrides):  # cluster.env={A:1}: a map set whole
            return UserError(key, value, f"is a map; set its entries one by one: +{key}.NAME=value")
        known = ", ".join(_known(parent, overrides))
        if parent and not known:  # a free-form map such as cluster.env: entries are added with '+'
            return UserError(key, value, f"{parent} is a map; add an entry with +{key}={value}")
        return UserError(key, value, f"unknown key; known keys{' under ' + parent if parent else ''}: {known}")
    cause = exc.__cause__ or exc
    full_key = getattr(cause, "full_key", None)
    if full_key:
        msg = str(cause).splitlines()[0]
        if "could not be converted to Integer" in msg:
            msg = f"must be a whole number, written as one ({msg})"
        elif "is not a valid bool" in msg:
            msg = "must be true or false"
        return UserError(full_key, _given(full_key, overrides), msg)
    m = re.search(r"Ambiguous value for argument '([^'=]+)=(.*)'", text)
    if m:
        return UserError(m.group(1), m.group(2), "a value with ',' is a sweep (run it with -m) or must be quoted: "
                                                 f"{m.group(1)}='{m.group(2)}'")
    m = re.match(r"LexerNoViableAltException: ([^=\s]+)=(.*)", text)  # a non-ASCII letter, '#', '&', a quote
    if m:
        key, value = m.groups()
        return UserError(key, value, "Hydra reads a value holding characters other than ASCII letters, digits and "
                                     f"/ . - + _ only in quotes: {key}='{value}' (in a shell: \"{key}='{value}'\")")
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return UserError("", None, f"bad override: {first}")


def _given(key: str, overrides: list[str]) -> Any:
    """The value the user gave `key`: the last one, as Hydra applies them in order."""
    return next((o.split("=", 1)[1] for o in reversed(overrides) if o.lstrip("+~").split("=", 1)[0] == key), None)


def _schema_node(path: str, overrides: list[str]) -> Any:
    """The schema's node at a dotted path (None if there is none); cluster.* is the chosen backend's."""
    node: Any = OmegaConf.structured(JobConfig)
    parts = [p for p in path.split(".") if p]
    if parts and parts[0] == "cluster":  # its schema depends on the chosen backend
        chosen = next((o.split("=", 1)[1] for o in overrides if o.startswith("cluster=")), backends.DEFAULT)
        chosen = chosen if chosen in backends.names() else backends.DEFAULT
        node = OmegaConf.create({"cluster": OmegaConf.structured(backends.schema(chosen))})
    for part in parts:
        node = node[part] if isinstance(node, DictConfig) and part in node else None
        if node is None:
            return None
    return node


def _known(parent: str, overrides: list[str]) -> list[str]:
    node = _schema_node(parent, overrides)
    return sorted(k for k in node.keys()) if isinstance(node, DictConfig) else []


def _is_map(key: str, overrides: list[str]) -> bool:
    """Does the schema declare `key` as a free-form map, empty by default (cluster.env, model.kwargs)?"""
    node = _schema_node(key, overrides)
    return isinstance(node, DictConfig) and not node.keys() and "." in key


def absolute_paths(cfg: JobConfig) -> None:
    """Paths of this machine's files, relative to where the command runs, made absolute: the ranks run in
    the run dir (launchers/node/wrapper.py), not here. A backend whose jobs read elsewhere (a PVC) keeps them."""
    if not backends.traits(cfg.cluster.backend).host_files:
        return
    for node, key in ((cfg.data, "path"), (cfg.model, "pretrained"), (cfg.model.kwargs, "config_dir")):
        value = node.get(key)
        if isinstance(value, str) and value and not value.startswith("/"):
            node[key] = str(Path(value).expanduser().absolute())


def compose(overrides: list[str]) -> tuple[JobConfig, dict[str, Any]]:
    """Compose, type-check and validate. Returns the typed config and its resolved plain dict."""
    result = compose_many([overrides])[0]
    if isinstance(result, UserError):
        raise result
    return result


def compose_many(override_lists: list[list[str]]) -> list[Union[tuple[JobConfig, dict[str, Any]], UserError]]:
    """compose() for each list (a sweep's members), in ONE Hydra context: Hydra then reads every config
    file once, and a sweep must feel instant. A member's error is returned in its place."""
    from hydra import compose as hydra_compose, initialize_config_dir

    register_schemas()
    out: list[Union[tuple[JobConfig, dict[str, Any]], UserError]] = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fsdp_jobs"):
        for overrides in override_lists:
            try:
                out.append(_compose_one(hydra_compose, overrides))
            except UserError as e:
                out.append(e)
    return out


# (conf/'s files, the installed backends) -> conf's config groups; (that, group choices) -> Hydra's config
_GROUPS: dict[tuple[Any, ...], frozenset[str]] = {}
_CHOSEN: dict[tuple[Any, ...], bytes] = {}  # pickled: unpickling copies in C what deepcopy walks in Python


def _hydra_compose(hydra_compose: Any, overrides: list[str]) -> DictConfig:
    """What Hydra composes of conf/ and the overrides. Hydra builds the config from the defaults list, which
    the group choices (model=..., fsdp=...) decide, then applies every other override to it in order with
    its own function (_apply_overrides_to_config). The first part is nearly all of a compose's work, and the
    same for the same group choices: a sweep's members, a process that plans more than once. So it is done once
    per set of group choices (and conf/ as it is), and the other overrides are applied to a copy with Hydra's
    function: the same config, the same errors. What Hydra treats otherwise (a hydra.* key, a sweep, a package,
    a nested group, an override it cannot parse) takes Hydra's whole path."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        apply = ConfigLoaderImpl._apply_overrides_to_config
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    except Exception:  # noqa: BLE001  another Hydra, or an override Hydra refuses: its whole path says why
        return hydra_compose("config", overrides=overrides)
    if any(o.is_sweep_override() or o.package is not None or o.key_or_group.startswith("hydra")
           or "/" in o.key_or_group for o in parsed):
        return hydra_compose("config", overrides=overrides)
    conf = (tuple((str(p), p.stat().st_mtime_ns) for p in sorted(CONF_DIR.rglob("*.yaml"))),
            tuple(backends.packages().items()))
    if conf not in _GROUPS:
        _GROUPS[conf] = frozenset(GlobalHydra.instance().config_loader().list_groups(""))
    choices, values = [], []
    for o in parsed:  # as Hydra tells them apart (hydra/_internal/defaults_list.py, Overrides)
        (choices if o.key_or_group in _GROUPS[conf] and not isinstance(o.value(), dict) else values).append(o)
    key = (conf, tuple(o.input_line for o in choices))
    if key not in _CHOSEN:
        _CHOSEN[key] = pickle.dumps(hydra_compose("config", overrides=[o.input_line for o in choices]))
    cfg = pickle.loads(_CHOSEN[key])
    apply(values, cfg)
    return cfg


def _compose_one(hydra_compose: Any, overrides: list[str]) -> tuple[JobConfig, dict[str, Any]]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    for o in overrides:
        if "=" not in o:
            raise UserError(o, None, "overrides are key=value (e.g. nodes=4, fsdp=full_shard)")
        check_utf8(*o.split("=", 1))  # before Hydra's parser, which would only ask for quotes
    try:
        cfg = _hydra_compose(hydra_compose, overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise _translate(e, overrides) from None
    schema_keys = {f.name for f in dataclasses.fields(JobConfig)}  # names only: OmegaConf.structured builds all
    for key in cfg.keys():
        if key not in schema_keys and key != "hydra":
            raise UserError(str(key), cfg[key], "unknown key; known top-level keys: " + ", ".join(sorted(schema_keys)))
    try:
        validate(cfg)
        absolute_paths(cfg)
        job = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise _translate(e, overrides) from None
    assert isinstance(job, dict)
    job.pop("hydra", None)
    check_text(job)
    check_numbers(job)
    check_utf8("run_root", str(Path(cfg.run_root).expanduser().absolute()))  # the working directory's path too
    return cfg, job
