"""Resolve a function symbol of an ELF shared object to the file offset a uprobe needs.

libbpf 1.1 resolves `func_name` itself; this is the fallback for the cases it cannot
(e.g. a stripped .symtab with the symbol only in .dynsym of an unusual layout), and the
way tests check libbpf's answer. ELF64 only (x86_64, arm64).
"""
from __future__ import annotations

import struct
from pathlib import Path

STT_FUNC = 2
STT_GNU_IFUNC = 10
SHT_SYMTAB = 2
SHT_DYNSYM = 11
PT_LOAD = 1


class ElfError(ValueError):
    pass


def symbol_file_offset(path: str | Path, symbol: str) -> int:
    """File offset of function `symbol` (from .dynsym, then .symtab) in the ELF at `path`."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF":
        raise ElfError(f"{path}: not an ELF file")
    if data[4] != 2:
        raise ElfError(f"{path}: only ELF64 is supported")
    endian = "<" if data[5] == 1 else ">"
    (e_phoff, e_shoff) = struct.unpack_from(endian + "QQ", data, 0x20)
    (e_phentsize, e_phnum, e_shentsize, e_shnum) = struct.unpack_from(endian + "HHHH", data, 0x36)
    sections = [struct.unpack_from(endian + "IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
                for i in range(e_shnum)]
    value = None
    for wanted in (SHT_DYNSYM, SHT_SYMTAB):
        for (_name, sh_type, _f, _a, sh_offset, sh_size, sh_link, _i, _al, sh_entsize) in sections:
            if sh_type != wanted or sh_entsize == 0:
                continue
            strtab_off = sections[sh_link][4]
            value = _find(data, endian, sh_offset, sh_size, sh_entsize, strtab_off, symbol.encode())
            if value:
                break
        if value:
            break
    if not value:
        raise ElfError(f"{path}: no defined function symbol {symbol!r}")
    for i in range(e_phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = struct.unpack_from(
            endian + "IIQQQQQQ", data, e_phoff + i * e_phentsize)
        if p_type == PT_LOAD and p_vaddr <= value < p_vaddr + p_filesz:
            return value - p_vaddr + p_offset
    raise ElfError(f"{path}: symbol {symbol!r} at {value:#x} lies in no loadable segment")


def _find(data: bytes, endian: str, offset: int, size: int, entsize: int, strtab: int, name: bytes) -> int | None:
    for pos in range(offset, offset + size, entsize):
        st_name, st_info, _other, st_shndx, st_value, _size = struct.unpack_from(endian + "IBBHQQ", data, pos)
        if st_shndx == 0 or st_value == 0 or (st_info & 0xF) not in (STT_FUNC, STT_GNU_IFUNC):
            continue
        end = data.index(b"\0", strtab + st_name)
        if data[strtab + st_name:end] == name:
            return st_value
    return None
