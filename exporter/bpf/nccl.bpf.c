// SPDX-License-Identifier: GPL-2.0
/* NCCL collectives from uprobes on libnccl: entry and return of every collective, and the
 * communicator initialisations that map an ncclComm_t pointer to (unique id, rank, nranks).
 *
 * Everything goes to user space through one ring buffer (exporter/nccl/uprobe.py decodes
 * `struct nccl_event`; keep the two in step). A collective is one event, at its return,
 * carrying its entry (nccl_open_calls below); calls still open are read from that map.
 * Collective events are submitted without waking the reader (BPF_RB_NO_WAKEUP): it drains
 * them in batches every 100 ms, instead of waking once per event (a wakeup per event cost
 * ~50 µs of exporter CPU each). Communicator init and destroy wake it at once. A call
 * blocked inside NCCL is visible while it is blocked (its open entry). No decisions are
 * made here.
 *
 * x86-64 SysV: integer arguments in rdi, rsi, rdx, rcx, r8, r9, then the stack; at a
 * function's first instruction [rsp] is the return address, so the first stack argument
 * is at rsp+8. ncclUniqueId (128 bytes) is passed by value in memory: it takes no register
 * and sits at rsp+8, so the next int argument (rank) still arrives in rdx.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

/* The argument layout below (stack arguments, the by-value ncclUniqueId) is x86-64 SysV.
 * Elsewhere the object holds no programs and user space reports the probe unsupported. */
#if defined(bpf_target_x86)

/* libbpf 1.1 stops at PARM5. */
#ifndef PT_REGS_PARM6
#define PT_REGS_PARM6(x) ((x)->r9)
#endif

#define NCCL_UNIQUE_ID_BYTES 128
#define MAX_INIT_ALL_DEVICES 16

enum event_kind {
	EV_COLL_ENTER = 1,
	EV_COLL_RETURN = 2,
	EV_COMM_INIT = 3,
	EV_COMM_END = 4,
	EV_COLL_DONE = 5,  /* a collective that returned: its entry, aux = entry-to-return ns */
};

/* Collective op codes: index into OPS in exporter/nccl/events.py. */
enum coll_op {
	OP_ALLREDUCE = 0, OP_ALLGATHER = 1, OP_REDUCESCATTER = 2, OP_BROADCAST = 3,
	OP_REDUCE = 4, OP_ALLTOALL = 5, OP_SEND = 6, OP_RECV = 7,
};

/* Communicator-initialisation function codes (EV_COMM_INIT.op). */
enum init_fn {
	INIT_RANK = 1, INIT_ALL = 2, INIT_SPLIT = 3, INIT_SCALABLE = 4,
};

struct nccl_event {
	__u64 ts_ns;       /* bpf_ktime_get_ns: CLOCK_MONOTONIC */
	__u64 comm;        /* ncclComm_t */
	__u64 count;       /* element count (collectives) */
	__u64 aux;         /* split: parent comm; init-all: first comm of the clique */
	__u32 pid;
	__u32 tid;
	__u16 kind;
	__u16 op;
	__s32 dtype;
	__s32 peer;        /* root or peer; split: color */
	__s32 rank;        /* init: rank; return: the ncclResult_t */
	__s32 nranks;
	__u32 seq;         /* collective entry: its sequence number on the comm (0: Send/Recv) */
	__u8 unique_id[NCCL_UNIQUE_ID_BYTES];
};

struct init_args {
	__u64 out;         /* ncclComm_t* the function fills */
	__u64 aux;
	__u32 op;
	__s32 rank;
	__s32 nranks;
	__s32 color;
	__u8 unique_id[NCCL_UNIQUE_ID_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} nccl_events SEC(".maps");

/* Events dropped because the ring buffer was full: user space exports the sum. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} nccl_events_lost SEC(".maps");

/* A collective is not sent at entry: its entry waits here, by thread, and goes to user
 * space once, with its enqueue time, when the call returns (EV_COLL_DONE): one event per
 * call instead of two. User space reads this map every batch for calls still open after
 * a few milliseconds (hang candidates, exporter/nccl/uprobe.py), so a call blocked inside
 * NCCL is still seen while it is blocked. LRU: a thread killed inside a call never
 * returns to delete its entry. */
struct open_call {
	__u64 ts_ns;
	__u64 comm;
	__u64 count;
	__u32 seq;
	__u16 op;
	__u16 pad;
	__s32 dtype;
	__s32 peer;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);                 /* pid_tgid */
	__type(value, struct open_call);
} nccl_open_calls SEC(".maps");

/* Collectives entered per (process, comm), Send/Recv excluded. Counted here, before the
 * ring buffer can drop the event, so one lost event does not shift a rank's later sequence
 * numbers against its peers' (user space joins ranks on them). Reset at init and destroy:
 * a comm pointer may be reused. */
struct comm_key {
	__u32 pid;
	__u32 pad;
	__u64 comm;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct comm_key);
	__type(value, __u32);
} nccl_comm_seq SEC(".maps");

/* Arguments of an init call in progress, by thread: the comm exists only at return. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct init_args);
} nccl_init_args SEC(".maps");

/* A zeroed template: init_args is too big to build on the 512-byte BPF stack twice. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct init_args);
} nccl_init_scratch SEC(".maps");

static __always_inline struct nccl_event *reserve(__u16 kind, __u16 op)
{
	struct nccl_event *e = bpf_ringbuf_reserve(&nccl_events, sizeof(*e), 0);
	__u64 id = bpf_get_current_pid_tgid();

	if (!e) {
		__u32 zero = 0;
		__u64 *lost = bpf_map_lookup_elem(&nccl_events_lost, &zero);
		if (lost)
			*lost += 1;
		return 0;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_ns();
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->kind = kind;
	e->op = op;
	return e;
}

static __always_inline __u32 next_seq(__u64 comm)
{
	struct comm_key key = { .pid = bpf_get_current_pid_tgid() >> 32, .comm = comm };
	__u32 one = 1, *seq = bpf_map_lookup_elem(&nccl_comm_seq, &key);

	if (!seq) {
		bpf_map_update_elem(&nccl_comm_seq, &key, &one, BPF_NOEXIST);
		return 1;
	}
	/* Not atomic: NCCL forbids using one comm from several threads at once, so one
	 * thread at a time enters here for a key (and the v1 instruction set this object is
	 * built for cannot return a fetch-and-add's value). */
	*seq += 1;
	return *seq;
}

static __always_inline void reset_seq(__u64 comm)
{
	struct comm_key key = { .pid = bpf_get_current_pid_tgid() >> 32, .comm = comm };

	bpf_map_delete_elem(&nccl_comm_seq, &key);
}

static __always_inline int coll_enter(__u16 op, __u64 comm, __u64 count, __s32 dtype, __s32 peer)
{
	__u32 seq = (op == OP_SEND || op == OP_RECV) ? 0 : next_seq(comm);
	__u64 id = bpf_get_current_pid_tgid();
	struct open_call call = {
		.ts_ns = bpf_ktime_get_ns(), .comm = comm, .count = count, .seq = seq, .op = op,
		.dtype = dtype, .peer = peer,
	};
	struct nccl_event *e;

	if (!bpf_map_update_elem(&nccl_open_calls, &id, &call, BPF_ANY))
		return 0;
	/* No room to keep it open (cannot happen with an LRU map, kept for safety): send it now. */
	e = reserve(EV_COLL_ENTER, op);
	if (!e)
		return 0;
	e->ts_ns = call.ts_ns;
	e->seq = seq;
	e->comm = comm;
	e->count = count;
	e->dtype = dtype;
	e->peer = peer;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

static __always_inline __u64 stack_arg(struct pt_regs *ctx, int index)
{
	__u64 value = 0;

	bpf_probe_read_user(&value, sizeof(value), (void *)(PT_REGS_SP(ctx) + 8 * (index + 1)));
	return value;
}

/* ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_allreduce_enter)
{
	return coll_enter(OP_ALLREDUCE, PT_REGS_PARM6(ctx), PT_REGS_PARM3(ctx), (__s32)PT_REGS_PARM4(ctx), -1);
}

/* ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_allgather_enter)
{
	return coll_enter(OP_ALLGATHER, PT_REGS_PARM5(ctx), PT_REGS_PARM3(ctx), (__s32)PT_REGS_PARM4(ctx), -1);
}

/* ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_reducescatter_enter)
{
	return coll_enter(OP_REDUCESCATTER, PT_REGS_PARM6(ctx), PT_REGS_PARM3(ctx), (__s32)PT_REGS_PARM4(ctx), -1);
}

/* ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_broadcast_enter)
{
	return coll_enter(OP_BROADCAST, PT_REGS_PARM6(ctx), PT_REGS_PARM3(ctx), (__s32)PT_REGS_PARM4(ctx),
			  (__s32)PT_REGS_PARM5(ctx));
}

/* ncclBcast(buff, count, datatype, root, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_bcast_enter)
{
	return coll_enter(OP_BROADCAST, PT_REGS_PARM5(ctx), PT_REGS_PARM2(ctx), (__s32)PT_REGS_PARM3(ctx),
			  (__s32)PT_REGS_PARM4(ctx));
}

/* ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream): comm on the stack */
SEC("uprobe")
int BPF_KPROBE(nccl_reduce_enter)
{
	return coll_enter(OP_REDUCE, stack_arg(ctx, 0), PT_REGS_PARM3(ctx), (__s32)PT_REGS_PARM4(ctx),
			  (__s32)PT_REGS_PARM6(ctx));
}

/* ncclAllToAll / ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_alltoall_enter)
{
	return coll_enter(OP_ALLTOALL, PT_REGS_PARM5(ctx), PT_REGS_PARM3(ctx), (__s32)PT_REGS_PARM4(ctx), -1);
}

/* ncclSend(sendbuff, count, datatype, peer, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_send_enter)
{
	return coll_enter(OP_SEND, PT_REGS_PARM5(ctx), PT_REGS_PARM2(ctx), (__s32)PT_REGS_PARM3(ctx),
			  (__s32)PT_REGS_PARM4(ctx));
}

/* ncclRecv(recvbuff, count, datatype, peer, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_recv_enter)
{
	return coll_enter(OP_RECV, PT_REGS_PARM5(ctx), PT_REGS_PARM2(ctx), (__s32)PT_REGS_PARM3(ctx),
			  (__s32)PT_REGS_PARM4(ctx));
}

/* Return of any collective: user space pairs it with the thread's open entry. */
SEC("uretprobe")
int BPF_KRETPROBE(nccl_coll_return)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct open_call *call = bpf_map_lookup_elem(&nccl_open_calls, &id);
	struct nccl_event *e;

	if (!call) {                        /* entered before the probes, or sent at entry */
		e = reserve(EV_COLL_RETURN, 0);
		if (!e)
			return 0;
		e->rank = (__s32)PT_REGS_RC(ctx);
		bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
		return 0;
	}
	e = reserve(EV_COLL_DONE, call->op);
	if (e) {
		__u64 now = e->ts_ns;

		e->ts_ns = call->ts_ns;
		e->aux = now - call->ts_ns;
		e->comm = call->comm;
		e->count = call->count;
		e->seq = call->seq;
		e->dtype = call->dtype;
		e->peer = call->peer;
		e->rank = (__s32)PT_REGS_RC(ctx);
		bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	}
	bpf_map_delete_elem(&nccl_open_calls, &id);
	return 0;
}

static __always_inline struct init_args *scratch(void)
{
	__u32 zero = 0;
	struct init_args *a = bpf_map_lookup_elem(&nccl_init_scratch, &zero);

	if (a)
		__builtin_memset(a, 0, sizeof(*a));
	return a;
}

static __always_inline int save_init(struct init_args *a)
{
	__u64 id = bpf_get_current_pid_tgid();

	bpf_map_update_elem(&nccl_init_args, &id, a, BPF_ANY);
	return 0;
}

/* ncclCommInitRank(comm*, nranks, ncclUniqueId commId, rank) and
 * ncclCommInitRankConfig(comm*, nranks, ncclUniqueId commId, rank, config*) */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_init_rank_enter)
{
	struct init_args *a = scratch();

	if (!a)
		return 0;
	a->op = INIT_RANK;
	a->out = PT_REGS_PARM1(ctx);
	a->nranks = (__s32)PT_REGS_PARM2(ctx);
	a->rank = (__s32)PT_REGS_PARM3(ctx);
	bpf_probe_read_user(a->unique_id, NCCL_UNIQUE_ID_BYTES, (void *)(PT_REGS_SP(ctx) + 8));
	return save_init(a);
}

/* ncclCommInitRankScalable(comm*, nranks, myrank, nId, ncclUniqueId* commIds, config*) */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_init_scalable_enter)
{
	struct init_args *a = scratch();

	if (!a)
		return 0;
	a->op = INIT_SCALABLE;
	a->out = PT_REGS_PARM1(ctx);
	a->nranks = (__s32)PT_REGS_PARM2(ctx);
	a->rank = (__s32)PT_REGS_PARM3(ctx);
	bpf_probe_read_user(a->unique_id, NCCL_UNIQUE_ID_BYTES, (void *)PT_REGS_PARM5(ctx));
	return save_init(a);
}

/* ncclCommInitAll(comm* array, ndev, devlist) */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_init_all_enter)
{
	struct init_args *a = scratch();

	if (!a)
		return 0;
	a->op = INIT_ALL;
	a->out = PT_REGS_PARM1(ctx);
	a->nranks = (__s32)PT_REGS_PARM2(ctx);
	return save_init(a);
}

/* ncclCommSplit(comm, color, key, newcomm*, config*) */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_split_enter)
{
	struct init_args *a = scratch();

	if (!a)
		return 0;
	a->op = INIT_SPLIT;
	a->aux = PT_REGS_PARM1(ctx);
	a->color = (__s32)PT_REGS_PARM2(ctx);
	/* The new rank is decided inside NCCL; the key (PyTorch passes the rank in the parent
	 * group) orders ranks and tells the processes of one split apart. */
	a->rank = (__s32)PT_REGS_PARM3(ctx);
	a->nranks = 0;
	a->out = PT_REGS_PARM4(ctx);
	return save_init(a);
}

static __always_inline void emit_init(struct init_args *a, __u64 comm, __s32 rank, __s32 nranks, __u64 aux)
{
	struct nccl_event *e;

	if (!comm)
		return;
	reset_seq(comm);
	e = reserve(EV_COMM_INIT, a->op);
	if (!e)
		return;
	e->comm = comm;
	e->rank = rank;
	e->nranks = nranks;
	e->aux = aux;
	e->peer = a->color;
	__builtin_memcpy(e->unique_id, a->unique_id, NCCL_UNIQUE_ID_BYTES);
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

/* Return of any init function: the ncclComm_t now exists in *out. */
SEC("uretprobe")
int BPF_KRETPROBE(nccl_comm_init_return)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct init_args *a = bpf_map_lookup_elem(&nccl_init_args, &id);
	__s32 rc = (__s32)PT_REGS_RC(ctx);
	__u64 comm = 0, first = 0;

	if (!a)
		return 0;
	/* ncclSuccess, or ncclInProgress for non-blocking communicators. */
	if (rc == 0 || rc == 7) {
		if (a->op == INIT_ALL) {
			bpf_probe_read_user(&first, sizeof(first), (void *)a->out);
			for (int i = 0; i < MAX_INIT_ALL_DEVICES; i++) {
				if (i >= a->nranks)
					break;
				comm = 0;
				bpf_probe_read_user(&comm, sizeof(comm), (void *)(a->out + 8 * i));
				emit_init(a, comm, i, a->nranks, first);
			}
		} else {
			bpf_probe_read_user(&comm, sizeof(comm), (void *)a->out);
			emit_init(a, comm, a->rank, a->nranks, a->aux);
		}
	}
	bpf_map_delete_elem(&nccl_init_args, &id);
	return 0;
}

/* ncclCommDestroy(comm) / ncclCommAbort(comm): the pointer may be reused afterwards. */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_end_enter)
{
	struct nccl_event *e;

	reset_seq(PT_REGS_PARM1(ctx));
	e = reserve(EV_COMM_END, 0);
	if (!e)
		return 0;
	e->comm = PT_REGS_PARM1(ctx);
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

#endif /* bpf_target_x86 */
