// SPDX-License-Identifier: GPL-2.0
/* Exercises the loader itself (uprobes, hash maps, per-CPU maps, ring buffers) in
 * tests/test_ebpf_libbpf.py; built by exporter/bpf/Makefile with SRC_DIR=tests/bpf. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "fabric.h"

char LICENSE[] SEC("license") = "GPL";

/* tgid -> calls of the probed function. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps");

/* tgid -> calls, per CPU, to check per-CPU summing. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u64);
} calls_percpu SEC(".maps");

/* Every value the uretprobe returns, through the RTT histogram's slot function: the
 * tests compare the kernel's slots with exporter/bpf_loader/histogram.py. Same layout as
 * fabric_tcp_rtt_excess_seconds in tcp.bpf.c. */
DECLARE_HIST(returned_values, 3, 4, 19);

struct event {
	__u32 tgid;
	__u32 is_return;
	__u64 arg0;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} events SEC(".maps");

static __always_inline void emit(__u64 arg0, __u32 is_return)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u64 one = 1, *n;
	struct event *e;

	n = bpf_map_lookup_elem(&calls, &tgid);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&calls, &tgid, &one, BPF_NOEXIST);
	n = bpf_map_lookup_elem(&calls_percpu, &tgid);
	if (n)
		*n += 1;
	else
		bpf_map_update_elem(&calls_percpu, &tgid, &one, BPF_NOEXIST);
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return;
	e->tgid = tgid;
	e->is_return = is_return;
	e->arg0 = arg0;
	bpf_ringbuf_submit(e, 0);
}

SEC("uprobe")
int BPF_KPROBE(probe_entry, __u64 arg0)
{
	emit(arg0, 0);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(probe_return, __u64 ret)
{
	emit(ret, 1);
	returned_values_observe(ret);
	return 0;
}
