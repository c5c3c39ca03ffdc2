"""NVIDIA's cuda-bindings (unmodified, from PyPI) driving the emulator's libcuda.so.1:
init, device query, context, alloc, HtoD/DtoH copy, PTX module load, kernel launch, sync,
free. Usage: cuda_roundtrip.py <spin.ptx>. Prints one JSON line; exits non-zero on any error."""

import ctypes
import json
import sys

import numpy as np
from cuda.bindings import driver as cu


def check(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise RuntimeError(f"CUDA call failed: {name.decode() if name else err}")
    return rest[0] if len(rest) == 1 else rest


def main():
    ptx = open(sys.argv[1], "rb").read() + b"\0"
    check(cu.cuInit(0))
    count = check(cu.cuDeviceGetCount())
    dev = check(cu.cuDeviceGet(0))
    name = check(cu.cuDeviceGetName(256, dev)).split(b"\0")[0].decode()
    sms = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))

    host = np.arange(1 << 16, dtype=np.uint32)
    nbytes = host.nbytes
    dptr = check(cu.cuMemAlloc(nbytes))
    free_after, total = check(cu.cuMemGetInfo())
    check(cu.cuMemcpyHtoD(dptr, host.ctypes.data, nbytes))

    module = check(cu.cuModuleLoadData(ptx))
    fn = check(cu.cuModuleGetFunction(module, b"spin"))
    cycles = np.array([100000], dtype=np.uint64)
    params = np.array([cycles.ctypes.data], dtype=np.uint64)
    check(cu.cuLaunchKernel(fn, sms, 1, 1, 128, 1, 1, 0, 0, params.ctypes.data, 0))
    check(cu.cuCtxSynchronize())

    back = np.zeros_like(host)
    check(cu.cuMemcpyDtoH(back.ctypes.data, dptr, nbytes))
    check(cu.cuMemFree(dptr))
    check(cu.cuModuleUnload(module))
    check(cu.cuDevicePrimaryCtxRelease(dev))
    print(json.dumps({
        "devices": count, "name": name, "sms": sms, "copied": nbytes,
        "roundtrip_equal": bool((back == host).all()), "used_during": int(total - free_after),
    }))


if __name__ == "__main__":
    main()
