// SPDX-License-Identifier: GPL-2.0
/* TCP signals: smoothed RTT, connect latency, retransmits by peer address.
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

char LICENSE[] SEC("license") = "GPL";

/* Microseconds. RTT: 8 buckets per power of two from 8 us to 2^20 us (~1 s), the
 * resolution the microburst rule (p99 > 3x its average) needs. Connect latency: 4 per
 * power of two from 16 us to 2^23 us (~8 s, past the SYN retransmit timeouts).
 * The same numbers are in tcp.yaml. */
DECLARE_HIST(fabric_tcp_rtt_seconds, 3, 3, 20);
DECLARE_HIST(fabric_tcp_connect_latency_seconds, 0, 4, 23);
DECLARE_MAP_ERRORS(2);

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

/* Fires on every received segment: tp_btf skips building the trace record, which
 * halves its cost against the classic tracepoint. */
SEC("tp_btf/tcp_probe")
int BPF_PROG(tcp_probe, struct sock *sk, const struct sk_buff *skb)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	__u32 srtt_us;

	if (!tp)
		return 0;
	srtt_us = tp->srtt_us >> 3;   /* srtt_us is stored << 3 */
	if (srtt_us)
		fabric_tcp_rtt_seconds_observe(srtt_us);
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
