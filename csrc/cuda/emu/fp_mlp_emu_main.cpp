/* fp_mlp_emu_main.cpp: runs csrc/cuda/fp_mlp.cu's kernels on the host (cuda_emu.h) for the
 * tests (tests/helpers/cuda_emu.py builds it with g++; FP_EMU_CU names the .cu to compile,
 * so a test can build a mutated copy).
 *
 *   batch      NET W X Y ST batch grid block tag
 *       fp_mlp_batch on X (batch rows); writes Y (batch x n_out floats) and ST (batch ints).
 *   persistent NET W XS Y ST n_req grid block hold stop
 *       fp_mlp_persistent on a slot in host memory, served by the host protocol (fp_gpu.c):
 *       wait for `ready`, n_req requests (rows of XS), then stop and wait for the exit.
 *       hold=1 keeps the last block from starting until the host has watched `ready` for a
 *       while (a block not resident yet); stop=word sets only the request word's stop bit,
 *       stop=api calls fp_gpu_stop. Writes Y (n_req x n_out), ST (rc per request) and
 *       key=value lines on stdout.
 * NET is the packed table (fastpath.gpu._pack), W the float32 weights. Exit 0 when done,
 * 2 on bad arguments, 3 on a deadlock in a block, 4 when the kernel never exits.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include FP_EMU_CU

namespace {

void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return nullptr;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = calloc(1, (size_t)len + 64);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = nullptr;
    }
    fclose(f);
    if (n) *n = (size_t)len;
    return buf;
}

int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const size_t w = fwrite(p, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

struct BatchArgs {
    const fp_gpu_net *net;
    const float *w, *x;
    float *a, *b, *y;
    int *status;
    int tag, batch;
    unsigned *bar;
};

void run_batch(void *p) {
    BatchArgs *k = (BatchArgs *)p;
    fp_mlp_batch(k->net, k->w, k->x, k->a, k->b, k->y, k->status, k->tag, k->batch, k->bar);
}

struct PersistentArgs {
    const fp_gpu_net *net;
    const float *w;
    fp_gpu_slot *slot;
    float *x, *a, *b, *y;
    int *status;
    unsigned *bar, *ctl;
};

void run_persistent(void *p) {
    PersistentArgs *k = (PersistentArgs *)p;
    fp_mlp_persistent(k->net, k->w, k->slot, k->x, k->a, k->b, k->y, k->status, k->bar, k->ctl);
}

int usage() {
    fprintf(stderr, "usage: fp_mlp_emu batch NET W X Y ST batch grid block tag\n"
                    "       fp_mlp_emu persistent NET W XS Y ST n_req grid block hold stop\n");
    return 2;
}

int main_batch(const fp_gpu_net *net, const float *w, char **argv) {
    const int batch = atoi(argv[7]), tag = atoi(argv[10]);
    const unsigned grid = (unsigned)atoi(argv[8]), block = (unsigned)atoi(argv[9]);
    size_t nx = 0;
    float *x = (float *)read_file(argv[4], &nx);
    if (!x || batch < 1 || nx != (size_t)batch * net->n_in * 4) return usage();
    const size_t wmax = (size_t)batch * net->max_width;
    float *a = (float *)calloc(wmax, 4), *b = (float *)calloc(wmax, 4);
    float *y = (float *)calloc((size_t)batch * net->n_out, 4);
    int *st = (int *)calloc((size_t)batch, 4);
    unsigned *bar = (unsigned *)calloc(2, 4);
    BatchArgs k = {net, w, x, a, b, y, st, tag, batch, bar};
    fp_emu_launch *l = fp_emu_start(run_batch, &k, grid, block, grid);
    if (!l) return usage();
    fp_emu_join(l);
    if (write_file(argv[5], y, (size_t)batch * net->n_out * 4) ||
        write_file(argv[6], st, (size_t)batch * 4))
        return 2;
    return 0;
}

int main_persistent(const fp_gpu_net *net, const float *w, char **argv) {
    const int n_req = atoi(argv[7]), hold = atoi(argv[10]);
    const unsigned grid = (unsigned)atoi(argv[8]), block = (unsigned)atoi(argv[9]);
    const bool stop_word = strcmp(argv[11], "word") == 0;
    const int64_t second = 1000000000LL;
    size_t nx = 0;
    float *xs = (float *)read_file(argv[4], &nx);
    if (!xs || n_req < 0 || nx != (size_t)n_req * net->n_in * 4 || grid < 1) return usage();
    const size_t bytes = fp_gpu_slot_bytes(net->n_in, net->n_out);
    fp_gpu_slot *slot = (fp_gpu_slot *)aligned_alloc(64, bytes);
    if (!slot || fp_gpu_slot_init(slot, net->n_in, net->n_out) != FP_GPU_OK) return usage();
    float *x = (float *)calloc((size_t)net->n_in, 4);
    float *a = (float *)calloc((size_t)net->max_width, 4);
    float *b = (float *)calloc((size_t)net->max_width, 4);
    float *y = (float *)calloc((size_t)net->n_out, 4);
    int *status = (int *)calloc(1, 4);
    unsigned *bar = (unsigned *)calloc(2, 4), *ctl = (unsigned *)calloc(1, 4);
    PersistentArgs k = {net, w, slot, x, a, b, y, status, bar, ctl};
    fp_emu_launch *l = fp_emu_start(run_persistent, &k, grid, block, hold ? grid - 1 : grid);
    if (!l) return usage();
    if (hold) {
        /* the last block is not resident: the kernel must not report running yet */
        const int rc = fp_gpu_wait_ready(slot, FP_GPU_READY_RUNNING, second / 2);
        printf("ready_while_held=%u\nwait_while_held=%d\n",
               __atomic_load_n(&slot->ready, __ATOMIC_ACQUIRE), rc);
        fp_emu_release_held(l);
    }
    printf("ready_rc=%d\n", fp_gpu_wait_ready(slot, FP_GPU_READY_RUNNING, 60 * second));
    float *ys = (float *)calloc((size_t)(n_req ? n_req : 1) * net->n_out, 4);
    int *rcs = (int *)calloc((size_t)(n_req ? n_req : 1), 4);
    const unsigned long long fences0 = fp_emu_counts_g.fence_sys;
    for (int r = 0; r < n_req; r++) {
        uint64_t seq = 0, dev = 0;
        int64_t wait = 0;
        rcs[r] = fp_gpu_request(slot, xs + (size_t)r * net->n_in, ys + (size_t)r * net->n_out,
                                60 * second, &seq, &dev, &wait);
        if (seq != (uint64_t)r + 1) rcs[r] = -100;
    }
    printf("request_fences=%llu\n", fp_emu_counts_g.fence_sys - fences0);
    if (stop_word)
        __atomic_fetch_or(&slot->req_seq, FP_GPU_REQ_STOP, __ATOMIC_RELEASE);
    else
        fp_gpu_stop(slot);
    const int exit_rc = fp_gpu_wait_ready(slot, FP_GPU_READY_EXITED, 30 * second);
    printf("exit_rc=%d\n", exit_rc);
    fflush(stdout);
    if (write_file(argv[5], ys, (size_t)n_req * net->n_out * 4) ||
        write_file(argv[6], rcs, (size_t)n_req * 4))
        return 2;
    if (exit_rc != FP_GPU_OK) _exit(4);   /* its blocks still spin: no join */
    fp_emu_join(l);
    uint64_t seq = 0;
    const int after = n_req ? fp_gpu_request(slot, xs, ys, second / 100, &seq, nullptr, nullptr)
                            : FP_GPU_STOPPED;
    printf("after_stop_rc=%d\nfences=%llu\nld_sys=%llu\n", after, fp_emu_counts_g.fence_sys,
           fp_emu_counts_g.ld_sys);
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    const bool batch = strcmp(argv[1], "batch") == 0;
    if (!(batch ? argc == 11 : strcmp(argv[1], "persistent") == 0 && argc == 12)) return usage();
    alarm(300);   /* a hang ends the process, never the test run */
    size_t nn = 0, nw = 0;
    fp_gpu_net *net = (fp_gpu_net *)read_file(argv[2], &nn);
    float *w = (float *)read_file(argv[3], &nw);
    if (!net || !w || nn != sizeof(fp_gpu_net)) return usage();
    return batch ? main_batch(net, w, argv) : main_persistent(net, w, argv);
}
