/* A decoding step of one block of aah_core/model.py's Transformer (Block.cached), float32 on the CPU, in one call
   (aah_block_step): the layer norms, the projections, rotary and the MLP of a few rows around the cache's
   attention (decode_kernel.c), instead of a dozen small torch operations (each of which costs more in dispatch
   than in arithmetic at a decode step's size).
   A row times a matrix is dot products of the row with the matrix's rows (nn.Linear's [out, in] layout, read as
   it is), four at a time so that their sums do not wait on each other. */

#include "kernel.h"

/* out[b, o] = x[b] . w[o] + bias[o] (bias may be NULL) + add[b, o] (add may be NULL); x [B, n_in], w [n_out,
   n_in], out and add [B, n_out], all contiguous; n_in a multiple of VL, n_out of 4. */
static void rows_times(const float *x, int64_t B, int64_t n_in, const float *w, int64_t n_out, const float *bias,
                       const float *add, float *out) {
    for (int64_t o = 0; o < n_out; o += 4) {
        const float *w0 = w + o * n_in, *w1 = w0 + n_in, *w2 = w1 + n_in, *w3 = w2 + n_in;
        for (int64_t b = 0; b < B; b++) {
            const float *xb = x + b * n_in;
            vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int64_t c = 0; c < n_in; c += VL) {
                const vf xv = *(const vfu *)(xb + c);
                a0 += xv * *(const vfu *)(w0 + c), a1 += xv * *(const vfu *)(w1 + c);
                a2 += xv * *(const vfu *)(w2 + c), a3 += xv * *(const vfu *)(w3 + c);
            }
            float *ob = out + b * n_out + o;
            const float sums[4] = {sum_lanes(a0), sum_lanes(a1), sum_lanes(a2), sum_lanes(a3)};
            for (int i = 0; i < 4; i++)
                ob[i] = sums[i] + (bias ? bias[o + i] : 0.0f) + (add ? add[b * n_out + o + i] : 0.0f);
        }
    }
}

/* out[b] = (x[b] - mean) / sqrt(var + eps) * weight + bias, per row of C (a multiple of VL). */
static void layer_norm(const float *x, int64_t B, int64_t C, const float *weight, const float *bias, float eps,
                       float *out) {
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * C;
        float *ob = out + b * C;
        vf sum = {0};
        for (int64_t c = 0; c < C; c += VL) sum += *(const vfu *)(xb + c);
        const float mean = sum_lanes(sum) / (float)C;
        vf squares = {0};
        for (int64_t c = 0; c < C; c += VL) {
            const vf d = *(const vfu *)(xb + c) - mean;
            squares += d * d;
        }
        const float inv = 1.0f / sqrtf(sum_lanes(squares) / (float)C + eps);
        for (int64_t c = 0; c < C; c += VL)
            *(vfu *)(ob + c) = (*(const vfu *)(xb + c) - mean) * inv * *(const vfu *)(weight + c)
                               + *(const vfu *)(bias + c);
    }
}

/* The exact GELU, x (1 + erf(x / sqrt 2)) / 2, in place on n floats (a multiple of VL). erf by Abramowitz and
   Stegun's 7.1.26 (Handbook of Mathematical Functions, 1964: absolute error under 1.5e-7), odd in x. */
static void gelu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += VL) {
        const vf v = *(vfu *)(x + i), z = v * 0.70710678118654752f;
        const vf a = (vf)((vi)z & INT32_MAX); /* |z| */
        const vf t = 1.0f / (1.0f + 0.3275911f * a);
        vf p = t * 1.061405429f - 1.453152027f;
        p = p * t + 1.421413741f;
        p = p * t - 0.284496736f;
        p = p * t + 0.254829592f;
        const vf erf_a = 1.0f - p * t * exp_lanes((vf){0} - a * a);
        const vf erf_z = (vf)((vi)erf_a | ((vi)z & INT32_MIN)); /* z's sign */
        *(vfu *)(x + i) = 0.5f * v * (1.0f + erf_z);
    }
}

/* The block's first half for rows x [B, C]: qkv [B, 3C] = layer_norm(x) times w_qkv [3C, C], its first 2C
   columns (the q heads, then the k heads, H of each, C / H wide) rotated to position `pos` in pairs, (a, b) ->
   (a cos - b sin, a sin + b cos), by rows `pos` of cos and sin [positions, C / H / 2]. C a multiple of VL.
   Returns 0, -1 for bad arguments, -2 without memory. */
static int step_in(const float *x, int64_t B, int64_t C, int64_t H, const float *ln_weight, const float *ln_bias,
                   float eps, const float *w_qkv, const float *cos, const float *sin, int64_t positions,
                   int64_t pos, float *qkv) {
    if (B < 1 || C < VL || C % VL || H < 1 || C % (2 * H) || pos < 0 || pos >= positions) return -1;
    size_t held;
    float *normed = take((size_t)(B * C) * sizeof(float), &held);
    if (!normed) return -2;
    layer_norm(x, B, C, ln_weight, ln_bias, eps, normed);
    rows_times(normed, B, C, w_qkv, 3 * C, NULL, NULL, qkv);
    give(normed, held);
    const int64_t half = C / H / 2;
    const float *c = cos + pos * half, *s = sin + pos * half;
    for (int64_t b = 0; b < B; b++) {
        float *row = qkv + b * 3 * C;
        for (int64_t i = 0; i < C; i++) { /* 2 H heads of half pairs: C pairs */
            const float a = row[2 * i], d = row[2 * i + 1], ci = c[i % half], si = s[i % half];
            row[2 * i] = a * ci - d * si, row[2 * i + 1] = a * si + d * ci;
        }
    }
    return 0;
}

/* The block's second half, after attention gave y [B, C] for rows x [B, C]: r = x + y times w_proj [C, C], then
   out [B, C] = r + (gelu(layer_norm(r) times w_fc [F, C] + b_fc) times w_out [C, F] + b_out). C and F multiples
   of VL. Returns 0, -1 for bad arguments, -2 without memory. */
static int step_out(const float *x, const float *y, int64_t B, int64_t C, int64_t F, const float *w_proj,
                    const float *ln_weight, const float *ln_bias, float eps, const float *w_fc, const float *b_fc,
                    const float *w_out, const float *b_out, float *out) {
    if (B < 1 || C < VL || C % VL || F < VL || F % VL) return -1;
    size_t held;
    float *r = take((size_t)(B * (2 * C + F)) * sizeof(float), &held);
    if (!r) return -2;
    float *normed = r + B * C, *hidden = normed + B * C;
    rows_times(y, B, C, w_proj, C, NULL, x, r);
    layer_norm(r, B, C, ln_weight, ln_bias, eps, normed);
    rows_times(normed, B, C, w_fc, F, b_fc, NULL, hidden);
    gelu(hidden, B * F);
    rows_times(hidden, B, F, w_out, C, b_out, r, out);
    give(r, held);
    return 0;
}

/* A decoding step of one block in one call: step_in's half, the cache's attention (aah_decode_step: the step's
   key and value written into the rings, then every query head over its kv head's ring), step_out's half.
   x, out [B, C]; params: the block's 12 tensors' addresses (block_step.py's order); eps: the two layer norms';
   positions: the rotary tables' rows; k, v [B, slots, D] with the rings (first, capacity, window) of its n_kv = H
   kv heads; D = C / H a multiple of 16 up to 128. Returns 0, -1 for bad arguments, -2 without memory. */
int aah_block_step(const float *x, float *out, int64_t B, int64_t C, int64_t H, int64_t F, const int64_t *params,
                   const float *eps, int64_t positions, float *k, float *v, int64_t slots, int64_t n_kv,
                   const int64_t *first, const int64_t *capacity, const int64_t *window, int64_t pos, int threads,
                   int64_t parallel_work) {
    if (B < 1 || C < VL || H < 1 || C % H || n_kv != H) return -1; /* the block's own k and v heads */
    const float *p[12];
    for (int i = 0; i < 12; i++) p[i] = (const float *)(intptr_t)params[i];
    const int64_t D = C / H;
    size_t held;
    float *qkv = take((size_t)(B * 4 * C) * sizeof(float), &held);
    if (!qkv) return -2;
    float *y = qkv + B * 3 * C;
    int rc = step_in(x, B, C, H, p[0], p[1], eps[0], p[2], p[3], p[4], positions, pos, qkv);
    const int64_t strides[12] = {3 * C, D, 3 * C, D, 3 * C, D, slots * D, D, slots * D, D, C, D};
    if (rc == 0)
        rc = aah_decode_step(qkv, qkv + C, qkv + 2 * C, k, v, y, strides, B, n_kv, 1, D, first, capacity,
                             window, pos, 1.0f / sqrtf((float)D), threads, parallel_work);
    if (rc == 0) rc = step_out(x, y, B, C, F, p[5], p[6], p[7], eps[1], p[8], p[9], p[10], p[11], out);
    give(qkv, held);
    return rc;
}
