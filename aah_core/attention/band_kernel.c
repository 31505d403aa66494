/* Exact windowed causal attention on the CPU: forward only, float32 (aah_core/attention/native.py builds it).

   Query i of a head with window w attends keys j with i - w < j <= i (aah_core/attention/__init__.py). The
   queries are taken VL = 16 at a time, one per vector lane: a tile of queries i0 .. i0+15 reads the keys
   lo = max(0, i0 - w + 1) .. i0 + 15, so a query costs about (w + 15) keys, against the c + w - 1 of the
   banded backend's blocks and with none of its per-block calls. Per tile:

   1. the tile's queries, scaled, transposed into D vectors (lane r: query i0 + r);
   2. per key j: its score against all 16 queries (D multiply-adds of a vector by one scalar of k_j), the
      lanes outside their query's window set to -inf, and the running maximum per lane;
   3. per key: exp(score - maximum) (a polynomial: no libm call per element) and its sum per lane;
   4. the output: per key j, its probabilities (a vector over queries) times each element of v_j, summed
      into 16 accumulators per 16 output elements; divided by the sums and written to the query rows.

   No division of the keys into blocks with an online softmax: a tile's scores (nk vectors, nk <= w + 15)
   stay in the thread's scratch, so each score is computed once and exponentiated once.

   Threads: the tiles of every (sequence, head) to compute are dealt to `threads` POSIX threads in
   contiguous runs of about equal work (a tile's work grows with its keys). The calling thread runs the first.

   GCC/Clang vector extensions (vector_size(64)): AVX-512 registers where the CPU has them, two AVX2 halves
   otherwise; the compiler is asked for the host's instruction set (-march=native). */

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef float vfu __attribute__((vector_size(64), aligned(4))); /* an unaligned load or store of 16 floats */
#define VL 16
#define MAX_THREADS 256

/* exp(x) per lane for x <= 0, or -inf (gives 0): exp(x) = 2^n exp(r), r = x - n ln2 in [-ln2/2, ln2/2],
   exp(r) by its Taylor series to r^6 (relative error under 2e-7 there). */
static inline vf exp_lanes(vf x) {
    const vi keep = x > -87.0f; /* exp(-87) is the smallest normal float's order; below it (and -inf, NaN): 0 */
    const vf floor_ = (vf){0} - 87.0f;
    x = (vf)(((vi)x & keep) | ((vi)floor_ & ~keep));
    vf t = x * 1.44269504088896341f;                       /* x / ln 2 <= 0 */
    vi n = __builtin_convertvector(t - 0.5f, vi);          /* nearest integer (t <= 0: truncation of t - 1/2) */
    vf nf = __builtin_convertvector(n, vf);
    vf r = x - nf * 0.693359375f;                          /* ln 2 in two parts: n * hi is exact */
    r = r + nf * 2.12194440e-4f;
    vf p = r * (1.0f / 720) + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vf two_n = (vf)((n + 127) << 23);                      /* n >= -126: a normal float */
    return (vf)((vi)(p * two_n) & keep);
}

static inline vf max_lanes(vf a, vf b) {
    vi a_bigger = a > b;
    return (vf)(((vi)a & a_bigger) | ((vi)b & ~a_bigger));
}

typedef struct {
    const float *q, *k, *v;
    float *o;
    int64_t qs[3], ks[3], vs[3], os[3]; /* strides in elements: sequence, head, row */
    int64_t H, T, D;
    const int64_t *windows;
    float scale;
    int64_t first, last; /* this thread's tiles: items first .. last-1 of the list below */
    const int64_t *items; /* (sequence * H + head) * tiles + tile, for the heads computed here */
    vf *scratch;          /* D + max keys of a tile + VL vectors */
    float *packed;        /* dense copies of a run's keys and values (after the scratch) */
} job_t;

static void run_tile(const job_t *J, int64_t b, int64_t h, int64_t i0) {
    const int64_t D = J->D, T = J->T, w = J->windows[h];
    const int64_t qs = J->qs[2], ks = J->ks[2], vs = J->vs[2], os = J->os[2];
    const float *q = J->q + b * J->qs[0] + h * J->qs[1];
    const float *k = J->k + b * J->ks[0] + h * J->ks[1];
    const float *v = J->v + b * J->vs[0] + h * J->vs[1];
    float *o = J->o + b * J->os[0] + h * J->os[1];
    const int64_t rows = T - i0 < VL ? T - i0 : VL;
    const int64_t lo = i0 - w + 1 > 0 ? i0 - w + 1 : 0;
    const int64_t nk = i0 + rows - lo; /* keys lo .. i0 + rows - 1 */
    vf *qt = J->scratch;               /* D vectors */
    vf *S = qt + D;                    /* nk vectors: scores, then probabilities */

    for (int64_t r = 0; r < VL && i0 + VL + r < T; r++) { /* the next tile's queries, on their way */
        const char *next = (const char *)(q + (i0 + VL + r) * qs);
        for (int64_t c = 0; c < D * (int64_t)sizeof(float); c += 64) __builtin_prefetch(next + c);
    }
    float *qf = (float *)qt; /* qf[d * VL + r] = scale * q[i0 + r][d]: plain stores, no lane inserts */
    if (rows < VL) memset(qf, 0, (size_t)D * VL * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float *qr = q + (i0 + r) * qs;
        for (int64_t d = 0; d < D; d++) qf[d * VL + r] = qr[d] * J->scale;
    }

    /* scores, 8 keys at a time: 8 independent chains of multiply-adds */
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8) {
        const float *kj = k + (lo + j) * ks;
        vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
        for (int64_t d = 0; d < D; d++) {
            vf x = qt[d];
            a0 += x * kj[d];
            a1 += x * kj[ks + d];
            a2 += x * kj[2 * ks + d];
            a3 += x * kj[3 * ks + d];
            a4 += x * kj[4 * ks + d];
            a5 += x * kj[5 * ks + d];
            a6 += x * kj[6 * ks + d];
            a7 += x * kj[7 * ks + d];
        }
        S[j] = a0, S[j + 1] = a1, S[j + 2] = a2, S[j + 3] = a3;
        S[j + 4] = a4, S[j + 5] = a5, S[j + 6] = a6, S[j + 7] = a7;
    }
    for (; j < nk; j++) {
        const float *kj = k + (lo + j) * ks;
        vf a = {0};
        for (int64_t d = 0; d < D; d++) a += qt[d] * kj[d];
        S[j] = a;
    }

    /* lane r (query i0 + r) sees key lo + j when i0 + r - w < lo + j <= i0 + r, i.e. rel <= r < rel + w: only
       the keys at the window's two edges are hidden from some lanes */
    vi lane;
    for (int r = 0; r < VL; r++) lane[r] = r;
    const vf minus_inf = (vf){0} - INFINITY;
    vf m = minus_inf;
    for (j = 0; j < nk; j++) {
        const int64_t rel = lo + j - i0; /* in [-(w - 1), VL - 1] */
        if (rel > 0 || rel + w < rows) {
            const int32_t from = (int32_t)(rel > -VL ? rel : -VL), to = (int32_t)(rel + w < VL ? rel + w : VL);
            vi seen = (lane >= from) & (lane < to) & (lane < (int32_t)rows);
            S[j] = (vf)(((vi)S[j] & seen) | ((vi)minus_inf & ~seen));
        }
        m = max_lanes(m, S[j]);
    }

    /* output elements 16 at a time: 16 accumulators, each key's probabilities (a vector over queries) times
       its value's elements; the first pass turns the scores into probabilities (padding lanes, rows < VL:
       -inf - -inf is NaN, which exp_lanes makes 0) */
    float *of = (float *)qt; /* q is spent: of[t * VL + r] = output element d0 + t of query i0 + r */
    vf sum = {0};
    for (int64_t d0 = 0; d0 < D; d0 += VL) {
        vf acc[VL];
        for (int t = 0; t < VL; t++) acc[t] = (vf){0};
        for (j = 0; j < nk; j++) {
            const float *vj = v + (lo + j) * vs + d0;
            vf p = S[j];
            if (d0 == 0) {
                p = exp_lanes(p - m);
                S[j] = p;
                sum += p;
            }
            for (int t = 0; t < VL; t++) acc[t] += p * vj[t];
        }
        const vf inv = 1.0f / sum; /* every query sees its own key: sum >= 1 in the lanes written */
        for (int t = 0; t < VL; t++) ((vf *)of)[t] = acc[t] * inv;
        for (int64_t r = 0; r < rows; r++) {
            float *out = o + (i0 + r) * os + d0;
            for (int t = 0; t < VL; t++) out[t] = of[t * VL + r];
        }
    }
}

/* Rows first .. last-1 of a [rows, D] matrix with row stride `stride`, packed densely into `to`; returns the
   packed matrix indexed by the original row numbers. */
static const float *pack(const float *from, int64_t stride, int64_t first, int64_t last, int64_t D, float *to) {
    for (int64_t i = first; i < last; i++)
        for (int64_t d = 0; d < D; d += VL) *(vfu *)(to + (i - first) * D + d) = *(const vfu *)(from + i * stride + d);
    return to - first * D;
}

static void *work(void *arg) {
    const job_t *J = arg;
    const int64_t tiles = (J->T + VL - 1) / VL, D = J->D;
    for (int64_t n = J->first; n < J->last;) {
        /* this thread's run of tiles of one (sequence, head): its keys and values packed into dense rows
           first, as each is read by about (w + 15) / 16 tiles (strided rows cost 10-25 % more) */
        const int64_t bh = J->items[n] / tiles, b = bh / J->H, h = bh % J->H;
        int64_t end = n;
        while (end < J->last && J->items[end] / tiles == bh) end++;
        const int64_t i_first = (J->items[n] % tiles) * VL;
        const int64_t i_last = ((J->items[end - 1] % tiles) + 1) * VL < J->T ? ((J->items[end - 1] % tiles) + 1) * VL : J->T;
        const int64_t k_first = i_first - J->windows[h] + 1 > 0 ? i_first - J->windows[h] + 1 : 0;
        job_t P = *J;
        float *dense = (float *)J->packed;
        P.k = pack(J->k + b * J->ks[0] + h * J->ks[1], J->ks[2], k_first, i_last, D, dense);
        dense += (i_last - k_first) * D;
        P.v = pack(J->v + b * J->vs[0] + h * J->vs[1], J->vs[2], k_first, i_last, D, dense);
        P.ks[0] = P.ks[1] = P.vs[0] = P.vs[1] = 0;
        P.ks[2] = P.vs[2] = D;
        for (; n < end; n++) run_tile(&P, b, h, (J->items[n] % tiles) * VL);
    }
    return NULL;
}

/* Buffers kept from call to call: a fresh multi-megabyte malloc is mapped anew each time, and its first touch
   of every page faults (hundreds of faults a call). A call takes what it needs and gives it back. */
#define POOL 64
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static void *pool[POOL];
static size_t pool_bytes[POOL];
static int pooled = 0;

static void *take(size_t bytes, size_t *held) {
    void *p = NULL;
    size_t have = 0;
    pthread_mutex_lock(&pool_lock);
    if (pooled > 0) --pooled, p = pool[pooled], have = pool_bytes[pooled];
    pthread_mutex_unlock(&pool_lock);
    if (p != NULL && have >= bytes) {
        *held = have;
        return p;
    }
    free(p);
    bytes = (bytes + 63) / 64 * 64;
    *held = bytes;
    return aligned_alloc(64, bytes);
}

static void give(void *p, size_t bytes) {
    if (p == NULL) return;
    pthread_mutex_lock(&pool_lock);
    if (pooled < POOL) pool[pooled] = p, pool_bytes[pooled] = bytes, ++pooled, p = NULL;
    pthread_mutex_unlock(&pool_lock);
    free(p);
}

/* q, k, v, o: [B, H, T, D] with these strides (12 int64: q's sequence, head and row strides, then k's, v's,
   o's), each row's D elements contiguous; D a multiple of 16. windows: H ints, a window >= T being causal
   attention; a head with window 0 is skipped (the caller computes it). Returns 0, or -1 for bad arguments, -2 when memory ran out. */
int aah_band_attention(const float *q, const float *k, const float *v, float *o, const int64_t *strides, int64_t B,
                       int64_t H, int64_t T, int64_t D, const int64_t *windows, float scale, int threads) {
    if (B < 0 || H < 0 || T < 0 || D < VL || D % VL || T >= (1LL << 30)) return -1;
    const int64_t tiles = (T + VL - 1) / VL;
    int64_t count = 0, widest = 0;
    for (int64_t h = 0; h < H; h++) {
        if (windows[h] < 0) return -1;
        if (windows[h] > 0) {
            count += B * tiles;
            if (windows[h] > widest) widest = windows[h] < T ? windows[h] : T;
        }
    }
    if (count == 0) return 0;
    size_t list_bytes;
    int64_t *items = take((size_t)(2 * count + 1) * sizeof(int64_t), &list_bytes);
    if (!items) return -2;
    int64_t *cost = items + count;
    /* a tile's work: its keys (scores, exponentials, outputs) and its queries (transposes) */
    int64_t n = 0;
    cost[0] = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            if (windows[h] == 0) continue;
            for (int64_t t = 0; t < tiles; t++, n++) {
                const int64_t i0 = t * VL, lo = i0 - windows[h] + 1 > 0 ? i0 - windows[h] + 1 : 0;
                const int64_t rows = T - i0 < VL ? T - i0 : VL;
                items[n] = (b * H + h) * tiles + t;
                cost[n + 1] = cost[n] + (i0 + rows - lo) + 16;
            }
        }
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > count) threads = (int)count;
    const int64_t most_keys = VL + widest - 1 < T ? VL + widest - 1 : T;
    job_t jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    size_t held[MAX_THREADS];
    int64_t first = 0, failed = 0;
    for (int t = 0; t < threads; t++) {
        job_t *J = &jobs[t];
        J->q = q, J->k = k, J->v = v, J->o = o;
        memcpy(J->qs, strides, sizeof J->qs), memcpy(J->ks, strides + 3, sizeof J->ks);
        memcpy(J->vs, strides + 6, sizeof J->vs), memcpy(J->os, strides + 9, sizeof J->os);
        J->H = H, J->T = T, J->D = D, J->windows = windows, J->scale = scale, J->items = items;
        /* this thread's run ends where the work done so far passes its share */
        const int64_t share = cost[count] * (t + 1) / threads;
        int64_t last = first;
        while (last < count && (cost[last + 1] <= share || t == threads - 1)) last++;
        J->first = first, J->last = last;
        first = last;
        const size_t vectors = (size_t)(D + most_keys + VL) * sizeof(vf);
        J->scratch = take(vectors + (size_t)(2 * (T + VL + widest)) * (size_t)D * sizeof(float), &held[t]);
        J->packed = J->scratch ? (float *)(J->scratch + (D + most_keys + VL)) : NULL;
        if (!J->scratch) failed = 1;
    }
    if (!failed) {
        for (int t = 1; t < threads; t++) started[t] = pthread_create(&ids[t], NULL, work, &jobs[t]) == 0;
        work(&jobs[0]);
        for (int t = 1; t < threads; t++) {
            if (started[t])
                pthread_join(ids[t], NULL);
            else
                work(&jobs[t]); /* no thread to be had: this one does that share too */
        }
    }
    for (int t = 0; t < threads; t++) give(jobs[t].scratch, held[t]);
    give(items, list_bytes);
    return failed ? -2 : 0;
}

/* The causal attention of rows h .. 2h-1 from its two parts, merged by their log-sum-exps (banded.balanced_causal):
   `near` attended keys h .. i (lse near_lse), `far` keys 0 .. h-1 (lse far_lse); out = (e^near_lse near +
   e^far_lse far) / (e^near_lse + e^far_lse). Also copies `first` (rows 0 .. h-1, already final) into out.
   Every matrix is [B, H, h, D] with (sequence, head, row) strides in elements, rows contiguous; the lses are
   [B, H, h] with their (sequence, head, row) strides. One thread: 2 h D elements, too few to wake another. */
void aah_merge_halves(const float *first, const float *near, const float *near_lse, const float *far,
                      const float *far_lse, float *out, const int64_t *strides, int64_t B, int64_t H, int64_t h,
                      int64_t D) {
    const int64_t *fs = strides, *ns = strides + 3, *nls = strides + 6, *xs = strides + 9, *xls = strides + 12,
                  *os = strides + 15;
    for (int64_t b = 0; b < B; b++)
        for (int64_t hd = 0; hd < H; hd++)
            for (int64_t i = 0; i < h; i++) {
                const float *f = first + b * fs[0] + hd * fs[1] + i * fs[2];
                float *o_first = out + b * os[0] + hd * os[1] + i * os[2];
                memcpy(o_first, f, (size_t)D * sizeof(float));
                const float a = near_lse[b * nls[0] + hd * nls[1] + i * nls[2]];
                const float c = far_lse[b * xls[0] + hd * xls[1] + i * xls[2]];
                const float m = a > c ? a : c;
                const float wa = expf(a - m), wc = expf(c - m), norm = 1.0f / (wa + wc);
                const float *n = near + b * ns[0] + hd * ns[1] + i * ns[2];
                const float *x = far + b * xs[0] + hd * xs[1] + i * xs[2];
                float *o = out + b * os[0] + hd * os[1] + (h + i) * os[2];
                for (int64_t d = 0; d < D; d++) o[d] = (wa * n[d] + wc * x[d]) * norm;
            }
}
