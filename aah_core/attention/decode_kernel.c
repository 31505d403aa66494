/* One decoding step's attention on the CPU, float32 (aah_core/inference/kvcache.py calls it through
   aah_core/attention/native.py): the step's key and value go into each kv head's ring of a cache, and each query
   head reads its kv head's ring where it lies, one call for every head of a layer, whatever their windows. Per
   (sequence, kv head): the new key and value written, each query's scores against the ring's keys (16 elements a
   vector, the lanes summed), exp and sum 16 at a time, then the values weighted by them. The items are dealt to
   the threads in runs of about equal slots. */

#include "kernel.h"

#define MAX_HEADS 1024 /* kv heads a layer */

typedef struct {
    const float *q, *k_new, *v_new;
    float *k, *v, *o;
    int64_t qs[2], kns[2], vns[2], ks[2], vs[2], os[2]; /* strides: sequence, then head (q, new, o) or slot (k, v) */
    int64_t n_kv, group, D;
    const int64_t *first, *slot, *length; /* per kv head: its slots first .. first + length - 1, the new one's */
    float scale;
    int64_t item_first, item_last;      /* this thread's (sequence, kv head) items */
    float *scores;                      /* the longest ring's floats, rounded up to VL */
} decode_job_t;

static void *decode_work(void *arg) {
    const decode_job_t *J = arg;
    const int64_t D = J->D;
    for (int64_t item = J->item_first; item < J->item_last; item++) {
        const int64_t b = item / J->n_kv, j = item % J->n_kv, L = J->length[j];
        float *k = J->k + b * J->ks[0] + J->first[j] * J->ks[1];
        float *v = J->v + b * J->vs[0] + J->first[j] * J->vs[1];
        memcpy(k + J->slot[j] * J->ks[1], J->k_new + b * J->kns[0] + j * J->kns[1], D * sizeof(float));
        memcpy(v + J->slot[j] * J->vs[1], J->v_new + b * J->vns[0] + j * J->vns[1], D * sizeof(float));
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

/* One decoding step over a cache at position `pos`: q [B, H, D] and o [B, H, D], the step's keys and values
   k_new, v_new [B, n_kv, D] (strides: sequence, head), the cache's k and v [B, slots, D] (strides: sequence,
   slot; D contiguous, D a multiple of 16 up to 128). kv head j's ring is the `capacity[j]` slots from first[j];
   position p lives in its slot p mod window[j] (a ring not yet grown to its window holds positions 0 ..
   capacity[j] - 1 in order). The call writes k_new and v_new into position pos's slots, then attends: every slot
   of the ring held (min(pos + 1, capacity[j]) slots) is seen by its `group` query heads j*group .. (j+1)*group -
   1 (no mask: the caller's rings hold exactly what each head sees). The (sequence, kv head) items are dealt to
   up to `threads` threads in runs of about equal slots when they read at least `parallel_work` floats of keys,
   else one. Returns 0, -1 for bad arguments, -2 without memory. */
int aah_decode_step(const float *q, const float *k_new, const float *v_new, float *k, float *v, float *o,
                    const int64_t *strides, int64_t B, int64_t n_kv, int64_t group, int64_t D, const int64_t *first,
                    const int64_t *capacity, const int64_t *window, int64_t pos, float scale, int threads,
                    int64_t parallel_work) {
    if (B < 1 || n_kv < 1 || n_kv > MAX_HEADS || group < 1 || D < VL || D % VL || D > 8 * VL || pos < 0) return -1;
    int64_t slot[MAX_HEADS], length[MAX_HEADS];
    int64_t longest = 0, total = 0;
    for (int64_t j = 0; j < n_kv; j++) {
        if (capacity[j] < 1 || first[j] < 0 || window[j] < 1) return -1;
        slot[j] = pos % window[j], length[j] = pos + 1 < capacity[j] ? pos + 1 : capacity[j];
        if (slot[j] >= capacity[j]) return -1; /* a ring not grown to hold this position */
        longest = length[j] > longest ? length[j] : longest;
        total += length[j] * B;
    }
    const int64_t items = B * n_kv;
    if (total * group * D < parallel_work || threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > items) threads = (int)items;
    decode_job_t jobs[MAX_THREADS];
    size_t held[MAX_THREADS];
    int failed = 0;
    int64_t item = 0, done = 0;
    for (int t = 0; t < threads; t++) {
        decode_job_t *J = &jobs[t];
        J->q = q, J->k_new = k_new, J->v_new = v_new, J->k = k, J->v = v, J->o = o;
        int64_t *to[6] = {J->qs, J->kns, J->vns, J->ks, J->vs, J->os};
        for (int i = 0; i < 6; i++) memcpy(to[i], strides + 2 * i, 2 * sizeof(int64_t));
        J->n_kv = n_kv, J->group = group, J->D = D, J->first = first, J->slot = slot, J->length = length;
        J->scale = scale, J->item_first = item;
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
