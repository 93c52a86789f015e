"""The compact traversal form of a Topology: CSR arrays built once per topology version.

Connectivity is judged per partition (VLAN / IB partition): the traversal runs over
(device, partition) *states*, and an edge joins two states of the same partition only,
so a host that sits in two partitions never bridges them. A state is connected when some
anchor of its partition reaches it over up edges AND it reaches some anchor (a link whose
transmit lane died breaks the conversation even if the other lane works).

Per version we run two BFS from a virtual root wired to every anchor state — one over
the edges, one over the reversed edges — and keep both BFS trees. A failure removes a
set of devices; a surviving state can only lose connectivity if a removed state is one of
its tree ancestors (every other state keeps its tree path). So a simulation looks at the
tree descendants of the removed states only (the candidates) and re-attaches those that
still have an edge from a safe state, growing the rescued set within the candidates. The
rest are cut off. Cost follows the size of the failure's subtree, not of the cluster, and
nothing is copied per simulation: the per-call scratch is a few flat arrays.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, depth_first_order

from .model import LINK_KINDS, POWER, Topology

INDEX = np.int32


def _csr(rows: np.ndarray, cols: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) of the pairs rows[i] -> cols[i], rows in 0..n-1."""
    order = np.argsort(rows, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return indptr, cols[order].astype(INDEX, copy=False)


def gather(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (neighbour, row) pairs of `rows` in a CSR, vectorised: neighbours and their owners."""
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, dtype=INDEX), np.empty(0, dtype=INDEX)
    owners = np.repeat(rows, counts)
    offsets = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total)
    return indices[offsets], owners


@dataclass
class _Tree:
    """One direction's baseline: who is reached from the root, the BFS tree, BFS order."""
    reached: np.ndarray          # bool per state (+ root)
    parent: np.ndarray           # tree parent per state, -1 for root/unreached
    children_indptr: np.ndarray
    children: np.ndarray
    rank: np.ndarray             # position in BFS order (ancestors come first)
    parent_kind: np.ndarray      # LINK_KINDS index of the tree edge parent -> state
    pre: np.ndarray              # DFS preorder position (-1: unreached)
    end: np.ndarray              # subtree of v = preorder positions [pre[v], end[v])
    out_indptr: np.ndarray       # this direction's edges (without the root)
    out: np.ndarray
    in_indptr: np.ndarray        # and their reverse, for "is there a safe edge into me"
    into: np.ndarray


@dataclass
class Outcome:
    removed: np.ndarray          # device indices, in the order they went down
    removed_cause: np.ndarray    # device that took each down (-1: failed first)
    removed_reason: list[str]    # "failed" | "contained" | "power"
    cut_devices: np.ndarray      # surviving devices that lost a partition, by BFS rank
    cut_cause: np.ndarray        # the device each was reached through in the baseline tree
    cut_link_kind: np.ndarray    # kind of that link (index into LINK_KINDS)
    cut_lost: np.ndarray         # bitmask of the partitions each lost (bit k: partitions[k])
    affected_jobs: np.ndarray    # job indices


class CompactTopology:
    """Flat arrays of one topology version; simulate() never mutates them."""

    def __init__(self, topology: Topology) -> None:
        graph = topology.graph
        self.version = topology.version
        self.names = list(graph.nodes)
        self.index = {name: i for i, name in enumerate(self.names)}
        n = self.n = len(self.names)
        index = self.index
        nodes = graph.nodes

        # Kinds and name order, so results count and sort with numpy, not per name.
        self.kind_names = sorted({kind for _, kind in nodes(data="kind")})
        kind_code = {kind: k for k, kind in enumerate(self.kind_names)}
        self.kinds = np.array([kind_code[kind] for _, kind in nodes(data="kind")], dtype=np.int16)
        self.name_rank = np.empty(n, dtype=INDEX)
        self.name_rank[np.array(sorted(range(n), key=self.names.__getitem__), dtype=np.int64)] = np.arange(n)

        # Containment (server -> components) and power (pdu -> device).
        hosts = [(index[h], i) for i, h in enumerate(h for _, h in nodes(data="host")) if h is not None]
        rows, cols = (np.array(x, dtype=INDEX) for x in zip(*hosts)) if hosts else (np.empty(0, INDEX),) * 2
        self.contained_indptr, self.contained = _csr(rows, cols, n)
        feeds = [(index[a], index[b]) for a, b, kind in graph.edges(data="kind") if kind == POWER]
        rows, cols = (np.array(x, dtype=INDEX) for x in zip(*feeds)) if feeds else (np.empty(0, INDEX),) * 2
        self.fed_indptr, self.fed = _csr(rows, cols, n)
        self.feed_count = np.bincount(cols, minlength=n).astype(INDEX)

        # States: one per (device, partition) membership.
        memberships = topology.memberships()
        anchors = topology.anchors(memberships)
        self.partitions = sorted({p for parts in memberships.values() for p in parts})
        part_index = {p: k for k, p in enumerate(self.partitions)}
        state_of: dict[tuple[int, int], int] = {}
        state_device, state_part = [], []
        for name in self.names:
            i = index[name]
            for part in sorted(memberships[name]):
                state_of[(i, part_index[part])] = len(state_device)
                state_device.append(i)
                state_part.append(part_index[part])
        s = self.states = len(state_device)
        self.root = s
        self.state_device = np.array(state_device, dtype=INDEX)
        self.state_part = np.array(state_part, dtype=np.int16)
        self.device_states_indptr, self.device_states = _csr(self.state_device, np.arange(s, dtype=INDEX), n)

        src, dst, kinds = [], [], []
        kind_code = {kind: k for k, kind in enumerate(LINK_KINDS)}
        for a, b, data in graph.edges(data=True):
            if data["kind"] == POWER or data["state"] != "up":
                continue
            p = part_index.get(data["partition"])
            sa = state_of.get((index[a], p))
            sb = state_of.get((index[b], p))
            if sa is not None and sb is not None:   # both ends members: the VLAN boundary
                src.append(sa)
                dst.append(sb)
                kinds.append(kind_code[data["kind"]])
        src = np.array(src, dtype=INDEX)
        dst = np.array(dst, dtype=INDEX)
        kinds = np.array(kinds, dtype=np.int8)
        anchor_states = np.array(sorted(state_of[(index[d], part_index[p])] for p, ds in anchors.items() for d in ds),
                                 dtype=INDEX)
        self.edges = len(src)
        self.forward = self._tree(src, dst, kinds, anchor_states)
        self.backward = self._tree(dst, src, kinds, anchor_states)
        self.baseline = self.forward.reached & self.backward.reached

        # Jobs: which devices each active job depends on.
        self.job_names = [job.name for job in topology.active_jobs()]
        members = [np.array(sorted(index[d] for d in job.devices()), dtype=INDEX) for job in topology.active_jobs()]
        self.job_indptr = np.zeros(len(members) + 1, dtype=np.int64)
        np.cumsum([len(m) for m in members], out=self.job_indptr[1:])
        self.job_members = np.concatenate(members) if members else np.empty(0, INDEX)

    def _tree(self, src: np.ndarray, dst: np.ndarray, kinds: np.ndarray, anchor_states: np.ndarray) -> _Tree:
        s = self.states
        out_indptr, out = _csr(src, dst, s + 1)
        in_indptr, into = _csr(dst, src, s + 1)
        rows = np.concatenate([src, np.full(len(anchor_states), s, dtype=INDEX)])
        cols = np.concatenate([dst, anchor_states])
        matrix = csr_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(s + 1, s + 1))
        order, predecessors = breadth_first_order(matrix, s, directed=True, return_predecessors=True)
        reached = np.zeros(s + 1, dtype=bool)
        reached[order] = True
        parent = np.where(predecessors < 0, -1, predecessors).astype(INDEX)
        rank = np.full(s + 1, np.iinfo(INDEX).max, dtype=INDEX)
        rank[order] = np.arange(len(order), dtype=INDEX)
        has_parent = np.flatnonzero(parent >= 0).astype(INDEX)
        children_indptr, children = _csr(parent[has_parent], has_parent, s + 1)
        # Preorder intervals: the subtree of v is [pre[v], end[v]) in DFS preorder, so "is w
        # below a removed state" is one binary search instead of walking subtrees.
        tree = csr_matrix((np.ones(len(children), dtype=np.int8), children, children_indptr), shape=(s + 1, s + 1))
        preorder = depth_first_order(tree, s, directed=True, return_predecessors=False)
        pre = np.full(s + 1, -1, dtype=np.int64)
        pre[preorder] = np.arange(len(preorder))
        end = pre + 1
        levels, frontier = [], np.array([s], dtype=INDEX)
        while frontier.size:
            levels.append(frontier)
            frontier, _ = gather(children_indptr, children, frontier)
        for level in reversed(levels[1:]):
            np.maximum.at(end, parent[level], end[level])
        # Kind of each tree edge, looked up once here so a simulation's path costs nothing.
        kind_of = csr_matrix((kinds.astype(np.int16) + 1, (src, dst)), shape=(s + 1, s + 1))
        parent_kind = np.full(s + 1, -1, dtype=np.int8)
        below_root = has_parent[parent[has_parent] != s]
        if below_root.size:
            parent_kind[below_root] = np.asarray(kind_of[parent[below_root], below_root]).ravel() - 1
        return _Tree(reached, parent, children_indptr, children, rank, parent_kind, pre, end,
                     out_indptr, out, in_indptr, into)

    # ---- simulation ---------------------------------------------------------------------
    def _removal(self, failed: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
        """Failed devices plus what goes down with them: components of a removed server,
        devices whose every power feed is gone. Returns order, causes, reasons, mask."""
        removed = np.zeros(self.n, dtype=bool)
        lost_feeds = np.zeros(self.n, dtype=INDEX)
        frontier = np.unique(failed).astype(INDEX)
        removed[frontier] = True
        order, causes, reasons = [frontier], [np.full(len(frontier), -1, dtype=INDEX)], ["failed"] * len(frontier)
        while frontier.size:
            kids, kid_cause = gather(self.contained_indptr, self.contained, frontier)
            fed, fed_cause = gather(self.fed_indptr, self.fed, frontier)
            np.add.at(lost_feeds, fed, 1)
            dark = (lost_feeds[fed] >= self.feed_count[fed])
            new = np.concatenate([kids, fed[dark]])
            cause = np.concatenate([kid_cause, fed_cause[dark]])
            why = np.concatenate([np.zeros(len(kids), dtype=bool), np.ones(int(dark.sum()), dtype=bool)])
            keep = ~removed[new]
            new, cause, why = new[keep], cause[keep], why[keep]
            new, first = np.unique(new, return_index=True)
            removed[new] = True
            order.append(new)
            causes.append(cause[first])
            reasons += ["power" if w else "contained" for w in why[first]]
            frontier = new
        return np.concatenate(order), np.concatenate(causes), reasons, removed

    def _cut(self, tree: _Tree, removed_states: np.ndarray, removed_mask: np.ndarray) -> np.ndarray:
        """States this direction no longer reaches after the removal.

        Only tree descendants of removed states can lose their path. Walk down from the
        removed states; a child with an edge from a state outside every removed subtree is
        still attached (and so is its whole subtree, unless another removed state sits
        below it, which that state's own walk covers), so the walk stops there. The
        children left (pending) are walked further. Finally a pending state is re-attached
        if an edge reaches it from any live state that is not pending (unwalked states
        below an attached one are attached), and attachment spreads within the pending set.
        """
        removed_states = removed_states[tree.reached[removed_states]]
        if not removed_states.size:
            return np.empty(0, dtype=INDEX)
        # Merged preorder intervals of the removed subtrees (laminar, so sort and drop nested).
        los, his = tree.pre[removed_states], tree.end[removed_states]
        order = np.argsort(los, kind="stable")
        los, his = los[order], his[order]
        outer = np.ones(len(los), dtype=bool)
        outer[1:] = los[1:] >= np.maximum.accumulate(his)[:-1]
        los, his = los[outer], his[outer]

        def under_removed(states: np.ndarray) -> np.ndarray:
            pos = tree.pre[states]
            k = np.searchsorted(los, pos, side="right") - 1
            return (k >= 0) & (pos < his[np.maximum(k, 0)]) & (pos >= 0)

        pending_parts, frontier = [], removed_states
        while frontier.size:
            kids, _ = gather(tree.children_indptr, tree.children, frontier)
            kids = kids[~removed_mask[kids]]
            if not kids.size:
                break
            sources, owners = gather(tree.in_indptr, tree.into, kids)
            safe = tree.reached[sources] & ~removed_mask[sources] & ~under_removed(sources)
            attached = np.zeros(self.states + 1, dtype=bool)
            attached[owners[safe]] = True
            frontier = kids[~attached[kids]]
            pending_parts.append(frontier)
        pending = np.concatenate(pending_parts) if pending_parts else np.empty(0, dtype=INDEX)
        if not pending.size:
            return pending
        is_pending = np.zeros(self.states + 1, dtype=bool)
        is_pending[pending] = True
        sources, owners = gather(tree.in_indptr, tree.into, pending)
        live = tree.reached[sources] & ~removed_mask[sources] & ~is_pending[sources]
        rescued = np.zeros(self.states + 1, dtype=bool)
        frontier = np.unique(owners[live])
        rescued[frontier] = True
        while frontier.size:
            nxt, _ = gather(tree.out_indptr, tree.out, frontier)
            nxt = np.unique(nxt[is_pending[nxt] & ~rescued[nxt]])
            rescued[nxt] = True
            frontier = nxt
        return pending[~rescued[pending]]

    def simulate(self, failed: np.ndarray) -> Outcome:
        removed, removed_cause, reasons, removed_devices = self._removal(failed)
        removed_states, _ = gather(self.device_states_indptr, self.device_states, removed)
        removed_mask = np.zeros(self.states + 1, dtype=bool)
        removed_mask[removed_states] = True
        cut_fwd = self._cut(self.forward, removed_states, removed_mask)
        cut_bwd = self._cut(self.backward, removed_states, removed_mask)
        # Only states connected both ways before the failure can be lost to it.
        cut_fwd = cut_fwd[self.baseline[cut_fwd]]
        cut_bwd = cut_bwd[self.baseline[cut_bwd] & ~np.isin(cut_bwd, cut_fwd)]
        # Order cut states as the BFS met them and name the device each hung from.
        states = np.concatenate([cut_fwd, cut_bwd])
        rank = np.concatenate([self.forward.rank[cut_fwd], self.backward.rank[cut_bwd]])
        via = np.concatenate([self.forward.parent[cut_fwd], self.backward.parent[cut_bwd]])
        order = np.argsort(rank, kind="stable")
        states, via = states[order], via[order]
        link_kind = np.concatenate([self.forward.parent_kind[cut_fwd], self.backward.parent_kind[cut_bwd]])[order]
        devices = self.state_device[states]
        unique_devices, first = np.unique(devices, return_index=True)
        first = np.sort(first)
        cut_devices = devices[first]
        lost = np.zeros(self.n, dtype=np.int64)
        np.bitwise_or.at(lost, devices, np.left_shift(1, self.state_part[states].astype(np.int64)))
        affected = removed_devices.copy()
        affected[unique_devices] = True
        if self.job_members.size:
            hit = affected[self.job_members]
            counts = np.diff(self.job_indptr)
            nonempty = counts > 0
            any_hit = np.zeros(len(counts), dtype=bool)
            any_hit[nonempty] = np.logical_or.reduceat(hit, self.job_indptr[:-1][nonempty])
            jobs = np.flatnonzero(any_hit)
        else:
            jobs = np.empty(0, dtype=np.int64)
        return Outcome(removed, removed_cause, reasons, cut_devices, self.state_device[via[first]],
                       link_kind[first], lost[cut_devices], jobs)

    def sorted_by_name(self, devices: np.ndarray) -> np.ndarray:
        """Distinct device indices, in the order of their names."""
        devices = np.unique(devices)
        return devices[np.argsort(self.name_rank[devices], kind="stable")]

    def count_kinds(self, devices: np.ndarray) -> dict[str, int]:
        counts = np.bincount(self.kinds[devices], minlength=len(self.kind_names))
        return {kind: int(count) for kind, count in zip(self.kind_names, counts.tolist()) if count}

    def memory_bytes(self) -> int:
        arrays = [v for v in vars(self).values() if isinstance(v, np.ndarray)]
        for tree in (self.forward, self.backward):
            arrays += [v for v in vars(tree).values() if isinstance(v, np.ndarray)]
        return sum(a.nbytes for a in arrays)
