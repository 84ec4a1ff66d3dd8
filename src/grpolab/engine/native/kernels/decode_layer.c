#include <stdint.h>
/* grpolab's CPU decode step, one whole layer per call (grpolab.engine.native.kernels.decode_layer), in fp32:
   the composition of the kernels in decode_step.c and decode_linear.c, in the order the lean decoder's
   forward calls them one at a time,

       h = RMSNorm(x; ln1) ;  qkv = h W_qkv^T + b_qkv
       a = rope_attend(qkv, cache, slot t)               (RoPE, the cache writes, the attention)
       x = x + a W_o^T + b_o
       h = RMSNorm(x; ln2) ;  gu = h W_gu^T ;  x = x + (silu(g) * u) W_down^T

   so the results are the same to the bit; what it saves is the Python between them (eight calls a layer,
   each with its argument checks). x (N, H) is updated in place; the weights are panels
   (grpolab_pack_panels); h, qkv, att, gu, act are the caller's scratch, (N, H), (N, Nqkv), (N, nh d),
   (N, 2 I), (N, I). Returns 0; 1 when rope_attend does not take the shapes (nothing written to x or the
   cache); 2 when a product could not allocate its row buffer (x may be half updated: the caller raises). */

int grpolab_rms_norm(const float *x, int N, int H, int x_stride, const float *w, float eps, float *out);
int grpolab_silu_mul(const float *gu, int N, int I, int gu_stride, float *out);
int grpolab_panel_linear(const float *x, int M, int K, const float *P, int Nout, const float *bias,
                         const float *add, float *y);
int grpolab_rope_attend(const float *qkv, int qkv_stride, const float *cosv, const float *sinv, float *kc, float *vc,
                        const uint8_t *valid, int valid_stride, float *out, int N, int nh, int nkv, int d, int t,
                        int cap, float scale);

int grpolab_decode_layer(float *x, int N, int H, const float *ln1, const float *ln2, float eps, const float *Pqkv,
                         const float *bqkv, const float *Po, const float *bo, const float *Pgu, const float *Pdown,
                         int I, const float *cosv, const float *sinv, float *kc, float *vc, const uint8_t *valid,
                         int valid_stride, int nh, int nkv, int d, int t, int cap, float scale, float *h, float *qkv,
                         float *att, float *gu, float *act) {
    const int Nqkv = (nh + 2 * nkv) * d;
    grpolab_rms_norm(x, N, H, H, ln1, eps, h);
    if (grpolab_panel_linear(h, N, H, Pqkv, Nqkv, bqkv, 0, qkv)) return 2;
    if (grpolab_rope_attend(qkv, Nqkv, cosv, sinv, kc, vc, valid, valid_stride, att, N, nh, nkv, d, t, cap, scale))
        return 1;
    if (grpolab_panel_linear(att, N, nh * d, Po, H, bo, x, x)) return 2;
    grpolab_rms_norm(x, N, H, H, ln2, eps, h);
    if (grpolab_panel_linear(h, N, H, Pgu, 2 * I, 0, 0, gu)) return 2;
    grpolab_silu_mul(gu, N, I, 2 * I, act);
    return grpolab_panel_linear(act, N, I, Pdown, H, 0, x, x) ? 2 : 0;
}
