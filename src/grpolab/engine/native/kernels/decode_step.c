#include "attend.h"
#define BLOCK 64
#define MAXBLOCKS 8192 /* V up to MAXBLOCKS * BLOCK = 524288 tokens */
/* grpolab's CPU decode step, the parts between the matrix products (grpolab.engine.native.kernels), in fp32.

   grpolab_rope_attend: one decode step's attention for every row, from the q, k, v projections of the
   new token to the attention output, in one pass per (row, kv head):

       k' = RoPE(k), q' = RoPE(q)    RoPE(x)_i = x_i cos_i + r(x)_i sin_i,  r([a, b]) = [-b, a]
       cache_k[n, g, :, t] = k', cache_v[n, g, t] = v
       out[n, h] = sum_j p_j cache_v[n, g, j],  p = softmax_j(scale * q'[n, h] . cache_k[n, g, :, j])

   over the slots j <= t with valid[n, j] != 0, g = h / (nh / nkv). qkv is (N, qkv_stride) with q, k, v
   at columns [0, nh d), [nh d, (nh + nkv) d), [(nh + nkv) d, (nh + 2 nkv) d); cos, sin (N, d); the
   keys' cache transposed, (N, nkv, d, cap), the values' (N, nkv, cap, d), contiguous; out (N, nh d). Returns 0, or 1 for shapes it does not take
   (before writing anything).

   grpolab_sample: one token per row of logits z (N, V) from softmax(z / T), by inverse CDF with the
   uniform draw u[n] in [0, 1) (greedy: the first argmax), and its log-prob (z_tok - max z) / T - log sum,
   in one pass over the logits: the sum of exp((z - max) / T) kept per block of BLOCK tokens, the draw's
   block found on those sums, then the token inside it. Returns 0, or 1 for V beyond its block buffer. */

static void rope(const float *restrict x, const float *restrict c, const float *restrict s, float *restrict y,
                 int d) {
    const int h = d / 2;
    for (int i = 0; i < h; i++) {
        y[i] = x[i] * c[i] - x[i + h] * s[i];
        y[i + h] = x[i + h] * c[i + h] + x[i] * s[i + h];
    }
}

int grpolab_rope_attend(const float *qkv, int qkv_stride, const float *cosv, const float *sinv, float *kc, float *vc,
                        const uint8_t *valid, int valid_stride, float *out, int N, int nh, int nkv, int d, int t,
                        int cap, float scale) {
    const int rep = nh / nkv;
    const int S = t + 1;
    if (rep > MAXREP || d > MAXD || d % 2 || nh != rep * nkv || t < 0 || S > cap || S > MAXS) return 1;
    #pragma omp parallel
    {
        float s[MAXREP * MAXS];
        float o[MAXREP * MAXD];
        float qr[MAXREP * MAXD];
        #pragma omp for schedule(static)
        for (int item = 0; item < N * nkv; item++) {
            const int n = item / nkv, g = item % nkv;
            const float *restrict row = qkv + (int64_t)n * qkv_stride;
            const float *restrict c = cosv + (int64_t)n * d, *restrict sn = sinv + (int64_t)n * d;
            float *restrict kb = kc + (int64_t)item * cap * d;
            float *restrict vb = vc + (int64_t)item * cap * d;
            float kt[MAXD];
            rope(row + (nh + g) * d, c, sn, kt, d);
            for (int e = 0; e < d; e++) kb[(int64_t)e * cap + t] = kt[e];
            const float *restrict vnew = row + (nh + nkv + g) * d;
            for (int e = 0; e < d; e++) vb[(int64_t)t * d + e] = vnew[e];
            for (int r = 0; r < rep; r++) rope(row + (g * rep + r) * d, c, sn, qr + r * d, d);
            const uint8_t *restrict ok = valid + (int64_t)n * valid_stride;
            attend_pair(qr, kb, vb, ok, out + ((int64_t)n * nh + g * rep) * d, rep, d, S, cap, scale, s, o, 1);
        }
    }
    return 0;
}


int grpolab_sample(const float *logits, int N, int V, int stride, float inv_t, const float *u, int greedy,
                   int64_t *tok, float *logp) {
    const int nb = (V + BLOCK - 1) / BLOCK;
    if (nb > MAXBLOCKS || V < 1) return 1;
    #pragma omp parallel
    {
        float bsum[MAXBLOCKS];
        #pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *restrict z = logits + (int64_t)n * stride;
            float mx = -INFINITY;
            #pragma omp simd reduction(max:mx)
            for (int j = 0; j < V; j++) mx = z[j] > mx ? z[j] : mx;
            double total = 0.0;
            for (int b = 0; b < nb; b++) {
                const int lo = b * BLOCK, hi = lo + BLOCK < V ? lo + BLOCK : V;
                float acc = 0.f;
                #pragma omp simd reduction(+:acc)
                for (int j = lo; j < hi; j++) acc += exp_neg((z[j] - mx) * inv_t);
                bsum[b] = acc;
                total += acc;
            }
            int pick = 0;
            if (greedy) {
                while (z[pick] != mx && pick < V - 1) pick++;  /* the first largest, as torch.argmax */
            } else {
                const double target = (double)u[n] * total;
                double cum = 0.0;
                int b = 0;
                while (b < nb - 1 && cum + bsum[b] <= target) cum += bsum[b++];
                const int lo = b * BLOCK, hi = lo + BLOCK < V ? lo + BLOCK : V;
                pick = -1;
                for (int j = lo; j < hi; j++) {
                    const float p = exp_neg((z[j] - mx) * inv_t);
                    if (p > 0.f) pick = j;  /* the last token with mass, should rounding leave cum <= target */
                    cum += p;
                    if (p > 0.f && cum > target) break;
                }
                if (pick < 0)
                    while (z[pick < 0 ? (pick = 0) : pick] != mx && pick < V - 1) pick++;
            }
            tok[n] = pick;
            logp[n] = (float)((double)((z[pick] - mx) * inv_t) - log(total));
        }
    }
    return 0;
}

/* grpolab_rms_norm: out[n] = w * x[n] / sqrt(mean(x[n]^2) + eps) for rows x (N, H) with row stride
   x_stride, out (N, H) contiguous; the sum of squares in fp32 (the HF Llama norm's precision). Small
   inputs (a decode step's) run on the calling thread: waking the others costs more than the work. */
int grpolab_rms_norm(const float *x, int N, int H, int x_stride, const float *w, float eps, float *out) {
    #pragma omp parallel for schedule(static) if ((int64_t)N * H >= (1 << 16))
    for (int n = 0; n < N; n++) {
        const float *restrict xn = x + (int64_t)n * x_stride;
        float *restrict on = out + (int64_t)n * H;
        float ss = 0.f;
        #pragma omp simd reduction(+:ss)
        for (int e = 0; e < H; e++) ss += xn[e] * xn[e];
        const float r = 1.f / sqrtf(ss / (float)H + eps);
        #pragma omp simd
        for (int e = 0; e < H; e++) on[e] = w[e] * (xn[e] * r);
    }
    return 0;
}

/* silu(x) = x / (1 + e^-x), e^-x by exp_neg on -|x| so that no exponent overflows. */
static inline float silu(float x) {
    const float e = exp_neg(x > 0.f ? -x : x); /* e^-|x| */
    return x > 0.f ? x / (1.f + e) : x * e / (1.f + e);
}

/* grpolab_silu_mul: out[n, i] = silu(gu[n, i]) * gu[n, I + i] for gu (N, 2 I) with row stride gu_stride
   (the gate and up projections side by side), out (N, I) contiguous. */
int grpolab_silu_mul(const float *gu, int N, int I, int gu_stride, float *out) {
    #pragma omp parallel for schedule(static) if ((int64_t)N * I >= (1 << 16))
    for (int n = 0; n < N; n++) {
        const float *restrict g = gu + (int64_t)n * gu_stride;
        const float *restrict u = g + I;
        float *restrict o = out + (int64_t)n * I;
        #pragma omp simd
        for (int i = 0; i < I; i++) o[i] = silu(g[i]) * u[i];
    }
    return 0;
}
