/* One decoding step's attention on the CPU, float32 (aah_core/inference/kvcache.py calls it through
   aah_core/attention/native.py): each query head reads its kv head's ring of a cache where it lies, one call for
   every head of a layer, whatever their windows. Per (sequence, kv head): each query's scores against the ring's
   keys (16 elements a vector, the lanes summed), exp and sum 16 at a time, then the values weighted by them. The
   items are dealt to the threads in runs of about equal slots. */

#include "kernel.h"

static inline float sum_lanes(vf x) {
    const vi half = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
    const vi quarter = {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11};
    const vi eighth = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
    const vi pair = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
    x += __builtin_shuffle(x, half);
    x += __builtin_shuffle(x, quarter);
    x += __builtin_shuffle(x, eighth);
    x += __builtin_shuffle(x, pair);
    return x[0];
}

typedef struct {
    const float *q, *k, *v;
    float *o;
    int64_t qs[2], ks[2], vs[2], os[2]; /* strides: sequence, then head (q, o) or slot (k, v) */
    int64_t n_kv, group, D;
    const int64_t *first, *length;      /* per kv head: its slots first .. first + length - 1 */
    float scale;
    int64_t item_first, item_last;      /* this thread's (sequence, kv head) items */
    float *scores;                      /* the longest ring's floats, rounded up to VL */
} decode_job_t;

static void *decode_work(void *arg) {
    const decode_job_t *J = arg;
    const int64_t D = J->D;
    for (int64_t item = J->item_first; item < J->item_last; item++) {
        const int64_t b = item / J->n_kv, j = item % J->n_kv, L = J->length[j];
        const float *k = J->k + b * J->ks[0] + J->first[j] * J->ks[1];
        const float *v = J->v + b * J->vs[0] + J->first[j] * J->vs[1];
        for (int64_t h = j * J->group; h < (j + 1) * J->group; h++) {
            const float *q = J->q + b * J->qs[0] + h * J->qs[1];
            float *o = J->o + b * J->os[0] + h * J->os[1];
            vf qv[8]; /* D <= 128 */
            for (int64_t c = 0; c < D / VL; c++) qv[c] = *(const vfu *)(q + c * VL) * J->scale;
            float m = -INFINITY;
            for (int64_t t = 0; t < L; t++) {
                const float *kt = k + t * J->ks[1];
                vf acc = qv[0] * *(const vfu *)kt;
                for (int64_t c = 1; c < D / VL; c++) acc += qv[c] * *(const vfu *)(kt + c * VL);
                const float s = sum_lanes(acc);
                J->scores[t] = s;
                m = s > m ? s : m;
            }
            vf sums = {0};
            const vf mv = (vf){0} + m;
            int64_t t = 0;
            for (; t + VL <= L; t += VL) {
                const vf p = exp_lanes(*(vfu *)(J->scores + t) - mv);
                *(vfu *)(J->scores + t) = p;
                sums += p;
            }
            float sum = sum_lanes(sums);
            for (; t < L; t++) {
                const float p = expf(J->scores[t] - m);
                J->scores[t] = p, sum += p;
            }
            vf acc[8] = {{0}};
            for (t = 0; t < L; t++) {
                const float *vt = v + t * J->vs[1], p = J->scores[t];
                for (int64_t c = 0; c < D / VL; c++) acc[c] += p * *(const vfu *)(vt + c * VL);
            }
            for (int64_t c = 0; c < D / VL; c++) *(vfu *)(o + c * VL) = acc[c] / sum;
        }
    }
    return NULL;
}

/* One decoding step's attention over a cache: q [B, H, D] and o [B, H, D] (strides: sequence, head), k and v
   [B, slots, D] (strides: sequence, slot; D contiguous, D a multiple of 16 up to 128); kv head j's ring is slots
   first[j] .. first[j] + length[j] - 1, every slot of it seen by its `group` query heads j*group ..
   (j+1)*group - 1 (no mask: the caller's rings hold exactly what each head sees). The (sequence, kv head) items
   are dealt to `threads` threads in runs of about equal slots. Returns 0, -1 for bad arguments, -2 without
   memory. */
int aah_decode_attention(const float *q, const float *k, const float *v, float *o, const int64_t *strides, int64_t B,
                         int64_t n_kv, int64_t group, int64_t D, const int64_t *first, const int64_t *length,
                         float scale, int threads) {
    if (B < 1 || n_kv < 1 || group < 1 || D < VL || D % VL || D > 8 * VL) return -1;
    int64_t longest = 0, total = 0;
    for (int64_t j = 0; j < n_kv; j++) {
        if (length[j] < 1 || first[j] < 0) return -1;
        longest = length[j] > longest ? length[j] : longest;
        total += length[j] * B;
    }
    const int64_t items = B * n_kv;
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > items) threads = (int)items;
    decode_job_t jobs[MAX_THREADS];
    size_t held[MAX_THREADS];
    int failed = 0;
    int64_t item = 0, done = 0;
    for (int t = 0; t < threads; t++) {
        decode_job_t *J = &jobs[t];
        J->q = q, J->k = k, J->v = v, J->o = o;
        memcpy(J->qs, strides, sizeof J->qs), memcpy(J->ks, strides + 2, sizeof J->ks);
        memcpy(J->vs, strides + 4, sizeof J->vs), memcpy(J->os, strides + 6, sizeof J->os);
        J->n_kv = n_kv, J->group = group, J->D = D, J->first = first, J->length = length, J->scale = scale;
        J->item_first = item;
        const int64_t share = total * (t + 1) / threads;
        while (item < items && (done + length[item % n_kv] <= share || t == threads - 1)) done += length[item++ % n_kv];
        J->item_last = item;
        J->scores = take((size_t)(longest + VL) * sizeof(float), &held[t]);
        if (!J->scores) failed = 1;
    }
    if (!failed) run_threads(decode_work, jobs, sizeof jobs[0], threads);
    for (int t = 0; t < threads; t++) give(jobs[t].scores, held[t]);
    return failed ? -2 : 0;
}
