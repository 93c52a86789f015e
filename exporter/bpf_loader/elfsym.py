"""Function symbols of an ELF shared object: the file offset a uprobe needs, and the names
a library exports.

libbpf 1.1 resolves `func_name` itself; symbol_file_offset is the fallback for the cases
it cannot (e.g. a stripped .symtab with the symbol only in .dynsym of an unusual layout),
and the way tests check libbpf's answer. exporter/nccl/discovery.py lists a library's
exported functions through defined_functions. ELF64 only (x86_64, arm64). Files are read
through mmap: a 300 MB libtorch_cuda.so is not copied into memory.

Any file a traced process maps can be handed here, truncated or crafted ones included:
every offset is checked against the file before it is read, and whatever is wrong with a
file is an ElfError for that file (counted in MALFORMED_FILES), never an exception that
would end a scan of the others.
"""
from __future__ import annotations

import mmap
import struct
import threading
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

STT_FUNC = 2
STT_GNU_IFUNC = 10
SHT_SYMTAB = 2
SHT_DYNSYM = 11
PT_LOAD = 1


class ElfError(ValueError):
    pass


# Files refused as malformed since start, by reason ("not_elf", "not_elf64", "malformed"):
# exported by the collectors whose scans read ELF files.
MALFORMED_FILES: Counter = Counter()
_count_lock = threading.Lock()


def _refuse(path, reason: str, detail: str) -> ElfError:
    with _count_lock:
        MALFORMED_FILES[reason] += 1
    return ElfError(f"{path}: {detail}")


def _unpack(fmt: str, data, offset: int, path) -> tuple:
    """struct.unpack_from that refuses to read outside the file."""
    if offset < 0 or offset + struct.calcsize(fmt) > len(data):
        raise _refuse(path, "malformed", f"malformed ELF: a header points outside the file (offset {offset:#x})")
    return struct.unpack_from(fmt, data, offset)


class ElfFile:
    """The section headers of a mapped ELF64 file; `data` stays valid inside open_elf()."""

    SECTION = "IIQQQQIIQQ"

    def __init__(self, data, path: str | Path) -> None:
        if len(data) < 0x40 or data[:4] != b"\x7fELF":
            raise _refuse(path, "not_elf", "not an ELF file")
        if data[4] != 2:
            raise _refuse(path, "not_elf64", "only ELF64 is supported")
        self.data, self.path = data, path
        self.endian = "<" if data[5] == 1 else ">"
        (e_shoff,) = _unpack(self.endian + "Q", data, 0x28, path)
        (e_shentsize, e_shnum) = _unpack(self.endian + "HH", data, 0x3A, path)
        if e_shnum and e_shentsize < struct.calcsize(self.SECTION):
            raise _refuse(path, "malformed", f"malformed ELF: section header size {e_shentsize}")
        self.sections = [_unpack(self.endian + self.SECTION, data, e_shoff + i * e_shentsize, path)
                         for i in range(e_shnum)]

    def defined_functions(self, table: int = SHT_DYNSYM) -> Iterator[tuple[bytes, int, int]]:
        """(name, value, size) of every defined FUNC/IFUNC symbol in the `table` sections."""
        data, fmt, path = self.data, self.endian + "IBBHQQ", self.path
        entry_size = struct.calcsize(fmt)
        for (_name, sh_type, _f, _a, sh_offset, sh_size, sh_link, _i, _al, sh_entsize) in self.sections:
            if sh_type != table or sh_entsize == 0:
                continue
            if sh_entsize < entry_size or sh_link >= len(self.sections) or sh_offset + sh_size > len(data):
                raise _refuse(path, "malformed", "malformed ELF: symbol table outside the file or unlinked")
            strtab = self.sections[sh_link][4]
            for pos in range(sh_offset, sh_offset + sh_size - entry_size + 1, sh_entsize):
                st_name, st_info, _other, st_shndx, st_value, st_size = struct.unpack_from(fmt, data, pos)
                if st_shndx == 0 or st_value == 0 or (st_info & 0xF) not in (STT_FUNC, STT_GNU_IFUNC):
                    continue
                start = strtab + st_name
                end = data.find(b"\0", start) if start < len(data) else -1
                if end < 0:
                    raise _refuse(path, "malformed", "malformed ELF: symbol name outside the file")
                yield data[start:end], st_value, st_size

    def file_offset(self, value: int) -> int | None:
        """File offset of virtual address `value`, None when no PT_LOAD segment holds it."""
        (e_phoff,) = _unpack(self.endian + "Q", self.data, 0x20, self.path)
        (e_phentsize, e_phnum) = _unpack(self.endian + "HH", self.data, 0x36, self.path)
        for i in range(e_phnum):
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = _unpack(
                self.endian + "IIQQQQQQ", self.data, e_phoff + i * e_phentsize, self.path)
            if p_type == PT_LOAD and p_vaddr <= value < p_vaddr + p_filesz:
                return value - p_vaddr + p_offset
        return None


@contextmanager
def open_elf(path: str | Path) -> Iterator[ElfFile]:
    with open(path, "rb") as handle:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:           # an empty file cannot be mapped
            raise _refuse(path, "not_elf", "not an ELF file") from None
        with data:
            yield ElfFile(data, path)


def symbol_file_offset(path: str | Path, symbol: str) -> int:
    """File offset of function `symbol` (from .dynsym, then .symtab) in the ELF at `path`."""
    name = symbol.encode()
    with open_elf(path) as elf:
        value = next((v for table in (SHT_DYNSYM, SHT_SYMTAB)
                      for n, v, _ in elf.defined_functions(table) if n == name), None)
        if value is None:
            raise ElfError(f"{path}: no defined function symbol {symbol!r}")
        offset = elf.file_offset(value)
    if offset is None:
        raise ElfError(f"{path}: symbol {symbol!r} at {value:#x} lies in no loadable segment")
    return offset


def function_code(path: str | Path, symbols: set[str]) -> dict[str, bytes]:
    """The machine code of each exported function of `symbols` the ELF defines (from .dynsym,
    by its symbol size); absent names are left out."""
    wanted = {name.encode(): name for name in symbols}
    code: dict[str, bytes] = {}
    with open_elf(path) as elf:
        for name, value, size in elf.defined_functions(SHT_DYNSYM):
            if name not in wanted or wanted[name] in code or size <= 0:
                continue
            offset = elf.file_offset(value)
            if offset is None or offset + size > len(elf.data):
                raise _refuse(path, "malformed", f"malformed ELF: {wanted[name]} lies outside the file")
            code[wanted[name]] = bytes(elf.data[offset:offset + size])
    return code
