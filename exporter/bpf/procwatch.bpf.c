// SPDX-License-Identifier: GPL-2.0
/* Hints for NCCL process discovery, so user space never has to poll every process.
 *
 * Uprobes attach per library file (inode): a process that maps an already-probed libnccl
 * is traced with no work at all. Only a library file not seen before needs finding, and
 * a process can only come to map one by exec (its DT_NEEDED libraries, mapped by ld.so
 * right after) or by dlopen (PyTorch loads libnccl / libtorch_cuda that way). So:
 *   - tp_btf/sched_process_exec: the new image's tgid, looked at shortly after;
 *   - a uretprobe on libc's dlopen: the caller's tgid, after a successful load.
 * Each is one 8-byte record; user space coalesces them per process (exporter/nccl/discovery.py,
 * ProcessWatch) and keeps a slow full rescan as the safety net (processes in containers with
 * their own libc, a lost record).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "fabric.h"

char LICENSE[] SEC("license") = "GPL";

enum proc_hint { PROC_EXEC = 1, PROC_DLOPEN = 2 };

struct procwatch_event {
	__u32 tgid;
	__u32 kind;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} proc_events SEC(".maps");

/* Records dropped because the ring buffer was full: user space then rescans everything. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} proc_events_lost SEC(".maps");

/* The exporter's PID namespace (fabric.h scoped_pid_tgid), written before attaching:
 * processes outside it are not the exporter's to find. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} proc_pidns SEC(".maps");

static __always_inline int emit(__u32 kind)
{
	__u32 zero = 0;
	__u32 *pidns = bpf_map_lookup_elem(&proc_pidns, &zero);
	__u64 id = pidns ? scoped_pid_tgid(*pidns) : 0;
	struct procwatch_event *e;

	if (!id)
		return 0;
	e = bpf_ringbuf_reserve(&proc_events, sizeof(*e), 0);

	if (!e) {
		__u32 zero = 0;
		__u64 *lost = bpf_map_lookup_elem(&proc_events_lost, &zero);
		if (lost)
			__sync_fetch_and_add(lost, 1);
		return 0;
	}
	e->tgid = id >> 32;
	e->kind = kind;
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(proc_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	return emit(PROC_EXEC);
}

/* void *dlopen(const char *filename, int flags): only a load that succeeded. */
SEC("uretprobe")
int BPF_KRETPROBE(proc_dlopen_return, void *handle)
{
	if (!handle)
		return 0;
	return emit(PROC_DLOPEN);
}
