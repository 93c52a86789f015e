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

static __always_inline long get_task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return BPF_CORE_READ(t, __state);
	return BPF_CORE_READ((struct task_struct___pre514 *)t, state);
}

DECLARE_HIST(fabric_sched_runqueue_latency_seconds);
DECLARE_COUNTER(fabric_sched_context_switches_total);
DECLARE_COUNTER(fabric_sched_migrations_total);
DECLARE_MAP_ERRORS(1);

/* pid -> time it became runnable. LRU: a task that never runs again ages out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} runnable_since SEC(".maps");

static __always_inline void mark_runnable(struct task_struct *p)
{
	__u32 pid = p->pid;
	__u64 now = bpf_ktime_get_ns();

	if (!pid)
		return;
	if (bpf_map_update_elem(&runnable_since, &pid, &now, BPF_ANY))
		map_error(&fabric_ebpf_map_update_errors_total, MAP_ID_WAKEUP);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup, struct task_struct *p)
{
	mark_runnable(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(sched_wakeup_new, struct task_struct *p)
{
	mark_runnable(p);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u32 pid;
	__u64 *since;

	counter_add(&fabric_sched_context_switches_total, 1);
	/* A preempted task goes straight back to the run queue. */
	if (get_task_state(prev) == TASK_RUNNING)
		mark_runnable(prev);
	pid = next->pid;
	if (!pid)
		return 0;
	since = bpf_map_lookup_elem(&runnable_since, &pid);
	if (!since)
		return 0;
	__u64 delta_ns = bpf_ktime_get_ns() - *since;
	bpf_map_delete_elem(&runnable_since, &pid);
	hist_observe(&fabric_sched_runqueue_latency_seconds, delta_ns / 1000);   /* microseconds */
	return 0;
}

SEC("tp_btf/sched_migrate_task")
int BPF_PROG(sched_migrate_task, struct task_struct *p, int dest_cpu)
{
	counter_add(&fabric_sched_migrations_total, 1);
	return 0;
}
