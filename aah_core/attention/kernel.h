/* What the C kernels share (band_kernel.c, decode_kernel.c, step_kernel.c; aah_core/attention/native.py builds
   them into one library): GCC/Clang vector types of 16 floats, a polynomial exp per lane, a pool of buffers kept
   from call to call, and a run of a function on several POSIX threads. */

#ifndef AAH_KERNEL_H
#define AAH_KERNEL_H

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

/* The sum of a vector's 16 lanes. */
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

/* Buffers kept from call to call (band_kernel.c): take at least `bytes` (*held: the buffer's size), give it back. */
void *take(size_t bytes, size_t *held);
void give(void *p, size_t bytes);

/* decode_kernel.c's step, which step_kernel.c's block step calls. */
int aah_decode_step(const float *q, const float *k_new, const float *v_new, float *k, float *v, float *o,
                    const int64_t *strides, int64_t B, int64_t n_kv, int64_t group, int64_t D, const int64_t *first,
                    const int64_t *capacity, const int64_t *window, int64_t pos, float scale, int threads,
                    int64_t parallel_work);

/* fn(jobs[t]) for t < threads (jobs: `size` bytes apart), the calling thread running jobs[0]. */
void run_threads(void *(*fn)(void *), void *jobs, size_t size, int threads);

#endif
