/* fp_gpu.h: the request/response slot shared by the host and the persistent GPU kernel, and
 * the host side of its protocol.
 *
 * Decision: one slot in mapped page-locked host memory, three 64-byte lines of control then
 * the features and the outputs, each on their own lines. The request sequence number has a
 * line to itself (only the host writes it), the response sequence number and its status
 * share one (only the device writes them), so neither side's polling reads a line the
 * other keeps dirtying. The host writes the features, then release-stores req_seq; the
 * device acquires req_seq, computes, writes outputs + status, fences at system scope, then
 * stores resp_seq; the host acquire-loads resp_seq and only then reads the outputs. A stop
 * request is the top bit of req_seq (FP_GPU_REQ_STOP), so the device's poll reads one word
 * over PCIe per spin; `stop` in line 2 is the host's own record of it. Every
 * host wait has a deadline: a kernel that faulted or never started is a timeout, not a hang.
 * This header is plain C and also compiled by nvcc (csrc/cuda/fp_mlp.cu): one layout.
 */
#ifndef FP_GPU_H
#define FP_GPU_H

#include <stdint.h>

#define FP_GPU_LINE 64
#define FP_GPU_HDR_BYTES (3 * FP_GPU_LINE)
#define FP_GPU_ROUND_LINE(n) ((((n) + FP_GPU_LINE - 1) / FP_GPU_LINE) * FP_GPU_LINE)

/* req_seq's top bit: the host asks the device loop to return (sequence numbers never reach it) */
#define FP_GPU_REQ_STOP (1ull << 63)

/* status the device writes with each response */
enum { FP_GPU_ST_OK = 0, FP_GPU_ST_NONFINITE = 1 };

/* what the host calls return */
enum {
    FP_GPU_OK = 0,
    FP_GPU_NONFINITE = 1,   /* answered, but a pre-activation was NaN/Inf: outputs not usable */
    FP_GPU_TIMEOUT = -1,    /* no answer before the deadline (kernel stopped, faulted, absent) */
    FP_GPU_STOPPED = -2,    /* the slot was stopped (no request is sent), or the device loop
                             * returned while the request waited (it will never answer) */
    FP_GPU_BADSEQ = -3,     /* the device answered a sequence number that was not asked */
    FP_GPU_BADARG = -4
};

typedef struct {
    /* line 0, host -> device */
    uint64_t req_seq;
    uint8_t _pad0[FP_GPU_LINE - 8];
    /* line 1, device -> host: resp_seq is stored last, after outputs/status/device_ns */
    uint64_t resp_seq;
    int32_t status;
    int32_t _r1;
    uint64_t device_ns;     /* %globaltimer ns from seeing the request to publishing the answer */
    uint8_t _pad1[FP_GPU_LINE - 24];
    /* line 2, control */
    uint32_t stop;          /* host sets 1 with FP_GPU_REQ_STOP (the device reads only that) */
    uint32_t ready;         /* device sets 1 once running, 2 on exit */
    int32_t n_in, n_out;
    uint8_t _pad2[FP_GPU_LINE - 16];
} fp_gpu_slot;

/* features start after the header; outputs after the features, each line-aligned */
#define FP_GPU_IN_OFF FP_GPU_HDR_BYTES
#define FP_GPU_OUT_OFF(n_in) (FP_GPU_HDR_BYTES + FP_GPU_ROUND_LINE((n_in) * 4))
#define FP_GPU_SLOT_BYTES(n_in, n_out) (FP_GPU_OUT_OFF(n_in) + FP_GPU_ROUND_LINE((n_out) * 4))

#ifndef __CUDACC__
#include <stddef.h>

#ifdef __cplusplus
extern "C" {   /* the host emulation of the kernel (csrc/cuda/emu/) is C++ */
#endif

#define FP_GPU_READY_RUNNING 1u
#define FP_GPU_READY_EXITED 2u

static inline float *fp_gpu_in(fp_gpu_slot *s) { return (float *)((char *)s + FP_GPU_IN_OFF); }
static inline float *fp_gpu_out(fp_gpu_slot *s) {
    return (float *)((char *)s + FP_GPU_OUT_OFF(s->n_in));
}

/* bytes a slot for these widths needs (a multiple of 64) */
size_t fp_gpu_slot_bytes(int n_in, int n_out);
/* zero the slot at `mem` (64-byte aligned, fp_gpu_slot_bytes long) and record the widths;
 * FP_GPU_BADARG when misaligned or a width < 1 */
int fp_gpu_slot_init(void *mem, int n_in, int n_out);

/* Send x (n_in floats), wait for the answer until CLOCK_MONOTONIC passes `timeout_ns` from
 * now, copy it to out (n_out floats). *seq_out: the request's sequence number; *device_ns:
 * what the device measured; *wait_ns: host ns from publishing to seeing the answer.
 * FP_GPU_OK, FP_GPU_NONFINITE (out written, not usable), or an error code (<0). After a
 * timeout the slot is poisoned for that seq: a late answer is recognised and skipped. */
int fp_gpu_request(fp_gpu_slot *s, const float *x, float *out, int64_t timeout_ns,
                   uint64_t *seq_out, uint64_t *device_ns, int64_t *wait_ns);

/* ask the device loop to return; it does so at its next poll */
void fp_gpu_stop(fp_gpu_slot *s);
/* wait until `ready` reaches `want` (FP_GPU_READY_RUNNING / _EXITED), or the timeout;
 * FP_GPU_OK or FP_GPU_TIMEOUT */
int fp_gpu_wait_ready(fp_gpu_slot *s, uint32_t want, int64_t timeout_ns);

/* The device's loop on the CPU, for tests of the protocol without a GPU: answer requests
 * with forward(ctx, x, out) (returns 1 if every pre-activation was finite), each after
 * spinning `delay_ns` (a slow device, so answers can arrive late), stop after
 * `max_answers` answers (then stay silent until stopped, as a hung kernel would), return
 * when stopped or after `idle_timeout_ns` without a request. Returns the answers given
 * (-1: out of memory). */
typedef int (*fp_gpu_forward_fn)(void *ctx, const float *x, float *out);
int64_t fp_gpu_emulate_device(fp_gpu_slot *s, fp_gpu_forward_fn forward, void *ctx,
                              int64_t max_answers, int64_t delay_ns, int64_t idle_timeout_ns);
#ifdef __cplusplus
}
#endif
#endif

#endif
