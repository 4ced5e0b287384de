/* cuda_emu.h: enough of CUDA to compile csrc/cuda/fp_mlp.cu with g++ and run its kernels on
 * the host, so tests run the kernel's own indexing, barriers and protocol without a GPU.
 * Force-included (g++ -include) before the .cu; FP_CUDA_EMU replaces its PTX helpers.
 *
 * Decision: each block is a host thread, each CUDA thread of a block a fiber (ucontext) on
 * that thread, switched only at __syncthreads and warp shuffles. So __shared__ is
 * `static thread_local` (one copy per block), threadIdx is set by the fiber switch, blocks run
 * truly in parallel (the grid barrier's spin in one block sees the other blocks' atomics),
 * and a spin by one thread while the rest of its block waits at a barrier (the .cu's grid
 * barrier and poll loop) cannot starve them. System-scope loads and stores are C11 atomics;
 * fences are counted so tests can check who issues them. A block where every fiber waits at
 * a barrier that cannot open (divergent __syncthreads, a missing lane) exits with status 3.
 */
#ifndef FP_CUDA_EMU_H
#define FP_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define FP_CUDA_EMU 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local

struct fp_emu_dim3 {
    unsigned x, y, z;
};

extern thread_local fp_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

/* counters the driver reports (all threads, all blocks) */
struct fp_emu_counts {
    unsigned long long fence_sys;      /* __threadfence_system calls */
    unsigned long long fence_sys_b0;   /* of those, by block 0 */
    unsigned long long ld_sys;         /* fp_ld_acquire_sys calls */
};
extern fp_emu_counts fp_emu_counts_g;

void fp_emu_syncthreads(void);
float fp_emu_shfl_xor(unsigned mask, float v, int lane_mask);

static inline void __syncthreads(void) { fp_emu_syncthreads(); }
static inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    return fp_emu_shfl_xor(mask, v, lane_mask);
}
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system(void) {
    __atomic_fetch_add(&fp_emu_counts_g.fence_sys, 1ull, __ATOMIC_RELAXED);
    if (blockIdx.x == 0) __atomic_fetch_add(&fp_emu_counts_g.fence_sys_b0, 1ull, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline unsigned atomicExch(unsigned *p, unsigned v) {
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}

/* the .cu's PTX helpers (ld.acquire.sys, st.release.sys, %globaltimer) */
void fp_emu_poll_pause(void);
static inline unsigned long long fp_ld_acquire_sys(const uint64_t *p) {
    __atomic_fetch_add(&fp_emu_counts_g.ld_sys, 1ull, __ATOMIC_RELAXED);
    fp_emu_poll_pause();
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void fp_st_release_sys(uint64_t *p, unsigned long long v) {
    __atomic_store_n(p, (uint64_t)v, __ATOMIC_RELEASE);
}
unsigned long long fp_emu_globaltimer(void);
static inline unsigned long long fp_globaltimer(void) { return fp_emu_globaltimer(); }

/* Run kernel(args) on a grid of `grid` blocks of `block` threads (a multiple of 32, at most
 * 1024). Blocks >= hold_from start only when fp_emu_release_held() is called (blocks that
 * are not resident yet). fp_emu_join waits for every block; a block that deadlocks at a
 * barrier ends the process with status 3 (a diagnostic on stderr). */
typedef void (*fp_emu_kernel_fn)(void *args);
struct fp_emu_launch;
fp_emu_launch *fp_emu_start(fp_emu_kernel_fn kernel, void *args, unsigned grid, unsigned block,
                            unsigned hold_from);
void fp_emu_release_held(fp_emu_launch *l);
int fp_emu_join(fp_emu_launch *l);

#endif
