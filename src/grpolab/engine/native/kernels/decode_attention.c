#include <math.h>
#include <stdint.h>
#include <float.h>
#define MAXREP 16
#define MAXD 256
/* grpolab's CPU decode attention (grpolab.kernels): one decode step of grouped-query attention, every
   row and head, reading each row's keys and values once:

       out[n, h, :] = sum_j p_j v[n, g, j, :],   p = softmax_j(scale * q[n, h, :] . k[n, g, j, :])

   over the slots j < S with valid[n, j] != 0, g = h / (nh / nkv), in fp32. q and out are (N, nh, d),
   k and v (N, nkv, cap, d), contiguous; valid is (N, valid_stride) bytes. The (row, kv head) pairs are
   shared among the threads of the OpenMP runtime already in the process (torch's, by soname), so it
   runs on torch.get_num_threads() threads. Returns 0, or 1 for shapes it does not take (rep > 16,
   d > 256, nh not a multiple of nkv, S outside [1, cap]) and 2 for S > 512, before writing anything
   in the first case. */
int grpolab_decode_attention(const float *q, const float *k, const float *v, const uint8_t *valid, float *out,
                             int N, int nh, int nkv, int d, int S, int cap, int valid_stride, float scale) {
    const int rep = nh / nkv;
    if (rep > MAXREP || d > MAXD || nh != rep * nkv || S < 1 || S > cap) return 1;
    if (S > 512) return 2;
    #pragma omp parallel
    {
        float s[MAXREP * 512];
        float o[MAXREP * MAXD];
        #pragma omp for schedule(static)
        for (int item = 0; item < N * nkv; item++) {
            const int n = item / nkv, g = item % nkv;
            const float *restrict kb = k + (int64_t)item * cap * d;
            const float *restrict vb = v + (int64_t)item * cap * d;
            const float *restrict qg = q + ((int64_t)n * nh + g * rep) * d;
            const uint8_t *restrict ok = valid + (int64_t)n * valid_stride;
            float mx[MAXREP];
            for (int r = 0; r < rep; r++) mx[r] = -FLT_MAX;
            for (int j = 0; j < S; j++) {
                const float *restrict kj = kb + (int64_t)j * d;
                for (int r = 0; r < rep; r++) {
                    const float *restrict qr = qg + r * d;
                    float acc = 0.f;
                    #pragma omp simd reduction(+:acc)
                    for (int e = 0; e < d; e++) acc += qr[e] * kj[e];
                    acc = ok[j] ? acc * scale : -FLT_MAX;
                    s[r * S + j] = acc;
                    mx[r] = acc > mx[r] ? acc : mx[r];
                }
            }
            float inv[MAXREP];
            for (int r = 0; r < rep; r++) {
                float *restrict sr = s + r * S;
                const float m = mx[r];
                float sum = 0.f;
                #pragma omp simd reduction(+:sum)
                for (int j = 0; j < S; j++) { float x = ok[j] ? expf(sr[j] - m) : 0.f; sr[j] = x; sum += x; }
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
            float *restrict og = out + ((int64_t)n * nh + g * rep) * d;
            for (int r = 0; r < rep; r++)
                for (int e = 0; e < d; e++) og[r * d + e] = o[r * d + e] * inv[r];
        }
    }
    return 0;
}
