#include <stdint.h>
#include <stdlib.h>
#include <string.h>
/* grpolab's fp32 matrix product for the CPU decode step (grpolab.engine.native.kernels.panel_linear).

       y[m, n] = add[m, n] + bias[n] + sum_k x[m, k] W[n, k]      (add, bias optional)

   A decode step multiplies a few rows (one per sequence) by every weight of the model, read from memory
   once per token: the product is as fast as the weights stream in while the arithmetic goes on. W (Nout,
   K) is packed once per rollout into panels of PW output columns, each K x PW contiguous floats
   (grpolab_pack_panels), so a thread walks its panels front to back; the loop over k keeps MB rows x PW
   columns of accumulators in registers, one vector load of weights per k for MB multiply-adds, and asks
   the cache for the weights PREFETCH bytes ahead (into L2), far enough that the memory works while the
   multiply-adds run (without it a product's time was about the sum of the two). Rows come in chunks of
   MC whose x fits in L2, so a prefill of many rows reads each panel once per chunk.
   The sums over k run in order k = 0, 1, ..., K - 1 in fp32 (another order than MKL's: within float
   rounding of F.linear). */

#if defined(__AVX512F__)
#define PW 16 /* columns per panel: one vector register */
#define MB 16 /* rows per block: MB accumulators + the weight vector + a broadcast, of 32 registers */
#elif defined(__AVX__)
#define PW 8
#define MB 8 /* of 16 registers */
#else
#define PW 4
#define MB 8
#endif
#define PREFETCH 36864 /* bytes ahead: a 576 x 16 panel */
#define CHUNK_BYTES 262144 /* x rows per chunk: at most this many bytes of them (in L2) */

typedef float vec __attribute__((vector_size(PW * 4), aligned(4)));

int grpolab_panel_width(void) { return PW; }

/* P (ceil(Nout / PW) panels of K x PW) from W (Nout, K) row-major; the last panel's missing columns zero. */
int grpolab_pack_panels(const float *W, int Nout, int K, float *P) {
    const int np = (Nout + PW - 1) / PW;
    #pragma omp parallel for schedule(static)
    for (int p = 0; p < np; p++)
        for (int l = 0; l < PW; l++) {
            const int n = p * PW + l;
            float *restrict dst = P + (int64_t)p * K * PW + l;
            if (n < Nout) {
                const float *restrict src = W + (int64_t)n * K;
                for (int k = 0; k < K; k++) dst[(int64_t)k * PW] = src[k];
            } else {
                for (int k = 0; k < K; k++) dst[(int64_t)k * PW] = 0.f;
            }
        }
    return 0;
}

/* MB rows of x (stride K) times panel pp: acc[i] = sum_k x[i, k] pp[k, :]. The weights are read through
   the vector type itself (aligned(4): any address), not memcpy, which GCC's AVX2 tuning split into two
   16-byte moves through the stack; the accumulators are locals, kept in registers over the loop. */
static inline void block(const float *restrict x, int K, const float *restrict pp, vec acc[MB]) {
    vec a[MB];
    for (int i = 0; i < MB; i++) a[i] = (vec){0};
    for (int k = 0; k < K; k++) {
        __builtin_prefetch((const char *)(pp + (int64_t)k * PW) + PREFETCH, 0, 2);
        const vec w = *(const vec *)(pp + (int64_t)k * PW);
        #pragma GCC unroll 16
        for (int i = 0; i < MB; i++) a[i] += x[(int64_t)i * K + k] * w;
    }
    for (int i = 0; i < MB; i++) acc[i] = a[i];
}

/* y (M, Nout) = add + x (M, K) P^T + bias, every array contiguous; add and bias may be NULL, add may be y.
   Returns 0, or 1 when it could not allocate (nothing written). */
int grpolab_panel_linear(const float *x, int M, int K, const float *P, int Nout, const float *bias,
                         const float *add, float *y) {
    const int np = (Nout + PW - 1) / PW;
    const int full = M / MB * MB;
    float *tail = NULL; /* the last M % MB rows, zero-padded to MB */
    if (full < M) {
        tail = calloc((size_t)MB * K, sizeof(float));
        if (!tail) return 1;
        memcpy(tail, x + (int64_t)full * K, (size_t)(M - full) * K * sizeof(float));
    }
    int chunk = CHUNK_BYTES / (4 * K) / MB * MB;
    if (chunk < MB) chunk = MB;
    #pragma omp parallel
    for (int m1 = 0; m1 < M; m1 += chunk) {
        const int m2 = m1 + chunk < M ? m1 + chunk : M;
        #pragma omp for schedule(static)
        for (int p = 0; p < np; p++) {
            const float *pp = P + (int64_t)p * K * PW;
            const int n0 = p * PW, nv = Nout - n0 < PW ? Nout - n0 : PW;
            for (int m0 = m1; m0 < m2; m0 += MB) {
                const int mb = m2 - m0 < MB ? m2 - m0 : MB;
                vec acc[MB];
                block(mb == MB ? x + (int64_t)m0 * K : tail, K, pp, acc);
                for (int i = 0; i < mb; i++) {
                    float out[PW];
                    memcpy(out, &acc[i], sizeof out);
                    const int64_t at = (int64_t)(m0 + i) * Nout + n0;
                    for (int l = 0; l < nv; l++)
                        y[at + l] = out[l] + (bias ? bias[n0 + l] : 0.f) + (add ? add[at + l] : 0.f);
                }
            }
        }
    }
    free(tail);
    return 0;
}
