"""An unmodified-style Python trainer (NVIDIA cuda-bindings) holding a primary context and
device memory, waiting to be stopped with Ctrl-C. Python's own SIGINT handling runs:
KeyboardInterrupt, finalisation, then CPython re-kills itself with SIGINT (exit_sigint)."""

import time

from cuda.bindings import driver as cu

assert cu.cuInit(0)[0] == 0
dev = cu.cuDeviceGet(0)[1]
ctx = cu.cuDevicePrimaryCtxRetain(dev)[1]
cu.cuCtxSetCurrent(ctx)
err, p = cu.cuMemAlloc(1 << 20)
assert int(err) == 0
print("ready", flush=True)
while True:
    time.sleep(0.02)
