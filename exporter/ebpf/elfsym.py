"""Function symbols of an ELF shared object: the file offset a uprobe needs, and the names
a library exports.

libbpf 1.1 resolves `func_name` itself; symbol_file_offset is the fallback for the cases
it cannot (e.g. a stripped .symtab with the symbol only in .dynsym of an unusual layout),
and the way tests check libbpf's answer. exporter/nccl/discovery.py lists a library's
exported functions through defined_functions. ELF64 only (x86_64, arm64). Files are read
through mmap: a 300 MB libtorch_cuda.so is not copied into memory.
"""
from __future__ import annotations

import mmap
import struct
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


class ElfFile:
    """The section headers of a mapped ELF64 file; `data` stays valid inside open_elf()."""

    def __init__(self, data, path: str | Path) -> None:
        if data[:4] != b"\x7fELF":
            raise ElfError(f"{path}: not an ELF file")
        if data[4] != 2:
            raise ElfError(f"{path}: only ELF64 is supported")
        self.data, self.path = data, path
        self.endian = "<" if data[5] == 1 else ">"
        (e_shoff,) = struct.unpack_from(self.endian + "Q", data, 0x28)
        (e_shentsize, e_shnum) = struct.unpack_from(self.endian + "HH", data, 0x3A)
        self.sections = [struct.unpack_from(self.endian + "IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
                         for i in range(e_shnum)]

    def defined_functions(self, table: int = SHT_DYNSYM) -> Iterator[tuple[bytes, int]]:
        """(name, value) of every defined FUNC/IFUNC symbol in the `table` sections."""
        data, fmt = self.data, self.endian + "IBBHQQ"
        for (_name, sh_type, _f, _a, sh_offset, sh_size, sh_link, _i, _al, sh_entsize) in self.sections:
            if sh_type != table or sh_entsize == 0:
                continue
            strtab = self.sections[sh_link][4]
            for pos in range(sh_offset, sh_offset + sh_size, sh_entsize):
                st_name, st_info, _other, st_shndx, st_value, _size = struct.unpack_from(fmt, data, pos)
                if st_shndx == 0 or st_value == 0 or (st_info & 0xF) not in (STT_FUNC, STT_GNU_IFUNC):
                    continue
                start = strtab + st_name
                yield data[start:data.find(b"\0", start)], st_value

    def file_offset(self, value: int) -> int | None:
        """File offset of virtual address `value`, None when no PT_LOAD segment holds it."""
        (e_phoff,) = struct.unpack_from(self.endian + "Q", self.data, 0x20)
        (e_phentsize, e_phnum) = struct.unpack_from(self.endian + "HH", self.data, 0x36)
        for i in range(e_phnum):
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = struct.unpack_from(
                self.endian + "IIQQQQQQ", self.data, e_phoff + i * e_phentsize)
            if p_type == PT_LOAD and p_vaddr <= value < p_vaddr + p_filesz:
                return value - p_vaddr + p_offset
        return None


@contextmanager
def open_elf(path: str | Path) -> Iterator[ElfFile]:
    with open(path, "rb") as handle:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:           # an empty file cannot be mapped
            raise ElfError(f"{path}: not an ELF file") from None
        with data:
            yield ElfFile(data, path)


def symbol_file_offset(path: str | Path, symbol: str) -> int:
    """File offset of function `symbol` (from .dynsym, then .symtab) in the ELF at `path`."""
    name = symbol.encode()
    with open_elf(path) as elf:
        value = next((v for table in (SHT_DYNSYM, SHT_SYMTAB)
                      for n, v in elf.defined_functions(table) if n == name), None)
        if value is None:
            raise ElfError(f"{path}: no defined function symbol {symbol!r}")
        offset = elf.file_offset(value)
    if offset is None:
        raise ElfError(f"{path}: symbol {symbol!r} at {value:#x} lies in no loadable segment")
    return offset
