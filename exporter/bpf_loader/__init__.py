"""eBPF for the exporter: a ctypes libbpf binding, map readers and conversions.

libbpf.py    load CO-RE objects, attach tracepoint/tp_btf/raw_tp/uprobe programs, read maps
reasons.py   the bounded reasons eBPF can be unavailable (fabric_ebpf_available{reason})
objects.py   where compiled objects live, building them with exporter/bpf/Makefile
elfsym.py    function symbols of an ELF: file offset for uprobes, exported names
"""
