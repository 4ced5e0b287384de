# Declarations of csrc/fp_gpu.h (the persistent kernel's slot protocol); cdef extern only.
from libc.stdint cimport int64_t, uint32_t, uint64_t


cdef extern from "fp_gpu.h" nogil:
    enum:
        FP_GPU_OK
        FP_GPU_NONFINITE
        FP_GPU_TIMEOUT
        FP_GPU_STOPPED
        FP_GPU_BADSEQ
        FP_GPU_BADARG
        FP_GPU_LINE
        FP_GPU_HDR_BYTES
        FP_GPU_READY_RUNNING
        FP_GPU_READY_EXITED
    const uint64_t FP_GPU_REQ_STOP
    ctypedef struct fp_gpu_slot:
        uint64_t req_seq
        uint64_t resp_seq
        int status
        uint64_t device_ns
        uint32_t stop
        uint32_t ready
        int n_in
        int n_out
    ctypedef int (*fp_gpu_forward_fn)(void *ctx, const float *x, float *out) noexcept nogil
    size_t fp_gpu_slot_bytes(int n_in, int n_out)
    int fp_gpu_slot_init(void *mem, int n_in, int n_out)
    int fp_gpu_request(fp_gpu_slot *s, const float *x, float *out, int64_t timeout_ns,
                       uint64_t *seq_out, uint64_t *device_ns, int64_t *wait_ns)
    void fp_gpu_stop(fp_gpu_slot *s)
    int fp_gpu_wait_ready(fp_gpu_slot *s, uint32_t want, int64_t timeout_ns)
    int64_t fp_gpu_emulate_device(fp_gpu_slot *s, fp_gpu_forward_fn forward, void *ctx,
                                  int64_t max_answers, int64_t delay_ns,
                                  int64_t idle_timeout_ns)
