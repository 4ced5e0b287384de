/* fp_gpu.c: the host side of the persistent-kernel protocol (see fp_gpu.h), and the device's
 * loop written for the CPU so the protocol is tested where no GPU exists.
 *
 * Decision: the waits spin with a pause and read CLOCK_MONOTONIC only every few dozen spins:
 * an answer over PCIe takes microseconds, a clock read ~25 ns, and the deadline only has to
 * be honoured to within a microsecond or so, never skipped.
 */
#include "fp_gpu.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FP_GPU_PAUSE() _mm_pause()
#else
#define FP_GPU_PAUSE() ((void)0)
#endif

#define FP_GPU_CLOCK_EVERY 32

/* the kernel (csrc/cuda/fp_mlp.cu) asserts the same offsets */
_Static_assert(offsetof(fp_gpu_slot, resp_seq) == 64 && offsetof(fp_gpu_slot, stop) == 128 &&
               sizeof(fp_gpu_slot) == FP_GPU_HDR_BYTES, "fp_gpu_slot layout");

static int64_t fp_gpu_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* now + timeout_ns, saturated: a timeout near INT64_MAX ("wait as long as it takes") wrapped
 * the sum negative (signed overflow), and the first clock check called the wait over */
static int64_t fp_gpu_deadline(int64_t now, int64_t timeout_ns) {
    if (timeout_ns < 0) timeout_ns = 0;
    return timeout_ns > INT64_MAX - now ? INT64_MAX : now + timeout_ns;
}

size_t fp_gpu_slot_bytes(int n_in, int n_out) {
    if (n_in < 1 || n_out < 1) return 0;
    return (size_t)FP_GPU_SLOT_BYTES((size_t)n_in, (size_t)n_out);
}

int fp_gpu_slot_init(void *mem, int n_in, int n_out) {
    if (!mem || ((uintptr_t)mem) % FP_GPU_LINE || n_in < 1 || n_out < 1) return FP_GPU_BADARG;
    memset(mem, 0, fp_gpu_slot_bytes(n_in, n_out));
    fp_gpu_slot *s = (fp_gpu_slot *)mem;
    s->n_in = n_in;
    s->n_out = n_out;
    return FP_GPU_OK;
}

int fp_gpu_request(fp_gpu_slot *s, const float *x, float *out, int64_t timeout_ns,
                   uint64_t *seq_out, uint64_t *device_ns, int64_t *wait_ns) {
    if (timeout_ns < 0) return FP_GPU_BADARG;
    if (__atomic_load_n(&s->stop, __ATOMIC_RELAXED)) return FP_GPU_STOPPED;
    /* only this thread counts req_seq up, but fp_gpu_stop may set its stop bit from another
     * thread at any time: a compare-exchange keeps that bit (a plain store could clear it) */
    uint64_t cur = __atomic_load_n(&s->req_seq, __ATOMIC_RELAXED);
    if (cur & FP_GPU_REQ_STOP) return FP_GPU_STOPPED;
    const uint64_t seq = cur + 1;
    if (seq_out) *seq_out = seq;
    memcpy(fp_gpu_in(s), x, sizeof(float) * (size_t)s->n_in);
    const int64_t t0 = fp_gpu_now_ns();
    /* release: the features are visible before the device can see the new seq */
    if (!__atomic_compare_exchange_n(&s->req_seq, &cur, seq, 0, __ATOMIC_RELEASE,
                                     __ATOMIC_RELAXED))
        return FP_GPU_STOPPED;   /* the only other writer sets the stop bit */
    const int64_t deadline = fp_gpu_deadline(t0, timeout_ns);
    for (unsigned spin = 1;; spin++) {
        const uint64_t r = __atomic_load_n(&s->resp_seq, __ATOMIC_ACQUIRE);
        if (r == seq) break;
        /* r < seq: no answer yet, or a late one to a request that timed out: keep waiting.
         * r > seq was never asked: the slot is shared or corrupt, stop trusting it */
        if (r > seq) return FP_GPU_BADSEQ;
        if (spin % FP_GPU_CLOCK_EVERY == 0) {
            /* a device loop that has returned (stopped, or the slot stopped by another
             * thread while this request waited) will never answer: say so now instead of
             * spinning out the whole deadline. It publishes resp_seq before `ready`, so one
             * more look after seeing it exited decides whether this answer made it. */
            if (__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE) == FP_GPU_READY_EXITED) {
                if (__atomic_load_n(&s->resp_seq, __ATOMIC_ACQUIRE) == seq) break;
                if (wait_ns) *wait_ns = fp_gpu_now_ns() - t0;
                return FP_GPU_STOPPED;
            }
            if (fp_gpu_now_ns() > deadline) {
                if (wait_ns) *wait_ns = fp_gpu_now_ns() - t0;
                return FP_GPU_TIMEOUT;
            }
        }
        FP_GPU_PAUSE();
    }
    const int64_t t1 = fp_gpu_now_ns();
    if (wait_ns) *wait_ns = t1 - t0;
    if (device_ns) *device_ns = s->device_ns;
    memcpy(out, fp_gpu_out(s), sizeof(float) * (size_t)s->n_out);
    return s->status == FP_GPU_ST_OK ? FP_GPU_OK : FP_GPU_NONFINITE;
}

void fp_gpu_stop(fp_gpu_slot *s) {
    __atomic_store_n(&s->stop, 1u, __ATOMIC_RELEASE);
    __atomic_fetch_or(&s->req_seq, FP_GPU_REQ_STOP, __ATOMIC_RELEASE);
}

int fp_gpu_wait_ready(fp_gpu_slot *s, uint32_t want, int64_t timeout_ns) {
    const int64_t deadline = fp_gpu_deadline(fp_gpu_now_ns(), timeout_ns);
    for (unsigned spin = 1;; spin++) {
        if (__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE) >= want) return FP_GPU_OK;
        if (spin % FP_GPU_CLOCK_EVERY == 0 && fp_gpu_now_ns() > deadline) return FP_GPU_TIMEOUT;
        FP_GPU_PAUSE();
    }
}

int64_t fp_gpu_emulate_device(fp_gpu_slot *s, fp_gpu_forward_fn forward, void *ctx,
                              int64_t max_answers, int64_t delay_ns, int64_t idle_timeout_ns) {
    int64_t answers = 0;
    /* the kernel copies the features out of the slot as soon as it sees the request */
    float *x = (float *)malloc(sizeof(float) * (size_t)s->n_in);
    if (!x) return -1;
    uint64_t seen = __atomic_load_n(&s->req_seq, __ATOMIC_ACQUIRE) & ~FP_GPU_REQ_STOP;
    __atomic_store_n(&s->ready, FP_GPU_READY_RUNNING, __ATOMIC_RELEASE);
    int64_t idle_since = fp_gpu_now_ns();
    for (unsigned spin = 1;; spin++) {
        /* one word per poll, as the kernel reads it: the stop bit, else a new sequence number */
        const uint64_t q = __atomic_load_n(&s->req_seq, __ATOMIC_ACQUIRE);
        if (q & FP_GPU_REQ_STOP) break;
        if (q != seen && answers < max_answers) {
            const int64_t t0 = fp_gpu_now_ns();
            memcpy(x, fp_gpu_in(s), sizeof(float) * (size_t)s->n_in);
            while (fp_gpu_now_ns() - t0 < delay_ns) FP_GPU_PAUSE();
            const int ok = forward(ctx, x, fp_gpu_out(s));
            s->status = ok ? FP_GPU_ST_OK : FP_GPU_ST_NONFINITE;
            s->device_ns = (uint64_t)(fp_gpu_now_ns() - t0);
            __atomic_store_n(&s->resp_seq, q, __ATOMIC_RELEASE);
            seen = q;
            answers++;
            idle_since = fp_gpu_now_ns();
            continue;
        }
        if (spin % FP_GPU_CLOCK_EVERY == 0 && fp_gpu_now_ns() - idle_since > idle_timeout_ns)
            break;
        FP_GPU_PAUSE();
    }
    free(x);
    __atomic_store_n(&s->ready, FP_GPU_READY_EXITED, __ATOMIC_RELEASE);
    return answers;
}
