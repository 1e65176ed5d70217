"""Command-template backend for the CANN toolchain (``ccec`` / ``bisheng``),
docs/design.md#compilers.

Config keys:

* ``cce_command`` (required): argv template, split like a shell line (no shell runs), e.g.
  ``"ccec -c {source} -o {output} {defines} {flags}"``. Placeholders: ``{source}``,
  ``{output}`` (the binary), ``{entry}``, ``{out_dir}``, ``{out_name}``; ``{defines}`` and
  ``{flags}`` must stand alone as a word and expand to zero or more arguments: ``{flags}``
  is the include folders, the request's ``extra_flags`` (less its ``-O…`` for a debug build
  at ``-O0``), then the debug flags, which so win over the request's; a word of the template
  itself after ``{flags}`` (an ``-O2``) still wins over them.
* ``cce_flags``: debug flag → compiler flags (a string split like a shell line, or a list).
  Defaults: ``O0`` → ``-O0``, ``g`` → ``-g``; ``loc`` (used when a line map is asked for)
  defaults to the ``g`` flags. Unmapped debug flags are logged and skipped.
* ``cce_preprocess_command``: template writing the preprocessed source to ``{output}``;
  default: ``cce_command`` with its ``-c`` word replaced by ``-E``.
* ``cce_suffix`` (default ``.o``), ``cce_magic`` (default ``RT_DEV_BINARY_MAGIC_ELF``),
  ``cce_core_type`` (default ``AiCore``).
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping
from pathlib import Path

from cachemgr.compilers import envvars
from cachemgr.compilers.base import (
    DEBUG_FLAGS,
    CompileJob,
    CompilerBackend,
    config_str,
    find_executable,
)
from cachemgr.errors import ConfigError
from cachemgr.words import noun

_PLACEHOLDERS = frozenset({"source", "output", "defines", "flags", "entry", "out_dir", "out_name"})
_MULTI = ("{defines}", "{flags}")
_DEFAULT_FLAGS: dict[str, list[str]] = {"O0": ["-O0"], "g": ["-g"]}


class TemplateBackend(CompilerBackend):
    """A compiler driven by an argv template (see module docstring for config keys).

    :raises ConfigError: at construction, for a missing or malformed template or flag map.
    """

    name = "template"
    languages = frozenset({"cce"})
    #: ``ccec`` and ``bisheng`` are clang-based: clang's variables (:mod:`.envvars`)
    env_names = envvars.CLANG

    def __init__(self, config: Mapping[str, object] | None = None) -> None:
        super().__init__(config)
        self.template = _parse_template(self.config, "cce_command")
        self.pre_template: list[str] | None = None
        if "cce_preprocess_command" in self.config:
            self.pre_template = _parse_template(self.config, "cce_preprocess_command")
        elif "-c" in self.template:
            self.pre_template = ["-E" if w == "-c" else w for w in self.template]
        self.flag_map = _parse_flag_map(self.config.get("cce_flags"))
        self.bin_suffix = config_str(self.config, "cce_suffix", ".o") or ".o"
        self.magic = config_str(self.config, "cce_magic", self.magic) or self.magic
        self.core_type = config_str(self.config, "cce_core_type", self.core_type) or "AiCore"

    def executable(self) -> str:
        """The template's first word, resolved on PATH.

        :raises CompileError: naming it when it is not installed.
        """
        return find_executable([self.template[0]], "CANN compiler", "cce_command")

    def flags(self, job: CompileJob) -> list[str]:
        """Mapped flags of each debug flag (sorted), plus the ``loc`` flags for emit loc."""
        out: list[str] = []
        for flag in sorted(job.debug_flags):
            out.extend(self.flag_map.get(flag, []))
        if "loc" in job.emit and "g" not in job.debug_flags:
            out.extend(self.flag_map.get("loc", self.flag_map.get("g", [])))
        return out

    def unsupported_debug_flags(self, job: CompileJob) -> frozenset[str]:
        """Debug flags with no entry in ``cce_flags``."""
        return job.debug_flags - self.flag_map.keys()

    def command(self, job: CompileJob) -> list[str]:
        """``cce_command`` with the placeholders filled in; word 0 resolved to a path."""
        return self._expand(self.template, job, self.binary_path(job))

    def preprocess_command(self, job: CompileJob, output: Path) -> list[str]:
        """``cce_preprocess_command`` (or the ``-E`` form of ``cce_command``) for ``output``.

        :raises ConfigError: when neither template can preprocess.
        """
        if self.pre_template is None:
            raise ConfigError(
                "emit 'cce' needs config cce_preprocess_command (cce_command has no -c to turn "
                "into -E)"
            )
        return self._expand(self.pre_template, job, output)

    def _expand(self, template: list[str], job: CompileJob, output: Path) -> list[str]:
        values = {
            "source": str(job.source),
            "output": str(output),
            "entry": job.entry,
            "out_dir": str(job.out_dir),
            "out_name": job.out_name,
        }
        argv: list[str] = []
        for word in template:
            if word == "{defines}":
                argv.extend(self.define_args(job))
            elif word == "{flags}":  # debug flags last: they win (docs/compiling.md)
                argv.extend(self.include_args(job))
                argv.extend(self.flags(job))
            else:
                argv.append(word.format_map(values))
        argv[0] = self.executable()
        return argv


#: The example ``cce_command`` a message about a missing one shows.
EXAMPLE_COMMAND = 'cce_command = "ccec -c {source} -o {output} {defines} {flags}"'


def _parse_template(config: Mapping[str, object], key: str) -> list[str]:
    """``config[key]`` split into argv words, every placeholder checked.

    :raises ConfigError: it is missing or empty (the message names ``[compilers] KEY`` and an
        example line), cannot be split, or has a bad placeholder.
    """
    text = config.get(key)
    if text is None or (isinstance(text, str) and not text.strip()):
        given = "is not set" if text is None else "is empty"
        raise ConfigError(
            f"a cce kernel needs [compilers] {key}, the CANN compiler's command line; it "
            f"{given}. Add a line like {EXAMPLE_COMMAND} under [compilers] in the config file"
        )
    if not isinstance(text, str):
        raise ConfigError(f"[compilers] {key}={text!r} must be a string, e.g. {EXAMPLE_COMMAND}")
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"config {key}={text!r} cannot be split: {exc}") from None
    for word in words:
        _check_word(key, word)
    if "{output}" not in text or "{source}" not in text:
        raise ConfigError(f"config {key}={text!r} must contain {{source}} and {{output}}")
    if "{" in words[0]:
        raise ConfigError(f"config {key}={text!r}: the compiler word takes no placeholder")
    return words


def _check_word(key: str, word: str) -> None:
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(word) if name is not None}
    except ValueError as exc:
        raise ConfigError(f"config {key}: bad word {word!r}: {exc}") from None
    unknown = names - _PLACEHOLDERS
    if unknown:
        raise ConfigError(
            f"config {key}: unknown {noun(len(unknown), 'placeholder')} {sorted(unknown)} in "
            f"{word!r} "
            f"(known: {sorted(_PLACEHOLDERS)})"
        )
    if word not in _MULTI and any(m in word for m in _MULTI):
        raise ConfigError(f"config {key}: {{defines}}/{{flags}} must be a word alone: {word!r}")


def _parse_flag_map(value: object) -> dict[str, list[str]]:
    if value is None:
        return dict(_DEFAULT_FLAGS)
    if not isinstance(value, Mapping):
        raise ConfigError(f"config cce_flags={value!r} must map debug flags to compiler flags")
    out = dict(_DEFAULT_FLAGS)
    for flag, flags in value.items():
        if flag not in DEBUG_FLAGS | {"loc"}:
            raise ConfigError(
                f"config cce_flags has unknown key {flag!r} (known: {sorted(DEBUG_FLAGS)} + loc)"
            )
        if isinstance(flags, str):
            out[str(flag)] = shlex.split(flags)
        elif isinstance(flags, list | tuple) and all(isinstance(f, str) for f in flags):
            out[str(flag)] = list(flags)
        else:
            raise ConfigError(f"config cce_flags[{flag!r}]={flags!r} must be a string or list")
    return out
