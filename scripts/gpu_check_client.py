#!/usr/bin/env python3
"""CUDA and NVML clients for scripts/gpu-check.sh, through ctypes only.

They load the driver the way any CUDA program does (libcuda.so.1 / libnvidia-ml.so.1 by
name), so the same file runs against a real GPU and against the project's emulator, and
under the xcuda shim (LD_PRELOAD) ctypes' dlsym lookups reach the shim's hooks. No package
is needed; `torch-quota` uses the host's PyTorch when it is installed.

Every command prints one JSON object on stdout.
"""
import ctypes
import json
import os
import signal
import sys
import time

MIB = 1 << 20
CUDA_ERROR_OUT_OF_MEMORY = 2


def out(**kw):
    print(json.dumps(kw), flush=True)


class Cuda:
    """The few driver entry points the checks need, with the _v2 ABI names."""

    def __init__(self, device=0):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check("cuInit", 0)
        self.dev = ctypes.c_int()
        self.check("cuDeviceGet", ctypes.byref(self.dev), device)
        self.ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
        self.check("cuCtxSetCurrent", self.ctx)

    def call(self, name, *args):
        return getattr(self.lib, name)(*args)

    def check(self, name, *args):
        r = self.call(name, *args)
        if r != 0:
            raise RuntimeError(f"{name} returned CUresult {r}")

    def alloc(self, nbytes):
        """Device pointer, or the CUresult of a refusal."""
        ptr = ctypes.c_uint64()
        r = self.call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return (ptr.value, 0) if r == 0 else (None, r)

    def free(self, ptr):
        self.check("cuMemFree_v2", ctypes.c_uint64(ptr))

    def mem_info(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def release(self):
        self.check("cuCtxSynchronize")
        self.check("cuDevicePrimaryCtxRelease_v2", self.dev)


def wait_for_stop():
    """Holds until SIGTERM/SIGINT (KeyboardInterrupt, Python's own Ctrl-C path). Short sleeps,
    like a training loop's steps: CPython runs a handler only between bytecodes."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass


def quota(chunk_mib, limit_mib, hold):
    """Allocates chunk after chunk until the driver (or the shim) refuses; reports the total."""
    cu = Cuda()
    _, total = cu.mem_info()
    ptrs, refusal = [], 0
    while len(ptrs) * chunk_mib < limit_mib:
        p, r = cu.alloc(chunk_mib * MIB)
        if p is None:
            refusal = r
            break
        ptrs.append(p)
    out(check="quota", allocated_mib=len(ptrs) * chunk_mib, refusal=refusal,
        reported_total_mib=total // MIB, pid=os.getpid())
    if hold:
        wait_for_stop()
    for p in ptrs:
        cu.free(p)
    cu.release()


def hold(mib):
    """Holds a context and memory until Ctrl-C (KeyboardInterrupt) or SIGTERM; the shim must
    release the context before the process dies."""
    cu = Cuda()
    p, r = cu.alloc(mib * MIB)
    out(check="hold", holding_mib=mib if p else 0, refusal=r, pid=os.getpid())
    signal.signal(signal.SIGINT, signal.default_int_handler)
    wait_for_stop()
    # No explicit release: the interpreter exits with the context live, as training scripts do.


def ctx(hold_after=False):
    """Asks for a context and reports the driver's answer (0, or the refusing CUresult and
    call), then lets it go: what a process gets under the GPU's compute mode. With --hold, a
    context made does work on the GPU (1 MiB allocated, set and synchronised: `work` is the
    first refusal, 0 when all went through) and is kept until SIGTERM/SIGINT (so that MPS lists
    the client meanwhile)."""
    lib = ctypes.CDLL("libcuda.so.1")
    r = lib.cuInit(0)
    at, work = "cuInit", None
    if r == 0:
        dev, c = ctypes.c_int(), ctypes.c_void_p()
        r = lib.cuDeviceGet(ctypes.byref(dev), 0)
        at = "cuDeviceGet"
        if r == 0:
            r = lib.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev)
            at = "cuDevicePrimaryCtxRetain"
            if r == 0 and hold_after:
                # A context is made lazily by some drivers: make it current and use it.
                lib.cuCtxSetCurrent(c)
                free, total = ctypes.c_size_t(), ctypes.c_size_t()
                lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
                p = ctypes.c_uint64()
                work = lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(MIB))
                if work == 0:
                    work = lib.cuMemsetD8_v2(p, ctypes.c_ubyte(7), ctypes.c_size_t(MIB)) or lib.cuCtxSynchronize()
                    lib.cuMemFree_v2(p)
    out(check="ctx", result=r, at=at, pid=os.getpid(), **({} if work is None else {"work": work}))
    if r == 0:
        if hold_after:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            wait_for_stop()
        lib.cuDevicePrimaryCtxRelease_v2(dev)


def pool_keep(chunk_mib, hold_after):
    """A stream-ordered pool that keeps freed memory, as PyTorch's cudaMallocAsync backend sets
    it up: the current pool's release threshold raised to UINT64_MAX, CHUNK allocated with
    cuMemAllocAsync, freed with cuMemFreeAsync, synchronised. The pool still reserves it (the
    driver's figure is reported); a plain cuMemAlloc of CHUNK more must then be refused under a
    quota that holds fewer than two chunks, and succeed after cuMemPoolTrimTo(pool, 0).
    With --hold, a first line (phase "kept") is printed while the pool keeps the chunk, and the
    trim waits for SIGUSR1 (at most 300 s): the kit reads NVML in between."""
    if hold_after:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    cu = Cuda()
    u64 = ctypes.c_uint64
    pool = ctypes.c_void_p()
    cu.check("cuDeviceGetMemPool", ctypes.byref(pool), cu.dev)
    # CUmemPool_attribute: RELEASE_THRESHOLD 4, RESERVED_MEM_CURRENT 5 (cuda.h).
    cu.check("cuMemPoolSetAttribute", pool, 4, ctypes.byref(u64(2**64 - 1)))

    def reserved():
        v = u64()
        cu.check("cuMemPoolGetAttribute", pool, 5, ctypes.byref(v))
        return v.value // MIB

    ptr = u64()
    r_async = cu.call("cuMemAllocAsync", ctypes.byref(ptr), ctypes.c_size_t(chunk_mib * MIB), None)
    if r_async == 0:
        cu.check("cuMemFreeAsync", ptr, None)
    cu.check("cuStreamSynchronize", None)
    kept = reserved()
    held, r_kept = cu.alloc(chunk_mib * MIB)
    if hold_after:
        out(check="pool-keep", phase="kept", chunk_mib=chunk_mib, async_alloc=r_async,
            kept_mib=kept, alloc_while_kept=r_kept, pid=os.getpid())
        signal.sigtimedwait({signal.SIGUSR1}, 300)
    cu.check("cuMemPoolTrimTo", pool, ctypes.c_size_t(0))
    trimmed = reserved()
    p2, r_trimmed = (None, 0) if held else cu.alloc(chunk_mib * MIB)
    out(check="pool-keep", chunk_mib=chunk_mib, async_alloc=r_async, kept_mib=kept,
        alloc_while_kept=r_kept, trimmed_mib=trimmed, alloc_after_trim=r_trimmed, pid=os.getpid())
    if hold_after:
        wait_for_stop()
    for p in (held, p2):
        if p:
            cu.free(p)
    cu.release()


def own_nvml_mib():
    """Device memory NVML attributes to this process on GPU 0 (MiB), or None if it cannot say."""
    try:
        mine = [used for pid, used in compute_processes(0) if pid == os.getpid()]
    except RuntimeError:
        return None
    return mine[0] // MIB if mine and mine[0] != 2**64 - 1 else None


def stack_limit(quota_mib):
    """cuCtxSetLimit(CU_LIMIT_STACK_SIZE): the driver reserves the stack for every resident
    thread. A raise sized to about half the quota (the shim's count: bytes above the 1 KiB
    default x SMs x resident threads per SM) is made and NVML's figure for this process read
    before and after; then a raise to about twice the quota, which the shim must refuse."""
    cu = Cuda()
    sms, threads, v = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
    cu.check("cuDeviceGetAttribute", ctypes.byref(sms), 16, cu.dev)
    cu.check("cuDeviceGetAttribute", ctypes.byref(threads), 39, cu.dev)
    resident = sms.value * threads.value
    per = max(1, quota_mib * MIB // 2 // resident // 1024) * 1024
    before = own_nvml_mib()
    r_half = cu.call("cuCtxSetLimit", 0, ctypes.c_size_t(1024 + per))
    cu.check("cuCtxGetLimit", ctypes.byref(v), 0)
    got = v.value
    after = own_nvml_mib()
    r_over = cu.call("cuCtxSetLimit", 0, ctypes.c_size_t(1024 + 4 * per))
    r_back = cu.call("cuCtxSetLimit", 0, ctypes.c_size_t(1024))
    out(check="stack-limit", resident_threads=resident, stack_bytes=got, set_half=r_half,
        counted_mib=(got - 1024) * resident // MIB, nvml_before_mib=before, nvml_after_mib=after,
        set_over=r_over, set_back=r_back, pid=os.getpid())
    cu.release()


def capture_mem(chunk_mib):
    """A CUDA graph from stream capture, as PyTorch's CUDA graphs with the cudaMallocAsync
    backend make them: CHUNK allocated with cuMemAllocAsync on a capturing stream (a memory node
    of the graph, nothing allocated now) and freed in the graph, the graph instantiated, CHUNK
    allocated with cuMemAlloc, then the graph launched. Under a quota that holds fewer than two
    chunks the launch must be refused before anything is mapped."""
    cu = Cuda()
    stream, graph, exe = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    cu.check("cuStreamCreate", ctypes.byref(stream), 1)  # CU_STREAM_NON_BLOCKING
    cu.check("cuStreamBeginCapture_v2", stream, 0)  # CU_STREAM_CAPTURE_MODE_GLOBAL
    ptr = ctypes.c_uint64()
    r_node = cu.call("cuMemAllocAsync", ctypes.byref(ptr), ctypes.c_size_t(chunk_mib * MIB), stream)
    if r_node == 0:
        cu.check("cuMemFreeAsync", ptr, stream)
    r_end = cu.call("cuStreamEndCapture", stream, ctypes.byref(graph))
    r_inst = cu.call("cuGraphInstantiateWithFlags", ctypes.byref(exe), graph, ctypes.c_ulonglong(0)) \
        if r_end == 0 and r_node == 0 else -1
    held, r_plain = cu.alloc(chunk_mib * MIB)
    r_launch = cu.call("cuGraphLaunch", exe, stream) if r_inst == 0 else -1
    r_sync = cu.call("cuStreamSynchronize", stream)
    out(check="capture-mem", chunk_mib=chunk_mib, node=r_node, end=r_end, instantiate=r_inst,
        plain_alloc=r_plain, launch=r_launch, sync=r_sync, pid=os.getpid())
    if held:
        cu.free(held)
    cu.release()


def torch_quota(chunk_mib, limit_mib, hold_after):
    try:
        import torch
    except ImportError:
        out(check="torch-quota", skipped="PyTorch is not installed")
        return
    if not torch.cuda.is_available():
        out(check="torch-quota", skipped="torch.cuda.is_available() is false")
        return
    held, error = [], ""
    while len(held) * chunk_mib < limit_mib:
        try:
            held.append(torch.empty(chunk_mib * MIB, dtype=torch.uint8, device="cuda"))
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
            error = str(e).splitlines()[0][:160]
            break
    out(check="torch-quota", allocated_mib=len(held) * chunk_mib, error=error,
        torch=torch.__version__, pid=os.getpid())
    if hold_after:
        wait_for_stop()


def nvml_used(index):
    """Device memory in use as NVML sees it (outside any shim): the kit's independent meter."""
    nvml = ctypes.CDLL("libnvidia-ml.so.1")

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    if nvml.nvmlInit_v2() != 0:
        raise RuntimeError("nvmlInit_v2 failed")
    dev = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(dev)) != 0:
        raise RuntimeError("nvmlDeviceGetHandleByIndex_v2 failed")
    m = Memory()
    if nvml.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(m)) != 0:
        raise RuntimeError("nvmlDeviceGetMemoryInfo failed")
    out(check="nvml", used_mib=m.used // MIB, total_mib=m.total // MIB)
    nvml.nvmlShutdown()


def compute_processes(index):
    """(pid, used bytes) of each compute process NVML lists on GPU `index` (used is all ones,
    NVML_VALUE_NOT_AVAILABLE, when the driver cannot say)."""
    nvml = ctypes.CDLL("libnvidia-ml.so.1")

    class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2, the _v3 query's element)
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                    ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

    if nvml.nvmlInit_v2() != 0:
        raise RuntimeError("nvmlInit_v2 failed")
    try:
        dev = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(dev)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2 failed")
        n = ctypes.c_uint(64)
        infos = (ProcessInfo * 64)()
        r = nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(n), infos)
        if r != 0:
            raise RuntimeError(f"nvmlDeviceGetComputeRunningProcesses_v3 returned {r}")
        return [(p.pid, p.usedGpuMemory) for p in infos[:n.value]]
    finally:
        nvml.nvmlShutdown()


def nvml_procs(index):
    """The compute processes NVML lists on GPU `index`, one line each: pid, memory, and the
    process's `comm` (how the monitor tells the MPS server, `nvidia-cuda-mps`, from work)."""
    procs = compute_processes(index)
    for pid, used_bytes in procs:
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            comm = ""
        # NVML_VALUE_NOT_AVAILABLE (all ones) when the driver cannot say.
        used = -1 if used_bytes == 2**64 - 1 else used_bytes // MIB
        out(check="nvml-procs", pid=pid, used_mib=used, comm=comm)
    out(check="nvml-procs", listed=len(procs))


def small_allocs(count, extra_kib):
    """COUNT allocations of 1 MiB + EXTRA_KIB KiB with cuMemAlloc, each kept (stopping at the
    first refusal): what the shim counts is the bytes asked for; what the driver charges (NVML,
    outside the shim) is rounded up to its own granularity. Prints a line (phase "ctx") once the
    context exists and another (phase "held") once the allocations are made, each followed by a
    wait for SIGUSR1 (at most 300 s): the kit reads NVML at each."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    cu = Cuda()
    out(check="small-allocs", phase="ctx", pid=os.getpid())
    signal.sigtimedwait({signal.SIGUSR1}, 300)
    size = MIB + extra_kib * 1024
    held, refused = [], 0
    for _ in range(count):
        p, r = cu.alloc(size)
        if p is None:
            refused = r
            break
        held.append(p)
    out(check="small-allocs", phase="held", allocations=len(held), size_bytes=size,
        asked_mib=round(len(held) * size / MIB, 1), refused=refused, pid=os.getpid())
    signal.sigtimedwait({signal.SIGUSR1}, 300)
    for p in held:
        cu.free(p)
    cu.release()
    out(check="small-allocs", freed=len(held))


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: gpu_check_client.py quota CHUNK_MIB LIMIT_MIB [--hold] | hold MIB | "
                 "torch-quota CHUNK_MIB LIMIT_MIB [--hold] | pool-keep CHUNK_MIB [--hold] | stack-limit QUOTA_MIB | capture-mem CHUNK_MIB | "
                 "small-allocs COUNT EXTRA_KIB | "
                 "nvml-used INDEX | "
                 "nvml-procs INDEX | ctx [--hold]")
    cmd, rest = argv[1], argv[2:]
    hold_flag = "--hold" in rest
    nums = [int(a) for a in rest if not a.startswith("--")]
    if cmd == "quota":
        quota(nums[0], nums[1], hold_flag)
    elif cmd == "hold":
        hold(nums[0])
    elif cmd == "ctx":
        ctx(hold_flag)
    elif cmd == "torch-quota":
        torch_quota(nums[0], nums[1], hold_flag)
    elif cmd == "pool-keep":
        pool_keep(nums[0], hold_flag)
    elif cmd == "stack-limit":
        stack_limit(nums[0])
    elif cmd == "capture-mem":
        capture_mem(nums[0])
    elif cmd == "small-allocs":
        small_allocs(nums[0], nums[1])
    elif cmd == "nvml-used":
        nvml_used(nums[0] if nums else 0)
    elif cmd == "nvml-procs":
        nvml_procs(nums[0] if nums else 0)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv)
