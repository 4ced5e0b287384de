/* cuda_emu.cpp: the runtime behind cuda_emu.h: blocks as host threads, a block's CUDA threads
 * as fibers (ucontext) switched round-robin at __syncthreads and warp shuffles.
 */
#include "cuda_emu.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

thread_local fp_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
fp_emu_counts fp_emu_counts_g;

void fp_emu_run_kernel(fp_emu_launch *l);

namespace {

constexpr size_t kStack = 64 * 1024;
constexpr unsigned kWarp = 32;

struct Fiber {
    ucontext_t ctx;
    char *stack;
    bool done;
};

struct Warp {
    float val[kWarp];
    unsigned count;
    unsigned long long gen;
};

struct Block {
    fp_emu_launch *launch;
    unsigned id;
    pthread_t thread;
    ucontext_t main;
    Fiber *f;
    Warp *warps;
    unsigned n, cur, live;
    unsigned long long progress;   /* arrivals, releases, exits: a full round without any is a deadlock */
    unsigned bar_count;
    unsigned long long bar_gen;
};

thread_local Block *tb;

void die(const char *what) {
    Block *b = tb;
    fprintf(stderr, "cuda_emu: %s (block %u, thread %u)\n", what, b ? b->id : 0u,
            b ? b->cur : 0u);
    fflush(stderr);
    _exit(3);
}

unsigned next_live(Block *b, unsigned me) {
    for (unsigned k = 1; k <= b->n; k++) {
        const unsigned j = (me + k) % b->n;
        if (!b->f[j].done) return j;
    }
    return b->n;
}

/* hand this block's host thread to fiber `to`; returns when some fiber hands it back */
void switch_to(unsigned to) {
    Block *b = tb;
    const unsigned me = b->cur;
    b->cur = to;
    threadIdx = {to, 0, 0};
    swapcontext(&b->f[me].ctx, &b->f[to].ctx);
}

/* wait until *gen moves past g, running the block's other fibers meanwhile */
void wait_gen(const unsigned long long *gen, unsigned long long g) {
    Block *b = tb;
    while (*gen == g) {
        const unsigned long long p0 = b->progress;
        const unsigned nx = next_live(b, b->cur);
        if (nx == b->n || nx == b->cur) die("barrier can never open: no other thread runs");
        switch_to(nx);
        if (*gen == g && b->progress == p0)
            die("deadlock: every thread of the block waits at a barrier that cannot open");
    }
}

void fiber_main() {
    Block *b = tb;
    fp_emu_run_kernel(b->launch);
    b->f[b->cur].done = true;
    b->live--;
    b->progress++;
    /* a barrier the exited thread will never reach counts only the live ones */
    if (b->bar_count && b->bar_count == b->live) {
        b->bar_count = 0;
        b->bar_gen++;
    }
    const unsigned nx = next_live(b, b->cur);
    if (nx == b->n) setcontext(&b->main);
    b->cur = nx;
    threadIdx = {nx, 0, 0};
    setcontext(&b->f[nx].ctx);
}

}  // namespace

struct fp_emu_launch {
    fp_emu_kernel_fn kernel;
    void *args;
    unsigned grid, block, hold_from;
    int released;
    Block *blocks;
};

void fp_emu_run_kernel(fp_emu_launch *l) { l->kernel(l->args); }

namespace {

void *block_main(void *p) {
    Block *b = (Block *)p;
    fp_emu_launch *l = b->launch;
    tb = b;
    if (b->id >= l->hold_from) {
        const struct timespec ms = {0, 1000000};
        while (!__atomic_load_n(&l->released, __ATOMIC_ACQUIRE)) nanosleep(&ms, nullptr);
    }
    blockIdx = {b->id, 0, 0};
    blockDim = {l->block, 1, 1};
    gridDim = {l->grid, 1, 1};
    b->n = b->live = l->block;
    b->f = (Fiber *)calloc(b->n, sizeof(Fiber));
    b->warps = (Warp *)calloc((b->n + kWarp - 1) / kWarp, sizeof(Warp));
    if (!b->f || !b->warps) die("out of memory");
    for (unsigned i = 0; i < b->n; i++) {
        Fiber &f = b->f[i];
        f.stack = (char *)malloc(kStack);
        if (!f.stack) die("out of memory");
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_main, 0);
    }
    b->cur = 0;
    threadIdx = {0, 0, 0};
    swapcontext(&b->main, &b->f[0].ctx);
    for (unsigned i = 0; i < b->n; i++) free(b->f[i].stack);
    free(b->f);
    free(b->warps);
    return nullptr;
}

}  // namespace

void fp_emu_syncthreads(void) {
    Block *b = tb;
    b->progress++;
    const unsigned long long g = b->bar_gen;
    if (++b->bar_count == b->live) {
        b->bar_count = 0;
        b->bar_gen++;
        return;
    }
    wait_gen(&b->bar_gen, g);
}

static void warp_arrive(Warp &w) {
    Block *b = tb;
    b->progress++;
    const unsigned long long g = w.gen;
    if (++w.count == kWarp) {
        w.count = 0;
        w.gen++;
        return;
    }
    wait_gen(&w.gen, g);
}

float fp_emu_shfl_xor(unsigned mask, float v, int lane_mask) {
    Block *b = tb;
    if (mask != 0xffffffffu) die("__shfl_xor_sync: only the full-warp mask is emulated");
    if (b->n % kWarp) die("__shfl_xor_sync: block size is not a multiple of 32");
    const unsigned lane = threadIdx.x % kWarp;
    Warp &w = b->warps[threadIdx.x / kWarp];
    w.val[lane] = v;
    warp_arrive(w);
    const unsigned src = lane ^ (unsigned)lane_mask;
    const float r = src < kWarp ? w.val[src] : v;
    warp_arrive(w);   /* nobody overwrites val before every lane has read */
    return r;
}

void fp_emu_poll_pause(void) {
    static thread_local unsigned n;
    if (++n % 16 == 0) sched_yield();
}

unsigned long long fp_emu_globaltimer(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

fp_emu_launch *fp_emu_start(fp_emu_kernel_fn kernel, void *args, unsigned grid, unsigned block,
                            unsigned hold_from) {
    if (grid < 1 || block < 1 || block > 1024 || block % kWarp) return nullptr;
    fp_emu_launch *l = (fp_emu_launch *)calloc(1, sizeof(fp_emu_launch));
    if (!l) return nullptr;
    l->kernel = kernel;
    l->args = args;
    l->grid = grid;
    l->block = block;
    l->hold_from = hold_from;
    l->blocks = (Block *)calloc(grid, sizeof(Block));
    if (!l->blocks) return nullptr;
    for (unsigned i = 0; i < grid; i++) {
        l->blocks[i].launch = l;
        l->blocks[i].id = i;
        if (pthread_create(&l->blocks[i].thread, nullptr, block_main, &l->blocks[i])) return nullptr;
    }
    return l;
}

void fp_emu_release_held(fp_emu_launch *l) { __atomic_store_n(&l->released, 1, __ATOMIC_RELEASE); }

int fp_emu_join(fp_emu_launch *l) {
    fp_emu_release_held(l);
    for (unsigned i = 0; i < l->grid; i++) pthread_join(l->blocks[i].thread, nullptr);
    free(l->blocks);
    free(l);
    return 0;
}
