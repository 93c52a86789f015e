// SPDX-License-Identifier: GPL-2.0
/* TCP signals: smoothed RTT, RTT excess over each connection's min RTT, connect latency,
 * retransmits by peer address.
 * RTT from tp_btf (hot path); connects and retransmits from classic tracepoints (rare
 * events; need tracefs), whose record layouts are read through CO-RE so a kernel that
 * moved a field still loads. Metrics it feeds: see tcp.yaml.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "fabric.h"

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_CLOSE 7
#define MAP_ID_CONNECT 0
#define MAP_ID_RETRANS 1
#define TCPHDR_FIN 0x01
#define TCPHDR_ACK 0x10

char LICENSE[] SEC("license") = "GPL";

/* Microseconds. RTT excess: 8 buckets per power of two from 16 us to 2^19 us (~0.5 s), the
 * resolution the microburst rule (p99 > 3x its average) needs, over the range it judges
 * (its floor is 0.5 ms; a p99 past the last bound reads as that bound). Smoothed RTT (8 us to 2^20 us)
 * and connect latency (16 us to 2^23 us, ~8 s, past the SYN retransmit timeouts): one
 * per power of two, no rule takes a ratio of them. The same numbers are in tcp.yaml. */
DECLARE_HIST(fabric_tcp_rtt_seconds, 0, 3, 20);
DECLARE_HIST(fabric_tcp_rtt_excess_seconds, 3, 4, 19);
DECLARE_HIST(fabric_tcp_connect_latency_seconds, 0, 4, 23);
DECLARE_MAP_ERRORS(2);

/* RTT samples by kind: the index of fabric_tcp_rtt_samples_total (tcp.yaml). */
#define KIND_SEVERAL_SEGMENTS 0	/* an ACK of more than one segment */
#define KIND_REPLY 1		/* one segment, ACKed on the server's reply: a client's sample */
#define KIND_NEXT_REQUEST 2	/* one segment, ACKed on the client's next request: a server's */
#define KIND_DELAYED_ACK 3	/* one segment, ACKed by a pure ACK, which may have been delayed */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} fabric_tcp_rtt_samples_total SEC(".maps");

/* Network namespaces whose sockets the RTT histograms count (by inode number), written by
 * user space from ebpf.tcp_rtt_network_namespaces; tcp_netns_filter[0] != 0 turns the
 * filter on. Empty and off by default: every namespace is counted. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} tcp_netns_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u8);
} tcp_netns_watched SEC(".maps");

/* Peer address (IPv4 as v4-mapped IPv6); user space maps it to a cluster host name or
 * "other", so the metric's label stays bounded. LRU bounds the kernel side. */
struct peer_key {
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct peer_key);
	__type(value, __u64);
} fabric_tcp_retransmits_total SEC(".maps");

/* socket -> time it entered SYN_SENT. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, __u64);
} connect_start SEC(".maps");

static __always_inline int namespace_watched(struct sock *sk)
{
	__u32 zero = 0, inum, *on = bpf_map_lookup_elem(&tcp_netns_filter, &zero);

	if (!on || !*on)
		return 1;
	inum = sk->__sk_common.skc_net.net->ns.inum;
	return bpf_map_lookup_elem(&tcp_netns_watched, &inum) != 0;
}

/* What the kernel's send-side records say about the oldest unacknowledged segment. Read
 * in one copy: skb_mstamp_ns and cb[] are neighbours in struct sk_buff. */
struct rtx_head {
	__u64 sent_ns;
	struct tcp_skb_cb cb;
};

/* The RTT sample the kernel is about to take from this segment's ACK (tcp_ack ->
 * tcp_clean_rtx_queue, which has no tracepoint): now minus the send time of the oldest
 * unacknowledged segment, taken when the ACK acknowledges it and it was never
 * retransmitted or SACKed (Karn). 0: this segment carries no sample. Runs before the
 * kernel processes the segment, so snd_una and the retransmit queue are still as they
 * were when the peer sent the ACK. Few probe reads: each is a helper call, and this runs
 * on every ACK. */
static __always_inline __u64 rtt_sample_us(struct sock *sk, struct tcp_sock *tp, __u32 acked)
{
	/* Probe reads: tcp_rtx_queue shares a union with sk_send_head, which the verifier's
	 * BTF walk does not follow. */
	struct rb_node *node = BPF_CORE_READ(sk, tcp_rtx_queue.rb_node), *left;
	struct rtx_head head;
	__u64 now;
	int i;

	if (!node)
		return 0;
	/* The oldest unacknowledged segment is the leftmost node; an rbtree of 2^16
	 * segments is at most 32 deep. */
	for (i = 0; i < 32; i++) {
		left = BPF_CORE_READ(node, rb_left);
		if (!left)
			break;
		node = left;
	}
	/* rbnode is the first member of struct sk_buff (container_of at offset 0). */
	if (bpf_core_field_offset(struct sk_buff, cb) != bpf_core_field_offset(struct sk_buff, skb_mstamp_ns) + 8 ||
	    bpf_probe_read_kernel(&head, sizeof(head),
				  (void *)node + bpf_core_field_offset(struct sk_buff, skb_mstamp_ns)))
		return 0;
	if (head.cb.sacked & (TCPCB_RETRANS | TCPCB_SACKED_ACKED))
		return 0;
	now = bpf_ktime_get_ns();   /* the clock tcp_clock_ns() reads */
	if (!head.sent_ns || now <= head.sent_ns)
		return 0;
	return (now - head.sent_ns) / 1000;
}

/* The kernel's FLAG_ACK_MAYBE_DELAYED marks an ACK of one segment, which the peer may have
 * held back; what that ACK rides on says what held it. */
static __always_inline __u32 sample_kind(struct sock *sk, struct tcp_sock *tp,
					 const struct tcp_skb_cb *in, __u32 acked)
{
	if (acked > tp->mss_cache)
		return KIND_SEVERAL_SEGMENTS;
	if (in->end_seq - in->seq == !!(in->tcp_flags & TCPHDR_FIN))
		return KIND_DELAYED_ACK;   /* no data: a delayed-ACK timer may have held it */
	/* On the peer's data. A socket cloned from a listener keeps the listener's backlog
	 * limit; a connecting socket never listened. */
	return sk->sk_max_ack_backlog ? KIND_NEXT_REQUEST : KIND_REPLY;
}

/* Fires on every received segment of an established socket, before the kernel
 * processes it: tp_btf skips building the trace record, which halves its cost against
 * the classic tracepoint. */
SEC("tp_btf/tcp_probe")
int BPF_PROG(tcp_probe, struct sock *sk, const struct sk_buff *skb)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	struct tcp_skb_cb in;
	__u32 srtt_us, min_us, acked, kind;
	__u64 rtt_us;

	if (!tp || !namespace_watched(sk))
		return 0;
	srtt_us = tp->srtt_us >> 3;   /* srtt_us is stored << 3 */
	if (srtt_us)
		fabric_tcp_rtt_seconds_observe(srtt_us);

	/* This segment's control block (seq, end_seq, flags, ack_seq), one copy. */
	if (bpf_probe_read_kernel(&in, sizeof(in), (void *)skb + bpf_core_field_offset(struct sk_buff, cb)))
		return 0;
	acked = in.ack_seq - tp->snd_una;
	/* Not an ACK, nothing new acknowledged (a pure data segment, a duplicate ACK), or an
	 * ACK of data never sent, which the kernel ignores. */
	if (!(in.tcp_flags & TCPHDR_ACK) || (__s32)acked <= 0 || (__s32)(in.ack_seq - tp->snd_nxt) > 0)
		return 0;
	rtt_us = rtt_sample_us(sk, tp, acked);
	if (!rtt_us)
		return 0;
	kind = sample_kind(sk, tp, &in, acked);
	counter_add_at(&fabric_tcp_rtt_samples_total, kind, 1);
	/* Left out: a server's samples of its client's think time, and pure ACKs of one
	 * segment, which a delayed-ACK timer may have held. */
	if (kind == KIND_NEXT_REQUEST || kind == KIND_DELAYED_ACK)
		return 0;
	min_us = tp->rtt_min.s[0].v;   /* the kernel's windowed min RTT (5 min); ~0U: none yet */
	if (min_us == ~0U)
		return 0;
	fabric_tcp_rtt_excess_seconds_observe(rtt_us > min_us ? rtt_us - min_us : 0);
	return 0;
}

SEC("tracepoint/sock/inet_sock_set_state")
int inet_sock_set_state(struct trace_event_raw_inet_sock_set_state *ctx)
{
	__u64 sk, now, *start;
	int oldstate, newstate;

	if (BPF_CORE_READ(ctx, protocol) != IPPROTO_TCP)
		return 0;
	sk = (__u64)BPF_CORE_READ(ctx, skaddr);
	oldstate = BPF_CORE_READ(ctx, oldstate);
	newstate = BPF_CORE_READ(ctx, newstate);
	if (newstate == TCP_SYN_SENT) {
		now = bpf_ktime_get_ns();
		if (bpf_map_update_elem(&connect_start, &sk, &now, BPF_ANY))
			map_error(&fabric_ebpf_map_update_errors_total, MAP_ID_CONNECT);
		return 0;
	}
	if (oldstate != TCP_SYN_SENT)
		return 0;
	start = bpf_map_lookup_elem(&connect_start, &sk);
	if (start && newstate == TCP_ESTABLISHED)
		fabric_tcp_connect_latency_seconds_observe((bpf_ktime_get_ns() - *start) / 1000);
	bpf_map_delete_elem(&connect_start, &sk);
	return 0;
}

/* Kernels before 6.x shared the tcp_event_sk_skb record for this event. */
struct trace_event_raw_tcp_event_sk_skb___old {
	__u16 family;
	__u8 daddr[4];
	__u8 daddr_v6[16];
} __attribute__((preserve_access_index));

/* Peer address of a retransmit record into key (IPv4 as v4-mapped IPv6). Old and new
 * records spell family/daddr/daddr_v6 alike but are different types, so CO-RE needs each
 * read under its own type: a macro, not a function. */
#define READ_PEER(r, key)								\
	do {										\
		if (BPF_CORE_READ(r, family) == AF_INET) {				\
			(key).addr[10] = 0xff;						\
			(key).addr[11] = 0xff;						\
			bpf_core_read(&(key).addr[12], 4, &(r)->daddr);	/* 4 bytes, not sizeof(u8) */ \
		} else {								\
			BPF_CORE_READ_INTO(&(key).addr, r, daddr_v6);			\
		}									\
	} while (0)

SEC("tracepoint/tcp/tcp_retransmit_skb")
int tcp_retransmit_skb(void *ctx)
{
	struct peer_key key = {};
	__u64 one = 1, *count;

	if (bpf_core_type_exists(struct trace_event_raw_tcp_retransmit_skb)) {
		struct trace_event_raw_tcp_retransmit_skb *r = ctx;

		READ_PEER(r, key);
	} else {
		struct trace_event_raw_tcp_event_sk_skb___old *r = ctx;

		READ_PEER(r, key);
	}
	count = bpf_map_lookup_elem(&fabric_tcp_retransmits_total, &key);
	if (count) {
		__sync_fetch_and_add(count, 1);
		return 0;
	}
	if (bpf_map_update_elem(&fabric_tcp_retransmits_total, &key, &one, BPF_NOEXIST)) {
		/* Lost a race with another CPU creating the entry: add to it instead. */
		count = bpf_map_lookup_elem(&fabric_tcp_retransmits_total, &key);
		if (count)
			__sync_fetch_and_add(count, 1);
		else
			map_error(&fabric_ebpf_map_update_errors_total, MAP_ID_RETRANS);
	}
	return 0;
}
