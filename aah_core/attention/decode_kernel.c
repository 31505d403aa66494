/* One decoding step's attention on the CPU, float32 (aah_core/inference/kvcache.py calls it through
   aah_core/attention/native.py): the step's key and value go into each kv head's ring of a cache, and each query
   head reads its kv head's ring where it lies, one call for every head of a layer, whatever their windows. Per
   (sequence, kv head): the new key and value written, each query's scores against the ring's keys (16 elements a
   vector, the lanes summed), exp and sum 16 at a time, then the values weighted by them. The items are dealt to
   the threads in runs of about equal slots, a ring longer than a thread's share cut into pieces (FlashDecoding's
   split of the keys, Dao et al. 2023), their results merged by their maxima and sums. */

#include "kernel.h"

#define MAX_HEADS 1024 /* kv heads a layer */

#define MAX_PARTS 64  /* pieces a ring is cut into */
#define MIN_PIECE 256 /* slots: a ring is cut only into pieces at least this long */

typedef struct {
    const float *q, *k, *v;
    float *o;
    int64_t qs[2], ks[2], vs[2], os[2]; /* strides: sequence, then head (q, o) or slot (k, v) */
    int64_t n_kv, group, D, H;
    const int64_t *first, *length, *parts; /* per kv head: slots first .. first + length - 1, cut in `parts` */
    float scale;
    int64_t item, part, pieces;            /* this thread's pieces: `pieces` from (item, part) on, in order */
    float *scores;                         /* the longest piece's floats, rounded up to VL */
    float *partial;                        /* per (sequence, query head, part): max, sum, D weighted values */
    int64_t max_parts;                     /* (partial's parts a query head) */
} decode_job_t;

/* The sums of the lanes of 16 vectors, as one vector (its lane i: part[i]'s sum): halves, quarters, eighths and
   pairs of two vectors' lanes added in a tree, 45 operations for what sum_lanes does in 128. */
static inline vf sum_lanes_16(const vf part[VL]) {
    const vi lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const vi hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const vi lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const vi hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const vi lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const vi hi2 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    const vi lo1 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const vi hi1 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    vf eights[8], fours[4], twos[2];
    for (int j = 0; j < 8; j++) /* keys 2j, 2j+1: 8 partial sums each */
        eights[j] = __builtin_shuffle(part[2 * j], part[2 * j + 1], lo8) + __builtin_shuffle(part[2 * j], part[2 * j + 1], hi8);
    for (int j = 0; j < 4; j++) /* keys 4j .. 4j+3: 4 each */
        fours[j] = __builtin_shuffle(eights[2 * j], eights[2 * j + 1], lo4) + __builtin_shuffle(eights[2 * j], eights[2 * j + 1], hi4);
    for (int j = 0; j < 2; j++) /* keys 8j .. 8j+7: 2 each */
        twos[j] = __builtin_shuffle(fours[2 * j], fours[2 * j + 1], lo2) + __builtin_shuffle(fours[2 * j], fours[2 * j + 1], hi2);
    return __builtin_shuffle(twos[0], twos[1], lo1) + __builtin_shuffle(twos[0], twos[1], hi1);
}

/* One query over slots lo .. hi - 1 of its kv head's ring k, v: its scores' max *max and the sum of their exps
   *sum, and the values weighted by those exps in acc (D / VL vectors). */
static void attend_piece(const decode_job_t *J, const float *q, const float *k, const float *v, int64_t lo,
                         int64_t hi, float *max, float *sum, vf *acc) {
    const int64_t D = J->D, L = hi - lo;
    float *scores = J->scores;
    vf qv[8]; /* D <= 128 */
    for (int64_t c = 0; c < D / VL; c++) qv[c] = *(const vfu *)(q + c * VL) * J->scale;
    vf maxima = (vf){0} - INFINITY;
    int64_t t = 0;
    for (; t + VL <= L; t += VL) { /* 16 keys' scores at once */
        vf part[VL];
        for (int i = 0; i < VL; i++) {
            const float *kt = k + (lo + t + i) * J->ks[1];
            vf a = qv[0] * *(const vfu *)kt;
            for (int64_t c = 1; c < D / VL; c++) a += qv[c] * *(const vfu *)(kt + c * VL);
            part[i] = a;
        }
        const vf s = sum_lanes_16(part);
        *(vfu *)(scores + t) = s;
        maxima = max_lanes(maxima, s);
    }
    float m = -INFINITY;
    for (int i = 0; i < VL; i++) m = maxima[i] > m ? maxima[i] : m;
    for (; t < L; t++) {
        const float *kt = k + (lo + t) * J->ks[1];
        vf a = qv[0] * *(const vfu *)kt;
        for (int64_t c = 1; c < D / VL; c++) a += qv[c] * *(const vfu *)(kt + c * VL);
        const float s = sum_lanes(a);
        scores[t] = s;
        m = s > m ? s : m;
    }
    vf sums = {0};
    const vf mv = (vf){0} + m;
    for (t = 0; t + VL <= L; t += VL) {
        const vf p = exp_lanes(*(vfu *)(scores + t) - mv);
        *(vfu *)(scores + t) = p;
        sums += p;
    }
    float l = sum_lanes(sums);
    for (; t < L; t++) {
        const float p = expf(scores[t] - m);
        scores[t] = p, l += p;
    }
    for (int64_t c = 0; c < D / VL; c++) acc[c] = (vf){0};
    for (t = 0; t < L; t++) {
        const float *vt = v + (lo + t) * J->vs[1], p = scores[t];
        for (int64_t c = 0; c < D / VL; c++) acc[c] += p * *(const vfu *)(vt + c * VL);
    }
    *max = m, *sum = l;
}

static void *decode_work(void *arg) {
    const decode_job_t *J = arg;
    const int64_t D = J->D;
    int64_t item = J->item, part = J->part;
    for (int64_t n = 0; n < J->pieces; n++) {
        const int64_t b = item / J->n_kv, j = item % J->n_kv, L = J->length[j], P = J->parts[j];
        const float *k = J->k + b * J->ks[0] + J->first[j] * J->ks[1];
        const float *v = J->v + b * J->vs[0] + J->first[j] * J->vs[1];
        for (int64_t h = j * J->group; h < (j + 1) * J->group; h++) {
            vf acc[8];
            float m, l;
            attend_piece(J, J->q + b * J->qs[0] + h * J->qs[1], k, v, L * part / P, L * (part + 1) / P, &m, &l, acc);
            if (P == 1) {
                float *o = J->o + b * J->os[0] + h * J->os[1];
                for (int64_t c = 0; c < D / VL; c++) *(vfu *)(o + c * VL) = acc[c] / l;
            } else {
                float *w = J->partial + ((b * J->H + h) * J->max_parts + part) * (D + 2);
                w[0] = m, w[1] = l;
                for (int64_t c = 0; c < D / VL; c++) *(vfu *)(w + 2 + c * VL) = acc[c];
            }
        }
        if (++part == P) part = 0, item++;
    }
    return NULL;
}

/* The output of query head h of sequence b from its ring's P parts: each part's values weighted by exp(score -
   its max), rescaled to the largest max and divided by the sum of every part's exps (FlashDecoding's merge). */
static void merge_parts(const decode_job_t *J, int64_t b, int64_t h, int64_t P) {
    const int64_t D = J->D;
    const float *w = J->partial + (b * J->H + h) * J->max_parts * (D + 2);
    float m = -INFINITY, l = 0.0f;
    for (int64_t r = 0; r < P; r++) m = w[r * (D + 2)] > m ? w[r * (D + 2)] : m;
    vf acc[8] = {{0}};
    for (int64_t r = 0; r < P; r++) {
        const float *part = w + r * (D + 2), f = expf(part[0] - m);
        l += f * part[1];
        for (int64_t c = 0; c < D / VL; c++) acc[c] += f * *(const vfu *)(part + 2 + c * VL);
    }
    float *o = J->o + b * J->os[0] + h * J->os[1];
    for (int64_t c = 0; c < D / VL; c++) *(vfu *)(o + c * VL) = acc[c] / l;
}

/* One decoding step over a cache at position `pos`: q [B, H, D] and o [B, H, D], the step's keys and values
   k_new, v_new [B, n_kv, D] (strides: sequence, head), the cache's k and v [B, slots, D] (strides: sequence,
   slot; D contiguous, D a multiple of 16 up to 128). kv head j's ring is the `capacity[j]` slots from first[j];
   position p lives in its slot p mod window[j] (a ring not yet grown to its window holds positions 0 ..
   capacity[j] - 1 in order). The call writes k_new and v_new into position pos's slots, then attends: every slot
   of the ring held (min(pos + 1, capacity[j]) slots) is seen by its `group` query heads j*group .. (j+1)*group -
   1 (no mask: the caller's rings hold exactly what each head sees). When the keys read are at least
   `parallel_work` floats, up to `threads` threads share the work in runs of about equal slots, a ring longer than
   a thread's share cut into pieces whose results are merged; else one thread. Returns 0, -1 for bad arguments,
   -2 without memory. */
int aah_decode_step(const float *q, const float *k_new, const float *v_new, float *k, float *v, float *o,
                    const int64_t *strides, int64_t B, int64_t n_kv, int64_t group, int64_t D, const int64_t *first,
                    const int64_t *capacity, const int64_t *window, int64_t pos, float scale, int threads,
                    int64_t parallel_work) {
    if (B < 1 || n_kv < 1 || n_kv > MAX_HEADS || group < 1 || D < VL || D % VL || D > 8 * VL || pos < 0) return -1;
    int64_t length[MAX_HEADS], parts[MAX_HEADS];
    int64_t total = 0;
    for (int64_t j = 0; j < n_kv; j++) {
        if (capacity[j] < 1 || first[j] < 0 || window[j] < 1 || pos % window[j] >= capacity[j])
            return -1; /* (the last: a ring not grown to hold this position) */
        length[j] = pos + 1 < capacity[j] ? pos + 1 : capacity[j];
        total += length[j] * B;
    }
    const int64_t *ks = strides + 6, *vs = strides + 8;
    for (int64_t b = 0; b < B; b++) /* the step's keys and values into their slots, before anything reads them */
        for (int64_t j = 0; j < n_kv; j++) {
            const int64_t slot = first[j] + pos % window[j];
            memcpy(k + b * ks[0] + slot * ks[1], k_new + b * strides[2] + j * strides[3], D * sizeof(float));
            memcpy(v + b * vs[0] + slot * vs[1], v_new + b * strides[4] + j * strides[5], D * sizeof(float));
        }
    if (total * group * D < parallel_work || threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    const int64_t share = (total + threads - 1) / threads, piece = share > MIN_PIECE ? share : MIN_PIECE;
    int64_t pieces = 0, longest = 0, max_parts = 1;
    for (int64_t j = 0; j < n_kv; j++) {
        parts[j] = threads == 1 ? 1 : (length[j] + piece - 1) / piece;
        parts[j] = parts[j] < MAX_PARTS ? parts[j] : MAX_PARTS;
        const int64_t widest = (length[j] + parts[j] - 1) / parts[j];
        longest = widest > longest ? widest : longest;
        pieces += parts[j] * B, max_parts = parts[j] > max_parts ? parts[j] : max_parts;
    }
    if (threads > pieces) threads = (int)pieces;
    decode_job_t jobs[MAX_THREADS];
    size_t held[MAX_THREADS], partial_held = 0;
    const int split = max_parts > 1;
    float *partial = split ? take((size_t)(B * n_kv * group * max_parts * (D + 2)) * sizeof(float), &partial_held) : NULL;
    int failed = split && !partial;
    int64_t item = 0, part = 0, done = 0;
    for (int t = 0; t < threads; t++) {
        decode_job_t *J = &jobs[t];
        J->q = q, J->k = k, J->v = v, J->o = o;
        int64_t *to[4] = {J->qs, J->ks, J->vs, J->os};
        const int64_t from[4] = {0, 6, 8, 10};
        for (int i = 0; i < 4; i++) memcpy(to[i], strides + from[i], 2 * sizeof(int64_t));
        J->n_kv = n_kv, J->group = group, J->D = D, J->H = n_kv * group;
        J->first = first, J->length = length, J->parts = parts, J->scale = scale;
        J->partial = partial, J->max_parts = max_parts;
        J->item = item, J->part = part, J->pieces = 0;
        const int64_t until = total * (t + 1) / threads;
        while (item < B * n_kv) {
            const int64_t L = length[item % n_kv], P = parts[item % n_kv];
            const int64_t size = L * (part + 1) / P - L * part / P;
            if (done + size / 2 > until && t < threads - 1 && J->pieces > 0) break; /* the nearer end of a run */
            done += size, J->pieces++;
            if (++part == P) part = 0, item++;
        }
        J->scores = take((size_t)(longest + VL) * sizeof(float), &held[t]);
        failed |= !J->scores;
    }
    if (!failed) {
        run_threads(decode_work, jobs, sizeof jobs[0], threads);
        for (int64_t b = 0; split && b < B; b++)
            for (int64_t j = 0; j < n_kv; j++)
                for (int64_t h = j * group; parts[j] > 1 && h < (j + 1) * group; h++) merge_parts(&jobs[0], b, h, parts[j]);
    }
    for (int t = 0; t < threads; t++) give(jobs[t].scores, held[t]);
    give(partial, partial_held);
    return failed ? -2 : 0;
}
