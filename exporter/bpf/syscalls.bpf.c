// SPDX-License-Identifier: GPL-2.0
/* Process signals for AI workloads (no instrumentation): syscall density, GPU-driver
 * ioctl rate, mmap/munmap/mremap churn. One raw_tp/sys_enter program (no tracefs, no
 * kprobes). Labels stay bounded: only processes in `tracked_tgids` (those that made a
 * GPU-driver ioctl, added here at the first one, plus an allow-list user space adds) are
 * counted under their own name, in hash maps keyed by that name; every other process is counted in per-CPU
 * arrays (*_other), the cheapest possible path for the bulk of the system's syscalls.
 * Metrics it feeds: see syscalls.yaml.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "fabric.h"

#if defined(__TARGET_ARCH_x86)
#define NR_ioctl 16
#define NR_mmap 9
#define NR_munmap 11
#define NR_mremap 25
#elif defined(__TARGET_ARCH_arm64)
#define NR_ioctl 29
#define NR_mmap 222
#define NR_munmap 215
#define NR_mremap 216
#else
#error "syscall numbers for this architecture are not defined"
#endif

#define S_IFMT 00170000
#define S_IFCHR 0020000
#define MINORBITS 20
#define GPU_MAJOR_SLOTS 8
#define MAP_ID_SYSCALLS 0
#define MAP_ID_IOCTLS 1
#define MAP_ID_MMAP 2

enum mmap_op { OP_MMAP = 0, OP_MUNMAP = 1, OP_MREMAP = 2 };

char LICENSE[] SEC("license") = "GPL";

struct comm_key {
	char comm[16];   /* the process's (thread group leader's) name */
};

struct mmap_key {
	char comm[16];
	__u32 op;
};

/* tgid -> TRACKED_BY_* for processes counted under their own name. A process is added here
 * at its first GPU-driver ioctl, so user space never has to walk every process's fds to
 * find GPU processes; user space adds the allow-list and removes processes that exited. */
#define TRACKED_BY_USER 1
#define TRACKED_BY_KERNEL 2
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} tracked_tgids SEC(".maps");

/* GPU processes that found tracked_tgids full: user space reports them
 * (fabric_ebpf_untracked_processes) and moves them in when room frees up. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u32);
} untracked_gpu_tgids SEC(".maps");

/* Character-device majors of the GPU driver (from /proc/devices); 0 = unused slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GPU_MAJOR_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} gpu_majors SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, struct comm_key);
	__type(value, __u64);
} fabric_process_syscalls_total SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, struct comm_key);
	__type(value, __u64);
} fabric_gpu_driver_ioctls_total SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 768);
	__type(key, struct mmap_key);
	__type(value, __u64);
} fabric_process_mmap_calls_total SEC(".maps");

/* Untracked processes: "other". */
DECLARE_COUNTER(fabric_process_syscalls_other);
DECLARE_COUNTER(fabric_gpu_driver_ioctls_other);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 3);   /* enum mmap_op */
	__type(key, __u32);
	__type(value, __u64);
} fabric_process_mmap_calls_other SEC(".maps");

DECLARE_MAP_ERRORS(3);

static __always_inline void bump(void *map, void *key, __u32 map_id)
{
	__u64 one = 1, *count = bpf_map_lookup_elem(map, key);

	if (count) {
		*count += 1;   /* per-CPU value: no atomics needed */
		return;
	}
	if (bpf_map_update_elem(map, key, &one, BPF_NOEXIST)) {
		count = bpf_map_lookup_elem(map, key);
		if (count)
			*count += 1;
		else
			map_error(&fabric_ebpf_map_update_errors_total, map_id);
	}
}

/* Is `fd` of the current task a character device of the GPU driver? */
static __always_inline bool fd_is_gpu_device(unsigned int fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **fds, *file = NULL;
	struct inode *inode;
	__u32 major, i;

	if (!fdt || fd >= BPF_CORE_READ(fdt, max_fds))
		return false;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]) || !file)
		return false;
	inode = BPF_CORE_READ(file, f_inode);
	if ((BPF_CORE_READ(inode, i_mode) & S_IFMT) != S_IFCHR)
		return false;
	major = BPF_CORE_READ(inode, i_rdev) >> MINORBITS;
	for (i = 0; i < GPU_MAJOR_SLOTS; i++) {
		__u32 slot = i, *m = bpf_map_lookup_elem(&gpu_majors, &slot);

		if (!m || *m == 0)
			return false;
		if (*m == major)
			return true;
	}
	return false;
}

static __always_inline bool gpu_ioctl(struct pt_regs *regs)
{
	__u32 zero = 0, *first = bpf_map_lookup_elem(&gpu_majors, &zero);

	/* No GPU driver registered: skip the fd walk entirely. */
	return first && *first && fd_is_gpu_device((unsigned int)PT_REGS_PARM1_CORE(regs));
}

static __always_inline void track_gpu_process(__u32 tgid)
{
	__u32 by = TRACKED_BY_KERNEL;

	if (bpf_map_update_elem(&tracked_tgids, &tgid, &by, BPF_NOEXIST))
		bpf_map_update_elem(&untracked_gpu_tgids, &tgid, &by, BPF_ANY);
}

static __always_inline __u32 mmap_op(long id)
{
	return id == NR_mmap ? OP_MMAP : id == NR_munmap ? OP_MUNMAP : OP_MREMAP;
}

SEC("raw_tp/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long id)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	bool is_mmap = id == NR_mmap || id == NR_munmap || id == NR_mremap;

	if (!bpf_map_lookup_elem(&tracked_tgids, &tgid)) {
		counter_add(&fabric_process_syscalls_other, 1);
		if (id == NR_ioctl && gpu_ioctl(regs)) {
			counter_add(&fabric_gpu_driver_ioctls_other, 1);
			track_gpu_process(tgid);      /* by name from its next syscall on */
		} else if (is_mmap) {
			counter_add_at(&fabric_process_mmap_calls_other, mmap_op(id), 1);
		}
		return 0;
	}

	struct comm_key key = {};
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();

	BPF_CORE_READ_INTO(&key.comm, task, group_leader, comm);
	bump(&fabric_process_syscalls_total, &key, MAP_ID_SYSCALLS);
	if (id == NR_ioctl && gpu_ioctl(regs)) {
		bump(&fabric_gpu_driver_ioctls_total, &key, MAP_ID_IOCTLS);
	} else if (is_mmap) {
		struct mmap_key mkey = {};

		__builtin_memcpy(mkey.comm, key.comm, sizeof(mkey.comm));
		mkey.op = mmap_op(id);
		bump(&fabric_process_mmap_calls_total, &mkey, MAP_ID_MMAP);
	}
	return 0;
}
