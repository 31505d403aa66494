/* Exact windowed causal attention on the CPU, forward and backward, float32 (aah_core/attention/native.py builds it).

   Query i of a head with window w attends keys j with i - w < j <= i (aah_core/attention/__init__.py). The
   queries are taken VL = 16 at a time, one per vector lane: a tile of queries i0 .. i0+15 reads the keys
   lo = max(0, i0 - w + 1) .. i0 + 15, so a query costs about (w + 15) keys, against the c + w - 1 of the
   banded backend's blocks and with none of its per-block calls. Forward, per tile:

   1. the tile's queries, scaled, transposed into D vectors (lane r: query i0 + r);
   2. per key j: its score against all 16 queries (D multiply-adds of a vector by one scalar of k_j), the
      lanes outside their query's window set to -inf, and the running maximum per lane;
   3. per key: exp(score - maximum) (a polynomial: no libm call per element) and its sum per lane;
   4. the output: per key j, its probabilities (a vector over queries) times each element of v_j, summed
      into 16 accumulators per 16 output elements; divided by the sums and written to the query rows (and,
      for training, each row's log-sum-exp).

   With s sink keys (StreamingLLM's: keys 0 .. s-1, which every query also sees), a tile whose window does not
   reach them reads the sinks, then its window; one whose window does reads keys 0 .. i0+15.

   No division of the keys into blocks with an online softmax: a tile's scores (nk vectors, nk <= w + 15)
   stay in the thread's scratch, so each score is computed once and exponentiated once.

   Backward (FlashAttention-2's equations, Dao 2023, per tile as above): the probabilities again from the
   scores and the saved log-sum-exps, dp = dO v_j, ds = p (dp - rowsum(dO o)); the tile's query gradients
   sum ds k_j, and each key's gradients (sum over the tile's queries of ds q and of p dO) are added into the
   thread's own copy of its run's key rows, then to dk and dv: by the thread for a run of a whole head, after
   every thread is done and in thread order for the parts of a head two threads share (the same sums each call).

   Threads: the tiles of every (sequence, head) to compute are dealt to `threads` POSIX threads in
   contiguous runs of about equal work (a tile's work grows with its keys). The calling thread runs the first.

   GCC/Clang vector extensions (vector_size(64)): AVX-512 registers where the CPU has them, two AVX2 halves
   otherwise; the compiler is asked for the host's instruction set (-march=native). */

#include "kernel.h"

typedef struct {
    const float *q, *k, *v, *g; /* g: the output's gradient (backward) */
    float *o;                   /* the output: written by the forward, read by the backward */
    float *lse;                 /* [B, H, T] log-sum-exps of the rows' scores: written (forward, if not NULL), read */
    float *dq, *dk, *dv;        /* backward: dq written, dk and dv added to */
    int64_t qs[3], ks[3], vs[3], os[3], gs[3], dqs[3], dks[3], dvs[3]; /* strides in elements: sequence, head, row */
    int64_t H, T, D;
    const int64_t *windows;
    int64_t sinks;        /* keys 0 .. sinks-1, which every query also sees (StreamingLLM's attention sinks) */
    float scale;
    int backward;
    int64_t run_rows;     /* the most key rows of a run (T + VL + widest window): the size of each packed matrix */
    int64_t first, last; /* this thread's tiles: items first .. last-1 of the list below */
    const int64_t *items; /* (sequence * H + head) * tiles + tile, for the heads computed here */
    vf *scratch;          /* SCRATCH_VECTORS vectors */
    float *packed;        /* dense copies of a run's keys and values, and backward its key gradients (after the scratch) */
    int n_kept;           /* backward: this thread's runs of heads that other threads also have a part of (at most 2) */
    struct { int64_t b, h, first, last; float *dk, *dv; } kept[2]; /* their key rows' gradients, to add in order */
} job_t;

/* Scratch vectors of a tile with at most `keys` keys: the forward's transposed queries and scores, the
   backward's transposed queries, output gradients and query gradients, a chunk's scores and their gradients. */
#define SCRATCH_VECTORS(D, keys) (3 * (D) + 2 * (keys) + VL)

/* xt[d] lane r = scale * x[i0 + r][d] for r < rows (lanes past rows: 0), with plain stores, no lane inserts */
static void transpose_tile(const float *x, int64_t stride, int64_t i0, int64_t rows, int64_t D, float scale, vf *xt) {
    float *xf = (float *)xt;
    if (rows < VL) memset(xf, 0, (size_t)D * VL * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + (i0 + r) * stride;
        for (int64_t d = 0; d < D; d++) xf[d * VL + r] = xr[d] * scale;
    }
}

/* S[j] = the dot products of the 16 lanes of xt with row lo + j of y, j < nk; 8 rows at a time: 8 independent
   chains of multiply-adds */
static void dot_rows(const vf *xt, const float *y, int64_t ys, int64_t lo, int64_t nk, int64_t D, vf *S) {
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8) {
        const float *yj = y + (lo + j) * ys;
        vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
        for (int64_t d = 0; d < D; d++) {
            vf x = xt[d];
            a0 += x * yj[d];
            a1 += x * yj[ys + d];
            a2 += x * yj[2 * ys + d];
            a3 += x * yj[3 * ys + d];
            a4 += x * yj[4 * ys + d];
            a5 += x * yj[5 * ys + d];
            a6 += x * yj[6 * ys + d];
            a7 += x * yj[7 * ys + d];
        }
        S[j] = a0, S[j + 1] = a1, S[j + 2] = a2, S[j + 3] = a3;
        S[j + 4] = a4, S[j + 5] = a5, S[j + 6] = a6, S[j + 7] = a7;
    }
    for (; j < nk; j++) {
        const float *yj = y + (lo + j) * ys;
        vf a = {0};
        for (int64_t d = 0; d < D; d++) a += xt[d] * yj[d];
        S[j] = a;
    }
}

/* The scores of keys lo .. lo+nk-1 hidden (-inf) from the lanes whose query does not see them, and from lanes
   past `rows`; returns each lane's maximum. Lane r (query i0 + r) sees key lo + j when i0 + r - w < lo + j <=
   i0 + r, i.e. rel <= r < rel + w: only the keys at the window's two edges are hidden from some lanes. A sink
   key (lo + j < sinks) is seen by every query from its own position on. */
static vf mask_window(vf *S, int64_t nk, int64_t lo, int64_t i0, int64_t w, int64_t rows, int64_t sinks) {
    vi lane;
    for (int r = 0; r < VL; r++) lane[r] = r;
    const vf minus_inf = (vf){0} - INFINITY;
    vf m = minus_inf;
    for (int64_t j = 0; j < nk; j++) {
        const int64_t rel = lo + j - i0; /* in [-(w - 1), VL - 1], or below for a sink */
        if (lo + j < sinks) {
            if (rel > 0) {
                vi seen = (lane >= (int32_t)rel) & (lane < (int32_t)rows);
                S[j] = (vf)(((vi)S[j] & seen) | ((vi)minus_inf & ~seen));
            }
        } else if (rel > 0 || rel + w < rows) {
            const int32_t from = (int32_t)(rel > -VL ? rel : -VL), to = (int32_t)(rel + w < VL ? rel + w : VL);
            vi seen = (lane >= from) & (lane < to) & (lane < (int32_t)rows);
            S[j] = (vf)(((vi)S[j] & seen) | ((vi)minus_inf & ~seen));
        }
        m = max_lanes(m, S[j]);
    }
    return m;
}

/* The keys of the tile of queries i0 .. i0+rows-1 with window w: keys first[0] .. first[0]+count[0]-1, then
   first[1] .. first[1]+count[1]-1. Without sinks (or when the window reaches them) one range, lo .. i0+rows-1 (lo
   = 0 if the window reaches the sinks); else the sinks, then the window's keys. */
static void tile_keys(int64_t i0, int64_t rows, int64_t w, int64_t sinks, int64_t first[2], int64_t count[2]) {
    const int64_t lo = i0 - w + 1 > 0 ? i0 - w + 1 : 0;
    const int detached = lo > sinks;
    first[0] = 0, count[0] = detached ? sinks : 0;
    first[1] = detached ? lo : 0, count[1] = i0 + rows - first[1];
}

static void run_tile(const job_t *J, int64_t b, int64_t h, int64_t i0) {
    const int64_t D = J->D, T = J->T, w = J->windows[h];
    const int64_t qs = J->qs[2], ks = J->ks[2], vs = J->vs[2], os = J->os[2];
    const float *q = J->q + b * J->qs[0] + h * J->qs[1];
    const float *k = J->k + b * J->ks[0] + h * J->ks[1];
    const float *v = J->v + b * J->vs[0] + h * J->vs[1];
    float *o = J->o + b * J->os[0] + h * J->os[1];
    const int64_t rows = T - i0 < VL ? T - i0 : VL;
    int64_t first[2], count[2];
    tile_keys(i0, rows, w, J->sinks, first, count);
    vf *qt = J->scratch;               /* D vectors */
    vf *S = qt + D;                    /* count[0] + count[1] vectors: scores, then probabilities */

    for (int64_t r = 0; r < VL && i0 + VL + r < T; r++) { /* the next tile's queries, on their way */
        const char *next = (const char *)(q + (i0 + VL + r) * qs);
        for (int64_t c = 0; c < D * (int64_t)sizeof(float); c += 64) __builtin_prefetch(next + c);
    }
    transpose_tile(q, qs, i0, rows, D, J->scale, qt);
    dot_rows(qt, k, ks, first[0], count[0], D, S);
    dot_rows(qt, k, ks, first[1], count[1], D, S + count[0]);
    const vf m = max_lanes(mask_window(S, count[0], first[0], i0, w, rows, J->sinks),
                           mask_window(S + count[0], count[1], first[1], i0, w, rows, J->sinks));

    /* output elements 16 at a time: 16 accumulators, each key's probabilities (a vector over queries) times
       its value's elements; the first pass turns the scores into probabilities (padding lanes, rows < VL:
       -inf - -inf is NaN, which exp_lanes makes 0) */
    float *of = (float *)qt; /* q is spent: of[t * VL + r] = output element d0 + t of query i0 + r */
    vf sum = {0};
    for (int64_t d0 = 0; d0 < D; d0 += VL) {
        vf acc[VL];
        for (int t = 0; t < VL; t++) acc[t] = (vf){0};
        for (int64_t part = 0, j = 0; part < 2; part++)
            for (int64_t key = first[part]; key < first[part] + count[part]; key++, j++) {
                const float *vj = v + key * vs + d0;
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
    if (J->lse != NULL) {
        float *lse = J->lse + (b * J->H + h) * T + i0;
        for (int64_t r = 0; r < rows; r++) lse[r] = m[r] + logf(sum[r]);
    }
}

/* nv vectors (16 nv elements from d0) of two key rows' gradients: dk += sum over the tile's rows r of ds[r] q_r,
   dv += sum of p[r] g_r (inlined with nv constant: the accumulators stay in registers) */
static inline __attribute__((always_inline)) void add_key_grads(int nv, float *dk, float *dv, vf ds, vf p,
                                                                 const float *q, int64_t qs, const float *g,
                                                                 int64_t gs, int64_t rows) {
    vf ak[4], av[4];
    for (int c = 0; c < nv; c++) ak[c] = *(vfu *)(dk + c * VL), av[c] = *(vfu *)(dv + c * VL);
    for (int64_t r = 0; r < rows; r++) {
        const float dsr = ds[r], pr = p[r];
        for (int c = 0; c < nv; c++) {
            ak[c] += dsr * *(const vfu *)(q + r * qs + c * VL);
            av[c] += pr * *(const vfu *)(g + r * gs + c * VL);
        }
    }
    for (int c = 0; c < nv; c++) *(vfu *)(dk + c * VL) = ak[c], *(vfu *)(dv + c * VL) = av[c];
}

/* Keys a tile's backward takes at a time: their scores and gradients (2 x 8 KB) and their rows of k and v stay
   in the core's caches between the passes over them. */
#define KEY_CHUNK 128

/* A tile's backward: its rows of dq, and its keys' gradients (not yet scaled) added into dk and dv, the
   run's rows (indexed by key row, D apart). */
static void backward_tile(const job_t *J, int64_t b, int64_t h, int64_t i0, float *dk, float *dv) {
    const int64_t D = J->D, T = J->T, w = J->windows[h];
    const int64_t qs = J->qs[2], ks = J->ks[2], vs = J->vs[2], os = J->os[2], gs = J->gs[2], dqs = J->dqs[2];
    const float *q = J->q + b * J->qs[0] + h * J->qs[1] + i0 * qs;
    const float *k = J->k + b * J->ks[0] + h * J->ks[1];
    const float *v = J->v + b * J->vs[0] + h * J->vs[1];
    const float *o = J->o + b * J->os[0] + h * J->os[1] + i0 * os;
    const float *g = J->g + b * J->gs[0] + h * J->gs[1] + i0 * gs;
    const float *lse = J->lse + (b * J->H + h) * T + i0;
    float *dq = J->dq + b * J->dqs[0] + h * J->dqs[1] + i0 * dqs;
    const int64_t rows = T - i0 < VL ? T - i0 : VL;
    int64_t first[2], count[2];
    tile_keys(i0, rows, w, J->sinks, first, count);
    const int64_t nk = count[0] > count[1] ? count[0] : count[1];
    vf *qt = J->scratch, *gt = qt + D, *dqt = gt + D; /* D vectors each: scale * q, g and dq / scale, transposed */
    const int64_t chunk = nk < KEY_CHUNK ? nk : KEY_CHUNK;
    vf *P = dqt + D, *DS = P + chunk;                 /* a chunk's scores, then probabilities; dp, then ds */

    transpose_tile(q, qs, 0, rows, D, J->scale, qt);
    transpose_tile(g, gs, 0, rows, D, 1.0f, gt);
    memset(dqt, 0, (size_t)D * sizeof(vf));
    vf row_lse = {0}, delta = {0}; /* padding lanes: scores -inf, so p = 0 */
    for (int64_t r = 0; r < rows; r++) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; d++) dot += g[r * gs + d] * o[r * os + d];
        row_lse[r] = lse[r], delta[r] = dot;
    }
    for (int part = 0; part < 2; part++)
    for (int64_t c0 = 0; c0 < count[part]; c0 += chunk) {
        const int64_t n = count[part] - c0 < chunk ? count[part] - c0 : chunk, key0 = first[part] + c0; /* its keys */
        dot_rows(qt, k, ks, key0, n, D, P);
        mask_window(P, n, key0, i0, w, rows, J->sinks);
        dot_rows(gt, v, vs, key0, n, D, DS);
        for (int64_t j = 0; j < n; j++) {
            const vf p = exp_lanes(P[j] - row_lse);
            P[j] = p;
            DS[j] = p * (DS[j] - delta);
        }
        /* dq += sum_j ds_j k_j: 16 elements at a time, as the forward's output */
        for (int64_t d0 = 0; d0 < D; d0 += VL) {
            vf acc[VL];
            for (int t = 0; t < VL; t++) acc[t] = dqt[d0 + t];
            for (int64_t j = 0; j < n; j++) {
                const float *kj = k + (key0 + j) * ks + d0;
                const vf ds = DS[j];
                for (int t = 0; t < VL; t++) acc[t] += ds * kj[t];
            }
            for (int t = 0; t < VL; t++) dqt[d0 + t] = acc[t];
        }
        for (int64_t j = 0; j < n; j++) {
            float *dkj = dk + (key0 + j) * D, *dvj = dv + (key0 + j) * D;
            int64_t d0 = 0;
            for (; d0 + 4 * VL <= D; d0 += 4 * VL)
                add_key_grads(4, dkj + d0, dvj + d0, DS[j], P[j], q + d0, qs, g + d0, gs, rows);
            for (; d0 < D; d0 += VL) add_key_grads(1, dkj + d0, dvj + d0, DS[j], P[j], q + d0, qs, g + d0, gs, rows);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < D; d++) dq[r * dqs + d] = dqt[d][r] * J->scale;
}

/* Rows first .. last-1 of a [rows, D] matrix with row stride `stride`, packed densely into `to`; returns the
   packed matrix indexed by the original row numbers. Rows are fetched 8 ahead: the model's rows lie 3 H D floats
   apart, and the hardware's prefetch missed them (2-5 % of a windowed head's time). */
static const float *pack(const float *from, int64_t stride, int64_t first, int64_t last, int64_t D, float *to) {
    for (int64_t i = first; i < last; i++) {
        if (i + 8 < last)
            for (int64_t d = 0; d < D; d += VL) __builtin_prefetch(from + (i + 8) * stride + d);
        for (int64_t d = 0; d < D; d += VL) *(vfu *)(to + (i - first) * D + d) = *(const vfu *)(from + i * stride + d);
    }
    return to - first * D;
}

/* rows first .. last-1 of `to` (row stride `stride`) += scale * the packed rows `from` */
static void add_rows(float *to, int64_t stride, const float *from, int64_t first, int64_t last, int64_t D, float scale) {
    for (int64_t i = first; i < last; i++)
        for (int64_t d = 0; d < D; d += VL)
            *(vfu *)(to + i * stride + d) += scale * *(const vfu *)(from + (i - first) * D + d);
}

static void add_key_rows(const job_t *J, int64_t b, int64_t h, int64_t first, int64_t last, const float *dk,
                         const float *dv) {
    add_rows(J->dk + b * J->dks[0] + h * J->dks[1], J->dks[2], dk, first, last, J->D, J->scale);
    add_rows(J->dv + b * J->dvs[0] + h * J->dvs[1], J->dvs[2], dv, first, last, J->D, 1.0f);
}

static void *work(void *arg) {
    job_t *J = arg;
    const int64_t tiles = (J->T + VL - 1) / VL, D = J->D;
    for (int64_t n = J->first; n < J->last;) {
        /* this thread's run of tiles of one (sequence, head): its keys and values packed into dense rows
           first, as each is read by about (w + 15) / 16 tiles (strided rows cost 10-25 % more) */
        const int64_t bh = J->items[n] / tiles, b = bh / J->H, h = bh % J->H;
        int64_t end = n;
        while (end < J->last && J->items[end] / tiles == bh) end++;
        const int64_t i_first = (J->items[n] % tiles) * VL;
        const int64_t i_last = ((J->items[end - 1] % tiles) + 1) * VL < J->T ? ((J->items[end - 1] % tiles) + 1) * VL : J->T;
        /* (with sinks, every key from 0: the sinks' rows then lie where every tile's other keys do) */
        const int64_t k_first = i_first - J->windows[h] + 1 > 0 && !J->sinks ? i_first - J->windows[h] + 1 : 0;
        const int64_t keys = i_last - k_first;
        job_t P = *J;
        float *dense = (float *)J->packed;
        P.k = pack(J->k + b * J->ks[0] + h * J->ks[1], J->ks[2], k_first, i_last, D, dense);
        dense += keys * D;
        P.v = pack(J->v + b * J->vs[0] + h * J->vs[1], J->vs[2], k_first, i_last, D, dense);
        P.ks[0] = P.ks[1] = P.vs[0] = P.vs[1] = 0;
        P.ks[2] = P.vs[2] = D;
        if (!J->backward) {
            for (; n < end; n++) run_tile(&P, b, h, (J->items[n] % tiles) * VL);
            continue;
        }
        /* the run's key gradients in the thread's own rows. A run of a whole head adds them to dk and dv itself;
           the others (only a thread's first and last runs can be part of a head) are added after every thread
           is done, in thread order, so that a sum over threads is the same from call to call */
        const int shared = i_first > 0 || i_last < J->T;
        float *dk = shared && n == J->first && end < J->last ? J->packed + 4 * J->run_rows * D : dense + keys * D;
        float *dv = dk + keys * D;
        memset(dk, 0, (size_t)(2 * keys * D) * sizeof(float));
        for (; n < end; n++) backward_tile(&P, b, h, (J->items[n] % tiles) * VL, dk - k_first * D, dv - k_first * D);
        if (shared) {
            J->kept[J->n_kept].b = b, J->kept[J->n_kept].h = h, J->kept[J->n_kept].first = k_first;
            J->kept[J->n_kept].last = i_last, J->kept[J->n_kept].dk = dk, J->kept[J->n_kept].dv = dv;
            J->n_kept++;
        } else {
            add_key_rows(J, b, h, k_first, i_last, dk, dv);
        }
    }
    return NULL;
}

/* Runs `proto` (every field but the thread's own: first, last, items, scratch, packed) over the tiles of every
   (sequence, head) whose window is not 0, on `threads` threads. Returns 0, or -1 for bad arguments, -2 when
   memory ran out. */
static int run_heads(const job_t *proto, int64_t B, int threads) {
    const int64_t H = proto->H, T = proto->T, D = proto->D, *windows = proto->windows;
    if (B < 0 || H < 0 || T < 0 || D < VL || D % VL || T >= (1LL << 30) || proto->sinks < 0) return -1;
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
                const int64_t i0 = t * VL, rows = T - i0 < VL ? T - i0 : VL;
                int64_t first[2], count[2];
                tile_keys(i0, rows, windows[h], proto->sinks, first, count);
                items[n] = (b * H + h) * tiles + t;
                cost[n + 1] = cost[n] + count[0] + count[1] + 16;
            }
        }
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > count) threads = (int)count;
    const int64_t most_keys = VL + widest - 1 + proto->sinks < T ? VL + widest - 1 + proto->sinks : T;
    const int64_t run_rows = T + VL + widest;
    /* k and v of a run; backward also its dk and dv, and those of the thread's first run when others share it */
    const int64_t packed_rows = (proto->backward ? 6 : 2) * run_rows;
    job_t jobs[MAX_THREADS];
    size_t held[MAX_THREADS];
    int64_t first = 0, failed = 0;
    for (int t = 0; t < threads; t++) {
        job_t *J = &jobs[t];
        *J = *proto;
        J->items = items, J->run_rows = run_rows;
        /* this thread's run ends where the work done so far passes its share */
        const int64_t share = cost[count] * (t + 1) / threads;
        int64_t last = first;
        while (last < count && (cost[last + 1] <= share || t == threads - 1)) last++;
        J->first = first, J->last = last;
        first = last;
        const size_t vectors = (size_t)SCRATCH_VECTORS(D, most_keys);
        J->scratch = take(vectors * sizeof(vf) + (size_t)packed_rows * (size_t)D * sizeof(float), &held[t]);
        J->packed = J->scratch ? (float *)(J->scratch + vectors) : NULL;
        if (!J->scratch) failed = 1;
    }
    if (!failed) {
        run_threads(work, jobs, sizeof jobs[0], threads);
        for (int t = 0; t < threads; t++)
            for (int i = 0; i < jobs[t].n_kept; i++)
                add_key_rows(&jobs[t], jobs[t].kept[i].b, jobs[t].kept[i].h, jobs[t].kept[i].first, jobs[t].kept[i].last,
                             jobs[t].kept[i].dk, jobs[t].kept[i].dv);
    }
    for (int t = 0; t < threads; t++) give(jobs[t].scratch, held[t]);
    give(items, list_bytes);
    return failed ? -2 : 0;
}

/* q, k, v, o: [B, H, T, D] with these strides (12 int64: q's sequence, head and row strides, then k's, v's,
   o's), each row's D elements contiguous; D a multiple of 16. windows: H ints, a window >= T being causal
   attention; a head with window 0 is skipped (the caller computes it). sinks: keys every query also sees. lse: NULL, or [B, H, T] (contiguous)
   for each row's log-sum-exp of its scaled scores. Returns 0, or -1 for bad arguments, -2 when memory ran out. */
int aah_band_attention(const float *q, const float *k, const float *v, float *o, float *lse, const int64_t *strides,
                       int64_t B, int64_t H, int64_t T, int64_t D, const int64_t *windows, int64_t sinks, float scale,
                       int threads) {
    job_t J = {.q = q, .k = k, .v = v, .o = o, .lse = lse, .H = H, .T = T, .D = D, .windows = windows,
               .sinks = sinks, .scale = scale, .backward = 0};
    memcpy(J.qs, strides, sizeof J.qs), memcpy(J.ks, strides + 3, sizeof J.ks);
    memcpy(J.vs, strides + 6, sizeof J.vs), memcpy(J.os, strides + 9, sizeof J.os);
    return run_heads(&J, B, threads);
}

/* The gradients of aah_band_attention's output: g (the output's gradient), o and lse (the forward's output and
   log-sum-exps) and q, k, v give dq (written) and dk, dv (added to: zeros from the caller). strides: 24 int64,
   (sequence, head, row) of q, k, v, o, g, dq, dk, dv in that order; rows contiguous; lse [B, H, T] contiguous.
   Every window must be at least 1. Returns 0, -1 or -2 as aah_band_attention. */
int aah_band_attention_backward(const float *q, const float *k, const float *v, const float *o, const float *g,
                                const float *lse, float *dq, float *dk, float *dv, const int64_t *strides, int64_t B,
                                int64_t H, int64_t T, int64_t D, const int64_t *windows, int64_t sinks, float scale,
                                int threads) {
    for (int64_t h = 0; h < H; h++)
        if (windows[h] < 1) return -1;
    job_t J = {.q = q, .k = k, .v = v, .o = (float *)o, .g = g, .lse = (float *)lse, .dq = dq, .dk = dk, .dv = dv,
               .H = H, .T = T, .D = D, .windows = windows, .sinks = sinks, .scale = scale, .backward = 1};
    int64_t *fields[8] = {J.qs, J.ks, J.vs, J.os, J.gs, J.dqs, J.dks, J.dvs};
    for (int i = 0; i < 8; i++) memcpy(fields[i], strides + 3 * i, 3 * sizeof(int64_t));
    return run_heads(&J, B, threads);
}
