/* fp_mlp.cu: the MLP forward on the GPU, for one launch per call (a batch) and for a
 * persistent kernel that serves requests from mapped host memory (csrc/fp_gpu.h).
 *
 * Decision: one warp per output row (lanes stride over the row's inputs, a shuffle reduction
 * sums them), weights row-major per layer in one device buffer, and the whole network in one
 * kernel: the layers are separated by a grid barrier instead of a launch each, so a tick
 * costs one launch (launch path) or none (persistent path). The grid barrier needs every
 * block resident at once: the host launches at most one block per SM, counts the blocks the
 * persistent kernels running in a context hold, and launches no grid that could not be
 * resident beside them (fastpath/gpu/_backend.py). The per-element math (activations) is
 * csrc/fp_math.h, the same code the CPU kernels run; a non-finite pre-activation marks the
 * sample refused, as the CPU's dense kernels do.
 */
#include <stddef.h>

#include "fp_math.h"   /* csrc/ on the include path (setup.py, the tests, SourceModule) */
#include "fp_gpu.h"

#define FP_GPU_MAX_LAYERS 16
#define FP_WARP 32

/* one layer: y[o] = act(bias[o] + sum_i w[o*in + i] x[i]); w_off/b_off index the weights
 * buffer (floats). 32 bytes; fastpath/gpu/_pack.py writes the same layout. */
struct fp_gpu_layer {
    int in, out, act, _pad;
    long long w_off, b_off;
};

struct fp_gpu_net {
    int n_layers, n_in, n_out, max_width;
    fp_gpu_layer layers[FP_GPU_MAX_LAYERS];
};

/* the host packs these with numpy (fastpath/gpu/_pack.py) and the slot with C (fp_gpu.c) */
static_assert(sizeof(fp_gpu_layer) == 32, "fp_gpu_layer layout");
static_assert(offsetof(fp_gpu_net, layers) == 16 && sizeof(fp_gpu_net) == 16 + 32 * 16,
              "fp_gpu_net layout");
static_assert(offsetof(fp_gpu_slot, resp_seq) == 64 && offsetof(fp_gpu_slot, stop) == 128 &&
              sizeof(fp_gpu_slot) == FP_GPU_HDR_BYTES, "fp_gpu_slot layout");

/* PTX helpers; the host emulation (csrc/cuda/emu/cuda_emu.h) supplies its own */
#ifndef FP_CUDA_EMU
__device__ __forceinline__ unsigned long long fp_ld_acquire_sys(const uint64_t *p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void fp_st_release_sys(uint64_t *p, unsigned long long v) {
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long fp_globaltimer(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#endif

/* All blocks meet here. bar[0] counts arrivals, bar[1] is the generation: the last block in
 * resets the count and bumps the generation, the others wait for the bump. Each waiter reads
 * the generation before it arrives, so it cannot miss the bump. */
__device__ void fp_grid_barrier(unsigned *bar) {
    __syncthreads();
    if (gridDim.x == 1) return;
    if (threadIdx.x == 0) {
        volatile unsigned *gen = bar + 1;
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (*gen == g) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

/* x: batch rows of n_in floats; y: batch rows of n_out floats; a, b: batch * max_width
 * scratch. status[s] = tag when sample s met a non-finite pre-activation (tags change per
 * call, so status needs no clearing). Ends with a grid barrier: y is complete on return. */
__device__ void fp_mlp_forward_dev(const fp_gpu_net *net, const float *w, const float *x,
                                   float *a, float *b, float *y, int *status, int tag,
                                   int batch, unsigned *bar) {
    const int lane = threadIdx.x % FP_WARP;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / FP_WARP;
    const int n_warps = gridDim.x * blockDim.x / FP_WARP;
    const int n_layers = net->n_layers;
    const float *in = x;
    for (int l = 0; l < n_layers; l++) {
        const fp_gpu_layer L = net->layers[l];
        float *out = (l == n_layers - 1) ? y : ((l % 2) ? b : a);
        const float *wl = w + L.w_off;
        const float *bl = w + L.b_off;
        const int items = batch * L.out;
        for (int it = warp; it < items; it += n_warps) {
            const int s = it / L.out, o = it % L.out;
            const float *row = wl + (size_t)o * L.in;
            const float *xs = in + (size_t)s * L.in;
            float acc = 0.0f;
            for (int i = lane; i < L.in; i += FP_WARP) acc = fmaf(row[i], xs[i], acc);
            for (int d = FP_WARP / 2; d > 0; d /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, d);
            if (lane == 0) {
                const float v = acc + bl[o];
                if (!isfinite(v)) status[s] = tag;
                out[(size_t)s * L.out + o] = fp_actf(v, L.act);
            }
        }
        fp_grid_barrier(bar);
        in = out;
    }
}

/* Launch path: one call = one batch. */
extern "C" __global__ void fp_mlp_batch(const fp_gpu_net *net, const float *w, const float *x,
                                        float *a, float *b, float *y, int *status, int tag,
                                        int batch, unsigned *bar) {
    fp_mlp_forward_dev(net, w, x, a, b, y, status, tag, batch, bar);
}

/* Persistent path: launched once; block 0 polls the slot, every block computes. ctl[0] is the
 * command block 0 hands the others through device memory: 1 compute, 2 exit.
 * The poll reads one word over PCIe per spin: req_seq carries the stop request in its top bit
 * (FP_GPU_REQ_STOP, fp_gpu_stop). `ready` is published only after the first grid barrier, so
 * a grid whose blocks are not all resident never reports running (a start timeout, not a
 * first-request timeout). */
extern "C" __global__ void fp_mlp_persistent(const fp_gpu_net *net, const float *w,
                                             fp_gpu_slot *slot, float *x, float *a, float *b,
                                             float *y, int *status, unsigned *bar,
                                             unsigned *ctl) {
    __shared__ unsigned cmd;
    __shared__ unsigned long long seq, t0;
    const int n_in = net->n_in, n_out = net->n_out;
    const float *in = (const float *)((const char *)slot + FP_GPU_IN_OFF);
    float *outp = (float *)((char *)slot + FP_GPU_OUT_OFF(n_in));
    /* the sequence number is read before readiness is published: no request can precede it */
    if (blockIdx.x == 0 && threadIdx.x == 0) seq = fp_ld_acquire_sys(&slot->req_seq);
    fp_grid_barrier(bar);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        __threadfence_system();
        *(volatile unsigned *)&slot->ready = 1u;
        __threadfence_system();
    }
    for (;;) {
        if (blockIdx.x == 0) {
            if (threadIdx.x == 0) {
                for (;;) {
                    const unsigned long long q = fp_ld_acquire_sys(&slot->req_seq);
                    if (q & FP_GPU_REQ_STOP) {
                        cmd = 2u;
                        break;
                    }
                    if (q != seq) {
                        t0 = fp_globaltimer();
                        seq = q;
                        cmd = 1u;
                        break;
                    }
                }
                __threadfence();
            }
            __syncthreads();
            if (cmd == 1u)
                for (int i = threadIdx.x; i < n_in; i += blockDim.x)
                    x[i] = ((const volatile float *)in)[i];
            if (threadIdx.x == 0) *(volatile unsigned *)ctl = cmd;
        }
        fp_grid_barrier(bar);
        if (*(volatile unsigned *)ctl == 2u) break;
        /* status[0] is cleared after each answer, so one tag serves every request */
        const int tag = 1;
        fp_mlp_forward_dev(net, w, x, a, b, y, status, tag, 1, bar);
        if (blockIdx.x == 0) {
            for (int i = threadIdx.x; i < n_out; i += blockDim.x)
                ((volatile float *)outp)[i] = ((volatile float *)y)[i];
            /* the block's output stores happen before thread 0's system fence (the barrier
             * orders them, the fence is cumulative): one fence, not one per thread */
            __syncthreads();
            if (threadIdx.x == 0) {
                const int st = (*(volatile int *)status == tag) ? FP_GPU_ST_NONFINITE
                                                                 : FP_GPU_ST_OK;
                *(volatile int *)status = 0;
                *(volatile int *)&slot->status = st;
                *(volatile unsigned long long *)&slot->device_ns = fp_globaltimer() - t0;
                /* outputs and status reach host memory before the sequence number does */
                __threadfence_system();
                fp_st_release_sys(&slot->resp_seq, seq);
            }
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        __threadfence_system();
        *(volatile unsigned *)&slot->ready = 2u;
        __threadfence_system();
    }
}
