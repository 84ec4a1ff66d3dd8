#ifndef GRPOLAB_ATTEND_H
#define GRPOLAB_ATTEND_H
#include <math.h>
#include <stdint.h>
#include <float.h>
#define MAXREP 16
#define MAXD 256
#define MAXS 512
/* What the decode kernels share (decode_attention.c, decode_step.c): the attention of one (row, kv head)
   pair, and the exponential the fused step uses. Static inline, so each kernel's loop is compiled in
   place as before, with its own exponential. */

/* exp(x) for x <= 0 within 2 ulp (Cephes' expf: 2^n e^r, |r| <= ln 2 / 2, degree-6 polynomial), 0 below
   -87 (and for -inf); branch-free, so the compiler vectorises the loops that call it (glibc's expf is a
   call per value). */
static inline float exp_neg(float x) {
    const float zero = x < -87.f ? 0.f : 1.f; /* exactly 0 below: a token of probability 0 is never drawn */
    x = x < -87.f ? -87.f : x;
    const float n = floorf(x * 1.44269504088896341f + 0.5f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    union { int32_t i; float f; } two = {.i = ((int32_t)n + 127) << 23};
    return p * two.f * zero;
}

/* One (row, kv head) pair's grouped-query attention over its rep = nh / nkv query heads:

       og[r, :] = sum_j p_j vb[j, :],   p = softmax_j(scale * qg[r, :] . kt[:, j])

   over the slots j < S with ok[j] != 0, in fp32. qg and og are (rep, d), the keys kt transposed,
   (d, cap) (key j is column j: the scores of consecutive slots are one vector operation per element e,
   not a horizontal sum per slot), vb (>= S, d), all contiguous; s (rep * S floats) and o (rep * d
   floats) are the caller's scratch. The exponential is glibc's expf, or exp_neg where polynomial_exp is
   1 (a constant at each call, so each caller's inlined copy has one of the two and no branch). */
static inline __attribute__((always_inline)) void attend_pair(const float *restrict qg, const float *restrict kt,
                                                              const float *restrict vb, const uint8_t *restrict ok,
                                                              float *restrict og, int rep, int d, int S, int cap,
                                                              float scale, float *restrict s, float *restrict o,
                                                              const int polynomial_exp) {
    float mx[MAXREP];
    for (int r = 0; r < rep; r++) {
        float *restrict sr = s + r * S;
        const float *restrict qr = qg + r * d;
        for (int j = 0; j < S; j++) sr[j] = 0.f;
        for (int e = 0; e < d; e++) {
            const float qe = qr[e];
            const float *restrict ke = kt + (int64_t)e * cap;
            #pragma omp simd
            for (int j = 0; j < S; j++) sr[j] += qe * ke[j];
        }
        float m = -FLT_MAX;
        #pragma omp simd reduction(max:m)
        for (int j = 0; j < S; j++) {
            const float x = ok[j] ? sr[j] * scale : -FLT_MAX;
            sr[j] = x;
            m = x > m ? x : m;
        }
        mx[r] = m;
    }
    float inv[MAXREP];
    for (int r = 0; r < rep; r++) {
        float *restrict sr = s + r * S;
        const float m = mx[r];
        float sum = 0.f;
        if (polynomial_exp) {
            #pragma omp simd reduction(+:sum)
            for (int j = 0; j < S; j++) { float x = ok[j] ? exp_neg(sr[j] - m) : 0.f; sr[j] = x; sum += x; }
        } else {
            #pragma omp simd reduction(+:sum)
            for (int j = 0; j < S; j++) { float x = ok[j] ? expf(sr[j] - m) : 0.f; sr[j] = x; sum += x; }
        }
        inv[r] = 1.f / sum;
    }
    for (int i = 0; i < rep * d; i++) o[i] = 0.f;
    for (int j = 0; j < S; j++) {
        const float *restrict vj = vb + (int64_t)j * d;
        for (int r = 0; r < rep; r++) {
            const float p = s[r * S + j];
            float *restrict orow = o + r * d;
            #pragma omp simd
            for (int e = 0; e < d; e++) orow[e] += p * vj[e];
        }
    }
    for (int r = 0; r < rep; r++)
        for (int e = 0; e < d; e++) og[r * d + e] = o[r * d + e] * inv[r];
}
#endif
