"""The layout fsdp_jobs/ARCHITECTURE.md promises, held by reading the source (no imports executed):

- no import cycle between files: an import inside a function counts, one under `if TYPE_CHECKING:` too (it
  never runs, but a reader follows it as any other: a cycle is a cycle to a reader), and the imports by name
  count too: fsdp_jobs/planning/backends.py (the registry) reaches every launchers/<name>/config.py,
  fsdp_jobs/cli/launcher.py every launchers/<name>/backend.py;
- no import cycle between packages (fsdp_jobs, launchers, and each backend package launchers/<name>) in
  their static imports (TYPE_CHECKING's included): backends are plugins the CLI finds by name, as TorchX finds
  its schedulers;
- no backend is named in fsdp_jobs/ outside the registry (fsdp_jobs/planning/backends.py): not in code, strings,
  comments or docstrings, as `grep` would find it.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("fsdp_jobs", "launchers")  # the folders; launchers/ installs as fsdp_jobs.launchers (pyproject)
IMPORTED_AS = {"launchers": "fsdp_jobs.launchers"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    parts[:1] = IMPORTED_AS.get(parts[0], parts[0]).split(".")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)
def _syntax(source: str) -> ast.Module:
    return ast.parse(source)


def syntax(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once per process for the same text: each check below walks every file of
    the project, and parsing them is most of what a check costs. Its readers never change a tree."""
    return _syntax(path.read_text())


@functools.lru_cache(maxsize=None)
def source_files() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:`."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def imports_of(name: str, path: Path, modules: set[str], type_checking: bool = True) -> set[str]:
    """The project modules `name` imports (a package's __init__ too, which importing anything in it runs);
    those under `if TYPE_CHECKING:` too unless type_checking is False (what runs)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = syntax(path)
    for node in ast.walk(tree) if type_checking else _runtime_nodes(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for t in targets:
            parts = t.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
                if ".".join(parts[:i]) in modules:
                    found.add(".".join(parts[:i]))
    return found - {name}


def import_graph(by_name: bool = True, type_checking: bool = True) -> dict[str, set[str]]:
    from fsdp_jobs.planning import backends

    files = source_files()
    modules = set(files)
    graph = {name: imports_of(name, path, modules, type_checking) for name, path in files.items()}
    if by_name:  # importlib.import_module(...) of the registry
        graph["fsdp_jobs.planning.backends"] |= {f"{p}.config" for p in backends.BACKENDS.values()} & modules
        graph["fsdp_jobs.cli.launcher"] |= {f"{p}.backend" for p in backends.BACKENDS.values()} & modules
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan), or a node importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_of(module: str) -> str:
    """The folder a module lives in, which is the process its code runs in (fsdp_jobs/ARCHITECTURE.md):
    fsdp_jobs (the public entry points at its top), fsdp_jobs.<role> (planning, rundir, cli, runtime,
    models), fsdp_jobs.launchers (what backends share), fsdp_jobs.launchers.node (the node side) or
    fsdp_jobs.launchers.<backend>."""
    path = source_files()[module]
    return module if path.name == "__init__.py" or path.is_dir() else module.rpartition(".")[0]


def test_no_import_cycle_between_files():
    graph = import_graph()
    found = cycles(graph)
    assert not found, f"import cycles between files: {found}"
    assert "fsdp_jobs.launchers.slurm.node_task" in graph["fsdp_jobs.launchers.slurm.backend"]  # imports in functions are seen
    assert "fsdp_jobs.planning.errors" in graph["fsdp_jobs.launchers.docker.engine"]
    # byo.py names the schema's types under TYPE_CHECKING alone: seen here, absent from what runs
    assert "fsdp_jobs.planning.config" in graph["fsdp_jobs.planning.byo"]
    assert "fsdp_jobs.planning.config" not in import_graph(type_checking=False)["fsdp_jobs.planning.byo"]


def test_no_import_cycle_between_packages():
    """Between folders: importing fsdp_jobs.rundir.runs also runs fsdp_jobs/__init__.py and
    fsdp_jobs/rundir/__init__.py, which import nothing (checked here), so those edges are not counted."""
    files = source_files()
    inits = {name for name, path in files.items() if path.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    full = import_graph(by_name=False)
    assert not [name for name in inits if full[name]], "a package's __init__.py imports something"
    for src, targets in full.items():
        for dst in targets - inits:
            a, b = package_of(src), package_of(dst)
            graph.setdefault(a, set())
            if a != b:
                graph[a].add(b)
    found = cycles(graph)
    assert not found, f"import cycles between packages: {found}"
    assert "fsdp_jobs.launchers" in graph["fsdp_jobs.launchers.slurm"] and "fsdp_jobs.rundir" in graph["fsdp_jobs.launchers"]
    assert "fsdp_jobs.runtime" in graph["fsdp_jobs"]  # fsdp_jobs.job, export, bench: the entry points at the top


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


BACKEND_WORD = re.compile(r"\b(slurm\w*|sbatch|srun|docker\w*|kubernetes|k8s|volcano|jobset|pytorchjob|torchx\w*)\b",
                          re.I)
# TorchX is a backend (cluster=torchx) and also the library whose own dry run `bench dry-run` times as a
# yardstick: there, and only there, its name is the library's
LIBRARY_NAMED = {f"fsdp_jobs/bench/{name}": re.compile(r"\btorchx\w*\b", re.I) for name in ("dry_run.py", "__main__.py")}


def backend_mentions(path: Path, names: tuple[str, ...]) -> list[str]:
    """Backend names anywhere in the file (code, strings, comments, docstrings), as `grep -i` finds them;
    `local`, an everyday word, only as a quoted string or a cluster= value."""
    found = []
    library = LIBRARY_NAMED.get(path.relative_to(REPO).as_posix())
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = library.sub("", line) if library else line
        if BACKEND_WORD.search(line) or any(re.search(rf"[\"'=|]{n}[\"'|]|cluster={n}\b", line) for n in names):
            found.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()[:80]}")
    return found


def test_fsdp_jobs_names_no_backend_outside_the_registry():
    from fsdp_jobs.planning import backends

    mentions = [m for p in sorted((REPO / "fsdp_jobs").rglob("*.py")) if p.name != "backends.py"
                for m in backend_mentions(p, backends.names())]
    assert not mentions, "backend names in fsdp_jobs/ (ask fsdp_jobs/planning/backends.py instead):\n" + "\n".join(mentions)


def test_the_backend_name_check_sees_code_strings_and_comments(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.unit.test_architecture.REPO", tmp_path)
    f = tmp_path / "m.py"
    f.write_text('"""Talks about local variables."""\nx = 1  # a local copy\n')
    assert backend_mentions(f, ("local", "slurm")) == []
    for text in ('x = "local"\n', 'env = os.environ.get("SLURMD_NODENAME")\n', '# like Docker does\n',
                 '"""Runs on Kubernetes."""\n', 'cmd = "cluster=local nodes=2"\n'):
        f.write_text(text)
        assert len(backend_mentions(f, ("local", "slurm"))) == 1, text


# The repository's top level is fixed (a project decision, older than any code): a new document or tool goes
# inside one of these entries; fsdp_jobs/ARCHITECTURE.md lives in the package it describes.
TOP_LEVEL = {"pyproject.toml", "fsdp_jobs", "conf", "launchers", "tests", "deploy", "README.md", ".ci", ".gitignore"}


def test_the_top_level_holds_only_the_fixed_entries():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    extra = sorted({line.split("/")[0] for line in tracked.splitlines()} - TOP_LEVEL)
    assert not extra, f"tracked at the top level, outside the fixed layout: {extra}"


# The run dir's file and folder names (fsdp_jobs/rundir/layout.py spells each once). The word "heartbeats" is
# prose; only the retired folder's spellings below are names.
RUN_DIR_NAMES = ("state.json", "job.yaml", "plan.json", "launches.jsonl", "metrics.jsonl", "goodput.jsonl",
                 "hangs.jsonl", "failures.jsonl", "preflight.json", "stop-request", "stop-nodes", "scale-request",
                 "cancel-requested", "wandb-id", "wandb-ledger.json", "launcher.log", "supervisor.log",
                 "torchrun-error", "probe.pt", "preflight-rank", "job.json", "chaos-throttle", "chaos-link",
                 "chaos-cut", "world.json", "replaced-nodes", "data-identity.json", "node-verdict.json",
                 "launcher-end.json", "node-events.jsonl")
RETIRED_NAMES = ("heartbeats/", "RUN_DIR/heartbeats")  # every rank's file in the shared run dir: gone for good


def run_dir_name_mentions(path: Path) -> list[str]:
    """Run-dir names anywhere in the file (code, strings, comments, docstrings), as `grep -F` finds them."""
    return [f"{path.relative_to(REPO)}:{lineno}: {line.strip()[:80]}"
            for lineno, line in enumerate(path.read_text().splitlines(), 1)
            if any(name in line for name in RUN_DIR_NAMES + RETIRED_NAMES)]


def test_only_the_rundir_package_names_run_dir_files():
    layout = (REPO / "fsdp_jobs" / "rundir" / "layout.py").read_text()
    assert all(name in layout for name in RUN_DIR_NAMES), "a name the check looks for is not layout.py's"
    rundir = REPO / "fsdp_jobs" / "rundir"
    mentions = [m for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
                if rundir not in p.parents
                for m in run_dir_name_mentions(p)]
    assert not mentions, ("run-dir names outside fsdp_jobs/rundir/ (ask RunDir(run_dir) in "
                          "fsdp_jobs/rundir/layout.py, or name the record in words):\n" + "\n".join(mentions))


MAX_FUNCTION_LINES = 80


def long_functions(path: Path) -> list[str]:
    return [f"{path.relative_to(REPO)}:{n.lineno}: {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for n in ast.walk(syntax(path))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_is_over_80_lines():
    found = [f for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py")) for f in long_functions(p)]
    assert not found, "functions over 80 lines (split them where their parts have names):\n" + "\n".join(found)


def test_the_length_check_sees_a_long_function(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.unit.test_architecture.REPO", tmp_path)
    f = tmp_path / "m.py"
    f.write_text("def f():\n" + "    x = 1\n" * 80)
    assert long_functions(f) == ["m.py:1: f (81 lines)"]
    f.write_text("def f():\n" + "    x = 1\n" * 79)
    assert long_functions(f) == []


def imports_rebound_in_functions(path: Path) -> list[str]:
    """Names the module imports at its top level that a function assigns to (a loop or `with` target too): the
    function's later uses of the name then get the local, as bench.py's `runs` list once hid the `runs` module
    from the `runs.load_job` beside it, an AttributeError on a GPU path no CPU test runs."""
    tree = syntax(path)
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                and n.col_offset == 0 for a in n.names}
    return [f"{path.relative_to(REPO)}:{n.lineno}: {f.name} assigns {n.id}"
            for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in imported]


def test_no_function_rebinds_a_name_its_module_imports():
    found = [f for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py")) for f in imports_rebound_in_functions(p)]
    assert not found, "imported names assigned in functions (name the local otherwise):\n" + "\n".join(found)


def test_the_rebinding_check_sees_a_local_that_hides_an_import(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.unit.test_architecture.REPO", tmp_path)
    f = tmp_path / "m.py"
    f.write_text("from pkg import runs\n\ndef f():\n    runs = []\n    return runs.load_job()\n")
    assert imports_rebound_in_functions(f) == ["m.py:4: f assigns runs"]
    f.write_text("from pkg import runs\n\ndef f(path):\n    measured = []\n    return runs.load_job(path)\n")
    assert imports_rebound_in_functions(f) == []


def external_imports(path: Path) -> set[str]:
    """Top-level names of every module the file imports (in functions too; not under TYPE_CHECKING)."""
    found: set[str] = set()
    for node in _runtime_nodes(syntax(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def role_violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{p.relative_to(REPO)} imports {name}" for p in sorted((REPO / folder).rglob("*.py"))
            for name in sorted(external_imports(p)) if any(name == f or name.startswith(f + ".") for f in forbidden)]


def test_each_folder_keeps_to_its_process_role():
    """planning and the run-dir contract import no torch (a dry run, a status, a node wrapper never pay for
    it); the rank side imports no backend and nothing of the CLI; the run-dir contract imports nothing that
    runs above it."""
    found = (role_violations("fsdp_jobs/planning", ("torch",))
             + role_violations("fsdp_jobs/rundir", ("torch", "fsdp_jobs.launchers", "fsdp_jobs.cli", "fsdp_jobs.runtime"))
             + role_violations("fsdp_jobs/runtime", ("fsdp_jobs.launchers", "fsdp_jobs.cli")))
    assert not found, "\n".join(found)
    assert "torch" in external_imports(REPO / "fsdp_jobs" / "runtime" / "trainer.py")  # the check reads imports


def importers_of(package: str) -> list[str]:
    """The files of fsdp_jobs/ and launchers/ outside `package`'s folder that import it."""
    folder = source_files()[package].parent
    return [f"{p.relative_to(REPO)} imports {name}" for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
            if folder not in p.parents
            for name in sorted(external_imports(p)) if name == package or name.startswith(package + ".")]


def test_no_benchmark_sits_above_the_cli_and_the_backends():
    """A benchmark drives the product as a user does (`python -m fsdp_jobs ...`, a process of its own) and may
    use the layers below the CLI (rundir, planning, runtime, models): it imports neither the CLI nor a backend,
    and nothing of the product imports a benchmark, so fsdp_jobs/bench/ is a leaf of the import graph."""
    found = (role_violations("fsdp_jobs/bench", ("fsdp_jobs.cli", "fsdp_jobs.launchers"))
             + importers_of("fsdp_jobs.bench"))
    assert not found, "\n".join(found)
    assert "fsdp_jobs.rundir.stragglers" in external_imports(REPO / "fsdp_jobs" / "bench" / "scale.py")  # it reads


def test_a_node_wrapper_imports_neither_torch_nor_hydra(tmp_path):
    """The node wrapper (launchers/node/wrapper.py) starts on every node before its agent, and again with every
    container or SLURM task that restarts: what it imports is paid at each node start. Reading the job's
    fault keys through the schema, as it does, needs omegaconf, not hydra (hydra's import would be about half
    the wrapper's start: fsdp_jobs/planning/validation.py, register_schemas) and never torch."""
    (tmp_path / "job.yaml").write_text("fault:\n  hang_timeout_s: 90\n")
    probe = ("import sys, pathlib\n"
             "from fsdp_jobs.launchers.node import watchdog, wrapper\n"
             "fault = wrapper.job_fault(pathlib.Path(sys.argv[1]))\n"
             "print(fault.hang_timeout_s, sorted(m for m in ('torch', 'hydra') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == "90.0 []\n", r.stdout  # the job's value, read; nothing heavy imported


def test_pyproject_lists_every_package_under_the_name_it_is_imported_as():
    """launchers/ installs as fsdp_jobs.launchers (package-dir), which packages.find cannot see, so pyproject
    lists the packages: a folder of Python files left off the list would be missing from a wheel."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(p.parent / "__init__.py") for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert listed == folders, f"only in pyproject: {sorted(listed - folders)}; only on disk: {sorted(folders - listed)}"


# --------------------------------------------------------------------------- one writer role per run-dir record
# Every run-dir record (a RunDir attribute, fsdp_jobs/rundir/layout.py) has one writer role: the one
# fsdp_jobs/ARCHITECTURE.md's run-dir table names in its "written by" column. The roles are processes: a rank
# (RANK: rank 0 alone for the job-wide records, as the table says), a node (its wrapper, agent and watchdog, a
# scheduler's in-job node task), the supervisor (the launcher of local agents, a container engine's detached
# supervisor), the CLI (every command, a backend's submit and cancel, the chaos tooling).
RANK, NODE, SUPERVISOR, CLI = "rank", "node", "supervisor", "cli"
WRITER_ROLES = {
    # the run's outcome: fsdp_jobs/rundir/outcome.py derives it from these four, one role each
    "state_file": RANK, "node_verdict_file": NODE, "launcher_end_file": SUPERVISOR, "cancel_file": CLI,
    # written at submission
    "job_file": CLI, "history_dir": CLI, "plan_file": CLI, "launches_file": CLI, "lock_file": CLI, "code_dir": CLI,
    "script_dir": CLI, "data_identity_file": CLI, "checkpoints_before_dir": CLI, "logs_dir": CLI,
    # the ranks'
    "metrics_file": RANK, "goodput_file": RANK, "preflight_file": RANK, "preflight_scratch_file": RANK,
    "probe_file": RANK, "ranks_dir": RANK, "rank_file": RANK, "stack_file": RANK, "failures_file": RANK,
    "checkpoints_dir": RANK, "replaced_nodes_file": RANK, "world_file": RANK, "tensorboard_dir": RANK,
    "wandb_dir": RANK, "wandb_id_file": RANK, "wandb_ledger_file": RANK,
    # the nodes'
    "torchrun_error_file": NODE, "hang_dir": NODE, "hangs_file": NODE, "liveness_dir": NODE,
    "node_liveness_file": NODE, "job_liveness_file": NODE, "stop_request_file": NODE, "stop_nodes_file": SUPERVISOR, "stacks_parts_dir": NODE,
    "node_events_file": NODE,
    "node_launches_file": NODE,
    # the supervisor's
    "launcher_log": SUPERVISOR, "supervisor_log": SUPERVISOR,
    # requests and commands
    "scale_request_file": CLI, "scale_taken_file": SUPERVISOR, "stacks_dir": CLI, "stacks_file": CLI,
    "report_file": CLI, "export_dir": CLI, "chaos_throttle_file": CLI, "chaos_link_file": CLI, "chaos_cut_file": CLI,
    "chaos_incidents_file": CLI,
}
# the RunDir members that are no record of one role: a helper of paths, lists of other records, and a backend's
# own folder (its package names and writes its files, in its roles; a file of another package writing there is
# still found: it is none of WRITER_ROLES)
NOT_RECORDS = {"before", "progress_files", "rank_files", "backend_dir"}
# each product file's role (the longest prefix that matches): the processes it runs in
FILE_ROLES = {
    "fsdp_jobs/runtime/": RANK, "fsdp_jobs/models/": RANK, "fsdp_jobs/cli/": CLI, "fsdp_jobs/planning/": CLI,
    "fsdp_jobs/__main__.py": CLI, "fsdp_jobs/export.py": CLI, "fsdp_jobs/job.py": RANK,
    "launchers/node/": NODE, "launchers/lighthouse.py": NODE, "launchers/supervisor.py": SUPERVISOR,
    "launchers/docker/supervisor.py": SUPERVISOR, "launchers/slurm/node_task.py": NODE,
    "launchers/slurm/requeue.py": NODE, "launchers/slurm/batch_exit.py": NODE, "launchers/torchx/node.py": NODE,
    "launchers/kubernetes/boot.py": NODE, "launchers/stacks.py": NODE, "launchers/": CLI,
}
FUNCTION_ROLES = {"launchers/stacks.py::gather": CLI}  # `fsdp-jobs stacks` joins the parts the nodes wrote
# What reads no role: fsdp_jobs/rundir/ is the contract everyone calls (its helpers' writes are their callers'),
# and fsdp_jobs/bench/ builds synthetic run dirs with every role's writers (no job runs).
ROLELESS = ("fsdp_jobs/rundir/", "fsdp_jobs/bench/")
# Second writers this check found that are not gone yet: each (record, file) here must still be found (fixed,
# it is struck off), and no other may appear.
KNOWN_SECOND_WRITERS: set[tuple[str, str]] = set()
# what writes a path: its first argument (the contract's writers), or the path it is called on
ARG_WRITES = {"write_atomic", "open_append", "write_in_place"}
PATH_WRITES = {"write_text", "write_bytes", "touch", "mkdir"}


@functools.lru_cache(maxsize=None)
def rundir_members() -> frozenset[str]:
    tree = syntax(REPO / "fsdp_jobs" / "rundir" / "layout.py")
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunDir")
    return frozenset(f.name for f in cls.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_"))


def role_of(rel: str, function: str = "") -> str | None:
    if rel.startswith(ROLELESS):
        return None
    if f"{rel}::{function}" in FUNCTION_ROLES:
        return FUNCTION_ROLES[f"{rel}::{function}"]
    matches = [p for p in FILE_ROLES if rel.startswith(p)]
    return FILE_ROLES[max(matches, key=len)] if matches else "no role in FILE_ROLES"


def path_spine(expr: ast.AST | None, aliases: dict[str, set[str]]) -> set[str]:
    """The records a path expression is, or is inside: `rd.state_file`, `RunDir(d).hang_dir(t, n) / "x"`,
    `path.parent`, a name or `self.x` assigned one; a call of anything else (a reader, a dump) is no path."""
    if isinstance(expr, (ast.Name, ast.Attribute)) and ast.unparse(expr) in aliases:
        return aliases[ast.unparse(expr)]
    if isinstance(expr, ast.Attribute):
        return {expr.attr} if expr.attr in rundir_members() else path_spine(expr.value, aliases)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        if expr.func.attr in rundir_members():
            return {expr.func.attr}
        return path_spine(expr.func.value, aliases) if expr.func.attr in ("with_name", "with_suffix", "joinpath") else set()
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("Path", "str") and expr.args:
        return path_spine(expr.args[0], aliases)
    if isinstance(expr, ast.BinOp):
        return path_spine(expr.left, aliases)
    if isinstance(expr, (ast.Tuple, ast.List)):
        return set().union(*(path_spine(e, aliases) for e in expr.elts)) if expr.elts else set()
    if isinstance(expr, ast.IfExp):
        return path_spine(expr.body, aliases) | path_spine(expr.orelse, aliases)
    return set()


def contract_imports(tree: ast.AST, module: str) -> dict[str, str]:
    """The names a file calls the contract's (fsdp_jobs/rundir/'s) modules and functions by: `runs` ->
    "runs", `request_stop` -> "runs.request_stop"; in a rundir module, its own functions too."""
    out: dict[str, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == "fsdp_jobs.rundir":
            out.update({a.asname or a.name: a.name for a in n.names})
        elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith("fsdp_jobs.rundir."):
            out.update({a.asname or a.name: f"{n.module.rsplit('.', 1)[1]}.{a.name}" for a in n.names})
    if module:
        out.update({n.name: f"{module}.{n.name}" for n in getattr(tree, "body", []) if isinstance(n, ast.FunctionDef)})
    return out


def aliases_in(fn: ast.AST, start: dict[str, str | set[str]]) -> dict[str, set[str]]:
    """Names (and `self.x`) assigned a record's path in `fn`, or looped over a tuple of them."""
    aliases = {k: set(v) for k, v in start.items()}
    for n in ast.walk(fn):
        pairs = ([(t, n.value) for t in n.targets] if isinstance(n, ast.Assign)
                 else [(n.target, n.iter)] if isinstance(n, ast.For) else [])
        pairs += [pair for names, values in list(pairs) if isinstance(names, ast.Tuple) and isinstance(values, ast.Tuple)
                  for pair in zip(names.elts, values.elts)]  # a, b = x, y
        for target, value in pairs:
            found = path_spine(value, aliases)
            if found and isinstance(target, (ast.Name, ast.Attribute)):
                aliases[ast.unparse(target)] = aliases.get(ast.unparse(target), set()) | found
    return aliases


def written_paths(call: ast.Call, callee: str, aliases: dict[str, set[str]]) -> set[str]:
    if callee in ARG_WRITES and call.args:
        return path_spine(call.args[0], aliases)
    if callee == "open" and isinstance(call.func, ast.Name) and call.args:
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
            return path_spine(call.args[0], aliases)
    if callee in PATH_WRITES and isinstance(call.func, ast.Attribute):
        return path_spine(call.func.value, aliases)
    return set()


def record_writes(path: Path, helpers: dict[str, set[str]], module: str = "") -> list[tuple[str, str, int]]:
    """(record, function, line) of every write in the file: a path written (ARG_WRITES, PATH_WRITES, open for
    writing), or a call of a contract helper that writes it (`helpers`: "runs.write_state" -> {"state_file"}).
    A removal or a rename is no write: a request taken by its reader, an attempt clearing the last one's."""
    tree = syntax(path)
    imports, out = contract_imports(tree, module), {}
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    owners = {id(fn): of_class for c in classes for of_class in [aliases_in(c, {})]  # once a class, not a method
              for fn in ast.walk(c) if isinstance(fn, ast.FunctionDef)}
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        aliases = aliases_in(fn, {k: v for k, v in owners.get(id(fn), {}).items() if k.startswith("self.")})
        for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
            f = call.func
            callee = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            qual = (f"{imports[f.value.id]}.{f.attr}" if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                    and f.value.id in imports else imports.get(callee, "") if isinstance(f, ast.Name) else "")
            for record in sorted(helpers.get(qual) or written_paths(call, callee, aliases)):
                out.setdefault((record, call.lineno), fn.name)  # the outermost function (ast.walk: outer first)
    return [(record, fn, line) for (record, line), fn in out.items()]


@functools.lru_cache(maxsize=None)
def contract_writers() -> dict[str, frozenset[str]]:
    """Each fsdp_jobs/rundir/ function that writes records ("runs.write_state"), and which, through one another;
    a class whose methods write ("liveness.Publisher"): what makes one writes what they write."""
    helpers: dict[str, set[str]] = {}
    while True:
        before = {k: set(v) for k, v in helpers.items()}
        for p in sorted((REPO / "fsdp_jobs" / "rundir").glob("*.py")):
            tree = syntax(p)
            methods = {m.name: c.name for c in tree.body if isinstance(c, ast.ClassDef)
                       for m in c.body if isinstance(m, ast.FunctionDef)}
            for record, fn, _ in record_writes(p, helpers, p.stem):
                helpers.setdefault(f"{p.stem}.{fn}", set()).add(record)
                if fn in methods:
                    helpers.setdefault(f"{p.stem}.{methods[fn]}", set()).add(record)
        if helpers == before:
            return {k: frozenset(v) for k, v in helpers.items()}


def second_writers(root: Path = REPO) -> list[tuple[str, str, str]]:
    """(record, file, 'file:line: function (role)') of every write by a role other than the record's."""
    helpers = {k: set(v) for k, v in contract_writers().items()}
    found = []
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            rel = p.relative_to(root).as_posix()
            for record, fn, line in record_writes(p, helpers) if role_of(rel) is not None else []:
                role, owner = role_of(rel, fn), WRITER_ROLES.get(record, "no role")
                if role != owner:
                    found.append((record, rel, f"{rel}:{line}: {fn} ({role}) writes {record} ({owner}'s)"))
    return found


def test_every_run_dir_record_has_one_writer_role():
    """A role writes each record; no other does (the source read, no import run). The run's outcome is derived
    from the records of its four roles in one place (fsdp_jobs/rundir/outcome.py), never arbitrated between
    writers of one file."""
    assert set(WRITER_ROLES) | NOT_RECORDS == rundir_members(), "a RunDir member without a writer role, or gone"
    assert {"runs.write_state", "runs.write_node_verdict", "runs.write_launcher_end", "runs.record_cancel",
            "runs.record_launch", "failures.record", "events.append_event",
            "events.append_node_event"} <= set(contract_writers())  # seen
    found = second_writers()
    new = [why for record, rel, why in found if (record, rel) not in KNOWN_SECOND_WRITERS]
    assert not new, "a record written by a second role (give it a record of its own):\n" + "\n".join(new)
    fixed = KNOWN_SECOND_WRITERS - {(record, rel) for record, rel, _ in found}
    assert not fixed, f"no longer a second writer, strike it off KNOWN_SECOND_WRITERS: {sorted(fixed)}"


def test_the_writer_check_sees_a_second_role_write_a_record(tmp_path):
    """A node writing the leader's state record, directly, through the contract's writer or through a name it
    assigned, and the supervisor appending to the CLI's launch records, are each found; the rank's own write is not."""
    node, rank = tmp_path / "launchers" / "node", tmp_path / "fsdp_jobs" / "runtime"
    node.mkdir(parents=True)
    rank.mkdir(parents=True)
    (node / "wrapper.py").write_text(
        "from fsdp_jobs.rundir import runs\nfrom fsdp_jobs.rundir.runs import record_launch\n\n"
        "def a(d):\n    runs.write_state(d, status='failed')\n\n"
        "def b(d):\n    path = RunDir(d).state_file\n    runs.write_atomic(path, '{}')\n\n"
        "def c(d):\n    with open(RunDir(d).state_file, 'w') as f:\n        f.write('{}')\n\n"
        "def e(d):\n    RunDir(d).state_file.read_text()\n    open(RunDir(d).state_file).read()\n")
    (tmp_path / "launchers" / "supervisor.py").write_text(
        "from fsdp_jobs.rundir.runs import record_launch\n\ndef f(d, r):\n    record_launch(d, r)\n")
    (rank / "trainer.py").write_text("from fsdp_jobs.rundir import runs\n\ndef g(d):\n    runs.write_state(d, status='running')\n")
    found = sorted(why for _, _, why in second_writers(tmp_path))
    assert found == ["launchers/node/wrapper.py:12: c (node) writes state_file (rank's)",
                     "launchers/node/wrapper.py:5: a (node) writes state_file (rank's)",
                     "launchers/node/wrapper.py:9: b (node) writes state_file (rank's)",
                     "launchers/supervisor.py:4: f (supervisor) writes launches_file (cli's)"], found
