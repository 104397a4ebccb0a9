"""Build the job image the dev kubelet's pods run (kubelet.sh), from the Python environment that runs this file.

    .venv/bin/python deploy/kubernetes/dev-apiserver/image.py      # prints the image's name

No registry can be reached here, so deploy/docker/Dockerfile cannot be built (its base image is pulled). This
file makes an image with what that Dockerfile's image holds, taken from this machine instead of a registry:
the interpreter and its standard library, the fsdp-jobs distribution with the distributions it requires
(torch, torchx, ...: their installed files, not the venv's other packages), the project's sources where it is
installed editable (at the same paths, which the editable finder names), the shared libraries all of these
link against (ldd), /bin/sh, and a user 1000. Everything sits at the path it has here, so the venv's links
and the finder resolve unchanged; `PATH` starts at the venv's bin, so a pod's `python` is the venv's.

The name's tag is a digest of every file's path, size and modification time: an environment or a source that
changed gets a new image, an unchanged one is not built again (docker import of about 1 GB otherwise).
Standard library only, plus `docker` on PATH.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path
from typing import IO

REPOSITORY = "fsdp-jobs-dev"
UID = 1000
HEADERS = {".h", ".hpp", ".cuh", ".hxx"}  # C/C++ headers (torch/include: 62 MB) build extensions, not run jobs
SKIPPED_STDLIB = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "config-3.11"}


def required_distributions(root: str = "fsdp-jobs") -> list[metadata.Distribution]:
    """`root` and every distribution it requires, transitively, without extras (what `pip install root` gets)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [root]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement whose marker excludes this platform was never installed
        seen[name] = dist
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            todo.append(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0])
    return list(seen.values())


def project_sources() -> list[Path]:
    """The project's own files where it is installed editable: its packages' folders and its configs."""
    import fsdp_jobs
    from fsdp_jobs import launchers

    folders = [Path(p) for p in (*fsdp_jobs.__path__, *launchers.__path__)]
    repo = folders[0].parent
    return [*folders, repo / "conf", repo / "pyproject.toml"]


def files_under(path: Path) -> list[Path]:
    if path.is_file() or path.is_symlink():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink())


def interpreter_files() -> list[Path]:
    """The venv's bin links and pyvenv.cfg, the interpreter they lead to, and the standard library."""
    prefix, base = Path(sys.prefix), Path(sys.base_prefix)
    files = [*(p for p in (prefix / "bin").iterdir() if p.name.startswith("python")), prefix / "pyvenv.cfg"]
    files.append(Path(sys.executable).resolve())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(stdlib.iterdir()):
        if p.name not in SKIPPED_STDLIB:
            files.extend(files_under(p))
    libs = base / "lib"
    files.extend(p for p in libs.glob("libpython*") if p.is_file() or p.is_symlink())
    return [p for p in files if p.exists()]


def linked_libraries(files: list[Path]) -> list[Path]:
    """Every shared library the ELF files link against, as ldd resolves them here (links and their targets)."""
    elves = [str(p) for p in files if p.suffix == ".so" or ".so." in p.name or p.name.startswith("python3")]
    found: set[Path] = set()
    for i in range(0, len(elves), 200):
        out = subprocess.run(["ldd", *elves[i:i + 200]], capture_output=True, text=True).stdout
        for m in re.finditer(r"(?:=>\s*)?(/\S+)\s+\(0x", out):
            found.add(Path(os.path.normpath(m.group(1))))  # $ORIGIN/../x.libs
    return sorted(found)


def with_links(paths: list[Path]) -> list[Path]:
    """The paths, and the target of every link among them (a link's target may be outside the set)."""
    out: list[Path] = []
    todo = list(paths)
    seen: set[Path] = set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        if p.is_symlink():
            todo.append(Path(os.path.normpath(p.parent / p.readlink())))
    return sorted(out)


def image_files() -> list[Path]:
    files = interpreter_files()
    for dist in required_distributions():
        files.extend(Path(os.path.normpath(dist.locate_file(f))) for f in dist.files or [])  # RECORD has ../
    for src in project_sources():
        files.extend(files_under(src))
    sh = Path("/bin/sh")
    files.extend([sh, sh.resolve()])
    files = [p for p in files if (p.exists() or p.is_symlink()) and p.suffix not in HEADERS
             and "/torch/test/" not in str(p)]  # C++ test binaries (83 MB)
    return with_links(sorted({*files, *linked_libraries(files)}))


def digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        st = p.lstat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:12]


def write_layer(files: list[Path], out: IO[bytes]) -> None:
    """The image's one layer, streamed to `out` (a GB or more: never held in memory): a merged-/usr root like
    Debian 12's, /etc for user 1000, and the files."""
    with tarfile.open(fileobj=out, mode="w|") as tar:
        made: set[str] = set()

        def folder(name: str, mode: int = 0o755) -> None:
            """The folder and its parents, each readable by user 1000 (here /root is not)."""
            parts = name.split("/")
            for i in range(1, len(parts) + 1):
                path = "/".join(parts[:i])
                if path not in made:
                    info = tarfile.TarInfo(path)
                    info.type, info.mode = tarfile.DIRTYPE, mode if i == len(parts) else 0o755
                    tar.addfile(info)
                    made.add(path)

        def text(name: str, data: str) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data.encode()), 0o644
            tar.addfile(info, io.BytesIO(data.encode()))

        for d in ("etc", "proc", "sys", "dev", "run", "usr", "var", "home"):
            folder(d)
        folder("tmp", 0o1777)
        for d in ("bin", "lib", "lib64", "sbin"):
            info = tarfile.TarInfo(d)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{d}"
            tar.addfile(info)
            made.add(d)
        text("etc/passwd", f"root:x:0:0:root:/root:/bin/sh\nfsdp:x:{UID}:{UID}::/tmp:/bin/sh\n")
        text("etc/group", f"root:x:0:\nfsdp:x:{UID}:\n")
        for name in ("etc/hosts", "etc/resolv.conf", "etc/hostname"):
            text(name, "")
        for p in files:
            name = str(p).lstrip("/")
            if name.split("/")[0] in ("bin", "lib", "lib64", "sbin"):
                name = "usr/" + name  # merged /usr: /lib/x is /usr/lib/x, and /lib is the image's link
            folder(str(Path(name).parent))
            if name in made:
                continue
            info = tar.gettarinfo(str(p), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with open(p, "rb") as f:
                    tar.addfile(info, f)
            elif info.issym() or info.isdir():
                tar.addfile(info)
            made.add(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--print-files", action="store_true", help="list the files the image would hold, build nothing")
    a = ap.parse_args()
    files = image_files()
    if a.print_files:
        print("\n".join(map(str, files)))
        return
    name = f"{REPOSITORY}:{digest(files)}"
    if subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0:
        print(name)
        return
    with tempfile.TemporaryFile() as err:
        importer = subprocess.Popen(["docker", "import", "--change", f"ENV PATH={sys.prefix}/bin:/usr/bin:/bin",
                                     "--change", "ENV PYTHONUNBUFFERED=1", "-", name],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
        assert importer.stdin is not None
        try:
            write_layer(files, importer.stdin)
        except BrokenPipeError:
            pass  # docker import ended early: its own message below
        finally:
            importer.stdin.close()
        if importer.wait():
            err.seek(0)
            sys.exit(f"image.py: docker import failed: {err.read().decode(errors='replace').strip()[:300]}")
    size = sum(p.lstat().st_size for p in files if not p.is_symlink())
    print(f"image.py: {name}: {len(files)} files, {size / 2**20:.0f} MiB", file=sys.stderr)
    print(name)


if __name__ == "__main__":
    main()
