/* fp_simd.c: CPU feature detection and the kernel-set table.
 *
 * AVX2 and FMA are separate cpuid bits and some CPUs (and some hypervisors)
 * expose one without the other, so both are checked, plus XGETBV to make sure
 * the OS saves YMM registers; the answer is computed once and cached.
 */
#include "fp_simd.h"
#include <stdlib.h>
#include <string.h>

#if FP_HAVE_X86
#include <cpuid.h>

static int g_cpu_checked = 0, g_avx2 = 0, g_fma = 0;
static int g_avx512 = 0, g_avx512_bf16 = 0, g_avx512_vnni = 0, g_avx_vnni = 0;

static unsigned long long fp_xgetbv0(void) {
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static void fp_cpu_check(void) {
    unsigned int a, b, c, d;
    int osxsave = 0, avx = 0;
    if (g_cpu_checked) return;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        osxsave = (c >> 27) & 1;
        avx = (c >> 28) & 1;
        g_fma = (c >> 12) & 1;
    }
    /* XCR0 bits 1 (SSE) and 2 (AVX) must both be enabled by the OS. */
    int ymm_ok = osxsave && avx && ((fp_xgetbv0() & 6) == 6);
    unsigned long long xcr0 = osxsave ? fp_xgetbv0() : 0;
    /* ZMM needs XCR0 bits 5 (opmask), 6 (ZMM0-15 upper halves) and 7 (ZMM16-31) as well:
     * an OS (or hypervisor) that does not save them would corrupt the registers on a
     * context switch, so the cpuid bits alone are not enough. */
    int zmm_ok = ymm_ok && ((xcr0 & 0xe0) == 0xe0);
    if (ymm_ok && __get_cpuid_max(0, 0) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        g_avx2 = (b >> 5) & 1;
        /* the set the kernels use: F, DQ (16), BW (30), VL (31) */
        int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
        g_avx512 = zmm_ok && f && dq && bw && vl;
        g_avx512_vnni = g_avx512 && ((c >> 11) & 1);
        /* subleaf 1 only where leaf 7 has it (EAX of subleaf 0: the highest subleaf) */
        if (a >= 1) {
            unsigned int a1, b1, c1, d1;
            __cpuid_count(7, 1, a1, b1, c1, d1);
            g_avx512_bf16 = g_avx512 && ((a1 >> 5) & 1);
            g_avx_vnni = (a1 >> 4) & 1;
        }
    }
    if (!ymm_ok) { g_avx2 = 0; g_fma = 0; g_avx_vnni = 0; }
    g_cpu_checked = 1;
}

int fp_cpu_has_avx2(void) { fp_cpu_check(); return g_avx2; }
int fp_cpu_has_fma(void) { fp_cpu_check(); return g_fma; }
int fp_cpu_has_avx512(void) { fp_cpu_check(); return g_avx512 && g_fma; }
int fp_cpu_has_avx512_bf16(void) { fp_cpu_check(); return g_avx512_bf16 && g_fma; }
int fp_cpu_has_avx512_vnni(void) { fp_cpu_check(); return g_avx512_vnni && g_fma; }
int fp_cpu_has_avx_vnni(void) { fp_cpu_check(); return g_avx_vnni && g_avx2; }
#else
int fp_cpu_has_avx512(void) { return 0; }
int fp_cpu_has_avx512_bf16(void) { return 0; }
int fp_cpu_has_avx512_vnni(void) { return 0; }
int fp_cpu_has_avx_vnni(void) { return 0; }
int fp_cpu_has_avx2(void) { return 0; }
int fp_cpu_has_fma(void) { return 0; }
#endif

int fp_isa_supported(fp_isa isa) {
    switch (isa) {
    case FP_ISA_SCALAR: return 1;
    case FP_ISA_AVX2: return fp_cpu_has_avx2() && fp_cpu_has_fma();
    /* the AVX-512 set also uses AVX2 instructions (ymm folds, gathers), so it needs both */
    case FP_ISA_AVX512: return fp_cpu_has_avx512() && fp_cpu_has_avx2();
    }
    return 0;
}

fp_isa fp_isa_best(void) {
    if (fp_isa_supported(FP_ISA_AVX512)) return FP_ISA_AVX512;
    return fp_isa_supported(FP_ISA_AVX2) ? FP_ISA_AVX2 : FP_ISA_SCALAR;
}

const fp_kernels *fp_kernels_for(fp_isa isa) {
    if (!fp_isa_supported(isa)) return NULL;
#if FP_HAVE_X86
    if (isa == FP_ISA_AVX512) return &fp_kernels_avx512;
    if (isa == FP_ISA_AVX2) return &fp_kernels_avx2;
#endif
    if (isa == FP_ISA_SCALAR) return &fp_kernels_scalar;
    return NULL;
}

void *fp_aligned_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = FP_ALIGN;
    bytes = FP_ROUND_UP(bytes, FP_ALIGN);
    if (posix_memalign(&p, FP_ALIGN, bytes) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

void fp_aligned_free(void *p) { free(p); }
