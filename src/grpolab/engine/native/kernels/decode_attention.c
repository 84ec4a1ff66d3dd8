#include "attend.h"
/* grpolab's CPU decode attention (grpolab.kernels): one decode step of grouped-query attention, every
   row and head, reading each row's keys and values once:

       out[n, h, :] = sum_j p_j v[n, g, j, :],   p = softmax_j(scale * q[n, h, :] . k[n, g, :, j])

   over the slots j < S with valid[n, j] != 0, g = h / (nh / nkv), in fp32. q and out are (N, nh, d),
   the keys k transposed, (N, nkv, d, cap), v (N, nkv, cap, d), contiguous; valid is (N, valid_stride) bytes. The (row, kv head) pairs are
   shared among the threads of the OpenMP runtime already in the process (torch's, by soname), so it
   runs on torch.get_num_threads() threads. Returns 0, or 1 for shapes it does not take (rep > 16,
   d > 256, nh not a multiple of nkv, S outside [1, cap]) and 2 for S > 512, before writing anything
   in the first case. */
int grpolab_decode_attention(const float *q, const float *k, const float *v, const uint8_t *valid, float *out,
                             int N, int nh, int nkv, int d, int S, int cap, int valid_stride, float scale) {
    const int rep = nh / nkv;
    if (rep > MAXREP || d > MAXD || nh != rep * nkv || S < 1 || S > cap) return 1;
    if (S > MAXS) return 2;
    #pragma omp parallel
    {
        float s[MAXREP * MAXS];
        float o[MAXREP * MAXD];
        #pragma omp for schedule(static)
        for (int item = 0; item < N * nkv; item++) {
            const int n = item / nkv, g = item % nkv;
            const float *restrict kb = k + (int64_t)item * cap * d;
            const float *restrict vb = v + (int64_t)item * cap * d;
            const float *restrict qg = q + ((int64_t)n * nh + g * rep) * d;
            const uint8_t *restrict ok = valid + (int64_t)n * valid_stride;
            attend_pair(qg, kb, vb, ok, out + ((int64_t)n * nh + g * rep) * d, rep, d, S, cap, scale, s, o, 0);
        }
    }
    return 0;
}
