//! A scripted CUDA driver client for end-to-end tests: loads `libcuda.so.1` with `dlopen`,
//! resolves everything through `cuGetProcAddress_v2`, then runs the steps given as arguments,
//! printing one `key=value` line per result.
//!
//! Steps: `ctx` | `primary` | `destroy` | `release` | `meminfo` | `alloc BYTES` | `free` (last
//! allocation) | `alloc-path KIND BYTES` (plain, pitch, managed, async, pool, vmm, array,
//! array3d, mipmap) | `free-all` (every alloc-path allocation) | `hostile` (bad arguments) | `fork` |
//! `streams BLOCKS CYCLES` (async launches on two streams) | `graph BLOCKS CYCLES NODES` |
//! `graphlegacy BYTES HOW` (graph memory through the legacy `cuGraphInstantiate`) | `spin BLOCKS CYCLES COUNT` (COUNT back-to-back kernels, one sync, emulated time
//! by events) | `sync` | `ready` | `wait` (a line on stdin) | `sleep MS` | `hang` |
//! `procaddr NAME VERSION FLAGS` | `exit`.

// `get!` (resolve a typed driver function through `Cuda`, at `cuGetProcAddress_v2` flags 0)
// for every module of this client.
#[macro_use]
extern crate e2e;

mod graph;
mod hostile;
mod paths;
mod streams;

use cuda_abi::*;
use e2e::client::{die, dlopen, init_or_die, out, Contexts, Events, Kernels, Memory, Resolve, SpinLoad};
use std::ffi::{c_void, CString};
use std::io::{BufRead, Write};
use std::os::raw::{c_int, c_uint};

pub(crate) struct Cuda {
    lib: *mut c_void,
    gpa: PFN_cuGetProcAddress_v12000,
}

impl Resolve for Cuda {
    fn resolve(&self, name: &str, version: c_int) -> *mut c_void {
        self.proc(name, version, 0)
            .unwrap_or_else(|e| die(&format!("resolve {name}: {e:?}")))
    }
}

impl Cuda {
    fn load() -> Cuda {
        let lib = dlopen("libcuda.so.1");
        let sym = CString::new("cuGetProcAddress_v2").expect("no NUL");
        // SAFETY: dlsym on a live handle.
        let p = unsafe { libc::dlsym(lib, sym.as_ptr()) };
        if p.is_null() {
            die("cuGetProcAddress_v2 not exported");
        }
        // SAFETY: the exported symbol has the PFN_cuGetProcAddress_v12000 ABI.
        let gpa = unsafe { std::mem::transmute::<*mut c_void, PFN_cuGetProcAddress_v12000>(p) };
        Cuda { lib, gpa }
    }

    pub(crate) fn proc(
        &self,
        name: &str,
        version: c_int,
        flags: u64,
    ) -> Result<*mut c_void, (CUresult, CUdriverProcAddressQueryResult)> {
        let n = CString::new(name).expect("no NUL");
        let mut p = std::ptr::null_mut();
        let mut q = CUdriverProcAddressQueryResult(99);
        // SAFETY: valid name, out-pointers to locals.
        let r = unsafe { (self.gpa)(n.as_ptr(), &mut p, version, flags, &mut q) };
        if r.is_success() {
            Ok(p)
        } else {
            Err((r, q))
        }
    }

    /// Which exported symbol (from the proc table) has address `p`.
    fn symbol_of(&self, p: *mut c_void) -> String {
        for e in PROC_TABLE {
            let s = CString::new(e.symbol).expect("no NUL");
            // SAFETY: dlsym on a live handle.
            if unsafe { libc::dlsym(self.lib, s.as_ptr()) } == p {
                return e.symbol.to_string();
            }
        }
        "?".into()
    }
}

fn code(r: CUresult) -> u32 {
    r.0
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cu = Cuda::load();
    let Contexts { init, create: ctx_create, destroy: ctx_destroy, retain, release, set_current, sync } =
        Contexts::resolve(&cu);
    let Memory { alloc: mem_alloc, free: mem_free, info: mem_info } = Memory::resolve(&cu);
    let kernels = Kernels::resolve(&cu);
    let launch = kernels.launch;
    let Events { create: ev_create, record: ev_record, .. } = Events::resolve(&cu);
    // The CUDA 12.8 ABI of cuEventElapsedTime (the others use the 2.0 one).
    let ev_elapsed: PFN_cuEventElapsedTime_v12080 = get!(
        cu,
        "cuEventElapsedTime",
        PFN_cuEventElapsedTime_v12080,
        12080
    );

    // SAFETY (all calls below): functions resolved above with their PFN types; arguments are
    // locals or values the driver returned.
    unsafe {
        init_or_die(init);
        let mut ctx: CUcontext = std::ptr::null_mut();
        let mut allocs: Vec<CUdeviceptr> = Vec::new();
        let mut held: Vec<paths::Held> = Vec::new();
        let mut spin_fn: CUfunction = std::ptr::null_mut();
        let load_spin = |f: &mut CUfunction| {
            if f.is_null() {
                *f = kernels.load_spin().unwrap_or_else(|e| {
                    let (SpinLoad::Module(r) | SpinLoad::Function(r)) = e;
                    die(&format!("load spin: {r}"))
                });
            }
        };
        let mut i = 0;
        while i < args.len() {
            let arg = |k: usize| -> String {
                args.get(i + k)
                    .cloned()
                    .unwrap_or_else(|| die(&format!("{} needs {k} argument(s)", args[i])))
            };
            match args[i].as_str() {
                "ctx" => {
                    let r = ctx_create(&mut ctx, 0, 0);
                    out(format!("ctx={}", code(r)));
                }
                "primary" => {
                    let r = retain(&mut ctx, 0);
                    let r2 = if r.is_success() { set_current(ctx) } else { r };
                    out(format!("primary={}", code(r2)));
                }
                "destroy" => out(format!("destroy={}", code(ctx_destroy(ctx)))),
                "release" => out(format!("release={}", code(release(0)))),
                "meminfo" => {
                    let (mut f, mut t) = (0usize, 0usize);
                    let r = mem_info(&mut f, &mut t);
                    out(format!("meminfo={} free={f} total={t}", code(r)));
                }
                "alloc" => {
                    let n: usize = arg(1).parse().unwrap_or_else(|_| die("alloc BYTES"));
                    let mut p: CUdeviceptr = 0;
                    let r = mem_alloc(&mut p, n);
                    if r.is_success() {
                        allocs.push(p);
                    }
                    out(format!("alloc={}", code(r)));
                    i += 1;
                }
                "alloc-path" => {
                    let kind = arg(1);
                    let n: usize = arg(2)
                        .parse()
                        .unwrap_or_else(|_| die("alloc-path KIND BYTES"));
                    i += 2;
                    if !paths::KINDS.contains(&kind.as_str()) {
                        die(&format!(
                            "alloc-path kind must be one of {:?}",
                            paths::KINDS
                        ));
                    }
                    match paths::alloc(&cu, &kind, n) {
                        Ok(h) => {
                            held.push(h);
                            out(format!("path={kind} rc=0"));
                        }
                        Err(r) => out(format!("path={kind} rc={}", code(r))),
                    }
                }
                "free-all" => {
                    let n = held.len();
                    let mut rc = CUresult::CUDA_SUCCESS;
                    while let Some(h) = held.pop() {
                        let r = paths::free(&cu, h);
                        if rc.is_success() {
                            rc = r;
                        }
                    }
                    out(format!("freed={n} rc={}", code(rc)));
                }
                "fork" => {
                    // The child may not use the parent's driver state (real drivers refuse too).
                    let (mut f, mut t) = (0usize, 0usize);
                    let pid = libc::fork();
                    if pid == 0 {
                        let r = mem_info(&mut f, &mut t);
                        println!("forked-child meminfo={}", code(r));
                        let _ = std::io::stdout().flush();
                        libc::_exit(0);
                    }
                    let mut st = 0;
                    libc::waitpid(pid, &mut st, 0);
                    out(format!(
                        "fork-parent meminfo={}",
                        code(mem_info(&mut f, &mut t))
                    ));
                }
                "graph" => {
                    let blocks: c_uint = arg(1)
                        .parse()
                        .unwrap_or_else(|_| die("graph BLOCKS CYCLES NODES"));
                    let cycles: u64 = arg(2)
                        .parse()
                        .unwrap_or_else(|_| die("graph BLOCKS CYCLES NODES"));
                    let nodes: u32 = arg(3)
                        .parse()
                        .unwrap_or_else(|_| die("graph BLOCKS CYCLES NODES"));
                    i += 3;
                    load_spin(&mut spin_fn);
                    out(graph::run(&cu, spin_fn, blocks, cycles, nodes));
                }
                "streams" => {
                    let blocks: c_uint = arg(1)
                        .parse()
                        .unwrap_or_else(|_| die("streams BLOCKS CYCLES"));
                    let cycles: u64 = arg(2)
                        .parse()
                        .unwrap_or_else(|_| die("streams BLOCKS CYCLES"));
                    i += 2;
                    load_spin(&mut spin_fn);
                    out(streams::run(&cu, spin_fn, blocks, cycles));
                }
                "hostile" => {
                    for (case, rc) in hostile::run(&cu) {
                        out(format!("hostile case={case} rc={rc}"));
                    }
                }
                "free" => {
                    let p = allocs.pop().unwrap_or(0);
                    out(format!("free={}", code(mem_free(p))));
                }
                "spin" => {
                    let blocks: c_uint = arg(1)
                        .parse()
                        .unwrap_or_else(|_| die("spin BLOCKS CYCLES COUNT"));
                    let mut cycles: u64 = arg(2)
                        .parse()
                        .unwrap_or_else(|_| die("spin BLOCKS CYCLES COUNT"));
                    let count: u32 = arg(3)
                        .parse()
                        .unwrap_or_else(|_| die("spin BLOCKS CYCLES COUNT"));
                    i += 3;
                    if spin_fn.is_null() {
                        match kernels.load_spin() {
                            Ok(f) => spin_fn = f,
                            Err(SpinLoad::Module(r)) => {
                                out(format!("spin={}", code(r)));
                                i += 1;
                                continue;
                            }
                            Err(SpinLoad::Function(r)) => die(&format!("cuModuleGetFunction {r}")),
                        }
                    }
                    let (mut e0, mut e1): (CUevent, CUevent) =
                        (std::ptr::null_mut(), std::ptr::null_mut());
                    ev_create(&mut e0, 0);
                    ev_create(&mut e1, 0);
                    let wall = std::time::Instant::now();
                    let mut r = ev_record(e0, std::ptr::null_mut());
                    let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
                    for _ in 0..count {
                        if r.is_success() {
                            r = launch(
                                spin_fn,
                                blocks,
                                1,
                                1,
                                32,
                                1,
                                1,
                                0,
                                std::ptr::null_mut(),
                                params.as_mut_ptr(),
                                std::ptr::null_mut(),
                            );
                        }
                    }
                    if r.is_success() {
                        r = ev_record(e1, std::ptr::null_mut());
                    }
                    if r.is_success() {
                        r = sync();
                    }
                    let mut ms = 0f32;
                    if r.is_success() {
                        r = ev_elapsed(&mut ms, e0, e1);
                    }
                    out(format!(
                        "spin={} emulated_ms={ms:.3} wall_ms={:.3}",
                        code(r),
                        wall.elapsed().as_secs_f64() * 1e3
                    ));
                }
                "graphlegacy" => {
                    let n: usize = arg(1).parse().unwrap_or_else(|_| die("graphlegacy BYTES HOW"));
                    out(graph::legacy_mem(&cu, n, &arg(2)));
                    i += 2;
                }
                "sync" => out(format!("sync={}", code(sync()))),
                "ready" => out("ready".into()),
                "wait" => {
                    let mut line = String::new();
                    let _ = std::io::stdin().lock().read_line(&mut line);
                }
                "sleep" => {
                    let ms: u64 = arg(1).parse().unwrap_or_else(|_| die("sleep MS"));
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                    i += 1;
                }
                "hang" => loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                },
                "procaddr" => {
                    let name = arg(1);
                    let v: c_int = arg(2)
                        .parse()
                        .unwrap_or_else(|_| die("procaddr NAME VERSION FLAGS"));
                    let f: u64 = arg(3)
                        .parse()
                        .unwrap_or_else(|_| die("procaddr NAME VERSION FLAGS"));
                    i += 3;
                    match cu.proc(&name, v, f) {
                        Ok(p) => out(format!(
                            "procaddr name={name} rc=0 status=0 symbol={}",
                            cu.symbol_of(p)
                        )),
                        Err((r, q)) => out(format!(
                            "procaddr name={name} rc={} status={} symbol=null",
                            code(r),
                            q.0
                        )),
                    }
                }
                "exit" => std::process::exit(0),
                other => die(&format!("unknown step {other:?}")),
            }
            i += 1;
        }
        let _ = ctx;
    }
}
