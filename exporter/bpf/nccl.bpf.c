// SPDX-License-Identifier: GPL-2.0
/* NCCL collectives from uprobes on libnccl, accounted in the kernel.
 *
 * Every collective call is accounted here, in maps that user space reads about once a
 * second (exporter/nccl/kernel_state.py; keep the structs in step): per (process, comm,
 * op) the calls, bytes, enqueue-time and duration histograms and the last durations
 * (nccl_op_stats); per (process, comm) the sequence number, the latest call, the last
 * BOUNDARY_SLOTS sequence boundaries and the arrival-lag histogram (nccl_rank_state); calls still inside
 * NCCL by thread (nccl_open_calls). So the exporter's work is bounded by the number of
 * (comm, rank, op) series, whatever the collective rate: no per-call event reaches user
 * space. Only communicator init and destroy go through the ring buffer (rare, and they
 * wake the reader at once).
 *
 * The histograms' bounds and the datatype sizes come from user space (nccl_config,
 * written before the probes attach), so their one home stays exporter/nccl/tracker.py
 * and exporter/nccl/uprobe.py.
 *
 * Arrival lag is joined in the kernel: the ranks of one communicator on this node are
 * different processes with different ncclComm_t pointers, but the same comm identity,
 * computed here at init from the ncclUniqueId (the hash exporter/nccl/commid.py
 * specifies). Each collective (Send/Recv excluded) is numbered as NCCL numbers it: from
 * NCCL's own count of the comm's launched collectives, read from struct ncclComm at each
 * call (number_op), so every rank, and every exporter however late it started, gives op k
 * the same number k; a comm whose counter is not exact is numbered from its probed init,
 * or not at all. The first rank to enter op k on the node records its entry time in
 * nccl_arrivals, and every rank's lag is its entry minus that.
 *
 * Not atomic: NCCL forbids using one comm from several threads at once, so one thread at
 * a time updates a (process, comm) entry; the v1 instruction set this object is built
 * for has no fetch-and-add returning a value anyway.
 *
 * x86-64 SysV: integer arguments in rdi, rsi, rdx, rcx, r8, r9, then the stack; at a
 * function's first instruction [rsp] is the return address, so the first stack argument
 * is at rsp+8. ncclUniqueId (128 bytes) is passed by value in memory: it takes no register
 * and sits at rsp+8, so the next int argument (rank) still arrives in rdx.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "fabric.h"

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
/* Histogram bounds per histogram (the +Inf slot is one more), and the last durations
 * kept per (process, comm, op) for the hang judgement's rolling average. */
#define MAX_BOUNDS 16
#define RECENT_MAX 64
#define NUM_OPS 8
#define NUM_DATATYPES 16
/* NCCL's operation counter: up to this many 64-bit words summed (seqNumber[NCCL_NUM_FUNCTIONS]). */
#define MAX_COUNTER_WORDS 5
/* The last sequence boundaries kept per (process, comm): boundary k lives in slot
 * (k / boundary_ops) % BOUNDARY_SLOTS, so two nodes scraped a few boundaries apart still
 * both show an older one to join on (BOUNDARY_SLOTS in exporter/nccl/tracker.py). A power
 * of two: the slot index is masked for the verifier. */
#define BOUNDARY_SLOTS 4

enum event_kind {
	EV_COMM_INIT = 3,
	EV_COMM_END = 4,
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

/* Counters of what could not be accounted (nccl_problems slots). */
enum problem {
	PROBLEM_EVENTS_LOST = 0,       /* ring buffer full: an init or destroy event dropped */
	PROBLEM_UNKNOWN_DATATYPE = 1,  /* a call's ncclDataType_t is not one we know: 0 bytes */
	PROBLEM_STATE_FULL = 2,        /* no room for a new (process, comm[, op]) entry */
	NUM_PROBLEMS = 3,
};

struct nccl_event {
	__u64 ts_ns;       /* bpf_ktime_get_ns: CLOCK_MONOTONIC */
	__u64 comm;        /* ncclComm_t */
	__u64 ident;       /* init: the comm identity (0: unknown, a split of an unknown parent) */
	__u64 aux;         /* split: parent comm; init-all: first comm of the clique */
	__u32 pid;
	__u32 tid;
	__u16 kind;
	__u16 op;
	__s32 peer;        /* split: color */
	__s32 rank;        /* init: rank (split: the key) */
	__s32 nranks;
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

/* Written once by user space before the probes attach. Bounds in ns, ascending. */
struct nccl_config {
	__u64 enqueue_bounds[MAX_BOUNDS];
	__u64 duration_bounds[MAX_BOUNDS];
	__u64 lag_bounds[MAX_BOUNDS];
	__u32 enqueue_n;
	__u32 duration_n;
	__u32 lag_n;
	__u32 boundary_ops;            /* sequence boundaries: multiples of this */
	__u8 datatype_bytes[NUM_DATATYPES];   /* 0: unknown */
	__u32 pidns_inum;              /* the exporter's PID namespace (fabric.h scoped_pid_tgid) */
	__u32 pad;
};

struct hist {
	__u64 counts[MAX_BOUNDS + 1];  /* counts[i]: bound[i-1] < v <= bound[i]; counts[n]: above */
	__u64 sum_ns;
};

struct comm_key {
	__u32 pid;
	__u32 pad;
	__u64 comm;
};

/* A sequence boundary the rank entered: op k (a multiple of boundary_ops), at ts. */
struct boundary {
	__u64 seq;         /* 0: the slot was never filled */
	__u64 ts;
};

struct rank_state {
	__u64 ident;       /* comm identity, 0 until its init was seen */
	__u64 last_ts;     /* entry of the rank's latest call on the comm, any op */
	__u64 last_bytes;
	__u64 seq;         /* the number of the rank's latest collective on the comm; 0: none */
	__u64 calls;       /* collectives entered since the init (from_init) or since first seen */
	__u64 ctr_last;    /* NCCL's counter when it last moved */
	__u64 ctr_since;   /* this rank's collectives since then */
	__u32 ctr_via;     /* where NCCL's counter is (struct learned_ident) */
	__u32 ctr_at;
	__u16 last_op;
	__u8 ctr_words;    /* 0: no counter known for this comm */
	__u8 ctr_phase;    /* enum ctr_phase */
	__u8 ctr_inexact;  /* the counter once moved by other than this rank's calls */
	__u8 from_init;    /* the init was probed: `calls` numbers ops from the comm's first */
	__u8 learned;      /* user space's entry in nccl_comm_ident was taken */
	__u8 pad8;
	struct boundary boundaries[BOUNDARY_SLOTS];   /* slot (k / boundary_ops) % BOUNDARY_SLOTS */
	struct hist lag;   /* entry minus the first local entry of the same op */
};

/* How far NCCL's counter is trusted on a rank (count_from_nccl). */
enum ctr_phase {
	CTR_NONE = 0,      /* not read yet */
	CTR_READ = 1,      /* read; the probes may have come mid-group: not yet at a launch */
	CTR_ANCHORED = 2,  /* moved once: the rank is at a launch boundary */
	CTR_EXACT = 3,     /* moved again by exactly the calls seen since: numbers the rank's ops */
};

struct op_key {
	__u32 pid;
	__u32 op;
	__u64 comm;
};

struct op_stats {
	__u64 calls;
	__u64 bytes;
	__u64 last_ts;             /* entry of the latest call of this op */
	struct hist enqueue;       /* API entry to return */
	struct hist duration;      /* entry to the rank's next call on the comm */
	__u64 recent[RECENT_MAX];  /* the last durations, ns: slot (durations % RECENT_MAX) is next */
	__u64 durations;           /* durations observed in all */
};

struct arrival_key {
	__u64 ident;
	__u64 seq;
};

/* A call inside NCCL, by thread: its entry, for the enqueue time at return and for user
 * space to tell a call blocked inside NCCL (api_returned false). LRU: a thread killed
 * inside a call never returns to delete its entry. */
struct open_call {
	__u64 ts_ns;
	__u64 comm;
	__u32 op;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} nccl_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NUM_PROBLEMS);
	__type(key, __u32);
	__type(value, __u64);
} nccl_problems SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nccl_config);
} nccl_config SEC(".maps");

/* The calling thread's pid_tgid in the exporter's PID namespace; 0 when the caller is
 * outside it (another node's process on the same kernel): such calls are not accounted. */
static __always_inline __u64 current_id(void)
{
	__u32 zero = 0;
	struct nccl_config *cfg = bpf_map_lookup_elem(&nccl_config, &zero);

	return cfg ? scoped_pid_tgid(cfg->pidns_inum) : 0;
}

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);                 /* pid_tgid */
	__type(value, struct open_call);
} nccl_open_calls SEC(".maps");

/* Reset at init (a comm pointer may be reused); user space deletes a destroyed comm's
 * entries after reading them one last time, and a process's entries when it exits. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct comm_key);
	__type(value, struct rank_state);
} nccl_rank_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct op_key);
	__type(value, struct op_stats);
} nccl_op_stats SEC(".maps");

/* What user space learns of a comm from the communicator itself (exporter/nccl/commread.py,
 * commlayout.py): its identity, when its init came before the probes, and where NCCL keeps
 * its operation counter; taken into the rank's state at its next call. */
struct learned_ident {
	__u64 ident;       /* 0: keep the identity the init gave */
	__u32 ctr_via;     /* 0: the counter is in struct ncclComm; else the offset of a pointer to it */
	__u32 ctr_at;
	__u32 ctr_words;   /* 64-bit counters summed; 0: none known */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct comm_key);
	__type(value, struct learned_ident);
} nccl_comm_ident SEC(".maps");

/* First local entry of op `seq` on a comm. LRU: old ops age out on their own. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct arrival_key);
	__type(value, __u64);
} nccl_arrivals SEC(".maps");

/* Arguments of an init call in progress, by thread: the comm exists only at return. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct init_args);
} nccl_init_args SEC(".maps");

/* These structs are too big to build on the 512-byte BPF stack. zero_stats and zero_state
 * are never written: the zeroed values new entries are created from. */
struct scratch {
	struct init_args init;
	struct op_stats zero_stats;
	struct rank_state zero_state;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} nccl_scratch SEC(".maps");

static __always_inline struct nccl_event *reserve(__u64 id, __u16 kind, __u16 op)
{
	struct nccl_event *e = bpf_ringbuf_reserve(&nccl_events, sizeof(*e), 0);

	if (!e) {
		counter_add_at(&nccl_problems, PROBLEM_EVENTS_LOST, 1);
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

static __always_inline struct scratch *scratch(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&nccl_scratch, &zero);
}

/* counts[i] for the first bound >= v (Prometheus `le`), counts[n] above every bound. */
static __always_inline void observe(struct hist *h, const __u64 *bounds, __u32 n, __u64 v)
{
	__u32 slot = n < MAX_BOUNDS ? n : MAX_BOUNDS;

	for (__u32 i = 0; i < MAX_BOUNDS; i++) {
		if (i >= n)
			break;
		if (v <= bounds[i]) {
			slot = i;
			break;
		}
	}
	asm volatile("" : "+r"(slot));
	if (slot <= MAX_BOUNDS)
		h->counts[slot] += 1;
	h->sum_ns += v;
}

static __always_inline __u64 splitmix64(__u64 v)
{
	v += 0x9E3779B97F4A7C15ULL;
	v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ULL;
	v = (v ^ (v >> 27)) * 0x94D049BB133111EBULL;
	return v ^ (v >> 31);
}

/* The map's entry for key, created from a zeroed value when absent (counted when there
 * is no room). */
static __always_inline void *lookup_or_create(void *map, const void *key, const void *zeroed)
{
	void *value = bpf_map_lookup_elem(map, key);

	if (value)
		return value;
	bpf_map_update_elem(map, key, zeroed, BPF_NOEXIST);
	value = bpf_map_lookup_elem(map, key);
	if (!value)
		counter_add_at(&nccl_problems, PROBLEM_STATE_FULL, 1);
	return value;
}

static __always_inline struct rank_state *rank_state(__u32 pid, __u64 comm)
{
	struct comm_key key = { .pid = pid, .comm = comm };
	struct scratch *s = scratch();

	return s ? lookup_or_create(&nccl_rank_state, &key, &s->zero_state) : 0;
}

static __always_inline struct op_stats *op_stats(__u32 pid, __u32 op, __u64 comm)
{
	struct op_key key = { .pid = pid, .op = op, .comm = comm };
	struct scratch *s = scratch();

	return s ? lookup_or_create(&nccl_op_stats, &key, &s->zero_stats) : 0;
}

/* NCCL's counter of the comm's launched collectives, read at a call's entry: the calls
 * before it that NCCL launched. -1 when it cannot be read. */
static __always_inline __s64 read_counter(struct rank_state *state, __u64 comm)
{
	__u64 base = comm, words[MAX_COUNTER_WORDS] = {}, sum = 0;

	if (state->ctr_via) {
		if (bpf_probe_read_user(&base, sizeof(base), (void *)(comm + state->ctr_via)) || !base)
			return -1;
	}
	if (bpf_probe_read_user(words, sizeof(words), (void *)(base + state->ctr_at)))
		return -1;
	for (int i = 0; i < MAX_COUNTER_WORDS; i++)
		if (i < state->ctr_words)
			sum += words[i];
	return (__s64)(sum & 0x7fffffffffffffffULL);
}

/* Number the collective being entered from NCCL's own counter c (docs/nccl.md, "Numbering").
 * NCCL advances c when it launches, so at a call's entry c counts the comm's collectives
 * launched before it; calls of one group are launched together at its end, so the op is
 * c + (this rank's calls since c last moved). The probes may come mid-group, so the first
 * move only anchors; from the second on, every move must be exactly the calls seen since
 * the last, or the counter is not this comm's own (shared with split comms, or not moved by
 * launches without network work) and is never used for this rank again. */
static __always_inline void count_from_nccl(struct rank_state *state, __u64 comm)
{
	__s64 c = read_counter(state, comm);

	if (c < 0) {
		state->ctr_inexact = 1;
		return;
	}
	if (state->ctr_phase == CTR_NONE) {
		state->ctr_phase = CTR_READ;
		state->ctr_last = c;
		state->ctr_since = 0;
	} else if ((__u64)c != state->ctr_last) {
		if (state->ctr_phase == CTR_READ)
			state->ctr_phase = CTR_ANCHORED;
		else if ((__u64)c == state->ctr_last + state->ctr_since)
			state->ctr_phase = CTR_EXACT;
		else
			state->ctr_inexact = 1;
		state->ctr_last = c;
		state->ctr_since = 0;
	}
	state->ctr_since += 1;
}

/* The number of the collective being entered, the same on every rank of the comm whichever
 * exporter counts it; 0 when no exact number is had (the rank is not judged). */
static __always_inline __u64 number_op(struct rank_state *state, __u64 comm)
{
	if (state->ctr_words && !state->ctr_inexact) {
		count_from_nccl(state, comm);
		if (state->ctr_phase == CTR_EXACT && !state->ctr_inexact)
			return state->ctr_last + state->ctr_since;
	}
	return state->from_init ? state->calls : 0;
}

static __always_inline int coll_enter(__u16 op, __u64 comm, __u64 count, __s32 dtype, __s32 peer)
{
	__u32 zero = 0;
	struct nccl_config *cfg = bpf_map_lookup_elem(&nccl_config, &zero);
	__u64 id = cfg ? scoped_pid_tgid(cfg->pidns_inum) : 0;
	__u32 pid = id >> 32;
	__u64 now = bpf_ktime_get_ns();
	struct open_call call = { .ts_ns = now, .comm = comm, .op = op };
	struct rank_state *state;
	struct op_stats *stats;
	__u32 d = (__u32)dtype, size = 0;
	__u64 bytes = 0, previous;

	if (!cfg || !id)
		return 0;
	if (d < NUM_DATATYPES) {
		/* Hide the range from the compiler, or it drops the mask the verifier needs. */
		asm volatile("" : "+r"(d));
		size = cfg->datatype_bytes[d & (NUM_DATATYPES - 1)];
	}
	if (size)
		bytes = count * size;
	else
		counter_add_at(&nccl_problems, PROBLEM_UNKNOWN_DATATYPE, 1);
	bpf_map_update_elem(&nccl_open_calls, &id, &call, BPF_ANY);
	state = rank_state(pid, comm);
	if (!state)
		return 0;
	/* This call is the earliest evidence that the rank moved past its previous one
	 * (NCCL serialises a comm's operations): the previous op's duration ends here. */
	if (state->last_ts && now >= state->last_ts) {
		__u64 duration = now - state->last_ts;

		stats = op_stats(pid, state->last_op & (NUM_OPS - 1), comm);
		if (stats) {
			observe(&stats->duration, cfg->duration_bounds, cfg->duration_n, duration);
			stats->recent[stats->durations & (RECENT_MAX - 1)] = duration;
			stats->durations += 1;
		}
	}
	stats = op_stats(pid, op, comm);
	if (stats) {
		stats->calls += 1;
		stats->bytes += bytes;
		stats->last_ts = now;
	}
	state->last_ts = now;
	state->last_op = op;
	state->last_bytes = bytes;
	if (op == OP_SEND || op == OP_RECV)
		return 0;
	if (!state->learned) {
		struct comm_key key = { .pid = pid, .comm = comm };
		struct learned_ident *learned = bpf_map_lookup_elem(&nccl_comm_ident, &key);

		if (learned) {
			if (!state->ident)
				state->ident = learned->ident;
			state->ctr_via = learned->ctr_via;
			state->ctr_at = learned->ctr_at;
			state->ctr_words = learned->ctr_words > MAX_COUNTER_WORDS ? MAX_COUNTER_WORDS : learned->ctr_words;
			state->learned = 1;
		}
	}
	state->calls += 1;
	previous = state->seq;
	state->seq = number_op(state, comm);
	/* The numbering moved (NCCL's counter taking over from a count, or given up): a kept
	 * boundary is some other op's under the new numbers, and a peer reaching that k would
	 * join on it. The ring holds only boundaries of one unbroken run of numbers. */
	if (state->seq != previous + 1)
		__builtin_memset(state->boundaries, 0, sizeof(state->boundaries));
	if (state->seq && cfg->boundary_ops && state->seq % cfg->boundary_ops == 0) {
		struct boundary *slot = &state->boundaries[(state->seq / cfg->boundary_ops) & (BOUNDARY_SLOTS - 1)];

		slot->seq = state->seq;
		slot->ts = now;
	}
	if (!state->seq)
		return 0;
	if (state->ident) {
		struct arrival_key key = { .ident = state->ident, .seq = state->seq };
		__u64 *first = bpf_map_lookup_elem(&nccl_arrivals, &key);

		if (!first) {
			bpf_map_update_elem(&nccl_arrivals, &key, &now, BPF_NOEXIST);
			first = bpf_map_lookup_elem(&nccl_arrivals, &key);
		}
		if (first)
			observe(&state->lag, cfg->lag_bounds, cfg->lag_n, now > *first ? now - *first : 0);
	}
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

/* Return of any collective: its enqueue time, and the call is no longer inside NCCL. */
SEC("uretprobe")
int BPF_KRETPROBE(nccl_coll_return)
{
	__u32 zero = 0;
	struct nccl_config *cfg = bpf_map_lookup_elem(&nccl_config, &zero);
	__u64 id = cfg ? scoped_pid_tgid(cfg->pidns_inum) : 0;
	struct open_call *call = id ? bpf_map_lookup_elem(&nccl_open_calls, &id) : 0;
	__u64 now = bpf_ktime_get_ns();
	struct op_stats *stats;

	if (!call || !cfg)                  /* entered before the probes were attached */
		return 0;
	stats = op_stats(id >> 32, call->op & (NUM_OPS - 1), call->comm);
	if (stats && now >= call->ts_ns)
		observe(&stats->enqueue, cfg->enqueue_bounds, cfg->enqueue_n, now - call->ts_ns);
	bpf_map_delete_elem(&nccl_open_calls, &id);
	return 0;
}

static __always_inline struct init_args *init_scratch(void)
{
	struct scratch *s = scratch();

	if (!s)
		return 0;
	__builtin_memset(&s->init, 0, sizeof(s->init));
	return &s->init;
}
static __always_inline int save_init(struct init_args *a)
{
	__u64 id = current_id();

	if (!id)
		return 0;

	bpf_map_update_elem(&nccl_init_args, &id, a, BPF_ANY);
	return 0;
}

/* ncclCommInitRank(comm*, nranks, ncclUniqueId commId, rank) and
 * ncclCommInitRankConfig(comm*, nranks, ncclUniqueId commId, rank, config*) */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_init_rank_enter)
{
	struct init_args *a = init_scratch();

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
	struct init_args *a = init_scratch();

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
	struct init_args *a = init_scratch();

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
	struct init_args *a = init_scratch();

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

/* The comm identity (exporter/nccl/commid.py): splitmix64 folded over the 16 words of the
 * ncclUniqueId; for ncclCommInitAll, over (pid, first comm); for a split, the parent's
 * mixed with the color; 0 when the parent is unknown (initialised before we attached). */
static __always_inline __u64 comm_ident(struct init_args *a, __u32 pid, __u64 first)
{
	__u64 h = 0, word;

	if (a->op == INIT_ALL)
		return splitmix64(splitmix64(pid) ^ first);
	if (a->op == INIT_SPLIT) {
		struct comm_key key = { .pid = pid, .comm = a->aux };
		struct rank_state *parent = bpf_map_lookup_elem(&nccl_rank_state, &key);

		if (!parent || !parent->ident)
			return 0;
		return splitmix64(parent->ident ^ splitmix64((__u64)(__s64)a->color));
	}
	for (int i = 0; i < NCCL_UNIQUE_ID_BYTES / 8; i++) {
		__builtin_memcpy(&word, a->unique_id + 8 * i, sizeof(word));
		h = splitmix64(h ^ word);
	}
	return h;
}

/* A new comm (or a reused pointer): fresh state, then tell user space. */
static __always_inline void emit_init(struct init_args *a, __u64 comm, __s32 rank, __s32 nranks, __u64 aux,
				      __u64 ident)
{
	__u64 id = current_id();
	__u32 pid = id >> 32;
	struct comm_key key = { .pid = pid, .comm = comm };
	struct scratch *s = scratch();
	struct rank_state *state;
	struct nccl_event *e;

	if (!comm || !s || !id)
		return;
	if (bpf_map_update_elem(&nccl_rank_state, &key, &s->zero_state, BPF_ANY))
		counter_add_at(&nccl_problems, PROBLEM_STATE_FULL, 1);
	/* A learned entry of an older comm at this pointer is stale: user space writes this one's. */
	bpf_map_delete_elem(&nccl_comm_ident, &key);
	state = bpf_map_lookup_elem(&nccl_rank_state, &key);
	if (state) {
		state->ident = ident;
		state->from_init = 1;
	}
	for (__u32 op = 0; op < NUM_OPS; op++) {
		struct op_key stale = { .pid = pid, .op = op, .comm = comm };

		bpf_map_delete_elem(&nccl_op_stats, &stale);
	}
	e = reserve(id, EV_COMM_INIT, a->op);
	if (!e)
		return;
	e->comm = comm;
	e->ident = ident;
	e->rank = rank;
	e->nranks = nranks;
	e->aux = aux;
	e->peer = a->color;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

/* Return of any init function: the ncclComm_t now exists in *out. */
SEC("uretprobe")
int BPF_KRETPROBE(nccl_comm_init_return)
{
	__u64 id = current_id();
	struct init_args *a = id ? bpf_map_lookup_elem(&nccl_init_args, &id) : 0;
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
				emit_init(a, comm, i, a->nranks, first, comm_ident(a, id >> 32, first));
			}
		} else {
			bpf_probe_read_user(&comm, sizeof(comm), (void *)a->out);
			emit_init(a, comm, a->rank, a->nranks, a->aux, comm_ident(a, id >> 32, 0));
		}
	}
	bpf_map_delete_elem(&nccl_init_args, &id);
	return 0;
}

/* ncclCommDestroy(comm) / ncclCommAbort(comm): the pointer may be reused afterwards. User
 * space reads the comm's entries one last time, then deletes them. */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_end_enter)
{
	__u64 id = current_id();
	struct nccl_event *e = id ? reserve(id, EV_COMM_END, 0) : 0;

	if (!e)
		return 0;
	e->comm = PT_REGS_PARM1(ctx);
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

#endif /* bpf_target_x86 */
