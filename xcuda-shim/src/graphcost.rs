//! Graph launch pricing: an exec is priced by the kernel nodes of the graph it was instantiated
//! from, walked once at instantiation, and each launch takes that price from the throttle: the
//! blocks of all its kernel nodes at the launching GPU's price per block
//! ([`xshare_control::Throttle::kernel_cost`]), as if each kernel had been launched on its own.
//! Before, a graph launch cost a flat `graph_launch_waves` whatever it held (a graph of 200
//! kernels of 50 waves each paid 8 waves for 10,000).
//!
//! - The walk: `cuGraphGetNodes`, `cuGraphNodeGetType` per node; a kernel node adds its grid
//!   (`cuGraphKernelNodeGetParams_v2`, the v1 entry on a driver older than CUDA 12.0), a child
//!   graph node its child's blocks (at most [`MAX_DEPTH`] levels down); copy, set, host, event,
//!   semaphore, memory, batch memory-op and empty nodes run no kernel on the SMs: nothing. At
//!   most [`MAX_NODES`] nodes are visited. Never on the launch path, which reads one map entry.
//! - Fail closed: a graph the walk cannot price in full (a conditional node, whose body may run
//!   any number of times; a node type the shim does not know; a query the driver refuses; past
//!   the node or depth cap) costs what was walked plus the flat `graph_launch_waves` at each
//!   launch. An exec with no price at all pays the flat cost; the shim lets none live
//!   ([`GraphCost::instantiated`] refuses an exec it has no room to price).
//! - Changes: `cuGraphExecUpdate` prices the exec again from its new graph; a node's new
//!   parameters in an exec (`cuGraphExecKernelNodeSetParams`, `cuGraphExecNodeSetParams`,
//!   `cuGraphExecChildGraphNodeSetParams`) replace that node's blocks in the exec's price. The
//!   blocks of each top-level node are recorded per exec at instantiation (not read back from
//!   the graph node, which the application may have changed since); a node without a record
//!   (no room for it, or nested in a child graph) is taken to have had none: the exec pays its
//!   new blocks on top (more, never less).
//! - CUDA forbids using one exec from two threads at once (graph objects are not thread-safe):
//!   a launch concurrent with a change of its exec pays the old price or the new one. Changes
//!   and the destruction of an exec are serialised with their records
//!   ([`GraphCost::changing`]), so two changes of one exec on two threads leave the price of
//!   the one the driver applied last.
//! - Not seen: graphs launched from the device (`cudaGraphLaunch` in a kernel) and kernel node
//!   updates made from the device.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use cuda_abi::{CUgraph, CUgraphNode, CUgraphNodeType as T, CUresult, CUDA_KERNEL_NODE_PARAMS_v2};

use crate::ptrmap::PtrMap;
use crate::state::call_real;

/// Nodes one walk visits at most (child graphs' included); a bigger graph is priced as what
/// was walked plus the flat cost.
pub const MAX_NODES: usize = 65_536;
/// Child graph levels one walk descends at most.
pub const MAX_DEPTH: u32 = 8;
/// Execs priced at once (a process with more live execs has its next instantiations refused).
pub const EXEC_CAPACITY: usize = 16_384;
/// Top-level nodes whose blocks are recorded per exec (for node updates).
pub const NODE_CAPACITY: usize = 65_536;

/// Bit of an exec's price word: the walk did not price the whole graph (flat cost added).
const UNPRICED: u64 = 1 << 63;
/// Blocks an exec's price word holds at most (far past the throttle's cost cap).
const BLOCKS_MAX: u64 = UNPRICED - 1;

/// What a walk of a graph found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Price {
    /// Thread blocks of all kernel nodes (saturating).
    pub blocks: u64,
    /// Kernel nodes priced.
    pub kernels: u64,
    /// Whether every node was priced (else the flat cost is added at launch).
    pub complete: bool,
}

impl Price {
    /// The price of one kernel of `blocks` blocks.
    pub fn kernel(blocks: u64) -> Self {
        Self { blocks, kernels: 1, complete: true }
    }

    fn word(&self) -> u64 {
        self.blocks.min(BLOCKS_MAX) | if self.complete { 0 } else { UNPRICED }
    }
}

/// Blocks of a `x` x `y` x `z` grid (saturating).
pub fn grid_blocks(x: u32, y: u32, z: u32) -> u64 {
    u64::from(x).saturating_mul(u64::from(y)).saturating_mul(u64::from(z))
}

/// What a walk reads of a graph: the driver's graph queries ([`Driver`]), a fake in tests.
/// `None` from any of them: the driver refused (the graph is not priced in full).
pub trait GraphSource {
    /// The nodes of `graph`, at most `limit`, and whether those are all of them.
    fn nodes(&self, graph: u64, limit: usize) -> Option<(Vec<u64>, bool)>;
    /// The type of `node`.
    fn node_type(&self, node: u64) -> Option<T>;
    /// The blocks of kernel node `node`'s grid.
    fn kernel_blocks(&self, node: u64) -> Option<u64>;
    /// The graph of child graph node `node`.
    fn child_graph(&self, node: u64) -> Option<u64>;
}

/// Node types that run no kernel on the SMs.
fn runs_no_kernel(t: T) -> bool {
    matches!(
        t,
        T::CU_GRAPH_NODE_TYPE_MEMCPY
            | T::CU_GRAPH_NODE_TYPE_MEMSET
            | T::CU_GRAPH_NODE_TYPE_HOST
            | T::CU_GRAPH_NODE_TYPE_EMPTY
            | T::CU_GRAPH_NODE_TYPE_WAIT_EVENT
            | T::CU_GRAPH_NODE_TYPE_EVENT_RECORD
            | T::CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL
            | T::CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT
            | T::CU_GRAPH_NODE_TYPE_MEM_ALLOC
            | T::CU_GRAPH_NODE_TYPE_MEM_FREE
            | T::CU_GRAPH_NODE_TYPE_BATCH_MEM_OP
    )
}

/// Prices `graph` from `src`; `top` is told each top-level kernel or child graph node with its
/// blocks (a child graph node: its whole child's).
pub fn walk(src: &dyn GraphSource, graph: u64, top: &mut dyn FnMut(u64, u64)) -> Price {
    let mut p = Price { complete: true, ..Price::default() };
    let mut left = MAX_NODES;
    p.blocks = walk_in(src, graph, 0, &mut left, &mut p, Some(top));
    p
}

/// The blocks of `graph` at `depth`, visiting at most `left` more nodes; what could not be
/// priced clears `p.complete`.
fn walk_in(src: &dyn GraphSource, graph: u64, depth: u32, left: &mut usize, p: &mut Price, mut top: Option<&mut dyn FnMut(u64, u64)>) -> u64 {
    let Some((nodes, all)) = src.nodes(graph, *left) else {
        p.complete = false;
        return 0;
    };
    p.complete &= all;
    let mut sum = 0u64;
    for n in nodes {
        if *left == 0 {
            p.complete = false;
            break;
        }
        *left -= 1;
        let b = match src.node_type(n) {
            Some(T::CU_GRAPH_NODE_TYPE_KERNEL) => match src.kernel_blocks(n) {
                Some(b) => {
                    p.kernels += 1;
                    b
                }
                None => {
                    p.complete = false;
                    continue;
                }
            },
            Some(T::CU_GRAPH_NODE_TYPE_GRAPH) => match src.child_graph(n) {
                Some(child) if depth < MAX_DEPTH => walk_in(src, child, depth + 1, left, p, None),
                _ => {
                    p.complete = false;
                    continue;
                }
            },
            Some(t) if runs_no_kernel(t) => continue,
            // A conditional node (its body may run any number of times), a type this shim does
            // not know, or no answer: fail closed.
            _ => {
                p.complete = false;
                continue;
            }
        };
        sum = sum.saturating_add(b);
        if let Some(f) = top.as_mut() {
            f(n, b);
        }
    }
    sum
}

/// The real driver's graph queries.
pub struct Driver;

impl GraphSource for Driver {
    fn nodes(&self, graph: u64, limit: usize) -> Option<(Vec<u64>, bool)> {
        let g = graph as CUgraph;
        let mut n: usize = 0;
        let rc = call_real!(cuGraphGetNodes: cuda_abi::PFN_cuGraphGetNodes_v10000, g, std::ptr::null_mut(), &mut n);
        if rc != CUresult::CUDA_SUCCESS {
            return None;
        }
        // One slot more than asked for: a graph grown since the count shows in it.
        let want = n.min(limit);
        let mut buf: Vec<CUgraphNode> = vec![std::ptr::null_mut(); want + 1];
        let mut got = buf.len();
        let rc = call_real!(cuGraphGetNodes: cuda_abi::PFN_cuGraphGetNodes_v10000, g, buf.as_mut_ptr(), &mut got);
        if rc != CUresult::CUDA_SUCCESS {
            return None;
        }
        let all = n <= limit && got <= n;
        Some((buf[..got.min(want)].iter().filter(|p| !p.is_null()).map(|p| *p as u64).collect(), all))
    }

    fn node_type(&self, node: u64) -> Option<T> {
        let mut t = T(u32::MAX);
        let rc = call_real!(cuGraphNodeGetType: cuda_abi::PFN_cuGraphNodeGetType_v10000, node as CUgraphNode, &mut t);
        (rc == CUresult::CUDA_SUCCESS).then_some(t)
    }

    fn kernel_blocks(&self, node: u64) -> Option<u64> {
        // SAFETY: all-zero is a valid CUDA_KERNEL_NODE_PARAMS_v2 (integers and null pointers).
        let mut p: CUDA_KERNEL_NODE_PARAMS_v2 = unsafe { std::mem::zeroed() };
        let rc = if crate::real::driver(crate::interpose::Sym::cuGraphKernelNodeGetParams_v2).is_null() {
            // A driver older than CUDA 12.0: the v1 entry fills the v1 struct, v2's prefix.
            let v1 = (&mut p as *mut CUDA_KERNEL_NODE_PARAMS_v2).cast::<cuda_abi::CUDA_KERNEL_NODE_PARAMS_v1>();
            call_real!(cuGraphKernelNodeGetParams: cuda_abi::PFN_cuGraphKernelNodeGetParams_v10000, node as CUgraphNode, v1)
        } else {
            call_real!(cuGraphKernelNodeGetParams_v2: cuda_abi::PFN_cuGraphKernelNodeGetParams_v12000, node as CUgraphNode, &mut p)
        };
        (rc == CUresult::CUDA_SUCCESS).then(|| grid_blocks(p.gridDimX, p.gridDimY, p.gridDimZ))
    }

    fn child_graph(&self, node: u64) -> Option<u64> {
        let mut g: CUgraph = std::ptr::null_mut();
        let rc = call_real!(cuGraphChildGraphNodeGetGraph: cuda_abi::PFN_cuGraphChildGraphNodeGetGraph_v10000, node as CUgraphNode, &mut g);
        (rc == CUresult::CUDA_SUCCESS && !g.is_null()).then_some(g as u64)
    }
}

/// The price of each exec and the blocks of its top-level nodes.
pub struct GraphCost {
    /// exec -> price word (blocks, [`UNPRICED`] bit); owner word: its kernel nodes.
    execs: PtrMap,
    /// top-level node -> its blocks in the exec of the owner word.
    nodes: PtrMap,
    /// Held while the maps change (never on the launch path; freed in a fork child).
    update: crate::spin::SpinLock,
    /// One of these, chosen by the exec's handle ([`GraphCost::changing`]), is held across an
    /// exec change's driver call and the record of its new price, and across an exec's
    /// destruction (the hooks in `api`; taken before `update`; freed in a fork child). Two
    /// changes of one exec on two threads (which CUDA forbids, and a tenant may do anyway)
    /// would otherwise record in another order than the driver applied them (the exec priced
    /// by the smaller grid while it runs the bigger one), and a change recorded after the exec
    /// was destroyed and its handle handed to a new exec would price the new one. Striped, so
    /// that changes of different execs do not wait for each other's driver calls and walks.
    change: [crate::spin::SpinLock; CHANGE_STRIPES],
}

/// Stripes of [`GraphCost::changing`]'s lock.
const CHANGE_STRIPES: usize = 64;

impl Default for GraphCost {
    fn default() -> Self {
        Self::with_capacity(EXEC_CAPACITY, NODE_CAPACITY)
    }
}

impl GraphCost {
    /// Empty maps with room for `execs` execs and `nodes` node records.
    pub fn with_capacity(execs: usize, nodes: usize) -> Self {
        Self { execs: PtrMap::new(execs), nodes: PtrMap::new(nodes), update: crate::spin::SpinLock::new(), change: [const { crate::spin::SpinLock::new() }; CHANGE_STRIPES] }
    }

    /// Milli-waves a launch of `exec` takes from `t`: its kernels' blocks at `t`'s price per
    /// block (each kernel at least the 1 milli-wave a launch of its own costs), plus the flat
    /// graph cost if its graph was not priced in full; the flat cost alone for an exec with no
    /// price. One map lookup: atomics only.
    #[inline]
    pub fn launch_cost(&self, exec: u64, t: &xshare_control::Throttle) -> i64 {
        match self.execs.get_owned(exec) {
            None => t.graph_cost(),
            Some((word, kernels)) => {
                let k = t.kernel_cost(word & BLOCKS_MAX).max(i64::try_from(kernels).unwrap_or(i64::MAX));
                if word & UNPRICED != 0 {
                    k.saturating_add(t.graph_cost())
                } else {
                    k
                }
            }
        }
    }

    /// `exec` was instantiated from `graph`: priced by a walk of it through `src`, its top-level
    /// nodes' blocks recorded (as many as there is room for). `false`: no room for the exec
    /// (said once); the caller destroys it. Charging such an exec the flat cost instead would
    /// let a process escape the throttle by filling the table first.
    pub fn instantiated(&self, exec: u64, graph: u64, src: &dyn GraphSource) -> bool {
        let mut top = Vec::new();
        let p = walk(src, graph, &mut |n, b| top.push((n, b)));
        let _one = self.update.lock();
        // A handle the driver hands out again: nothing of the old exec is left (its destroy
        // took it), but a second entry would shadow the new price. An exec that went without
        // our destroy (with its context) leaves its node records too: they go with it.
        let mut stale = false;
        while self.execs.remove(exec).is_some() {
            stale = true;
        }
        if stale {
            self.nodes.remove_owned_by(exec);
        }
        if !self.execs.insert_owned(exec, p.word(), p.kernels) {
            table_full();
            return false;
        }
        self.record_nodes(exec, &top);
        true
    }

    /// Records `exec`'s top-level node blocks `top` until the table is full (a node without a
    /// record is priced as having had no blocks when it changes: more, never less).
    fn record_nodes(&self, exec: u64, top: &[(u64, u64)]) {
        for &(n, b) in top {
            if !self.nodes.insert_owned(n, b, exec) {
                break;
            }
        }
    }

    /// The lock that serialises the changes and the destruction of `exec` with their records
    /// (see the field `change`).
    pub fn changing(&self, exec: u64) -> crate::spin::SpinGuard<'_> {
        // Handles are pointers: their low bits are alignment.
        let i = ((exec >> 4) ^ (exec >> 12)) as usize % CHANGE_STRIPES;
        self.change[i].lock()
    }

    /// In a fork child: whoever held a change lock is not there.
    pub fn reset_after_fork(&self) {
        self.update.reset_after_fork();
        self.change.iter().for_each(crate::spin::SpinLock::reset_after_fork);
    }

    /// `exec` is about to be destroyed: its price and records go now, before the driver frees
    /// the handle (another thread's instantiation may get it at once). Returns what
    /// [`GraphCost::not_destroyed`] puts back if the driver refuses.
    pub fn destroying(&self, exec: u64) -> Option<(u64, u64)> {
        let _one = self.update.lock();
        let taken = self.execs.remove_where(exec, |_| true);
        if taken.is_some() {
            self.nodes.remove_owned_by(exec);
        }
        taken
    }

    /// The driver refused to destroy `exec`: its price (`taken` by [`GraphCost::destroying`])
    /// comes back; its node records do not (its node changes then cost more, never less).
    pub fn not_destroyed(&self, exec: u64, taken: Option<(u64, u64)>) {
        if let Some((word, kernels)) = taken {
            let _one = self.update.lock();
            if !self.execs.insert_owned(exec, word, kernels) {
                table_full();
            }
        }
    }

    /// `exec` was updated from `graph` (`cuGraphExecUpdate`): priced again from a walk of it.
    pub fn updated(&self, exec: u64, graph: u64, src: &dyn GraphSource) {
        let mut top = Vec::new();
        let p = walk(src, graph, &mut |n, b| top.push((n, b)));
        let _one = self.update.lock();
        self.nodes.remove_owned_by(exec);
        if self.execs.set(exec, p.word()) {
            self.execs.update_owner(exec, |_| Some(p.kernels));
        } else if !self.execs.insert_owned(exec, p.word(), p.kernels) {
            table_full();
        }
        self.record_nodes(exec, &top);
    }

    /// Top-level node `node` of `exec` runs `now` from the next launch on (new kernel
    /// parameters, a new child graph; the driver accepted them): the exec's price takes `now`'s
    /// blocks in place of the node's recorded ones (none recorded: on top).
    pub fn node_set(&self, exec: u64, node: u64, now: Price) {
        let _one = self.update.lock();
        let Some(word) = self.execs.get(exec) else { return };
        let old = self.nodes.remove_where(node, |o| o == exec).map_or(0, |(b, _)| b);
        let blocks = word & BLOCKS_MAX;
        // A saturated price stays so: what it holds beyond the cap is unknown.
        let rest = if blocks == BLOCKS_MAX { blocks } else { blocks.saturating_sub(old) };
        let _ = self.nodes.insert_owned(node, now.blocks, exec);
        let p = Price { blocks: rest.saturating_add(now.blocks), kernels: 0, complete: word & UNPRICED == 0 && now.complete };
        self.execs.set(exec, p.word());
    }

    /// `(blocks, priced in full)` of `exec`, if it has a price (tests, logs).
    pub fn price_of(&self, exec: u64) -> Option<(u64, bool)> {
        self.execs.get(exec).map(|w| (w & BLOCKS_MAX, w & UNPRICED == 0))
    }
}

/// Logs, once per process, that the exec price table is full.
fn table_full() {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        crate::state::logged(|| tracing::error!("xcuda: graph exec price table full: instantiations past it are refused (CUDA_ERROR_OUT_OF_MEMORY)"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A fake graph store: graph -> nodes; node -> (type, blocks or child graph).
    #[derive(Default)]
    struct Fake {
        graphs: HashMap<u64, Vec<u64>>,
        nodes: HashMap<u64, (T, u64)>,
        refused: Vec<u64>,
    }

    impl Fake {
        fn add(&mut self, graph: u64, node: u64, t: T, v: u64) {
            self.graphs.entry(graph).or_default().push(node);
            self.nodes.insert(node, (t, v));
        }
    }

    impl GraphSource for Fake {
        fn nodes(&self, graph: u64, limit: usize) -> Option<(Vec<u64>, bool)> {
            let all = self.graphs.get(&graph)?;
            Some((all.iter().take(limit).copied().collect(), all.len() <= limit))
        }
        fn node_type(&self, node: u64) -> Option<T> {
            self.nodes.get(&node).map(|(t, _)| *t)
        }
        fn kernel_blocks(&self, node: u64) -> Option<u64> {
            if self.refused.contains(&node) {
                return None;
            }
            self.nodes.get(&node).filter(|(t, _)| *t == T::CU_GRAPH_NODE_TYPE_KERNEL).map(|(_, b)| *b)
        }
        fn child_graph(&self, node: u64) -> Option<u64> {
            self.nodes.get(&node).filter(|(t, _)| *t == T::CU_GRAPH_NODE_TYPE_GRAPH).map(|(_, g)| *g)
        }
    }

    const K: T = T::CU_GRAPH_NODE_TYPE_KERNEL;

    fn price(f: &Fake, g: u64) -> Price {
        walk(f, g, &mut |_, _| {})
    }

    fn throttle(sms: u32) -> xshare_control::Throttle {
        xshare_control::Throttle::new(&Default::default(), sms)
    }

    #[test]
    fn kernels_add_their_blocks_and_copies_cost_nothing() {
        let mut f = Fake::default();
        f.add(1, 10, K, 100);
        f.add(1, 11, T::CU_GRAPH_NODE_TYPE_MEMCPY, 0);
        f.add(1, 12, K, 28);
        f.add(1, 13, T::CU_GRAPH_NODE_TYPE_MEM_ALLOC, 0);
        f.add(1, 14, T::CU_GRAPH_NODE_TYPE_EVENT_RECORD, 0);
        assert_eq!(price(&f, 1), Price { blocks: 128, kernels: 2, complete: true });
        f.graphs.insert(2, vec![]);
        assert_eq!(price(&f, 2), Price { blocks: 0, kernels: 0, complete: true });
    }

    #[test]
    fn blocks_saturate() {
        assert_eq!(grid_blocks(u32::MAX, u32::MAX, u32::MAX), u64::MAX);
        assert_eq!(grid_blocks(2, 3, 4), 24);
        let mut f = Fake::default();
        f.add(1, 10, K, u64::MAX);
        f.add(1, 11, K, u64::MAX);
        assert_eq!(price(&f, 1).blocks, u64::MAX);
        assert_eq!(Price { blocks: u64::MAX, kernels: 2, complete: true }.word(), BLOCKS_MAX, "the flag bit stays clear");
    }

    #[test]
    fn child_graphs_are_walked_to_a_bounded_depth() {
        let mut f = Fake::default();
        f.add(1, 10, K, 5);
        f.add(1, 11, T::CU_GRAPH_NODE_TYPE_GRAPH, 2);
        f.add(2, 20, K, 7);
        f.add(2, 21, T::CU_GRAPH_NODE_TYPE_GRAPH, 3);
        f.add(3, 30, K, 11);
        let mut top = Vec::new();
        let p = walk(&f, 1, &mut |n, b| top.push((n, b)));
        assert_eq!(p, Price { blocks: 23, kernels: 3, complete: true });
        assert_eq!(top, vec![(10, 5), (11, 18)], "top-level nodes only, a child with its subtree's blocks");
        // A chain deeper than MAX_DEPTH: what was walked, not in full.
        let mut deep = Fake::default();
        for d in 0..=u64::from(MAX_DEPTH) + 1 {
            deep.add(100 + d, 1000 + d, K, 1);
            deep.add(100 + d, 2000 + d, T::CU_GRAPH_NODE_TYPE_GRAPH, 101 + d);
        }
        let p = price(&deep, 100);
        assert!(!p.complete);
        assert_eq!(p.blocks, u64::from(MAX_DEPTH) + 1);
    }

    #[test]
    fn conditional_unknown_and_refused_nodes_fail_closed() {
        for bad in [T::CU_GRAPH_NODE_TYPE_CONDITIONAL, T(99)] {
            let mut f = Fake::default();
            f.add(1, 10, K, 40);
            f.add(1, 11, bad, 0);
            assert_eq!(price(&f, 1), Price { blocks: 40, kernels: 1, complete: false }, "{bad:?}");
        }
        let mut f = Fake::default();
        f.add(1, 10, K, 40);
        f.add(1, 11, K, 40);
        f.refused.push(11);
        assert_eq!(price(&f, 1), Price { blocks: 40, kernels: 1, complete: false });
        assert!(!price(&f, 9).complete, "an unknown graph");
        // A child graph node whose graph the driver does not give.
        f.add(1, 12, T::CU_GRAPH_NODE_TYPE_GRAPH, 77);
        f.refused.clear();
        assert!(!price(&f, 1).complete);
    }

    #[test]
    fn past_the_node_cap_is_not_priced_in_full() {
        let mut f = Fake::default();
        for n in 0..MAX_NODES as u64 + 5 {
            f.add(1, 10 + n, K, 1);
        }
        let p = price(&f, 1);
        assert_eq!((p.blocks, p.complete), (MAX_NODES as u64, false));
    }

    #[test]
    fn a_launch_pays_its_kernels_or_the_flat_cost() {
        let t = throttle(100);
        let c = GraphCost::with_capacity(16, 64);
        let mut f = Fake::default();
        for n in 0..200 {
            f.add(1, 0x1000 + n, K, 5000);
        }
        assert_eq!(c.launch_cost(0xe1, &t), t.graph_cost(), "unknown exec: flat");
        assert!(c.instantiated(0xe1, 1, &f));
        assert_eq!(c.launch_cost(0xe1, &t), t.kernel_cost(200 * 5000), "200 kernels of 50 waves");
        assert_eq!(c.launch_cost(0xe1, &t), 200 * t.kernel_cost(5000));
        // Not in full: what was walked plus the flat cost.
        f.add(2, 0x3000, K, 5000);
        f.add(2, 0x3001, T::CU_GRAPH_NODE_TYPE_CONDITIONAL, 0);
        assert!(c.instantiated(0xe2, 2, &f));
        assert_eq!(c.launch_cost(0xe2, &t), t.kernel_cost(5000) + t.graph_cost());
        // Copies only: next to nothing (a kernel-free graph runs nothing on the SMs).
        f.add(3, 0x4000, T::CU_GRAPH_NODE_TYPE_MEMSET, 0);
        assert!(c.instantiated(0xe3, 3, &f));
        assert_eq!(c.launch_cost(0xe3, &t), 1);
        // Many one-block kernels cost at least a launch each.
        for n in 0..100 {
            f.add(4, 0x5000 + n, K, 1);
        }
        assert!(c.instantiated(0xe4, 4, &f));
        assert_eq!(c.launch_cost(0xe4, &t), 1000, "100 blocks on 100 SMs: one wave");
        let tiny = throttle(100_000);
        assert_eq!(c.launch_cost(0xe4, &tiny), 100, "each kernel its 1 milli-wave");
    }

    #[test]
    fn a_full_table_refuses_the_exec_and_a_destroy_frees_its_slot() {
        let c = GraphCost::with_capacity(16, 64);
        let mut f = Fake::default();
        f.add(1, 0x10, K, 3);
        for e in 0..16u64 {
            assert!(c.instantiated(0x1000 + e * 0x100, 1, &f));
        }
        assert!(!c.instantiated(0x9000, 1, &f), "no room: refused, never priced flat");
        assert_eq!(c.price_of(0x9000), None);
        let taken = c.destroying(0x1000);
        assert_eq!(taken, Some((3, 1)));
        assert_eq!(c.price_of(0x1000), None);
        assert!(c.instantiated(0x9000, 1, &f));
        // A refused destroy puts the price back (here: no room left for it).
        c.not_destroyed(0x1000, taken);
        assert_eq!(c.price_of(0x1000), None);
        let taken = c.destroying(0x9000);
        c.not_destroyed(0x9000, taken);
        assert_eq!(c.price_of(0x9000), Some((3, true)));
    }

    #[test]
    fn node_changes_replace_the_recorded_blocks() {
        let c = GraphCost::with_capacity(16, 64);
        let mut f = Fake::default();
        f.add(1, 0x10, K, 100);
        f.add(1, 0x11, K, 50);
        assert!(c.instantiated(0xe, 1, &f));
        assert!(c.instantiated(0xf, 1, &f), "a second exec of the same graph");
        assert_eq!(c.price_of(0xe), Some((150, true)));
        // Same grid (new arguments): no change; repeated: still none.
        c.node_set(0xe, 0x10, Price::kernel(100));
        c.node_set(0xe, 0x10, Price::kernel(100));
        assert_eq!(c.price_of(0xe), Some((150, true)));
        // Grown, then shrunk again: the exec's price follows (the exec's own record, not the graph's).
        c.node_set(0xe, 0x10, Price::kernel(1000));
        assert_eq!(c.price_of(0xe), Some((1050, true)));
        c.node_set(0xe, 0x10, Price::kernel(10));
        assert_eq!(c.price_of(0xe), Some((60, true)));
        assert_eq!(c.price_of(0xf), Some((150, true)), "the other exec is untouched");
        // A node the exec has no record of (nested, or no room): its blocks on top.
        c.node_set(0xe, 0x99, Price::kernel(7));
        assert_eq!(c.price_of(0xe), Some((67, true)));
        // A child graph that cannot be priced in full: flat cost from now on.
        c.node_set(0xe, 0x11, Price { blocks: 50, kernels: 1, complete: false });
        assert_eq!(c.price_of(0xe), Some((67, false)));
        // An unknown exec stays unknown.
        c.node_set(0xabc, 0x10, Price::kernel(5));
        assert_eq!(c.price_of(0xabc), None);
    }

    #[test]
    fn without_a_node_record_a_change_costs_more_never_less() {
        let c = GraphCost::with_capacity(16, 16);
        let mut f = Fake::default();
        for n in 0..40u64 {
            f.add(1, 0x100 + n * 0x10, K, 10);
        }
        assert!(c.instantiated(0xe, 1, &f), "node records past the table's room are dropped, the exec priced");
        assert_eq!(c.price_of(0xe), Some((400, true)));
        // The last node has no record: its old blocks stay counted.
        c.node_set(0xe, 0x100 + 39 * 0x10, Price::kernel(10));
        assert_eq!(c.price_of(0xe), Some((410, true)));
    }

    #[test]
    fn an_update_prices_the_exec_again() {
        let c = GraphCost::with_capacity(16, 64);
        let mut f = Fake::default();
        f.add(1, 0x10, K, 100);
        f.add(2, 0x20, K, 900);
        f.add(3, 0x30, K, 5);
        f.add(3, 0x31, T::CU_GRAPH_NODE_TYPE_CONDITIONAL, 0);
        assert!(c.instantiated(0xe, 1, &f));
        c.node_set(0xe, 0x10, Price::kernel(300));
        c.updated(0xe, 2, &f);
        assert_eq!(c.price_of(0xe), Some((900, true)));
        c.node_set(0xe, 0x20, Price::kernel(900));
        assert_eq!(c.price_of(0xe), Some((900, true)), "the new graph's nodes are recorded");
        c.updated(0xe, 3, &f);
        assert_eq!(c.price_of(0xe), Some((5, false)));
        c.updated(0xe, 1, &f);
        assert_eq!(c.price_of(0xe), Some((100, true)), "priced in full again");
    }
}
