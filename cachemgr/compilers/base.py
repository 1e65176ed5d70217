"""Compiler backends: one small interface over every real compiler (docs/design.md#compilers, layer
6).

The pattern is filelock's: :class:`CompilerBackend` owns everything that is the same for every
compiler — validating the job, running the compiler in its own process group with a timeout,
checking that a binary came out and that it really holds the entry symbol, writing the
``.cce`` / ``*_loc.json`` artefacts (docs/design.md#debug-compiles-and-kernel_meta) and the
CANN-shaped kernel json (docs/design.md#files-of-an-entry). A backend module (``host``, ``cuda``,
``template``) only says where its compiler is, which argv compiles a job, and how debug flags map to
its own flags.

Process rules (:mod:`.process`): the compiler runs in its own process group; on timeout, on
any interruption and after it exits the whole group gets ``SIGKILL``, so a compile never
leaves processes behind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cachemgr.compilers import entrycheck, envvars, lineinfo, process, stamp
from cachemgr.compilers.elf import ElfFile, EntryMissingError, find_entry_symbol
from cachemgr.compilers.process import Outcome
from cachemgr.errors import CompileError, ConfigError, InvalidInputError
from cachemgr.memo import Memo
from cachemgr.storage import fsutil, safeio, secretfile

log = logging.getLogger(__name__)

#: Backend-neutral debug flags the policy layer may ask for
#: (docs/design.md#debug-compiles-and-kernel_meta table): ``O0`` and ``g`` (levels 2,
#: ``ccec_O0``/``ccec_g``), ``oom`` (out-of-bounds checks), ``instrument`` (level 1 debug
#: instrumentation), ``check_flag`` (sync-flag checks). Each backend maps what its compiler has and
#: logs what it has no equivalent for.
DEBUG_FLAGS = frozenset({"O0", "g", "oom", "instrument", "check_flag"})
#: Extra artefacts the policy layer may ask for (docs/design.md#debug-compiles-and-kernel_meta):
#: ``cce`` → ``<out_name>.cce`` (the preprocessed source as compiled), ``loc`` →
#: ``<out_name>_loc.json`` (source line → address).
EMITS = frozenset({"cce", "loc"})
#: Source languages some backend accepts.
LANGUAGES = frozenset({"c", "cpp", "cuda", "cce"})

#: A request's optimisation flag (gcc/clang/ccec ``-O…``, nvcc's ``-Xptxas=-O…``).
OPTIMISATION_FLAG = re.compile(r"^(?:-O[0-3sgz]?|-Ofast|-Xptxas=-O[0-3])$")

_IDENTITY_TIMEOUT_S = 30.0
_DEFINE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OUT_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class CompileJob:
    """One compile: ``source`` (absolute path) in ``language`` → ``out_dir/<out_name><suffix>``.

    ``defines`` become ``-DNAME=value`` (sorted by name, so the argv is deterministic);
    ``debug_flags`` ⊆ :data:`DEBUG_FLAGS`; ``emit`` ⊆ :data:`EMITS`; ``timeout_s`` bounds the
    wall time of each compiler process (compile, then preprocess for ``cce``) in seconds.
    ``out_dir`` must exist and be private to this compile. ``include_dirs`` become ``-I<dir>``
    (in order) and ``extra_flags`` (checked by :mod:`cachemgr.compile.extraflags`) follow the
    backend's base optimisation level, and the debug flags follow them, all before the
    defines: a debug flag wins over the request's own flags
    (docs/compiling.md#debug-flags-win).
    """

    source: Path
    language: str
    entry: str
    defines: Mapping[str, str | int | float | bool]
    out_dir: Path
    out_name: str
    debug_flags: frozenset[str] = frozenset()
    emit: frozenset[str] = frozenset()
    timeout_s: float = 600.0
    include_dirs: tuple[Path, ...] = ()
    extra_flags: tuple[str, ...] = ()
    depfile: Path | None = None
    #: keep the json in memory (:attr:`CompileResult.doc`) instead of writing ``json_path``:
    #: a publish takes the document itself (a temp file, a rename, a read
    #: back and an unlink less per miss)
    json_in_memory: bool = False
    #: the folder that mirrors the user's files by their absolute paths
    #: (``<mirror_root>/<absolute path>``, :func:`cachemgr.compile.inputs.mirror`): error
    #: messages name the user's path instead of this private copy
    mirror_root: Path | None = None
    #: the caller's values of the variables this compiler reads (:mod:`.envvars`), already
    #: translated for the build mirror; the compiler sees these and no other value of them
    #: (None: this process's environment, as it is)
    env: Mapping[str, str] | None = None
    #: the caller's own work while the compiler process runs, needing nothing it makes
    #: (a publish's files made ahead: :func:`.process.run_in_group`); an exception from it
    #: stops the compile and is raised. Not for the dependency listing or the ``.cce``.
    meanwhile: Callable[[], object] | None = None

    def user_view(self, text: str) -> str:
        """``text`` (a message, a compiler's stderr) with the private build folder taken out:
        mirrored paths become the user's own, other files in ``out_dir`` (the object, which is
        gone after the run) are named by the kernel they were built for. Unchanged for a job
        without a mirror (its ``out_dir`` is the caller's)."""
        if self.mirror_root is None:  # the caller's own folders: their paths are the user's
            return text
        text = text.replace(f"{self.mirror_root}/", "/")
        prefix = re.escape(f"{self.out_dir}/")
        return re.sub(prefix + r"[^\s;:,'\"]+", f"the build output of kernel {self.out_name}", text)


@dataclass(frozen=True)
class CompilerIdentity:
    """Which compiler: ``name`` (executable name), ``path`` (as found on PATH or configured),
    ``version`` (its own version line), ``real_path`` (the file run: links followed) and
    ``stamp`` (:func:`.stamp.stamp` of it and of the programs a wrapper script runs).

    ``version``, ``real_path`` and ``stamp`` are part of the cache key
    (docs/compiling.md#the-compiler): two compilers with the same version line never
    share an entry.
    """

    name: str
    path: str
    version: str
    real_path: str = ""
    stamp: str = ""


@dataclass(frozen=True)
class CompileResult:
    """What a successful compile produced.

    ``binary`` = ``out_dir/<out_name><bin_suffix>``; ``kernel_name`` is the symbol really found
    in it; ``json_path`` the CANN-shaped json (not written when the job said
    ``json_in_memory``: see :meth:`write_json`); ``doc`` that json's document; ``artefacts``
    the ``.cce``/``_loc.json`` files written; ``command`` the argv run; ``seconds`` the
    compiler's wall time.
    """

    binary: Path
    bin_suffix: str
    kernel_name: str
    json_path: Path
    artefacts: tuple[Path, ...]
    command: tuple[str, ...]
    seconds: float
    doc: Mapping[str, Any] = field(default_factory=dict)

    def write_json(self) -> Path:
        """Write :attr:`doc` to ``json_path`` if it is not there (atomically, no fsync: a
        build output); returns ``json_path``.

        :raises OSError: it cannot be written.
        """
        if not self.json_path.exists():
            fsutil.atomic_write_bytes(self.json_path, _dumps(self.doc), sync=False)
        return self.json_path


#: Compiler identities by (backend, executable, then per file it runs — links resolved now —
#: path, device, inode, size, mtime): one per compiler.
_identity_cache: Memo[tuple[object, ...], CompilerIdentity] = Memo("compiler identities", 256)
#: Version lines kept on disk between processes (entries), so a one-shot ``cachemgr compile``
#: hit runs no ``--version``.
_IDENTITY_FILE_ENTRIES = 64
#: The largest identity file read (bytes; 64 entries of a few hundred bytes each).
MAX_IDENTITY_FILE_BYTES = 1 << 20


def identity_cache_file() -> Path:
    """``$XDG_CACHE_HOME/cachemgr/compilers.json`` (default ``~/.cache/cachemgr/``): each
    compiler's version line by executable path, inode, size and mtime — ccache's default
    ``compiler_check = mtime``, which trusts a compiler whose file is unchanged. A file of
    the user's own, read and written as one (docs/design.md#the-users-own-files)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cachemgr" / "compilers.json"


def _disk_key(key: tuple[object, ...]) -> str:
    return json.dumps(list(key))


def _read_identities() -> dict[str, object]:
    """:func:`identity_cache_file`'s identities ({} when missing, not private or bad)."""
    return secretfile.read_own_json(identity_cache_file(), MAX_IDENTITY_FILE_BYTES, log)


def _remembered(key: tuple[object, ...]) -> CompilerIdentity | None:
    """The identity another process found for ``key`` (None when unknown or unreadable)."""
    found = _read_identities().get(_disk_key(key))
    if isinstance(found, list) and len(found) == 5 and all(isinstance(x, str) for x in found):
        return CompilerIdentity(*found)
    return None


def _remember(key: tuple[object, ...], ident: CompilerIdentity) -> None:
    """Add ``ident`` to :func:`identity_cache_file` (best effort: a failure costs one
    ``--version`` next time)."""
    path = identity_cache_file()
    try:
        data = _read_identities()
        data[_disk_key(key)] = [
            ident.name,
            ident.path,
            ident.version,
            ident.real_path,
            ident.stamp,
        ]
        kept = dict(list(data.items())[-_IDENTITY_FILE_ENTRIES:])
        secretfile.write_own(path, json.dumps(kept).encode())
    except OSError as exc:
        log.debug("cannot remember the identity of %s: %s", ident.path, exc)


class CompilerBackend(ABC):
    """Base of every backend. Subclasses set the class attributes and implement the hooks.

    :param config: backend settings (``cc``, ``nvcc``, ``cuda_arch``, ``cce_command``, ...;
        see each backend), never mutated.
    """

    name: ClassVar[str]
    languages: ClassVar[frozenset[str]]
    bin_suffix: str = ".o"
    #: ``magic`` and ``coreType`` written to the kernel json.
    magic: str = "RT_DEV_BINARY_MAGIC_ELF"
    core_type: str = "AiCore"
    #: The environment variables this compiler reads that change its output
    #: (:mod:`.envvars`, from the compiler's documentation).
    env_names: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: Mapping[str, object] | None = None) -> None:
        self.config: Mapping[str, object] = dict(config or {})

    # ----- hooks -----------------------------------------------------------------------------

    @abstractmethod
    def executable(self) -> str:
        """Absolute path of the compiler.

        :raises CompileError: naming the compiler when it is not installed.
        """

    @abstractmethod
    def flags(self, job: CompileJob) -> list[str]:
        """The compiler's own flags for ``job.debug_flags`` (and line info for ``emit`` loc)."""

    @abstractmethod
    def command(self, job: CompileJob) -> list[str]:
        """The exact argv that compiles ``job`` into :meth:`binary_path`.

        :raises CompileError: when the compiler is missing.
        :raises InvalidInputError: for a malformed define.
        """

    @abstractmethod
    def preprocess_command(self, job: CompileJob, output: Path) -> list[str]:
        """The argv that writes ``job``'s preprocessed source (same defines/flags) to ``output``."""

    def depend_command(self, job: CompileJob, output: Path) -> list[str]:
        """The argv that writes ``job``'s dependency list (make syntax, ``-M``: every file the
        preprocessor reads, the system's headers too, same defines/flags/include folders) to
        ``output``, compiling nothing. ``-M``, not ``-MM``: ``-MM`` also leaves out every
        header included *from* a system header, so a project header reached that way (an
        include folder's ``features.h`` with ``#include_next``) would be missing from the
        build mirror (docs/compiling.md#files-looked-for). gcc, clang, nvcc and CANN's
        clang-based ``ccec``/``bisheng`` all take ``-M``.

        :raises ConfigError: when this compiler cannot list dependencies.
        """
        argv = self.preprocess_command(job, output)
        return [("-M" if w == "-E" else w) for w in argv]

    def include_args(self, job: CompileJob) -> list[str]:
        """``-I<dir>`` for each include folder, then the extra flags (:meth:`request_flags`)."""
        return [*(f"-I{d}" for d in job.include_dirs), *self.request_flags(job)]

    #: Debug flags that compile without optimisation: with one of them the request's own
    #: optimisation flags are dropped (:meth:`request_flags`).
    unoptimised_by: ClassVar[frozenset[str]] = frozenset({"O0"})

    def request_flags(self, job: CompileJob) -> list[str]:
        """The request's ``extra_flags``, less its optimisation flags (``-O…``, ``-Ofast``,
        ``-Xptxas=-O…``) when ``job.debug_flags`` asks for an unoptimised build
        (:attr:`unoptimised_by`): debug flags win over the request's own optimisation
        (docs/compiling.md#debug-flags-win; CANN: ``ccec_O0`` and level 2 build at ``-O0``).
        The backends also put their debug flags after these, so every other debug flag wins
        too."""
        if not job.debug_flags & self.unoptimised_by:
            return list(job.extra_flags)
        kept = [f for f in job.extra_flags if not OPTIMISATION_FLAG.match(f)]
        if len(kept) != len(job.extra_flags):
            dropped = sorted(set(job.extra_flags) - set(kept))
            log.info("%s: debug build at -O0: the request's %s are not used", job.out_name, dropped)
        return kept

    def path_map_args(self, job: CompileJob) -> list[str]:
        """For a job compiled from a build mirror: gcc/clang flags that write the caller's
        paths into the object instead of the mirror's (docs/compiling.md#paths-in-the-binary).
        ``__FILE__`` and the DWARF file names lose the mirror's prefix
        (``-ffile-prefix-map=<mirror>/=/``: ``<mirror>/a/k.c`` is ``/a/k.c``), and the
        compile's working folder, the build folder (``DW_AT_comp_dir``), becomes the
        source's folder. The build-folder map comes first: gcc applies the last matching
        map, clang the longest. Nothing for a job without a mirror (its paths are the
        caller's, or a probe's source outside the mirror)."""
        folder = caller_folder(job)
        if folder is None:
            return []
        return [
            f"-fdebug-prefix-map={job.out_dir}={folder}",
            f"-ffile-prefix-map={job.mirror_root}/=/",
        ]

    #: The compile command writes ``job.depfile`` when set (gcc, clang, nvcc).
    writes_depfile: ClassVar[bool] = False

    def depfile_args(self, job: CompileJob) -> list[str]:
        """``-MD -MF <depfile>`` when the job asks for it and the compiler writes one."""
        return ["-MD", "-MF", str(job.depfile)] if job.depfile and self.writes_depfile else []

    def unsupported_debug_flags(self, job: CompileJob) -> frozenset[str]:
        """Debug flags of ``job`` this compiler has no equivalent for (logged, then skipped)."""
        return frozenset()

    def version_line(self, version_text: str) -> str:
        """Pick the version string out of ``<compiler> --version`` output: its first line."""
        return next((ln.strip() for ln in version_text.splitlines() if ln.strip()), "")

    def json_fields(self, job: CompileJob, elf: ElfFile, kernel_name: str) -> dict[str, Any]:
        """Backend-specific kernel-json fields (override; default: nothing extra)."""
        return {}

    def key_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """What of the compile environment ``env`` goes into the key for this compiler
        (:func:`.envvars.key_values` of :attr:`env_names`)."""
        return envvars.key_values(self.env_names, env)

    def resolve_native(self, words: tuple[str, ...]) -> tuple[str, ...]:
        """What ``-march=native``-style ``words`` resolve to on this host, for the key
        (docs/compiling.md#native). This backend cannot tell: refused.

        :raises InvalidInputError: always, one line naming the flag.
        """
        raise InvalidInputError(
            f"extra_flags {words[0]!r}: the {self.name} backend cannot tell what it "
            "resolves to on this host, so its binary could not be keyed by it; name the "
            "target instead"
        )

    # ----- shared machinery ------------------------------------------------------------------

    def identity(self) -> CompilerIdentity:
        """Name, path, version, real path and stamp of the compiler (:mod:`.stamp`), cached
        per file run (and programs a wrapper runs, each link to them resolved again, and the
        compiler behind a ccache link) by path, inode, size and mtime: in this
        process, and across processes in :func:`identity_cache_file` — so a hit runs no
        ``--version`` once the compiler is known.

        :raises CompileError: naming the compiler when it is missing or ``--version`` fails.
        :raises ConfigError: a bad ``[compilers] compiler_check``.
        """
        path = self.executable()
        mode = stamp.check_mode(self.config)
        files = stamp.compiler_files(path)
        key = (self.name, path, *stamp.stat_key(files, mode))
        cached = _identity_cache.get(key)
        if cached is not None:
            return cached
        ident = _remembered(key)
        if ident is None:
            out = self._run([path, "--version"], _IDENTITY_TIMEOUT_S, None, "version query")
            text = (out.stdout or out.stderr).decode("utf-8", "replace")
            if out.returncode != 0 or not text.strip():
                msg = f"{path} --version failed (exit {out.returncode}): {out.message()}"
                raise CompileError(msg)
            ident = CompilerIdentity(
                os.path.basename(path),
                path,
                self.version_line(text),
                files[0],
                stamp.stamp(files, mode),
            )
            _remember(key, ident)
        _identity_cache.put(key, ident)
        return ident

    def still_runs(self, ident: CompilerIdentity) -> bool:
        """Whether ``ident.path`` still runs the files ``ident`` was stamped from: the same
        real file and the same :func:`.stamp.stamp` of it, of the programs its script names
        and of the compiler behind a ccache link, every link resolved again (``stat``
        calls; a ``content`` stamp hashes only a file whose status changed). Checked after a
        compile and before its publish: a compiler changed since the key was computed
        compiled the binary, so it must not be published under that key
        (docs/compiling.md#the-compiler). False when a file cannot be read.

        :raises ConfigError: a bad ``[compilers] compiler_check``.
        """
        mode = stamp.check_mode(self.config)
        try:
            files = stamp.compiler_files(ident.path)
            return files[0] == ident.real_path and stamp.stamp(files, mode) == ident.stamp
        except CompileError:
            return False

    def binary_path(self, job: CompileJob) -> Path:
        """``out_dir/<out_name><bin_suffix>``."""
        return job.out_dir / f"{job.out_name}{self.bin_suffix}"

    def compile(self, job: CompileJob) -> CompileResult:
        """:meth:`_compile` with its errors naming the user's paths (:meth:`CompileJob.user_view`).

        :raises InvalidInputError: bad job (language, flags, out_name, missing source).
        :raises CompileError: see :meth:`_compile`.
        """
        try:
            return self._compile(job)
        except CompileError as exc:
            raise CompileError(job.user_view(str(exc))) from exc

    def _compile(self, job: CompileJob) -> CompileResult:
        """Compile ``job``, verify the binary and its entry symbol, write artefacts and json.

        The json is written last (atomically), so a visible json means a complete output.

        :raises InvalidInputError: bad job (language, flags, out_name, missing source).
        :raises CompileError: compiler missing, failed (its stderr, trimmed), crashed, timed out
            (its process group killed), produced no binary, or the entry symbol is absent.
        """
        self._validate(job)
        argv = self.command(job)
        binary = self.binary_path(job)
        fsutil.safe_unlink(binary)
        log.debug("compiling %s: %s", job.source, " ".join(argv))
        found: list[CompilerIdentity] = []

        def meanwhile() -> None:  # needs nothing the compiler makes: done while it runs
            found.append(self.identity())
            if job.meanwhile is not None:
                job.meanwhile()

        what = f"compiling {job.source}"
        out = self._run(argv, job.timeout_s, job.out_dir, what, job.env, meanwhile=meanwhile)
        ident = found[0]
        skipped = self.unsupported_debug_flags(job)
        if skipped:
            log.warning("%s has no equivalent for debug flags %s", ident.name, sorted(skipped))
        self._check_outcome(out, argv, job)
        if not binary.is_file():
            raise CompileError(
                f"{ident.name} exited 0 but wrote no binary {binary} (compiling {job.source})"
            )
        with ElfFile(binary, keep_open=True) as elf:  # one open for every read and the digest
            kernel_name = self._entry_symbol(job, elf)
            artefacts = self._emit(job, binary, kernel_name)
            doc = self._json_doc(job, ident, argv, elf, kernel_name)
        json_path = job.out_dir / f"{job.out_name}.json"
        if not job.json_in_memory:
            fsutil.atomic_write_bytes(json_path, _dumps(doc), sync=False)  # a build output
        log.info("compiled %s → %s in %.2f s", job.source.name, binary.name, out.seconds)
        return CompileResult(
            binary,
            self.bin_suffix,
            kernel_name,
            json_path,
            artefacts,
            tuple(argv),
            out.seconds,
            doc,
        )

    def _entry_symbol(self, job: CompileJob, elf: ElfFile) -> str:
        """:meth:`find_kernel_symbol`, its "absent" error led by the reason the sources show
        (a ``static`` entry, no exported function: :mod:`.entrycheck`).

        :raises CompileError: the symbol is absent, not exported, or ambiguous.
        """
        try:
            return self.find_kernel_symbol(elf, job.entry)
        except EntryMissingError as exc:
            exported = sorted(s.name for s in elf.symbols() if s.is_exported_function)
            files = entrycheck.compiled_files(job.source, job.mirror_root)
            why = entrycheck.missing_entry_reason(job.entry, files, exported)
            if why is None:
                raise
            shown = f" (exported functions: {exported[:10]})" if exported else ""
            raise CompileError(f"{why}{shown}") from exc

    def find_kernel_symbol(self, elf: ElfFile, entry: str) -> str:
        """The real symbol of ``entry`` in the binary (see :func:`.elf.find_entry_symbol`).

        :raises CompileError: when the symbol is absent, not exported, or ambiguous.
        """
        return find_entry_symbol(elf, entry)

    def define_args(self, job: CompileJob) -> list[str]:
        """``-DNAME=value`` for each define, sorted by name (bools as 1/0).

        :raises InvalidInputError: for a name that is not an identifier or a value with a
            newline or NUL.
        """
        args = []
        for name in sorted(job.defines):
            value = job.defines[name]
            if not isinstance(name, str) or not _DEFINE_NAME.match(name):
                raise InvalidInputError(f"define name {name!r} is not a C identifier")
            text = str(int(value)) if isinstance(value, bool) else str(value)
            if "\n" in text or "\0" in text:
                raise InvalidInputError(f"define {name}={text!r} contains a newline or NUL")
            args.append(f"-D{name}={text}")
        return args

    def _validate(self, job: CompileJob) -> None:
        if job.language not in self.languages:
            raise InvalidInputError(
                f"backend {self.name!r} does not compile language {job.language!r} "
                f"(it compiles {sorted(self.languages)})"
            )
        _check_subset("debug flag", job.debug_flags, DEBUG_FLAGS)
        _check_subset("emit", job.emit, EMITS)
        if not _OUT_NAME.match(job.out_name) or job.out_name in (".", ".."):
            raise InvalidInputError(f"out_name {job.out_name!r} must be a plain file name")
        if not Path(job.source).is_absolute() or not Path(job.source).is_file():
            raise InvalidInputError(f"kernel source {job.source} is not an existing absolute path")
        if not Path(job.out_dir).is_dir():
            raise InvalidInputError(f"out_dir {job.out_dir} is not an existing folder")
        if job.timeout_s <= 0:
            raise InvalidInputError(f"timeout_s must be > 0, got {job.timeout_s}")

    def _run(
        self,
        argv: list[str],
        timeout_s: float,
        cwd: Path | None,
        what: str,
        env: Mapping[str, str] | None = None,
        keep_stderr: process.Keep = process.DIAGNOSTICS,
        meanwhile: Callable[[], object] | None = None,
    ) -> Outcome:
        """Run ``argv`` in its own process group (see :mod:`.process`), inside the sandbox
        and resource limits of :data:`process.current_limits` when a caller set them, with
        the job's compile environment ``env`` (:func:`.envvars.process_env`), keeping of
        its output what :data:`process.DIAGNOSTICS` keeps (of stderr: ``keep_stderr``).
        Every other caller reads only messages, the first line of ``--version``, or files
        the compiler wrote (a dependency list, whose reader has its own cap). ``meanwhile``:
        see :func:`process.run_in_group`."""
        env_ = envvars.process_env(env)
        return process.run_in_group(
            argv, timeout_s, cwd, what, env_, keep_stderr=keep_stderr, meanwhile=meanwhile
        )

    def list_dependencies(self, job: CompileJob, output: Path) -> list[str]:
        """Run :meth:`depend_command` and return the files it names (paths as the compiler
        wrote them, the source first).

        :raises CompileError: the preprocessor failed (its message: a missing header...).
        """
        argv = self.depend_command(job, output)
        what = f"listing the headers of {job.source}"
        out = self._run(argv, job.timeout_s, job.out_dir, what, job.env)
        try:
            self._check_outcome(out, argv, job)
        except CompileError as exc:
            raise CompileError(job.user_view(str(exc))) from exc
        try:
            return read_depfile(output)
        except FileNotFoundError as exc:
            raise CompileError(f"{argv[0]} wrote no dependency list for {job.source}") from exc
        except OSError as exc:
            raise CompileError(f"the dependency list of {job.source}: {exc}") from exc

    def _check_outcome(self, out: Outcome, argv: list[str], job: CompileJob) -> None:
        tool = os.path.basename(argv[0])
        stderr = out.message()
        if out.returncode < 0:
            sig = process.signal_name(-out.returncode)
            raise CompileError(f"{tool} crashed ({sig}) compiling {job.source}: {stderr}")
        if out.returncode != 0:
            raise CompileError(
                f"{tool} failed (exit {out.returncode}) compiling {job.source}: {stderr}"
            )

    def _emit(self, job: CompileJob, binary: Path, kernel_name: str) -> tuple[Path, ...]:
        written = []
        if "cce" in job.emit:
            written.append(self._emit_cce(job))
        if "loc" in job.emit:
            written.append(self._emit_loc(job, binary, kernel_name))
        return tuple(written)

    def _emit_cce(self, job: CompileJob) -> Path:
        dest = job.out_dir / f"{job.out_name}.cce"
        tmp = fsutil.temp_path(dest)
        argv = self.preprocess_command(job, tmp)
        try:
            what = f"preprocessing {job.source}"
            out = self._run(argv, job.timeout_s, job.out_dir, what, job.env)
            self._check_outcome(out, argv, job)
            if not tmp.is_file():
                raise CompileError(f"preprocessor {argv[0]} wrote no output for {job.source}")
            fsutil.publish_temp(tmp, dest)
        finally:
            fsutil.safe_unlink(tmp)
        return dest

    def _emit_loc(self, job: CompileJob, binary: Path, kernel_name: str) -> Path:
        dest = job.out_dir / f"{job.out_name}_loc.json"
        rows = lineinfo.decode_lines(binary, lineinfo.readelf_path(self.config.get("readelf")))
        source = Path(job.user_view(str(job.source)))  # the caller's path, not the mirror's
        doc = lineinfo.loc_document(job.out_name, self.bin_suffix, kernel_name, source, rows)
        fsutil.atomic_write_bytes(dest, _dumps(doc))
        return dest

    def _json_doc(
        self,
        job: CompileJob,
        ident: CompilerIdentity,
        argv: list[str],
        elf: ElfFile,
        kernel_name: str,
    ) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "binFileName": job.out_name,
            "binFileSuffix": self.bin_suffix,
            "blockDim": 1,
            "coreType": self.core_type,
            "kernelName": kernel_name,
            "magic": self.magic,
            "opParaSize": 0,
            "parameters": [],
            "sha256": elf.digest(),
            "compileInfo": {
                "compiler": ident.name,
                "path": ident.path,
                "version": ident.version,
                "flags": self.flags(job),
                "command": argv,
            },
        }
        doc.update(self.json_fields(job, elf, kernel_name))
        return doc


def caller_folder(job: CompileJob) -> str | None:
    """The caller's folder of ``job.source`` (its path without the build mirror's prefix), or
    None for a job without a mirror or whose source is not in it."""
    if job.mirror_root is None or not job.source.is_relative_to(job.mirror_root):
        return None
    return "/" + str(job.source.parent.relative_to(job.mirror_root))


def find_executable(candidates: list[str], what: str, config_key: str | None = None) -> str:
    """First of ``candidates`` found (a path or a name on PATH), as an absolute path.

    :raises CompileError: naming what was tried (and the config key it came from).
    """
    for cand in candidates:
        found = shutil.which(cand)
        if found:
            return os.path.abspath(found)
    origin = f" (from config {config_key})" if config_key else " (names looked up on PATH)"
    raise CompileError(f"{what} not found: tried {', '.join(candidates)}{origin}")


def config_str(config: Mapping[str, object], key: str, default: str | None = None) -> str | None:
    """``config[key]`` as a non-empty string, or ``default`` when unset.

    :raises ConfigError: when set to something that is not a non-empty string.
    """
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"compiler config {key}={value!r} must be a non-empty string")
    return str(value)


#: The largest dependency listing read (bytes): a compiler run for a member writes it, so it
#: is read capped like any file not ours (docs/daemon.md, "Bounded memory"); a listing of
#: 10,000 headers is well under 1 MiB.
MAX_DEPFILE_BYTES = 16 << 20


def read_depfile(path: Path) -> list[str]:
    """The prerequisites listed in the dependency file ``path`` (:func:`parse_depfile`),
    read non-blocking, regular files only, at most :data:`MAX_DEPFILE_BYTES`.

    :raises OSError: it cannot be read (:class:`~cachemgr.storage.safeio.UnsafeFileError`
        over the cap, naming it).
    """
    raw = safeio.read_regular(path, MAX_DEPFILE_BYTES)
    return parse_depfile(raw.decode("utf-8", "surrogateescape"))


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a make rule as ``-MM``/``-MD`` write it: ``target: a b \\`` on
    continued lines, a space inside a name escaped as ``\\ ``. Target names are dropped."""
    joined = text.replace("\\\n", " ")
    out: list[str] = []
    for line in joined.splitlines():
        _, colon, rest = line.partition(": ")
        if not colon:
            _, colon, rest = line.partition(":")
        if not colon:
            continue
        words = re.split(r"(?<!\\)\s+", rest.strip())
        out.extend(w.replace("\\ ", " ") for w in words if w)
    return list(dict.fromkeys(out))


def _check_subset(what: str, given: frozenset[str], allowed: frozenset[str]) -> None:
    unknown = set(given) - allowed
    if unknown:
        raise InvalidInputError(f"unknown {what} {sorted(unknown)} (accepted: {sorted(allowed)})")


def _dumps(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(doc, indent=4, ensure_ascii=False) + "\n").encode("utf-8")
