//! Graph memory (`cuGraphAddMemAllocNode`): counted as the driver allocates it. A node only
//! fixes a virtual address; physical memory is mapped when the graph is launched, from the
//! device's graph memory pool, which keeps it across launches (and for allocations the graph
//! does not free, until the application frees them) and gives unused memory back on
//! `cuDeviceGraphMemTrim`. So the shim counts, per GPU, the pool's reserved bytes:
//!
//! - before a launch, the growth the pool may need (`used + this exec's alloc bytes` beyond what
//!   it reserves, as the driver reports it) is reserved in the quota, and a refusal fails the
//!   launch with `CUDA_ERROR_OUT_OF_MEMORY` before anything is mapped;
//! - after such a launch (in the launching thread) and after a trim, the count is settled to the
//!   driver's `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`; the controller thread settles every GPU
//!   each tick too, once the process has instantiated a graph (growth the shim did not foresee,
//!   such as a captured graph's memory nodes, is counted then, and reported).
//!
//! Launches of graphs without memory nodes pay one atomic load and one map lookup per GPU; only
//! launches of execs with memory nodes query the driver.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

use cuda_abi::{CUdevice, CUgraphMem_attribute, CUresult};

use crate::ptrmap::PtrMap;
use crate::quota::Quota;
use crate::state::{call_real, Gpu, State};

/// Ordinal bits of a map key (handles are pointers, below 2^48).
const ORD_SHIFT: u32 = 56;

fn key(handle: u64, ord: usize) -> u64 {
    handle ^ ((ord as u64) << ORD_SHIFT)
}

/// The alloc-node bytes of each graph and exec, per device ordinal.
pub struct GraphMem {
    seen: AtomicBool,
    graphs: PtrMap,
    execs: PtrMap,
}

impl Default for GraphMem {
    fn default() -> Self {
        Self::new()
    }
}

impl GraphMem {
    /// Empty maps (room for 1024 graph/device and exec/device pairs each).
    pub fn new() -> Self {
        Self { seen: AtomicBool::new(false), graphs: PtrMap::new(1024), execs: PtrMap::new(1024) }
    }

    /// Whether this process ever added a memory allocation node or instantiated a graph.
    #[inline]
    pub fn seen(&self) -> bool {
        self.seen.load(Relaxed)
    }

    /// A `bytes` alloc node was added to `graph` on ordinal `ord`.
    pub fn node_added(&self, graph: u64, ord: usize, bytes: u64) {
        self.seen.store(true, Relaxed);
        let k = key(graph, ord);
        let prev = self.graphs.remove(k).unwrap_or(0);
        if !self.graphs.insert(k, prev.saturating_add(bytes)) {
            crate::state::logged(|| tracing::error!("xcuda: graph memory table full: graph {graph:#x} is counted at launch only, after the driver mapped it"));
        }
    }

    /// `exec` was instantiated from `graph`: it needs the graph's alloc bytes per device. From
    /// now on graph launches are settled against the driver's pool (a captured graph may hold
    /// memory nodes the shim never saw added).
    pub fn instantiated(&self, graph: u64, exec: u64, devices: usize) {
        self.seen.store(true, Relaxed);
        for ord in 0..devices {
            if let Some(b) = self.graphs.get(key(graph, ord)) {
                self.execs.insert(key(exec, ord), b);
            }
        }
    }

    /// `exec` was destroyed (its pool memory stays reserved by the driver until trimmed).
    pub fn exec_destroyed(&self, exec: u64, devices: usize) {
        for ord in 0..devices {
            self.execs.remove(key(exec, ord));
        }
    }

    /// `graph` was destroyed.
    pub fn graph_destroyed(&self, graph: u64, devices: usize) {
        for ord in 0..devices {
            self.graphs.remove(key(graph, ord));
        }
    }

    /// Alloc-node bytes `exec` maps on ordinal `ord` at each launch.
    pub fn footprint(&self, exec: u64, ord: usize) -> u64 {
        self.execs.get(key(exec, ord)).unwrap_or(0)
    }
}

/// The driver's graph-memory attribute `attr` of ordinal `dev` (`None` if it cannot say).
fn attribute(dev: CUdevice, attr: CUgraphMem_attribute) -> Option<u64> {
    let mut v: u64 = 0;
    let rc = call_real!(cuDeviceGetGraphMemAttribute: cuda_abi::PFN_cuDeviceGetGraphMemAttribute_v11040, dev, attr, (&mut v as *mut u64).cast());
    (rc == CUresult::CUDA_SUCCESS).then_some(v)
}

/// Before launching `exec`: reserves in each GPU's quota the pool growth the launch may cause;
/// `Err(CUDA_ERROR_OUT_OF_MEMORY)` (nothing reserved) if a quota refuses.
pub fn before_launch(st: &State, exec: u64) -> Result<(), CUresult> {
    let gm = &st.graph_mem;
    for (ord, g) in st.gpus.iter().enumerate() {
        let fp = gm.footprint(exec, ord);
        if fp == 0 {
            continue;
        }
        let dev = ord as CUdevice;
        let attrs = (
            attribute(dev, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
            attribute(dev, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
        );
        // In flight and reserved under the GPU's graph lock: a settle lowers the count only
        // under it, seeing no other launch in flight, so it cannot lower the count this
        // launch reads between that read and its reservation (the launch would then map its
        // memory uncounted). The lock covers a few atomics only (the driver calls are above).
        lock(&g.graph_lock);
        g.graph_inflight.fetch_add(1, AcqRel);
        let (used, reserved) = match attrs {
            (Some(u), Some(r)) => (u, r),
            // The driver cannot say: assume nothing in the pool is reusable.
            _ => (g.graph_counted.load(Relaxed), g.graph_counted.load(Relaxed)),
        };
        let after = reserved.max(used.saturating_add(fp));
        let counted = g.graph_counted.load(Relaxed);
        let need = after.saturating_sub(counted);
        let reserved_ok = need == 0 || g.quota.try_reserve(need);
        if reserved_ok && need > 0 {
            g.graph_counted.fetch_add(need, Relaxed);
        }
        g.graph_lock.store(false, Release);
        if !reserved_ok {
            for (o, g) in st.gpus.iter().enumerate().take(ord + 1) {
                if gm.footprint(exec, o) > 0 {
                    settle(g, o as CUdevice, 1);
                    g.graph_inflight.fetch_sub(1, AcqRel);
                }
            }
            crate::state::logged(|| {
                tracing::error!(
                    device = ord,
                    graph_bytes = fp,
                    need,
                    quota_used = g.quota.used(),
                    quota = g.quota.limit(),
                    "xcuda: graph launch refused: its memory nodes would take the group over its quota (CUDA_ERROR_OUT_OF_MEMORY)"
                )
            });
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    Ok(())
}

/// Takes a GPU's graph lock (held for a few atomics at a time: spins, then yields).
fn lock(l: &AtomicBool) {
    let mut spins = 0u32;
    while l.compare_exchange_weak(false, true, Acquire, Relaxed).is_err() {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Settles GPU `g`'s (ordinal `dev`) graph-pool count to what the driver reserves. `own`: the
/// launches with memory nodes the caller itself has in flight on `g` (its reservation is not
/// yet mapped). While any other launch is in flight the count is not lowered: that launch's
/// reservation is still above what the pool holds, and its own settle lowers it later.
pub fn settle(g: &Gpu, dev: CUdevice, own: u32) {
    settle_guarded(&g.quota, &g.graph_counted, &g.graph_over, dev, &g.graph_lock, || g.graph_inflight.load(Acquire) <= own, || {
        attribute(dev, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
    });
}

/// [`settle_guarded`] with a lock of its own and `shrink` decided up front (unit tests).
#[cfg(test)]
fn settle_to(quota: &Quota, counted: &AtomicU64, over: &AtomicBool, dev: CUdevice, shrink: bool, actual: impl FnMut() -> Option<u64>) -> bool {
    settle_guarded(quota, counted, over, dev, &AtomicBool::new(false), || shrink, actual)
}

/// [`settle`] on its parts, with the pool's size from `actual`. Settles may run at once (a
/// trim, the controller tick, launches on several threads): each applies its difference with
/// one compare-and-swap on `counted`, and one that loses asks again, so a difference is given
/// back or reserved once. A lowering happens only under `lock` and only if `may_shrink` says
/// so there (no other launch in flight); with the lock busy it is left to the next settle.
/// Growth past the quota is counted as far as the quota allows (the group sees itself at its
/// limit: its next allocation is refused) and logged once until the count catches up.
/// Returns whether it logged that now.
fn settle_guarded(
    quota: &Quota,
    counted: &AtomicU64,
    over: &AtomicBool,
    dev: CUdevice,
    lock: &AtomicBool,
    may_shrink: impl Fn() -> bool,
    mut actual: impl FnMut() -> Option<u64>,
) -> bool {
    // Each lost swap means another settle or a launch moved the count: bounded, it is redone
    // on the next tick at the latest.
    for _ in 0..8 {
        let c = counted.load(Acquire);
        let Some(a) = actual() else { return false };
        if a > c {
            let more = a - c;
            let got = quota.reserve_up_to(more);
            if counted.compare_exchange(c, c + got, AcqRel, Acquire).is_err() {
                quota.release(got);
                continue;
            }
            if got == more {
                over.store(false, Relaxed);
                return false;
            }
            if over.swap(true, Relaxed) {
                return false;
            }
            crate::state::logged(|| tracing::error!(device = dev, pool = a, counted = c + got, quota_used = quota.used(), quota = quota.limit(), "xcuda: the driver's graph memory pool grew past the group's quota (an exec the shim could not size): counted as far as the quota allows; the group is at its limit"));
            return true;
        }
        if a < c {
            if lock.compare_exchange(false, true, Acquire, Relaxed).is_err() {
                return false;
            }
            let shrink = may_shrink();
            let lowered = shrink && counted.compare_exchange(c, a, AcqRel, Acquire).is_ok();
            lock.store(false, Release);
            if !shrink {
                return false;
            }
            if !lowered {
                continue;
            }
            quota.release(c - a);
        }
        over.store(false, Relaxed);
        return false;
    }
    false
}

/// After launching `exec` (successful or not): settles the GPUs its memory nodes use.
pub fn after_launch(st: &State, exec: u64) {
    for (ord, g) in st.gpus.iter().enumerate() {
        if st.graph_mem.footprint(exec, ord) > 0 {
            settle(g, ord as CUdevice, 1);
            g.graph_inflight.fetch_sub(1, AcqRel);
        }
    }
}

/// Controller tick: settles GPU `g` unless a launch with memory nodes is between its
/// reservation and its own settle.
pub fn tick(st: &State, g: &Gpu, dev: CUdevice) {
    if st.graph_mem.seen() && g.graph_inflight.load(Acquire) == 0 {
        settle(g, dev, 0);
    }
}

/// Bytes counted for graph pools, over every GPU (for tests and logs).
pub fn counted(st: &State) -> u64 {
    st.gpus.iter().map(|g| g.graph_counted.load(Relaxed)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A settle that runs while another is between reading the count and changing it (a trim
    /// against the controller tick, two launching threads): the pool's shrink is given back
    /// once. Both gave it back before: the count wrapped toward 2^64 and the quota's use went to
    /// zero (a later give-back would have freed the whole group's quota).
    #[test]
    fn concurrent_settles_give_a_shrink_back_once() {
        let (q, counted, over) = (Quota::local(100 * MIB), AtomicU64::new(0), AtomicBool::new(false));
        assert!(q.try_reserve(10 * MIB), "a plain allocation beside the pool");
        assert!(!settle_to(&q, &counted, &over, 0, true, || Some(80 * MIB)));
        assert_eq!((counted.load(Relaxed), q.used()), (80 * MIB, 90 * MIB));
        let mut first = true;
        settle_to(&q, &counted, &over, 0, true, || {
            if std::mem::take(&mut first) {
                // The other settle, between this one's read of the count and its change.
                settle_to(&q, &counted, &over, 0, true, || Some(30 * MIB));
            }
            Some(30 * MIB)
        });
        assert_eq!(counted.load(Relaxed), 30 * MIB, "pool counted once");
        assert_eq!(q.used(), 40 * MIB, "the plain allocation and the pool, 50 MiB given back once");
    }

    /// A launch that counts itself in flight after a settle read the pool (a trim emptied it)
    /// but before the settle lowers the count: the settle sees it in flight under the lock and
    /// leaves the count, which the launch's reservation was read against. Before, the settle
    /// had decided to lower up front: the launch reserved nothing against the stale count, the
    /// count went to 0, and the launch's memory was mapped uncounted (a neighbour took the
    /// quota it freed).
    #[test]
    fn a_launch_counted_in_flight_during_a_settle_keeps_the_count() {
        let (q, counted, over, lock) = (Quota::local(100 * MIB), AtomicU64::new(0), AtomicBool::new(false), AtomicBool::new(false));
        let inflight = std::sync::atomic::AtomicU32::new(0);
        assert!(!settle_to(&q, &counted, &over, 0, true, || Some(80 * MIB)));
        settle_guarded(&q, &counted, &over, 0, &lock, || inflight.load(Acquire) == 0, || {
            // A trim emptied the pool; a launch then counts itself in flight and finds the
            // count (80) covers its 60 MiB: it reserves nothing.
            inflight.fetch_add(1, AcqRel);
            Some(0)
        });
        assert_eq!((counted.load(Relaxed), q.used()), (80 * MIB, 80 * MIB), "not lowered under the launch");
    }

    /// While another launch is between its reservation and its settle, a settle does not lower
    /// the count (that launch's reservation is not mapped yet); growth is still counted.
    #[test]
    fn no_shrink_while_another_launch_is_in_flight() {
        let (q, counted, over) = (Quota::local(100 * MIB), AtomicU64::new(0), AtomicBool::new(false));
        settle_to(&q, &counted, &over, 0, true, || Some(60 * MIB));
        settle_to(&q, &counted, &over, 0, false, || Some(20 * MIB));
        assert_eq!((counted.load(Relaxed), q.used()), (60 * MIB, 60 * MIB));
        settle_to(&q, &counted, &over, 0, false, || Some(70 * MIB));
        assert_eq!((counted.load(Relaxed), q.used()), (70 * MIB, 70 * MIB));
    }

    /// The pool grew past the quota (memory the driver already mapped): it is counted up to the
    /// limit, so the group's next allocation is refused, and said once per episode, not every
    /// tick. Before: nothing was counted and the error came every tick.
    #[test]
    fn growth_past_the_quota_is_counted_to_the_limit_and_said_once() {
        let (q, counted, over) = (Quota::local(100 * MIB), AtomicU64::new(0), AtomicBool::new(false));
        assert!(q.try_reserve(70 * MIB));
        assert!(settle_to(&q, &counted, &over, 0, true, || Some(50 * MIB)), "said the first time");
        assert_eq!((counted.load(Relaxed), q.used()), (30 * MIB, 100 * MIB), "counted as far as the quota allows");
        assert!(!q.try_reserve(1), "the group is at its limit");
        assert!(!settle_to(&q, &counted, &over, 0, true, || Some(50 * MIB)), "not again on the next tick");
        assert_eq!((counted.load(Relaxed), q.used()), (30 * MIB, 100 * MIB));
        q.release(20 * MIB);
        assert!(!settle_to(&q, &counted, &over, 0, true, || Some(50 * MIB)), "room again: the rest is counted");
        assert_eq!((counted.load(Relaxed), q.used()), (50 * MIB, 100 * MIB));
        assert!(!over.load(Relaxed), "episode over");
        assert!(!settle_to(&q, &counted, &over, 0, true, || Some(10 * MIB)));
        assert!(settle_to(&q, &counted, &over, 0, true, || Some(200 * MIB)), "a new episode is said again");
        assert_eq!((counted.load(Relaxed), q.used()), (50 * MIB, 100 * MIB), "50 MiB beside 10 counted, 40 more fit");
    }

    #[test]
    fn footprints_follow_graphs_into_execs_per_device() {
        let gm = GraphMem::new();
        assert!(!gm.seen());
        gm.instantiated(0x9000, 0x9100, 2);
        assert!(gm.seen(), "any instantiation: launches are settled");
        assert_eq!(gm.footprint(0x9100, 0), 0);
        gm.node_added(0x1000, 0, 100);
        gm.node_added(0x1000, 0, 50);
        gm.node_added(0x1000, 1, 7);
        assert!(gm.seen());
        gm.instantiated(0x1000, 0x2000, 2);
        assert_eq!((gm.footprint(0x2000, 0), gm.footprint(0x2000, 1)), (150, 7));
        assert_eq!(gm.footprint(0x3000, 0), 0, "an exec without memory nodes");
        gm.exec_destroyed(0x2000, 2);
        assert_eq!(gm.footprint(0x2000, 0), 0);
        gm.graph_destroyed(0x1000, 2);
        gm.instantiated(0x1000, 0x2000, 2);
        assert_eq!(gm.footprint(0x2000, 0), 0);
    }
}
