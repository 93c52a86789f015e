/* Shared helpers for fabricscope BPF programs: log-linear histograms and counters.
 *
 * A histogram is a per-CPU array of one `struct { __u64 slots[N]; __u64 sum; }` with a
 * log-linear slot function: every power of two above 2^min_exp is split into 2^sub_bits
 * equal-width buckets, up to 2^max_exp; slot 0 holds v <= 2^min_exp and the last slot
 * the overflow. Every bound is an integer, so user space turns each slot into a
 * Prometheus bucket with no loss (exporter/bpf_loader/histogram.py mirrors loglin_slot; the
 * three layout numbers are repeated in the program's <name>.yaml, and a test checks
 * that they agree). Factor-2 buckets are too coarse for a "p99 > 3x average" rule;
 * 8 per power of two are not. `sum` is in the same unit as the values. Per-CPU: no
 * atomics on hot paths, user space sums the CPUs.
 */
#ifndef FABRIC_H
#define FABRIC_H

#include <bpf/bpf_core_read.h>

#define HIST_SLOTS(sub_bits, min_exp, max_exp) (2 + (((max_exp) - (min_exp)) << (sub_bits)))

/* floor(log2(x)) for x >= 1 (0 for x == 0), branch-free for the verifier. */
static __always_inline __u32 log2_floor(__u64 x)
{
	__u32 r = 0, shift;

	shift = (x > 0xFFFFFFFFULL) << 5; x >>= shift; r |= shift;
	shift = (x > 0xFFFF) << 4; x >>= shift; r |= shift;
	shift = (x > 0xFF) << 3; x >>= shift; r |= shift;
	shift = (x > 0xF) << 2; x >>= shift; r |= shift;
	shift = (x > 0x3) << 1; x >>= shift; r |= shift;
	r |= (x >> 1);
	return r;
}

/* The slot of v: 0 for v <= 2^min_exp; for v in (2^e, 2^(e+1)], min_exp <= e < max_exp,
 * 1 + (e - min_exp) * 2^sub_bits + the sub-bucket of width 2^(e - sub_bits) that holds v;
 * the last slot above 2^max_exp. Needs sub_bits <= min_exp. */
static __always_inline __u32 loglin_slot(__u64 v, __u32 sub_bits, __u32 min_exp, __u32 max_exp)
{
	__u64 x;
	__u32 e;

	if (v <= (1ULL << min_exp))
		return 0;
	x = v - 1;
	e = log2_floor(x);
	if (e >= max_exp)
		return HIST_SLOTS(sub_bits, min_exp, max_exp) - 1;
	return 1 + ((e - min_exp) << sub_bits) + (__u32)((x - (1ULL << e)) >> (e - sub_bits));
}

/* DECLARE_HIST(name, sub_bits, min_exp, max_exp) declares the map `name` and
 * name##_observe(value), which counts one value into it. */
#define DECLARE_HIST(name, sub_bits, min_exp, max_exp) \
	struct name##_value { \
		__u64 slots[HIST_SLOTS(sub_bits, min_exp, max_exp)]; \
		__u64 sum; \
	}; \
	struct { \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); \
		__uint(max_entries, 1); \
		__type(key, __u32); \
		__type(value, struct name##_value); \
	} name SEC(".maps"); \
	static __always_inline void name##_observe(__u64 value) \
	{ \
		__u32 zero = 0, slot = loglin_slot(value, sub_bits, min_exp, max_exp); \
		struct name##_value *h = bpf_map_lookup_elem(&name, &zero); \
		if (!h || slot >= HIST_SLOTS(sub_bits, min_exp, max_exp)) \
			return; \
		h->slots[slot] += 1; \
		h->sum += value; \
	}

/* Add n to slot `index` of a per-CPU array of __u64 counters. */
static __always_inline void counter_add_at(void *map, __u32 index, __u64 n)
{
	__u64 *c = bpf_map_lookup_elem(map, &index);

	if (c)
		*c += n;
}

static __always_inline void counter_add(void *map, __u64 n)
{
	counter_add_at(map, 0, n);
}

/* Map-update failures (a full map) are counted here, keyed by a small per-object map id,
 * so user space can expose them instead of silently losing events. */
#define DECLARE_MAP_ERRORS(n) \
	struct { \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); \
		__uint(max_entries, n); \
		__type(key, __u32); \
		__type(value, __u64); \
	} fabric_ebpf_map_update_errors_total SEC(".maps")

static __always_inline void map_error(void *errors, __u32 map_id)
{
	counter_add_at(errors, map_id, 1);
}

/* Process scoping by PID namespace: the exporter sees the processes its procfs shows, as a
 * container runtime scopes a pod. `pidns_inum` is the inode number of that procfs's PID
 * namespace (user space: stat <procfs>/1/ns/pid), 0 for the initial namespace. The
 * current task's pid_tgid as that namespace numbers it, or 0 when the task is outside it
 * (in a sibling namespace: another "node" on the same kernel). A task's pid carries one
 * number per namespace from the initial one down to its own (struct pid.numbers[level]);
 * the scope is one of those levels, or the task is not visible there. */
#define PIDNS_MAX_DEPTH 32       /* the kernel's MAX_PID_NS_LEVEL */

static __always_inline __u64 scoped_pid_tgid(__u32 pidns_inum)
{
	struct task_struct *task;
	struct pid *leader, *thread;
	struct upid number;
	__u32 depth, tgid;

	if (!pidns_inum)
		return bpf_get_current_pid_tgid();
	task = (struct task_struct *)bpf_get_current_task();
	leader = BPF_CORE_READ(task, group_leader, thread_pid);
	thread = BPF_CORE_READ(task, thread_pid);
	if (!leader || !thread)
		return 0;
	depth = BPF_CORE_READ(leader, level);
	for (__u32 i = 0; i < PIDNS_MAX_DEPTH; i++) {
		if (i > depth)
			break;
		if (bpf_probe_read_kernel(&number, sizeof(number), &leader->numbers[i]))
			return 0;
		if (BPF_CORE_READ(number.ns, ns.inum) != pidns_inum)
			continue;
		tgid = number.nr;
		/* A thread shares its process's PID namespace. */
		if (bpf_probe_read_kernel(&number, sizeof(number), &thread->numbers[i]))
			return 0;
		return ((__u64)tgid << 32) | (__u32)number.nr;
	}
	return 0;
}

#define DECLARE_COUNTER(name) \
	struct { \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); \
		__uint(max_entries, 1); \
		__type(key, __u32); \
		__type(value, __u64); \
	} name SEC(".maps")

#endif
