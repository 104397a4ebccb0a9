"""The registry of backends (fsdp_jobs/planning/backends.py) and what a backend declares of itself (its config.py's
TRAITS): a distribution's entry point that would shadow a built-in, or names a package that cannot be loaded, or
a BACKEND unlike its TRAITS, is one line and exit 2 before anything is written; a command a backend lacks (scale,
stacks, a chaos kind, the marathon) is refused in one line naming the backends that have it, from their TRAITS.
A plugin backend submitting a real job: tests/integration/test_backend_plugin.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.backend_plugin import BACKEND, CONFIG, install
from tests.conftest import cli


def one_line_refusal(r) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("fsdp-jobs: error: "), r.stderr
    return r.stderr


# a backend that cannot grow a running job, though its TRAITS (cluster=local's) say it can
NO_SCALER = 'name = "mine"\n\n    def __init__(self) -> None:\n        super().__init__()\n        self.scaler = None\n'
PLUGINS = [
    ("local = mybackend", CONFIG, BACKEND, [],
     "entry point local = mybackend (of mybackend) names a backend that exists already (fsdp_jobs.launchers.local)"),
    ("mine = nosuchpackage", CONFIG, BACKEND, [], "cannot import nosuchpackage.config (ModuleNotFoundError"),
    ("mine = mybackend:BACKEND", CONFIG, BACKEND, [], "its value the package holding its config.py and backend.py"),
    ("mine = mybackend", CONFIG.replace("TRAITS = local.TRAITS\n", ""), BACKEND, ["cluster=mine"],
     "mybackend.config declares no TRAITS = BackendTraits(...)"),
    ("mine = mybackend", CONFIG, BACKEND.replace('name = "mine"\n', NO_SCALER), ["cluster=mine"],
     "mybackend.backend.BACKEND is not what its config.py declares: scaler is None but TRAITS says yes"),
    ("mine = mybackend", CONFIG, "raise RuntimeError('half installed')\n", ["cluster=mine"],
     "cannot load mybackend.backend.BACKEND (RuntimeError: half installed)"),
]


@pytest.mark.parametrize("entry, config, backend, args, says", PLUGINS,
                         ids=["shadows local", "no package", "not a package", "no TRAITS", "unlike its TRAITS",
                              "backend.py raises"])
def test_a_plugin_that_shadows_a_builtin_or_cannot_load_is_one_line(tmp_path, entry, config, backend, args, says):
    site = install(tmp_path, entry, config, backend)
    runs = tmp_path / "runs"
    r = cli(*args, f"run_root={runs}", "name=p", "dry_run=true", env={"PYTHONPATH": str(site)}, timeout=120)
    assert says in one_line_refusal(r), r.stderr
    assert not runs.exists()


def make_run(run_root: Path, name: str, launch: dict) -> None:
    run_dir = run_root / name
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "job.yaml").write_text(f"name: {name}\nnodes: 2\ncluster: {{max_nodes: 4}}\n")
    (run_dir / "launches.jsonl").write_text(json.dumps(launch) + "\n")


REFUSED = [
    (["scale", "tx", "nodes=3"], "scale: not supported by the torchx backend (cluster=local, cluster=slurm, "
     "cluster=docker and cluster=kubernetes with cluster.kind=pytorchjob have it); resubmit the same name with nodes=N"),
    (["stacks", "k8s"], "stacks: not supported by the kubernetes backend (cluster=local, cluster=slurm, cluster=docker "
     "and cluster=torchx have it); its ranks run in pods this CLI does not exec into: kubectl exec POD -- py-spy"),
    (["chaos", "k8s", "kill-rank", "0"], "chaos='kill-rank': not supported by the kubernetes backend (cluster=local, "
     "cluster=slurm, cluster=docker and cluster=torchx have it)"),
    (["chaos", "k8s", "marathon"], "chaos='marathon': not supported by the kubernetes backend"),
    (["chaos", "k8s", "resume"], "chaos='resume': not supported by the kubernetes backend"),
    (["chaos", "loc", "stop-node", "1"], "chaos='stop-node': not supported by the local backend (cluster=docker has it)"),
    (["chaos", "loc", "cut-node", "1"], "chaos='cut-node': not supported by the local backend (cluster=slurm, "
     "cluster=docker and cluster=torchx have it)"),
]


@pytest.mark.parametrize("argv, says", REFUSED, ids=[" ".join(a[:3]) for a, _ in REFUSED])
def test_a_command_a_backend_lacks_names_the_backends_that_have_it(run_root, capsys, argv, says):
    """Before the backend is asked anything: no cluster, no API server, no process is needed for the refusal."""
    from fsdp_jobs.cli import ctl

    make_run(run_root, "tx", {"backend": "torchx", "job_id": "local_cwd://torchx/app"})
    make_run(run_root, "k8s", {"backend": "kubernetes", "job_id": "j", "kind": "volcano", "namespace": "ns", "name": "j"})
    make_run(run_root, "loc", {"backend": "local", "job_id": "999999", "pid": 999999})
    with pytest.raises(SystemExit) as e:
        ctl.main([*argv, "--run-root", str(run_root)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and says in err, err


def test_every_builtin_backend_is_what_its_traits_declare():
    """fsdp_jobs/cli/launcher.py's check, on each built-in: its capability objects are those its TRAITS promise."""
    from fsdp_jobs.cli import launcher
    from fsdp_jobs.planning import backends

    for name in backends.BACKENDS:
        backend = launcher.get(name)
        assert backend.traits is backends.traits(name) and set(backend.traits.marathon) - set(backend.traits.chaos) \
            <= {"corrupt-checkpoint"}, name  # the marathon deals what `chaos` injects, and its own
