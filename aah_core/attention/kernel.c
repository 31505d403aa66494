/* The C kernels' shared parts (kernel.h): the buffer pool and the threads; and the merge of a causal call's
   two halves (banded.balanced_causal). */

#include "kernel.h"

/* Buffers kept from call to call: a fresh multi-megabyte malloc is mapped anew each time, and its first touch
   of every page faults (hundreds of faults a call). A call takes what it needs and gives it back. */
#define POOL 64
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static void *pool[POOL];
static size_t pool_bytes[POOL];
static int pooled = 0;

void *take(size_t bytes, size_t *held) {
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

void give(void *p, size_t bytes) {
    if (p == NULL) return;
    pthread_mutex_lock(&pool_lock);
    if (pooled < POOL) pool[pooled] = p, pool_bytes[pooled] = bytes, ++pooled, p = NULL;
    pthread_mutex_unlock(&pool_lock);
    free(p);
}

void run_threads(void *(*fn)(void *), void *jobs, size_t size, int threads) {
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 1; t < threads; t++) started[t] = pthread_create(&ids[t], NULL, fn, (char *)jobs + t * size) == 0;
    fn(jobs);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(ids[t], NULL);
        else
            fn((char *)jobs + t * size); /* no thread to be had: this one does that share too */
    }
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
