/* Shared helpers for fabricscope BPF programs: log2 histograms and counters.
 *
 * Histograms are per-CPU arrays of one `struct log2_hist`: slot i counts values v
 * with 2^(i-1) < v <= 2^i (slot 0: v <= 1), so user space turns slot i into the
 * Prometheus bucket le = 2^i * multiplier with no loss; the last slot is the overflow.
 * `sum` is in the same unit as the values. Per-CPU: no atomics on hot paths, user space
 * sums the CPUs.
 */
#ifndef FABRIC_H
#define FABRIC_H

#define HIST_SLOTS 32

struct log2_hist {
	__u64 slots[HIST_SLOTS];
	__u64 sum;
};

/* ceil(log2(v)) for v >= 1, clamped to the last slot. */
static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 r = 0, shift;
	__u64 x = v;

	if (v <= 1)
		return 0;
	x = v - 1;
	shift = (x > 0xFFFFFFFFULL) << 5; x >>= shift; r |= shift;
	shift = (x > 0xFFFF) << 4; x >>= shift; r |= shift;
	shift = (x > 0xFF) << 3; x >>= shift; r |= shift;
	shift = (x > 0xF) << 2; x >>= shift; r |= shift;
	shift = (x > 0x3) << 1; x >>= shift; r |= shift;
	r |= (x >> 1);
	r += 1;
	return r < HIST_SLOTS ? r : HIST_SLOTS - 1;
}

static __always_inline void hist_observe(void *map, __u64 value)
{
	__u32 zero = 0;
	struct log2_hist *h = bpf_map_lookup_elem(map, &zero);

	if (!h)
		return;
	__u32 slot = log2_slot(value);
	h->slots[slot & (HIST_SLOTS - 1)] += 1;
	h->sum += value;
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

#define DECLARE_HIST(name) \
	struct { \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); \
		__uint(max_entries, 1); \
		__type(key, __u32); \
		__type(value, struct log2_hist); \
	} name SEC(".maps")

#define DECLARE_COUNTER(name) \
	struct { \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); \
		__uint(max_entries, 1); \
		__type(key, __u32); \
		__type(value, __u64); \
	} name SEC(".maps")

#endif
