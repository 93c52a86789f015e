// SPDX-License-Identifier: GPL-2.0
/* Scheduler signals: run-queue latency (wakeup -> on CPU), context switches, migrations.
 * tp_btf programs: typed arguments from kernel BTF, no tracefs needed.
 * Metrics it feeds: see sched.yaml.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "fabric.h"

#define TASK_RUNNING 0
#define MAP_ID_WAKEUP 0

char LICENSE[] SEC("license") = "GPL";

/* task_struct.state was renamed __state in 5.14; CO-RE picks whichever exists. */
struct task_struct___pre514 {
	long state;
} __attribute__((preserve_access_index));

/* tp_btf hands over trusted task pointers: direct (relocated) loads, no probe reads. */
static __always_inline long get_task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return t->__state;
	return ((struct task_struct___pre514 *)t)->state;
}

/* Microseconds, one bucket per power of two from 4 us to 2^20 us (~1 s); see sched.yaml. */
DECLARE_HIST(fabric_sched_runqueue_latency_seconds, 0, 2, 20);
DECLARE_COUNTER(fabric_sched_context_switches_total);
DECLARE_COUNTER(fabric_sched_migrations_total);
DECLARE_MAP_ERRORS(1);

/* Per-task "runnable since" timestamp in task-local storage: no hashing, no LRU, freed
 * with the task. Cheaper than a pid-keyed hash on the hottest path in the kernel. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} runnable_since SEC(".maps");

static __always_inline void mark_runnable(struct task_struct *p, __u64 now)
{
	__u64 *since;

	if (!p->pid)
		return;
	since = bpf_task_storage_get(&runnable_since, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (since)
		*since = now;
	else
		map_error(&fabric_ebpf_map_update_errors_total, MAP_ID_WAKEUP);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup, struct task_struct *p)
{
	mark_runnable(p, bpf_ktime_get_ns());
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(sched_wakeup_new, struct task_struct *p)
{
	mark_runnable(p, bpf_ktime_get_ns());
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 *since, now = bpf_ktime_get_ns();   /* one clock read per switch */

	counter_add(&fabric_sched_context_switches_total, 1);
	/* A preempted task goes straight back to the run queue. */
	if (get_task_state(prev) == TASK_RUNNING)
		mark_runnable(prev, now);
	if (!next->pid)
		return 0;
	since = bpf_task_storage_get(&runnable_since, next, 0, 0);
	if (!since || !*since)
		return 0;
	fabric_sched_runqueue_latency_seconds_observe((now - *since) / 1000);   /* microseconds */
	*since = 0;
	return 0;
}

SEC("tp_btf/sched_migrate_task")
int BPF_PROG(sched_migrate_task, struct task_struct *p, int dest_cpu)
{
	counter_add(&fabric_sched_migrations_total, 1);
	return 0;
}
