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

use std::sync::atomic::{AtomicBool, Ordering::*};

use cuda_abi::{CUdevice, CUgraph, CUgraphMem_attribute, CUresult, CUstream, CUstreamCaptureStatus};

use crate::poolcount::Pending;
use crate::ptrmap::PtrMap;
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
    /// Held while a graph's bytes are read and written back (two threads adding captured
    /// nodes to one graph must not both read the old figure; freed in a fork child).
    pub update: crate::spin::SpinLock,
}

impl Default for GraphMem {
    fn default() -> Self {
        Self::new()
    }
}

impl GraphMem {
    /// Empty maps (room for 1024 graph/device and exec/device pairs each).
    pub fn new() -> Self {
        Self { seen: AtomicBool::new(false), graphs: PtrMap::new(1024), execs: PtrMap::new(1024), update: crate::spin::SpinLock::new() }
    }

    /// Whether this process ever added a memory allocation node or instantiated a graph.
    #[inline]
    pub fn seen(&self) -> bool {
        self.seen.load(Relaxed)
    }

    /// A `bytes` alloc node is being added to `graph` on ordinal `ord` (recorded before the
    /// driver adds it, so that a node the shim cannot record is never made: `false`, the table
    /// is full, said once; [`GraphMem::node_not_added`] takes it back if the driver refuses).
    pub fn node_added(&self, graph: u64, ord: usize, bytes: u64) -> bool {
        self.seen.store(true, Relaxed);
        let _one = self.update.lock();
        let k = key(graph, ord);
        let prev = self.graphs.remove(k).unwrap_or(0);
        if self.graphs.insert(k, prev.saturating_add(bytes)) {
            return true;
        }
        // Its slot was just freed: the old figure goes back (or, if even that fails, the graph
        // is sized without its earlier nodes: its launches are settled after the fact).
        if prev > 0 {
            self.graphs.insert(k, prev);
        }
        table_full("graph");
        false
    }

    /// The driver refused the node [`GraphMem::node_added`] recorded: its bytes come off.
    pub fn node_not_added(&self, graph: u64, ord: usize, bytes: u64) {
        let _one = self.update.lock();
        let k = key(graph, ord);
        if let Some(prev) = self.graphs.remove(k) {
            let left = prev.saturating_sub(bytes);
            if left > 0 {
                self.graphs.insert(k, left);
            }
        }
    }

    /// `child` is being moved into `parent` (a child graph node added with
    /// `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`, the only way a child graph may hold memory
    /// nodes): its alloc bytes on each of `devices` ordinals join `parent`'s, recorded before the
    /// driver adds the node. `false`: no room to record them (said once), nothing changed; the
    /// caller refuses the node (the parent's launches would map the child's memory unreserved).
    pub fn child_moving(&self, parent: u64, child: u64, devices: usize) -> bool {
        for ord in 0..devices {
            let b = self.graphs.get(key(child, ord)).unwrap_or(0);
            if b > 0 && !self.node_added(parent, ord, b) {
                self.parent_takes_back(parent, child, ord);
                return false;
            }
        }
        true
    }

    /// The driver answered the move [`GraphMem::child_moving`] recorded: on success the child's
    /// records go (it belongs to `parent` now, which counts its bytes, and no memory node may be
    /// added to it any more: cuda.h); on failure `parent` gives its bytes back.
    pub fn child_moved(&self, parent: u64, child: u64, devices: usize, moved: bool) {
        if moved {
            self.graph_destroyed(child, devices);
        } else {
            self.parent_takes_back(parent, child, devices);
        }
    }

    /// `parent` gives back the bytes of `child` on its ordinals below `devices`.
    fn parent_takes_back(&self, parent: u64, child: u64, devices: usize) {
        for ord in 0..devices {
            let b = self.graphs.get(key(child, ord)).unwrap_or(0);
            if b > 0 {
                self.node_not_added(parent, ord, b);
            }
        }
    }

    /// `exec` was instantiated from `graph`: it needs the graph's alloc bytes per device. From
    /// now on graph launches are settled against the driver's pool (a captured graph may hold
    /// memory nodes the shim never saw added). `false`: the exec table is full (said once), so
    /// its launches would go unreserved; the caller destroys the exec.
    pub fn instantiated(&self, graph: u64, exec: u64, devices: usize) -> bool {
        self.seen.store(true, Relaxed);
        for ord in 0..devices {
            if let Some(b) = self.graphs.get(key(graph, ord)) {
                if !self.execs.insert(key(exec, ord), b) {
                    self.exec_destroyed(exec, devices);
                    table_full("exec");
                    return false;
                }
            }
        }
        true
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

/// The graph stream `stream` (a `CUstream`'s value, only passed to the driver) is capturing into (`cuStreamGetCaptureInfo_v2`), if it is
/// capturing (an invalidated capture, or a driver that cannot say: `None`, the allocation
/// counted as an allocation).
pub fn capture_graph(stream: u64) -> Option<u64> {
    let stream = stream as CUstream;
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: CUgraph = std::ptr::null_mut();
    let rc = call_real!(
        cuStreamGetCaptureInfo_v2: cuda_abi::PFN_cuStreamGetCaptureInfo_v11030,
        stream,
        &mut status,
        std::ptr::null_mut(),
        &mut graph,
        std::ptr::null_mut(),
        std::ptr::null_mut()
    );
    (rc == CUresult::CUDA_SUCCESS && status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE && !graph.is_null()).then_some(graph as u64)
}

/// A stream-ordered allocation of `bytes` on ordinal `ord` captured into `graph`: the driver
/// adds a memory node (`alloc`), no memory now; the node's bytes join the graph's footprint
/// (recorded first: no room, refused with `CUDA_ERROR_OUT_OF_MEMORY`), reserved at each launch
/// of its execs. Before, such nodes were sized only after their launch had mapped them.
pub fn captured_alloc(st: &State, graph: u64, ord: usize, bytes: u64, alloc: impl FnOnce() -> CUresult) -> CUresult {
    if !st.graph_mem.node_added(graph, ord, bytes) {
        return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = alloc();
    if rc != CUresult::CUDA_SUCCESS {
        st.graph_mem.node_not_added(graph, ord, bytes);
    }
    rc
}

/// A child graph node moving `child` into `graph` (`cuGraphAddNode`, ownership
/// `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`), added by `add` (the driver's call): the child's
/// memory-node bytes join the parent's first (no room: refused with
/// `CUDA_ERROR_OUT_OF_MEMORY`, never added), and stay the parent's if the driver moves it.
/// Before, the parent's execs had no footprint of the child's nodes: their launches mapped its
/// memory unreserved (settled only afterwards).
pub fn child_moved(gm: &GraphMem, graph: u64, child: u64, devices: usize, add: impl FnOnce() -> CUresult) -> CUresult {
    if !gm.child_moving(graph, child, devices) {
        return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = add();
    gm.child_moved(graph, child, devices, rc == CUresult::CUDA_SUCCESS);
    rc
}

/// Logs, once per process, that the `what` table of graph memory is full.
fn table_full(what: &'static str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        crate::state::logged(|| tracing::error!(table = what, "xcuda: graph memory table full: graphs with memory nodes past it are refused (CUDA_ERROR_OUT_OF_MEMORY)"));
    }
}

/// The GPUs a launch with memory nodes counted itself in flight on (`before_launch`), with
/// its footprint on each, for `after_launch` to end exactly those (an exec destroyed meanwhile
/// has no footprint left to find them by).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct InFlight {
    /// One bit per ordinal.
    on: u64,
    /// The footprint pending on each ordinal of `on`.
    fp: [u64; 64],
    /// Where it is pending on each ordinal of `on`.
    at: [Pending; 64],
}

impl Default for InFlight {
    fn default() -> Self {
        Self { on: 0, fp: [0; 64], at: [Pending::ALONE; 64] }
    }
}

/// The driver's graph-memory attribute `attr` of ordinal `dev` (`None` if it cannot say).
fn attribute(dev: CUdevice, attr: CUgraphMem_attribute) -> Option<u64> {
    let mut v: u64 = 0;
    let rc = call_real!(cuDeviceGetGraphMemAttribute: cuda_abi::PFN_cuDeviceGetGraphMemAttribute_v11040, dev, attr, (&mut v as *mut u64).cast());
    (rc == CUresult::CUDA_SUCCESS).then_some(v)
}

/// The pool's `(used, reserved)` bytes on ordinal `dev`, as the driver reports them.
fn pool_figures(dev: CUdevice) -> (Option<u64>, Option<u64>) {
    (attribute(dev, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), attribute(dev, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT))
}

/// How often a launch asks the driver again for figures another launch made stale before it
/// sizes its growth without them (as if nothing in the pool were reusable).
const FRESH_TRIES: usize = 4;

/// Before launching `exec`: reserves in each GPU's quota the pool growth the launch may cause;
/// `Err(CUDA_ERROR_OUT_OF_MEMORY)` (nothing reserved) if a quota refuses. The GPUs it counted
/// itself in flight on go to [`after_launch`].
fn before_launch(st: &State, exec: u64) -> Result<InFlight, CUresult> {
    let pause_ms = crate::state::config().memory.test_graph_launch_pause_ms;
    before_launch_on(&st.graph_mem, &st.gpus, exec, &|dev| {
        let figures = pool_figures(dev);
        if pause_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(pause_ms));
        }
        figures
    })
}

/// [`before_launch`] with `gm`'s footprints on `gpus`, the pool's figures from `figures`.
///
/// The growth is `max(reserved, used + fp + pending) - counted`: `pending` are the footprints of
/// the other execs with launches in flight, which may not be in the figures yet (two launches
/// that read an empty pool at once each reserved only what the count lacked: the second
/// nothing, and both mapped); not the launching exec's own (its launches are ordered behind
/// one another and map the same memory: a second launch of an exec maps nothing new). The
/// growth is at most `fp` beyond the count and what the pool holds uncounted
/// (`reserved - counted`): the count already covers what the launches in flight may map (each
/// reserved it), and a pending launch that has mapped is in `used` too, so `used + pending`
/// counts it twice. Figures read before another launch began or ended (it may have mapped and
/// settled since) are asked for again, [`FRESH_TRIES`] times, then the launch sizes its growth
/// as if the pool held nothing reusable (fail closed).
fn before_launch_on(gm: &GraphMem, gpus: &[Gpu], exec: u64, figures: &dyn Fn(CUdevice) -> (Option<u64>, Option<u64>)) -> Result<InFlight, CUresult> {
    let mut on = InFlight::default();
    // The shim has at most 64 GPUs (`crate::exit::MAX_DEVICES`): one bit each.
    for (ord, g) in gpus.iter().enumerate().take(64) {
        let fp = gm.footprint(exec, ord);
        if fp == 0 {
            continue;
        }
        let dev = ord as CUdevice;
        // In flight and reserved under the count's lock (`PoolCount::begin_mapping`): a settle
        // lowers the count only under it, seeing no other launch in flight, so it cannot lower
        // the count this launch reads between that read and its reservation (the launch would
        // then map its memory uncounted). The driver calls are outside the lock.
        let mut need = 0;
        let mut sized = |counted: u64, pending: u64, attrs: (Option<u64>, Option<u64>)| {
            let (used, reserved) = match attrs {
                (Some(u), Some(r)) => (u, r),
                // The driver cannot say: assume nothing in the pool is reusable.
                _ => (counted, counted),
            };
            let bound = reserved.max(used.saturating_add(fp).saturating_add(pending)).saturating_sub(counted);
            need = bound.min(fp.saturating_add(reserved.saturating_sub(counted)));
            need
        };
        let mut begun = None;
        for _ in 0..FRESH_TRIES {
            let seen = g.graph.epoch();
            let attrs = figures(dev);
            begun = g.graph.begin_mapping(&g.quota, exec, fp, Some(seen), |c, p| sized(c, p, attrs));
            if begun.is_some() {
                break;
            }
        }
        let begun = begun.or_else(|| g.graph.begin_mapping(&g.quota, exec, fp, None, |c, p| sized(c, p, (None, None))));
        // `None` cannot come back without `seen`; were it to, the launch is refused, not in flight.
        let Some((reserved_ok, at)) = begun else {
            after_launch_on(gpus, on);
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        };
        on.on |= 1 << ord;
        on.fp[ord] = fp;
        on.at[ord] = at;
        if !reserved_ok {
            after_launch_on(gpus, on);
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
    Ok(on)
}

/// A call that maps `exec`'s graph memory (a launch, an upload): its growth reserved first
/// (refused: `CUDA_ERROR_OUT_OF_MEMORY`, `call` never made), the count settled after. A
/// process that never made a memory node or an exec pays one atomic load.
#[inline]
pub fn mapping(st: &State, exec: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    if !st.graph_mem.seen() {
        return call();
    }
    let on = match before_launch(st, exec) {
        Ok(on) => on,
        Err(rc) => return rc,
    };
    let rc = call();
    after_launch(st, on);
    rc
}

/// Settles GPU `g`'s (ordinal `dev`) graph-pool count to what the driver reserves. `own`: the
/// launches with memory nodes the caller itself has in flight on `g` (see
/// [`crate::poolcount::PoolCount::settle`]).
pub fn settle(g: &Gpu, dev: CUdevice, own: u32) {
    g.graph.settle(&g.quota, dev, own, || attribute(dev, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT));
}

/// After a launch (successful or not) that [`before_launch`] counted in flight on the GPUs
/// `on`: settles each of them and ends its in-flight count.
fn after_launch(st: &State, on: InFlight) {
    after_launch_on(&st.gpus, on);
}

fn after_launch_on(gpus: &[Gpu], on: InFlight) {
    for (ord, g) in gpus.iter().enumerate().take(64) {
        if on.on & (1 << ord) != 0 {
            settle(g, ord as CUdevice, 1);
            g.graph.end_mapping(on.fp[ord], on.at[ord]);
        }
    }
}

/// Controller tick: settles GPU `g` unless a launch with memory nodes is between its
/// reservation and its own settle.
pub fn tick(st: &State, g: &Gpu, dev: CUdevice) {
    if st.graph_mem.seen() {
        g.graph.tick(&g.quota, dev, || attribute(dev, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT));
    }
}

/// Bytes counted for graph pools, over every GPU (for tests and logs).
pub fn counted(st: &State) -> u64 {
    st.gpus.iter().map(|g| g.graph.counted()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A launch ends its in-flight count on exactly the GPUs it began on, even when its exec is
    /// destroyed meanwhile (another thread): found again by its footprint, which is gone then,
    /// the count stayed up for good and no settle ever lowered that GPU's count again.
    #[test]
    fn a_launch_ends_in_flight_where_it_began_even_if_its_exec_is_destroyed_meanwhile() {
        let gm = GraphMem::new();
        let gpus = [Gpu::for_test(1 << 30), Gpu::for_test(1 << 30)];
        assert!(gm.node_added(0x1000, 1, 64 << 20));
        assert!(gm.instantiated(0x1000, 0x2000, 2));
        let on = before_launch_on(&gm, &gpus, 0x2000, &pool_figures).expect("fits");
        assert_eq!((gpus[0].graph.inflight(), gpus[1].graph.inflight()), (0, 1));
        assert_eq!(gpus[1].quota.used(), 64 << 20, "the launch's growth reserved on GPU 1");
        gm.exec_destroyed(0x2000, 2);
        after_launch_on(&gpus, on);
        assert_eq!((gpus[0].graph.inflight(), gpus[1].graph.inflight()), (0, 0));
    }

    const MIB: u64 = 1 << 20;

    /// One GPU with a 100 MiB quota and two execs (0x2000, 0x3000) of 64 MiB memory nodes each.
    fn two_execs() -> (GraphMem, [Gpu; 1]) {
        let gm = GraphMem::new();
        for (graph, exec) in [(0x1000, 0x2000), (0x1100, 0x3000)] {
            assert!(gm.node_added(graph, 0, 64 * MIB));
            assert!(gm.instantiated(graph, exec, 1));
        }
        (gm, [Gpu::for_test(100 * MIB)])
    }

    /// Review finding: two launches of different execs read the empty pool at once; the first
    /// reserved its 64 MiB, and the second, finding the count covered `used + fp` of the figures
    /// it had read, reserved nothing, and both mapped (128 MiB under a 100 MiB quota). The
    /// first launch's footprint, in flight and not yet in the driver's figures, now counts
    /// against the second: refused.
    #[test]
    fn a_launch_in_flight_counts_against_one_that_read_the_pool_before_it_mapped() {
        let (gm, gpus) = two_execs();
        let first = std::cell::Cell::new(None);
        // The pool stays empty in the driver's figures: the first launch has reserved and not
        // yet mapped.
        let second = before_launch_on(&gm, &gpus, 0x3000, &|_| {
            if first.get().is_none() {
                first.set(Some(before_launch_on(&gm, &gpus, 0x2000, &|_| (Some(0), Some(0))).expect("the first fits")));
            }
            (Some(0), Some(0))
        });
        assert_eq!(second, Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "64 + 64 MiB > 100 MiB");
        assert_eq!((gpus[0].quota.used(), gpus[0].graph.inflight()), (64 * MIB, 1), "only the first reserved");
        after_launch_on(&gpus, first.get().unwrap());
        assert_eq!(gpus[0].graph.inflight(), 0);
    }

    /// A whole launch (reservation, mapping, settle, end) between another launch's read of the
    /// pool and its reservation: the figures it read predate that mapping, which the count now
    /// holds, so they are asked for again (they showed the pool empty and the count covering
    /// its need: it reserved nothing).
    #[test]
    fn figures_older_than_another_launch_are_asked_for_again() {
        let (gm, gpus) = two_execs();
        let asked = std::cell::Cell::new(0);
        let second = before_launch_on(&gm, &gpus, 0x3000, &|_| {
            asked.set(asked.get() + 1);
            if asked.get() == 1 {
                let on = before_launch_on(&gm, &gpus, 0x2000, &|_| (Some(0), Some(0))).expect("the first fits");
                after_launch_on(&gpus, on);
                (Some(0), Some(0))
            } else {
                (Some(64 * MIB), Some(64 * MIB))
            }
        });
        assert_eq!(second, Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "asked {} times", asked.get());
        assert_eq!(asked.get(), 2, "the stale figures were asked for again");
        assert_eq!((gpus[0].quota.used(), gpus[0].graph.inflight()), (64 * MIB, 0));
    }

    /// Figures made stale at every try: the launch sizes its growth as if nothing in the pool
    /// were reusable (its footprint and every pending one), never from stale figures.
    #[test]
    fn figures_stale_at_every_try_size_the_launch_without_them() {
        let (gm, gpus) = two_execs();
        let asked = std::cell::Cell::new(0);
        let on = before_launch_on(&gm, &gpus, 0x3000, &|_| {
            asked.set(asked.get() + 1);
            // A launch without footprint elsewhere bumps the epoch each time.
            assert!(gpus[0].graph.begin(&gpus[0].quota, |_| 0));
            gpus[0].graph.end();
            (Some(0), Some(100 * MIB))
        })
        .expect("64 MiB fits");
        assert_eq!(asked.get(), FRESH_TRIES);
        assert_eq!(gpus[0].quota.used(), 64 * MIB, "its footprint, not the stale reserved 100 MiB");
        after_launch_on(&gpus, on);
    }

    /// Review finding: the pending footprints of launches in flight were added to every
    /// launch's need, its own exec's too. One 64 MiB exec already launched once (counted and
    /// reserved 64 MiB), launched from two threads at once under a 100 MiB quota: the second
    /// needed `max(64, 0 + 64 + 64) - 64 = 64` and was refused, though its launch is ordered
    /// behind the first's and maps nothing new. Both fit now, and nothing more is reserved.
    #[test]
    fn one_exec_launched_from_two_threads_at_once_within_the_quota_both_fit() {
        let (gm, gpus) = two_execs();
        let once = before_launch_on(&gm, &gpus, 0x2000, &|_| (Some(0), Some(0))).expect("the first launch fits");
        after_launch_on(&gpus, once);
        assert_eq!(gpus[0].quota.used(), 64 * MIB);
        // The pool keeps its 64 MiB, unused between launches.
        let figures = |_| (Some(0), Some(64 * MIB));
        let first = before_launch_on(&gm, &gpus, 0x2000, &figures).expect("the first thread's launch fits");
        let second = before_launch_on(&gm, &gpus, 0x2000, &figures);
        assert!(second.is_ok(), "the second thread's launch of the same exec was refused");
        assert_eq!((gpus[0].quota.used(), gpus[0].graph.inflight()), (64 * MIB, 2), "nothing more reserved");
        after_launch_on(&gpus, first);
        after_launch_on(&gpus, second.unwrap());
        assert_eq!(gpus[0].graph.inflight(), 0);
        // Another exec still counts that exec's launches in flight (once, not per launch).
        let a = before_launch_on(&gm, &gpus, 0x2000, &figures).expect("fits");
        let b = before_launch_on(&gm, &gpus, 0x2000, &figures).expect("fits");
        let other = before_launch_on(&gm, &gpus, 0x3000, &figures);
        assert_eq!(other, Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "64 MiB in flight + 64 MiB > 100 MiB");
        assert_eq!(gpus[0].quota.used(), 64 * MIB);
        after_launch_on(&gpus, a);
        after_launch_on(&gpus, b);
    }

    /// Review finding: a launch in flight that has already mapped is in the driver's `used`,
    /// and its pending footprint was added on top: a 64 MiB exec mapped (used = reserved =
    /// counted = 64 MiB) and a 32 MiB exec launched beside it under a 100 MiB quota needed
    /// `max(64, 64 + 32 + 64) - 64 = 96` MiB and was refused, though the pool can grow by its
    /// 32 MiB at most. A launch never reserves more than its footprint beyond the count (plus
    /// what the pool holds uncounted).
    #[test]
    fn a_launch_in_flight_that_mapped_is_not_counted_twice() {
        let (gm, gpus) = two_execs();
        assert!(gm.node_added(0x1200, 0, 32 * MIB));
        assert!(gm.instantiated(0x1200, 0x4000, 1));
        let mapped = before_launch_on(&gm, &gpus, 0x2000, &|_| (Some(0), Some(0))).expect("fits");
        let beside = before_launch_on(&gm, &gpus, 0x4000, &|_| (Some(64 * MIB), Some(64 * MIB)));
        assert!(beside.is_ok(), "64 + 32 MiB fit in 100 MiB");
        assert_eq!(gpus[0].quota.used(), 96 * MIB);
        after_launch_on(&gpus, mapped);
        after_launch_on(&gpus, beside.unwrap());
    }

    /// Review finding: a child graph with memory nodes moved into a parent (`cuGraphAddNode`,
    /// `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`) took them out of the count: only memory nodes
    /// were recorded, so the parent's exec had no footprint and its launches mapped the child's
    /// memory unreserved. The child's bytes now move with it (nested children too), and stay
    /// where they were when the driver refuses the move.
    #[test]
    fn a_child_graph_moved_into_a_parent_brings_its_memory_nodes() {
        let gm = GraphMem::new();
        assert!(gm.node_added(0x1000, 0, 64 * MIB), "the child's memory node");
        assert!(gm.node_added(0x1000, 1, 8 * MIB));
        assert!(gm.node_added(0x2000, 0, 4 * MIB), "one of the parent's own");
        let refused = child_moved(&gm, 0x2000, 0x1000, 2, || CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(refused, CUresult::CUDA_ERROR_INVALID_VALUE);
        assert!(gm.instantiated(0x2000, 0x2100, 2));
        assert_eq!((gm.footprint(0x2100, 0), gm.footprint(0x2100, 1)), (4 * MIB, 0), "a refused move moves nothing");
        assert_eq!(child_moved(&gm, 0x2000, 0x1000, 2, || CUresult::CUDA_SUCCESS), CUresult::CUDA_SUCCESS);
        assert!(gm.instantiated(0x2000, 0x2200, 2));
        assert_eq!((gm.footprint(0x2200, 0), gm.footprint(0x2200, 1)), (68 * MIB, 8 * MIB), "the parent's exec maps the child's nodes too");
        assert!(gm.instantiated(0x1000, 0x1100, 2));
        assert_eq!(gm.footprint(0x1100, 0), 0, "the child's record went with it (its handle may be reused)");
        // The parent moved on into a grandparent: everything with it.
        assert_eq!(child_moved(&gm, 0x3000, 0x2000, 2, || CUresult::CUDA_SUCCESS), CUresult::CUDA_SUCCESS);
        assert!(gm.instantiated(0x3000, 0x3100, 2));
        assert_eq!((gm.footprint(0x3100, 0), gm.footprint(0x3100, 1)), (68 * MIB, 8 * MIB));
    }

    /// Threads whose streams joined one capture add nodes to one graph at once: every node's
    /// bytes are in the footprint (a read-modify-write without the lock loses some).
    #[test]
    fn concurrent_nodes_of_one_graph_are_all_counted() {
        let gm = std::sync::Arc::new(GraphMem::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let gm = gm.clone();
                std::thread::spawn(move || {
                    for _ in 0..5_000 {
                        assert!(gm.node_added(0x1000, 0, 1));
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert!(gm.instantiated(0x1000, 0x2000, 1));
        assert_eq!(gm.footprint(0x2000, 0), 20_000);
    }

    /// With no room to record a memory node or an exec's footprint, the shim refuses (the
    /// caller fails the call), never lets a graph launch unreserved; a node the driver refused
    /// is taken off its graph again.
    #[test]
    fn full_tables_refuse_never_launch_unreserved() {
        let gm = GraphMem { seen: AtomicBool::new(false), graphs: PtrMap::new(16), execs: PtrMap::new(16), update: crate::spin::SpinLock::new() };
        assert!(gm.node_added(0x1000, 0, 10));
        assert!(gm.node_added(0x1000, 0, 5));
        gm.node_not_added(0x1000, 0, 5);
        assert!(gm.instantiated(0x1000, 0x2000, 1));
        assert_eq!(gm.footprint(0x2000, 0), 10, "the refused node is not in the footprint");
        let mut refused = 0;
        for g in 0..64u64 {
            if !gm.node_added(0x10_0000 + g * 0x100, 0, 1) {
                refused += 1;
            }
        }
        assert!(refused > 0, "a 16-entry table refuses some of 64 graphs");
        assert_eq!(gm.footprint(0x2000, 0), 10);
        let mut refused = 0;
        for e in 0..64u64 {
            if !gm.instantiated(0x1000, 0x20_0000 + e * 0x100, 1) {
                refused += 1;
                assert_eq!(gm.footprint(0x20_0000 + e * 0x100, 0), 0, "nothing half-recorded");
            }
        }
        assert!(refused > 0, "a 16-entry exec table refuses some of 64 execs");
    }
}
