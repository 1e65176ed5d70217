"""Minimal ELF reader: section names, function symbols, one section's bytes.

Both backends' binaries are ELF: a host relocatable object (``.o``) and an NVIDIA cubin
(``.cubin``, ``e_machine`` 190). Reading the symbol table here, instead of running ``nm`` or
``cuobjdump`` (the latter is absent from the PyPI ``nvidia-cuda-nvcc`` wheels), keeps symbol
lookup free of extra tools and identical for every backend. ELF32/ELF64, either byte order.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from cachemgr.errors import CompileError

log = logging.getLogger(__name__)

_MAGIC = b"\x7fELF"
#: The most bytes of one ELF part read into memory (headers, a symbol or string table, a
#: section asked for); a kernel's are KiB.
MAX_PART_BYTES = 64 << 20
_SHT_SYMTAB = 2
_SHT_DYNSYM = 11
_SHN_UNDEF = 0
#: ``STT_*`` and ``STB_*`` values used by :class:`Symbol`.
STT_FUNC = 2
STB_GLOBAL = 1
STB_WEAK = 2


@dataclass(frozen=True)
class Section:
    """One section header: ``name``, ``type`` (``SHT_*``), file ``offset``/``size`` in bytes."""

    name: str
    type: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    """One symbol-table entry; ``defined`` is False for undefined (imported) symbols."""

    name: str
    type: int
    bind: int
    defined: bool

    @property
    def is_exported_function(self) -> bool:
        """True for a defined global or weak function: something a loader can look up."""
        return self.defined and self.type == STT_FUNC and self.bind in (STB_GLOBAL, STB_WEAK)


#: Bytes read per ``pread`` when the whole file is hashed (:meth:`ElfFile.digest`).
_DIGEST_CHUNK = 1 << 20


class ElfFile:
    """An ELF file read by parts: its headers at once, a section's bytes when asked for —
    never the whole file (a member's kernel may compile to a 900 MB object: read whole, each
    worker held one; docs/security.md "Memory").

    :param keep_open: the file stays open for every later read and the digest until
        :meth:`close` (or the end of a ``with`` block): a miss checks the entry symbol and
        hashes the binary with one ``open`` instead of six. Otherwise each read opens it.
    :raises CompileError: when the file is not ELF or its headers are truncated.
    """

    def __init__(self, path: Path, keep_open: bool = False) -> None:
        self.path = Path(path)
        self._strings: dict[int, bytes] = {}
        self._fd: int | None = None
        self._fd = self._open()
        try:
            head = self._pread(0, 64)
            if head[:4] != _MAGIC or len(head) < 52:
                raise CompileError(f"{self.path} is not an ELF file")
            self._head = head
            self._is64 = head[4] == 2
            self._end = "<" if head[5] == 1 else ">"
            try:
                self.sections = self._read_sections()
            except struct.error as exc:
                raise CompileError(f"{self.path}: truncated ELF headers ({exc})") from exc
        except BaseException:
            self.close()
            raise
        if not keep_open:
            self.close()

    def _open(self) -> int:
        """:raises CompileError: the file cannot be opened."""
        try:
            return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise CompileError(f"{self.path}: cannot read ({exc.strerror})") from exc

    def close(self) -> None:
        """Close the descriptor a ``with`` block opened (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ElfFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pread(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (fewer at the end of the file).

        :raises CompileError: ``size`` is over :data:`MAX_PART_BYTES`, or it cannot be read.
        """
        if size > MAX_PART_BYTES:
            raise CompileError(
                f"{self.path}: an ELF part of {size} bytes is over the {MAX_PART_BYTES}-byte "
                "cap of what is read into memory (headers, symbol and string tables)"
            )
        if self._fd is not None:
            return self._read_at(self._fd, offset, size)
        fd = self._open()
        try:
            return self._read_at(fd, offset, size)
        finally:
            os.close(fd)

    def _read_at(self, fd: int, offset: int, size: int) -> bytes:
        """:raises CompileError: the read failed."""
        try:
            return os.pread(fd, size, offset)
        except OSError as exc:
            raise CompileError(f"{self.path}: cannot read ({exc.strerror})") from exc

    def digest(self) -> str:
        """Hex SHA-256 of the whole file, read in chunks (never whole into memory).

        :raises CompileError: it cannot be read.
        """
        fd = self._fd if self._fd is not None else self._open()
        try:
            sha, offset = hashlib.sha256(), 0
            while chunk := self._read_at(fd, offset, _DIGEST_CHUNK):
                sha.update(chunk)
                offset += len(chunk)
            return sha.hexdigest()
        finally:
            if fd != self._fd:
                os.close(fd)

    @property
    def machine(self) -> int:
        """``e_machine`` (62 = x86-64, 183 = AArch64, 190 = NVIDIA CUDA)."""
        machine: int = struct.unpack_from(self._end + "H", self._head, 18)[0]
        return machine

    def _read_sections(self) -> list[Section]:
        if self._is64:
            shoff, shentsize, shnum, shstrndx = self._unpack("Q", 0x28, "HHH", 0x3A)
            fmt = "IIQQQQIIQQ"
        else:
            shoff, shentsize, shnum, shstrndx = self._unpack("I", 0x20, "HHH", 0x2E)
            fmt = "IIIIIIIIII"
        table = self._pread(shoff, shnum * shentsize)
        raw = []
        for i in range(shnum):
            f = struct.unpack_from(self._end + fmt, table, i * shentsize)
            raw.append((f[0], f[1], f[4], f[5], f[6], f[9]))
        if not shnum or shstrndx >= shnum:
            return [Section("", r[1], r[2], r[3], r[4], r[5]) for r in raw]
        names = Section("", raw[shstrndx][1], raw[shstrndx][2], raw[shstrndx][3], 0, 0)
        return [Section(self._cstr(names, r[0]), r[1], r[2], r[3], r[4], r[5]) for r in raw]

    def _unpack(self, off_fmt: str, off_pos: int, rest_fmt: str, rest_pos: int) -> tuple[int, ...]:
        (shoff,) = struct.unpack_from(self._end + off_fmt, self._head, off_pos)
        return (shoff, *struct.unpack_from(self._end + rest_fmt, self._head, rest_pos))

    def _cstr(self, table: Section, offset: int) -> str:
        """The NUL-terminated string at ``offset`` of string table ``table`` (read once)."""
        data = self._strings.get(table.offset)
        if data is None:
            data = self._strings[table.offset] = self._pread(table.offset, table.size)
        end = data.index(b"\0", offset)
        return data[offset:end].decode("utf-8", "replace")

    def section(self, name: str) -> bytes | None:
        """Bytes of the first section called ``name``, or None if there is none."""
        for sec in self.sections:
            if sec.name == name:
                return self._pread(sec.offset, sec.size)
        return None

    def symbols(self) -> list[Symbol]:
        """Every entry of ``.symtab`` and ``.dynsym`` (index 0 excluded)."""
        out: list[Symbol] = []
        for sec in self.sections:
            if sec.type in (_SHT_SYMTAB, _SHT_DYNSYM) and sec.entsize:
                out.extend(self._symbols_of(sec))
        return out

    def _symbols_of(self, sec: Section) -> list[Symbol]:
        strtab = self.sections[sec.link]
        table = self._pread(sec.offset, sec.size)
        out = []
        for off in range(sec.entsize, sec.size, sec.entsize):
            if self._is64:
                name, info, _other, shndx = struct.unpack_from(self._end + "IBBH", table, off)
            else:
                name, _v, _s, info, _other, shndx = struct.unpack_from(
                    self._end + "IIIBBH", table, off
                )
            text = self._cstr(strtab, name) if name else ""
            out.append(Symbol(text, info & 0xF, info >> 4, shndx != _SHN_UNDEF))
        return out


def find_entry_symbol(elf: ElfFile, entry: str) -> str:
    """The exported function symbol of ``elf`` that is the kernel ``entry``.

    An exact match wins (so ``kernel_entry`` may name a mangled symbol). A C++ entry
    compiled without ``extern "C"`` — a plain function, a template instance, a function in a
    namespace — is accepted when exactly one mangled name holds ``<len><entry>``; several
    (overloads, template instances) are ambiguous and the error names them all, since
    ``kernel_entry`` may be set to one of them (``extern "C"`` cannot declare a template).

    :raises CompileError: when the symbol is absent, not exported (``static``), or ambiguous.
    """
    symbols = elf.symbols()
    funcs = [s for s in symbols if s.is_exported_function]
    if any(s.name == entry for s in funcs):
        return entry
    mangled = sorted({s.name for s in funcs if _mangles(s.name, entry)})
    if len(mangled) == 1:
        log.info("entry %s is C++-mangled as %s in %s", entry, mangled[0], elf.path)
        return mangled[0]
    if mangled:
        raise CompileError(
            f"entry {entry!r} is ambiguous in {elf.path}: mangled candidates {mangled} "
            "(overloads or template instances); set kernel_entry to one of these names"
        )
    local = any(s.name == entry and s.defined for s in symbols)
    why = "is not exported (static?) from" if local else "is not in"
    names = sorted(s.name for s in funcs)[:10]
    raise EntryMissingError(f"entry symbol {entry!r} {why} {elf.path}; exported functions: {names}")


class EntryMissingError(CompileError):
    """The object has no exported function that is the kernel entry (not an ambiguity)."""


def _mangles(name: str, entry: str) -> bool:
    """True when the Itanium-mangled ``name`` is a function called ``entry`` (at top level
    ``_Z<len><entry>``, in a namespace or class ``_ZN...<len><entry>...E``)."""
    if not name.startswith("_Z"):
        return False
    token = f"{len(entry)}{entry}"
    if name.startswith("_Z" + token):
        return True
    at = name.find(token, 3)
    return name.startswith("_ZN") and at > 0 and not name[at - 1].isdigit()
