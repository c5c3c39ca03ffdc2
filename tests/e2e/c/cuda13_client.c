/* A CUDA 13 driver-API client, built against NVIDIA's CUDA 13.0 cuda.h / cudaTypedefs.h the way a
 * CUDA 13 runtime or framework is: dlopen("libcuda.so.1"), then every entry point through
 * cuGetProcAddress_v2 at CUDA_VERSION (13000) or the version given with --version, typed with
 * the headers' own PFN_<name>_v<ver> typedefs.
 *
 * Steps (argv): version | ctx | destroy | primary | preset | prelease | sync | freeall | exit
 *               gpa NAME          (which object answers NAME: "lib=<file> sym=<symbol>")
 *               launch PTXFILE N  (N launches of the PTX's `spin` kernel through each of
 *                                  cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel)
 *               hold              (prints "hold" and waits for stdin to close)
 *               alloc N | async N | pool N | mpool N | vmm N   (one allocation of N bytes)
 * Each step prints one "step=rc ..." line; allocations are remembered for freeall. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if CUDA_VERSION < 13000
#error "build against the CUDA 13 headers (.cuda-headers-13)"
#endif

static PFN_cuGetProcAddress_v12000 gpa;
static int req_version = CUDA_VERSION;

static void *get(const char *name) {
    void *p = NULL;
    CUdriverProcAddressQueryResult q = (CUdriverProcAddressQueryResult)99;
    CUresult r = gpa(name, &p, req_version, CU_GET_PROC_ADDRESS_DEFAULT, &q);
    if (r != CUDA_SUCCESS || p == NULL) {
        printf("gpa_failed name=%s rc=%d status=%d\n", name, (int)r, (int)q);
        fflush(stdout);
        exit(3);
    }
    return p;
}

#define GET(var, name, pfn) pfn var = (pfn)get(name)

enum kind { DPTR, ASYNC, VMM };
struct held { enum kind k; unsigned long long h; };
static struct held held[256];
static int nheld;

int main(int argc, char **argv) {
    int i = 1;
    if (argc > 2 && strcmp(argv[1], "--version") == 0) {
        req_version = atoi(argv[2]);
        i = 3;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("dlopen_failed\n");
        return 2;
    }
    gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) {
        printf("no_cuGetProcAddress_v2\n");
        return 2;
    }
    GET(init, "cuInit", PFN_cuInit_v2000);
    GET(driver_version, "cuDriverGetVersion", PFN_cuDriverGetVersion_v2020);
    CUresult r = init(0);
    printf("init=%d\n", (int)r);
    if (r != CUDA_SUCCESS) return 1;

    CUcontext ctx = NULL;
    CUmemoryPool pool = NULL, mpool = NULL;
    CUstream stream = NULL;
    for (; i < argc; i++) {
        const char *s = argv[i];
        unsigned long long n = (i + 1 < argc) ? strtoull(argv[i + 1], NULL, 10) : 0;
        if (!strcmp(s, "version")) {
            int v = 0;
            r = driver_version(&v);
            printf("version=%d driver=%d\n", (int)r, v);
        } else if (!strcmp(s, "gpa")) {
            const char *name = argv[++i];
            void *p = get(name);
            Dl_info info;
            memset(&info, 0, sizeof info);
            dladdr(p, &info);
            const char *file = info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
            printf("gpa name=%s lib=%s sym=%s\n", name, file ? file + 1 : "?", info.dli_sname ? info.dli_sname : "?");
        } else if (!strcmp(s, "ctx")) {
            /* cuCtxCreate at CUDA 13: the v4 ABI with CUctxCreateParams. */
            GET(create, "cuCtxCreate", PFN_cuCtxCreate_v12050);
            CUctxCreateParams params;
            memset(&params, 0, sizeof params);
            r = create(&ctx, &params, 0, 0);
            printf("ctx=%d\n", (int)r);
        } else if (!strcmp(s, "sync")) {
            GET(sync, "cuCtxSynchronize", PFN_cuCtxSynchronize_v13000);
            r = sync(ctx);
            printf("sync=%d\n", (int)r);
        } else if (!strcmp(s, "destroy")) {
            GET(destroy, "cuCtxDestroy", PFN_cuCtxDestroy_v4000);
            r = destroy(ctx);
            printf("destroy=%d\n", (int)r);
            ctx = NULL;
            nheld = 0; /* the driver freed the context's allocations */
        } else if (!strcmp(s, "primary")) {
            GET(retain, "cuDevicePrimaryCtxRetain", PFN_cuDevicePrimaryCtxRetain_v7000);
            GET(set_current, "cuCtxSetCurrent", PFN_cuCtxSetCurrent_v4000);
            r = retain(&ctx, 0);
            if (r == CUDA_SUCCESS) r = set_current(ctx);
            printf("primary=%d\n", (int)r);
        } else if (!strcmp(s, "preset") || !strcmp(s, "prelease")) {
            /* The driver frees every allocation of the primary context it destroys. */
            CUresult (*f)(CUdevice) = !strcmp(s, "preset")
                ? (CUresult(*)(CUdevice))get("cuDevicePrimaryCtxReset")
                : (CUresult(*)(CUdevice))get("cuDevicePrimaryCtxRelease");
            PFN_cuDevicePrimaryCtxReset_v11000 typed = f; /* same ABI as the release _v11000 */
            r = typed(0);
            nheld = 0;
            printf("%s=%d\n", s, (int)r);
        } else if (!strcmp(s, "launch")) {
            const char *file = argv[++i];
            int count = atoi(argv[++i]);
            static char ptx[1 << 16];
            FILE *f = fopen(file, "rb");
            size_t len = f ? fread(ptx, 1, sizeof ptx - 1, f) : 0;
            if (f) fclose(f);
            ptx[len] = 0;
            GET(load, "cuModuleLoadData", PFN_cuModuleLoadData_v2000);
            GET(getfn, "cuModuleGetFunction", PFN_cuModuleGetFunction_v2000);
            GET(launch, "cuLaunchKernel", PFN_cuLaunchKernel_v4000);
            GET(launch_ex, "cuLaunchKernelEx", PFN_cuLaunchKernelEx_v11060);
            GET(launch_coop, "cuLaunchCooperativeKernel", PFN_cuLaunchCooperativeKernel_v9000);
            GET(ssync, "cuStreamSynchronize", PFN_cuStreamSynchronize_v2000);
            CUmodule mod = NULL;
            CUfunction fn = NULL;
            r = load(&mod, ptx);
            if (r == CUDA_SUCCESS) r = getfn(&fn, mod, "spin");
            unsigned long long cycles = 1000;
            void *args[] = {&cycles};
            CUlaunchConfig cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
            cfg.blockDimX = 32;
            cfg.blockDimY = cfg.blockDimZ = 1;
            cfg.hStream = stream;
            for (int k = 0; k < count && r == CUDA_SUCCESS; k++) {
                r = launch(fn, 1, 1, 1, 32, 1, 1, 0, stream, args, NULL);
                if (r == CUDA_SUCCESS) r = launch_ex(&cfg, fn, args, NULL);
                if (r == CUDA_SUCCESS) r = launch_coop(fn, 1, 1, 1, 32, 1, 1, 0, stream, args);
            }
            if (r == CUDA_SUCCESS) r = ssync(stream);
            printf("launch=%d\n", (int)r);
        } else if (!strcmp(s, "hold")) {
            printf("hold\n");
            fflush(stdout);
            while (getchar() != EOF) {
            }
        } else if (!strcmp(s, "alloc")) {
            GET(alloc, "cuMemAlloc", PFN_cuMemAlloc_v3020);
            CUdeviceptr p = 0;
            r = alloc(&p, (size_t)n);
            if (r == CUDA_SUCCESS) held[nheld++] = (struct held){DPTR, p};
            printf("alloc=%d\n", (int)r);
            i++;
        } else if (!strcmp(s, "async")) {
            GET(alloc, "cuMemAllocAsync", PFN_cuMemAllocAsync_v11020);
            CUdeviceptr p = 0;
            r = alloc(&p, (size_t)n, stream);
            if (r == CUDA_SUCCESS) held[nheld++] = (struct held){ASYNC, p};
            printf("async=%d\n", (int)r);
            i++;
        } else if (!strcmp(s, "pool") || !strcmp(s, "mpool")) {
            /* mpool: a managed-memory pool, new in CUDA 13.0. */
            int managed = !strcmp(s, "mpool");
            CUmemoryPool *pp = managed ? &mpool : &pool;
            if (*pp == NULL) {
                GET(pool_create, "cuMemPoolCreate", PFN_cuMemPoolCreate_v11020);
                CUmemPoolProps props;
                memset(&props, 0, sizeof props);
                props.allocType = managed ? CU_MEM_ALLOCATION_TYPE_MANAGED : CU_MEM_ALLOCATION_TYPE_PINNED;
                props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                props.location.id = 0;
                r = pool_create(pp, &props);
                if (r != CUDA_SUCCESS) {
                    printf("%s=%d create\n", s, (int)r);
                    i++;
                    continue;
                }
            }
            GET(alloc, "cuMemAllocFromPoolAsync", PFN_cuMemAllocFromPoolAsync_v11020);
            CUdeviceptr p = 0;
            r = alloc(&p, (size_t)n, *pp, stream);
            if (r == CUDA_SUCCESS) held[nheld++] = (struct held){ASYNC, p};
            printf("%s=%d\n", s, (int)r);
            i++;
        } else if (!strcmp(s, "vmm")) {
            GET(create, "cuMemCreate", PFN_cuMemCreate_v10020);
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = 0;
            CUmemGenericAllocationHandle h = 0;
            r = create(&h, (size_t)n, &prop, 0);
            if (r == CUDA_SUCCESS) held[nheld++] = (struct held){VMM, h};
            printf("vmm=%d\n", (int)r);
            i++;
        } else if (!strcmp(s, "freeall")) {
            GET(mfree, "cuMemFree", PFN_cuMemFree_v3020);
            GET(afree, "cuMemFreeAsync", PFN_cuMemFreeAsync_v11020);
            GET(release, "cuMemRelease", PFN_cuMemRelease_v10020);
            GET(ssync, "cuStreamSynchronize", PFN_cuStreamSynchronize_v2000);
            int bad = 0;
            for (int k = 0; k < nheld; k++) {
                CUresult fr = held[k].k == DPTR    ? mfree(held[k].h)
                              : held[k].k == ASYNC ? afree(held[k].h, stream)
                                                   : release(held[k].h);
                if (fr != CUDA_SUCCESS) bad = (int)fr;
            }
            nheld = 0;
            if (ssync(stream) != CUDA_SUCCESS) bad = -1;
            printf("freeall=%d\n", bad);
        } else if (!strcmp(s, "exit")) {
            break;
        } else {
            printf("unknown_step=%s\n", s);
            return 2;
        }
        fflush(stdout);
    }
    fflush(stdout);
    return 0;
}
