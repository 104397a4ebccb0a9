"""launchers/ installs as fsdp_jobs.launchers (pyproject.toml's package-dir): no package with a generic name
in site-packages, and a code snapshot in a run dir holds the whole project as installed, so a requeued job
runs the code it was submitted with, launchers included, whatever the checkout holds by then."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def python(code: str, cwd: Path, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_the_folder_refuses_its_own_name_and_imports_as_fsdp_jobs_launchers():
    r = python("import launchers", cwd=REPO)  # the checkout's root is on sys.path: the folder is found, and refuses
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == ("ImportError: 'launchers' is fsdp_jobs.launchers: import it under "
                                                 "that name (pip install -e . maps it)")
    r = python("import fsdp_jobs.launchers.node.wrapper as w; print(w.__file__)", cwd=Path("/"))
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == REPO / "launchers" / "node" / "wrapper.py"


def test_a_code_snapshot_is_the_installed_layout_and_shadows_the_checkout(tmp_path):
    """With the snapshot first on PYTHONPATH (as every backend starts the nodes), fsdp_jobs.launchers is the
    snapshot's copy, never the checkout the editable install maps it to."""
    r = python("from pathlib import Path; from fsdp_jobs.launchers.snapshot import take_snapshot; "
               "take_snapshot(Path('snap'))", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    snap = tmp_path / "snap"
    assert (snap / "fsdp_jobs" / "launchers" / "node" / "wrapper.py").is_file()
    assert not (snap / "launchers").exists()
    code = "import fsdp_jobs.launchers.node.wrapper as w; print(w.__file__); print(w.code_root())"
    r = python(code, cwd=Path("/"), pythonpath=str(snap))
    assert r.returncode == 0, r.stderr
    wrapper, root = r.stdout.split()
    assert Path(wrapper) == snap / "fsdp_jobs" / "launchers" / "node" / "wrapper.py"
    assert Path(root) == snap  # what the node wrapper puts on the ranks' PYTHONPATH
