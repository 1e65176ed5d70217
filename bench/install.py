"""The cachemgr a benchmark runs: a non-editable install as users get it, or the editable
``.venv`` of the checkout — and the environment and byte code a measured child needs.

A user runs ``python -m venv V && V/bin/pip install .``: pip compiles every module to byte code
in ``V``'s ``site-packages``, so each later ``cachemgr`` process loads ``.pyc`` files. An editable
install leaves the modules in the checkout; there byte code is written on the first import —
unless ``PYTHONDONTWRITEBYTECODE`` is set (this host sets it), when every run compiles every
module again (219 vs 112–125 ms of CPU for a CLI hit). So a measured child never inherits that
variable (:func:`measured_env`) and its modules are compiled once before timing
(:func:`warm_bytecode`).
"""

from __future__ import annotations

import atexit
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Variables a measured child must not inherit: with the first Python never writes byte code;
#: the second (``scripts/test`` sets one) moves it out of the ``__pycache__`` a user's run reads.
UNMEASURED_VARIABLES = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
#: Folders and files of the checkout that a build does not need (copied around, not in).
_NOT_BUILT = shutil.ignore_patterns(
    ".git", ".venv", ".venv.lock", "__pycache__", "*.egg-info", "build", ".*_cache", ".hypothesis"
)


@dataclass(frozen=True)
class Install:
    """One cachemgr installation a benchmark can run.

    :ivar kind: ``"installed"`` (``pip install .``, not editable) or ``"editable"`` (.venv).
    :ivar python: that environment's interpreter (its ``python -c pass`` is the floor).
    :ivar script: its ``cachemgr`` console script.
    :ivar venv: the virtualenv folder.
    """

    kind: str
    python: Path
    script: Path
    venv: Path


def measured_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) without :data:`UNMEASURED_VARIABLES`: the
    environment of a child whose time is measured, so it loads byte code as a user's does."""
    env = dict(os.environ if base is None else base)
    for name in UNMEASURED_VARIABLES:
        env.pop(name, None)
    return env


def _import_paths(python: Path, modules: Iterable[str]) -> list[Path]:
    """The folders holding ``modules`` and the ``site-packages`` of ``python``."""
    code = (
        "import importlib, json, sys, sysconfig\n"
        "paths = [sysconfig.get_paths()['purelib']]\n"
        "for name in sys.argv[1:]:\n"
        "    m = importlib.import_module(name)\n"
        "    paths.append(list(m.__path__)[0] if hasattr(m, '__path__') else m.__file__)\n"
        "print(json.dumps(paths))\n"
    )
    out = subprocess.run(
        [str(python), "-c", code, *modules],
        env=measured_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return [Path(p) for p in json.loads(out.stdout)]


def warm_bytecode(
    python: Path, modules: Iterable[str] = ("cachemgr",), site_packages: bool = True
) -> None:
    """Compile to byte code, once before timing, the folders of ``modules`` (for an editable
    install: the checkout's package) and ``python``'s ``site-packages`` (unless
    ``site_packages`` is false), as ``pip install`` does; files already compiled are skipped.

    :raises subprocess.CalledProcessError: ``python`` cannot import a module or compile.
    """
    found = _import_paths(python, modules)
    paths = sorted({str(p) for p in (found if site_packages else found[1:])})
    subprocess.run(
        [str(python), "-m", "compileall", "-q", "-j", "0", *paths],
        env=measured_env(),
        stdout=subprocess.DEVNULL,
        check=True,
    )


def editable_cachemgr() -> Install:
    """The checkout's ``.venv`` (editable install) that runs the benchmarks, byte code warm.

    :raises RuntimeError: the running interpreter has no ``cachemgr`` script beside it.
    """
    bindir = Path(sys.executable).parent
    script = bindir / "cachemgr"
    if not script.exists():
        raise RuntimeError(f"bench: no cachemgr script beside {sys.executable} (run scripts/bench)")
    found = Install("editable", Path(sys.executable), script, bindir.parent)
    warm_bytecode(found.python)
    return found


_INSTALLED: list[Install] = []


def installed_cachemgr(work_root: Path | None = None) -> Install:
    """A virtualenv with ``pip install .`` (not editable) of the checkout as it is now, made
    once per benchmark run (in ``work_root``, default ``/var/tmp``; removed at exit)
    and byte code warm.

    The checkout is copied first (its ``build/`` stays clean); ``--no-deps``: the dependencies
    are copied from the running ``.venv``, file by file from their ``RECORD``, so no index is
    needed for them. The build itself fetches the build backend (``setuptools``) like any
    ``pip install .``; without an index it falls back to ``--no-build-isolation``.

    :raises RuntimeError: the install failed (pip's last lines in the message).
    """
    if _INSTALLED:
        return _INSTALLED[0]
    if work_root is None:  # on the real disk, as the .venv is (/tmp may be tmpfs)
        var_tmp = Path("/var/tmp")
        work_root = var_tmp if os.access(var_tmp, os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="bench-installed-", dir=work_root))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    venv = folder / "venv"
    base_python = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([str(base_python), "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    source = folder / "src"
    shutil.copytree(ROOT, source, ignore=_NOT_BUILT, symlinks=True)
    _pip_install(python, source)
    _copy_dependencies(_site_packages(python))
    found = Install("installed", python, venv / "bin" / "cachemgr", venv)
    _check_imports_from(found)
    warm_bytecode(found.python)
    _INSTALLED.append(found)
    return found


def _check_imports_from(found: Install) -> None:
    """Make sure ``found``'s python imports cachemgr and its dependencies from its own venv.

    :raises RuntimeError: a module came from elsewhere (the checkout, the .venv).
    """
    code = "import json, cachemgr, click; print(json.dumps([cachemgr.__file__, click.__file__]))"
    out = subprocess.run(
        [str(found.python), "-c", code], cwd=found.venv, capture_output=True, text=True
    )
    files = json.loads(out.stdout) if out.returncode == 0 else [out.stderr.strip()[-200:]]
    outside = [f for f in files if not Path(f).resolve().is_relative_to(found.venv.resolve())]
    if outside:
        raise RuntimeError(f"bench: the installed venv {found.venv} imports {outside[0]}")


def _pip_install(python: Path, source: Path) -> None:
    env = {**measured_env(), "PYTHONWARNINGS": "ignore", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    base = [str(python), "-m", "pip", "install", "-q", "--no-deps"]
    tail = ""
    for extra in ([], ["--no-build-isolation", "--no-index"]):
        proc = subprocess.run([*base, *extra, str(source)], env=env, capture_output=True, text=True)
        if proc.returncode == 0:
            return
        lines = proc.stderr.strip().splitlines()
        tail = lines[-1] if lines else f"exit {proc.returncode}"
    raise RuntimeError(f"bench: pip install {source} failed: {tail}")


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_dependencies(dist_name: str = "cachemgr") -> list[importlib.metadata.Distribution]:
    """The installed distributions ``dist_name`` needs at run time (its requirements without
    extras, and theirs), from the running interpreter's metadata."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [dist_name]
    while todo:
        for req in importlib.metadata.requires(todo.pop()) or []:
            if "extra ==" in req.replace('"', "'") or "extra==" in req:
                continue
            name = _normalize(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0])
            if name in seen:
                continue
            try:
                seen[name] = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue  # an environment marker excluded it here
            todo.append(name)
    return list(seen.values())


def _copy_dependencies(site: Path) -> None:
    """Copy each runtime dependency's files (its ``RECORD``, byte code included) into ``site``."""
    for dist in runtime_dependencies():
        for rel in dist.files or []:
            src = Path(str(dist.locate_file(rel)))
            dst = (site / rel).resolve()
            if not src.is_file() or not dst.is_relative_to(site):
                continue  # scripts outside site-packages (bin/) are not needed by an import
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)  # keeps mtimes: the copied .pyc stay valid
