/* specli's filters and keyed draw for one logits row, in C (issue #51).

   Another search than sampling.py's numpy path (64-id blocks here, strided groups there), the same
   arithmetic where it decides (the top-k order, top-p's float64 sums in best-first order, min-p's
   float32 floor, the keyed noise with the C library's log), so that either gives the same support,
   the same scores and the same token (tests/test_native_sampling.py). specli/native.py compiles this
   file with the machine's C compiler on first use (-ffp-contract=off: no fused multiply-adds), and
   sampling.py falls back to numpy where it cannot. numpy pays ~1 us a call on caches a decode has
   just evicted and a filtered row needs some thirty; here the filter is one call.

   Order, as llama.cpp's default chain: top-k, then top-p over the top k's mass, then min-p. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef struct {
    float v;
    int64_t id;
} cand;

/* a ranks above b: the larger logit, ties to the lower id (llama.cpp's sort, sampling.py's lexsort) */
static inline int above(cand a, cand b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

/* A min-heap of the k best candidates seen: heap[0] is the worst of them. */
static void sift_down(cand *heap, long size, long i) {
    for (;;) {
        long l = 2 * i + 1, r = l + 1, w = i;
        if (l < size && above(heap[w], heap[l])) w = l;
        if (r < size && above(heap[w], heap[r])) w = r;
        if (w == i) return;
        cand t = heap[i];
        heap[i] = heap[w];
        heap[w] = t;
        i = w;
    }
}

static inline void offer(cand *heap, long k, long *size, cand c) {
    if (*size < k) {
        long i = (*size)++;
        heap[i] = c;
        while (i > 0) { /* sift up: the worst rises to the root */
            long p = (i - 1) / 2;
            if (!above(heap[p], heap[i])) break;
            cand t = heap[i];
            heap[i] = heap[p];
            heap[p] = t;
            i = p;
        }
    } else if (above(c, heap[0])) {
        heap[0] = c;
        sift_down(heap, k, 0);
    }
}

static int best_first(const void *a, const void *b) {
    cand x = *(const cand *)a, y = *(const cand *)b;
    return above(x, y) ? -1 : (above(y, x) ? 1 : 0);
}

static int by_id(const void *a, const void *b) {
    int64_t x = ((const cand *)a)->id, y = ((const cand *)b)->id;
    return (x > y) - (x < y);
}

/* Sort best first, or by ascending id: an insertion sort for the few dozen the filters keep, with the
   comparison inlined (each call site passes a constant), qsort past 64. */
static inline void sort_cands(cand *a, long count, int by_ascending_id) {
    if (count > 64) {
        qsort(a, (size_t)count, sizeof(cand), by_ascending_id ? by_id : best_first);
        return;
    }
    for (long i = 1; i < count; i++) {
        cand x = a[i];
        long j = i;
        for (; j > 0 && (by_ascending_id ? x.id < a[j - 1].id : above(x, a[j - 1])); j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

static int is_banned(int64_t id, const int64_t *banned, long n_banned) {
    for (long i = 0; i < n_banned; i++)
        if (banned[i] == id) return 1;
    return 0;
}

#define BLOCK 64 /* ids per block: a block's maximum bounds its ids */

/* The maximum of each block of BLOCK ids (the last one may be short) into bm, and whether the row
   holds a NaN: a sum of the row is NaN then (or where it holds both infinities, which the caller
   refuses as well), and costs one addition per vector where a NaN test would cost two. */
static int block_maxima_scalar(const float *row, long n, long b, float *bm, float sum) {
    for (; b * BLOCK < n; b++) {
        float m = -INFINITY;
        for (long i = b * BLOCK; i < n && i < (b + 1) * BLOCK; i++) {
            sum += row[i];
            if (row[i] > m) m = row[i];
        }
        bm[b] = m;
    }
    return sum != sum;
}

#ifdef __SSE2__
static float hmax4(__m128 m) {
    m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(m);
}

static float hsum4(__m128 s) {
    float lanes[4];
    _mm_storeu_ps(lanes, s);
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

static int block_maxima_sse2(const float *row, long n, float *bm) {
    long full = n / BLOCK, b = 0;
    __m128 acc = _mm_setzero_ps();
    for (; b < full; b++) {
        const float *p = row + b * BLOCK;
        __m128 m0 = _mm_loadu_ps(p), m1 = _mm_loadu_ps(p + 4), m2 = _mm_loadu_ps(p + 8),
               m3 = _mm_loadu_ps(p + 12);
        acc = _mm_add_ps(acc, _mm_add_ps(_mm_add_ps(m0, m1), _mm_add_ps(m2, m3)));
        for (int i = 16; i < BLOCK; i += 16) {
            __m128 v0 = _mm_loadu_ps(p + i), v1 = _mm_loadu_ps(p + i + 4), v2 = _mm_loadu_ps(p + i + 8),
                   v3 = _mm_loadu_ps(p + i + 12);
            acc = _mm_add_ps(acc, _mm_add_ps(_mm_add_ps(v0, v1), _mm_add_ps(v2, v3)));
            m0 = _mm_max_ps(m0, v0);
            m1 = _mm_max_ps(m1, v1);
            m2 = _mm_max_ps(m2, v2);
            m3 = _mm_max_ps(m3, v3);
        }
        bm[b] = hmax4(_mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
    }
    return block_maxima_scalar(row, n, b, bm, hsum4(acc));
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
/* The same with eight lanes, where the processor has AVX2 (chosen at run time: this file is built
   for any x86-64): ~9 us a 262k row here against ~16 with four. */
__attribute__((target("avx2"))) static int block_maxima_avx2(const float *row, long n, float *bm) {
    long full = n / BLOCK, b = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; b < full; b++) {
        const float *p = row + b * BLOCK;
        __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8), v2 = _mm256_loadu_ps(p + 16),
               v3 = _mm256_loadu_ps(p + 24), v4 = _mm256_loadu_ps(p + 32), v5 = _mm256_loadu_ps(p + 40),
               v6 = _mm256_loadu_ps(p + 48), v7 = _mm256_loadu_ps(p + 56);
        acc = _mm256_add_ps(acc, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)),
                                               _mm256_add_ps(_mm256_add_ps(v4, v5), _mm256_add_ps(v6, v7))));
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(v0, v1), _mm256_max_ps(v2, v3)),
                                 _mm256_max_ps(_mm256_max_ps(v4, v5), _mm256_max_ps(v6, v7)));
        bm[b] = hmax4(_mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1)));
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    return block_maxima_scalar(row, n, b, bm, hsum4(s));
}

/* The k-th largest of v[0, count) (k <= 64) and the largest, for finite or infinite values. The k largest
   seen are kept in ascending order in the top of 64 slots, and a value that beats the k-th is put in
   its place with vector compares and blends: a heap's sift mispredicts a branch at nearly every level
   (~100 cycles an insertion here, a few hundred insertions a row). */
__attribute__((target("avx2"))) static float kth_largest_avx2(const float *v, long count, long k,
                                                               float *largest) {
    float s[72];
    for (int j = 0; j < 72; j++) s[j] = j < 64 ? -INFINITY : INFINITY;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    float reach = -INFINITY;
    /* only the vectors that hold the k largest are compared and moved: below them the slots are
       passed over (what is shifted out of the lowest of those vectors is below the k-th) */
    const int low = (int)(64 - k) & ~7;
    for (long i = 0; i < count; i++) {
        if ((i & 7) == 0) { /* eight at a time while none beats the k-th */
            __m256 bar = _mm256_set1_ps(reach);
            while (i + 8 <= count &&
                   !_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), bar, _CMP_GT_OQ)))
                i += 8;
            if (i >= count) break;
        }
        float x = v[i];
        if (!(x > reach)) continue;
        __m256 xv = _mm256_set1_ps(x);
        int below = low; /* slots holding less than x: x goes to slot below - 1, those under it move down */
        for (int j = low; j < 64; j += 8)
            below += __builtin_popcount((unsigned)_mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_loadu_ps(s + j), xv, _CMP_LT_OQ)));
        __m256i at = _mm256_set1_epi32(below - 1);
        for (int j = low; j < 64; j += 8) {
            __m256 here = _mm256_loadu_ps(s + j), next = _mm256_loadu_ps(s + j + 1);
            __m256i slot = _mm256_add_epi32(lane, _mm256_set1_epi32(j));
            __m256 moves = _mm256_castsi256_ps(_mm256_cmpgt_epi32(at, slot));
            __m256 lands = _mm256_castsi256_ps(_mm256_cmpeq_epi32(at, slot));
            _mm256_storeu_ps(s + j, _mm256_blendv_ps(_mm256_blendv_ps(here, next, moves), xv, lands));
        }
        reach = s[64 - k];
    }
    *largest = s[63];
    return reach;
}
#endif
#endif

static int block_maxima(const float *row, long n, float *bm) {
#ifdef HAVE_AVX2_PATH
    if (__builtin_cpu_supports("avx2")) return block_maxima_avx2(row, n, bm);
#endif
#ifdef __SSE2__
    return block_maxima_sse2(row, n, bm);
#else
    return block_maxima_scalar(row, n, 0, bm, 0.0f);
#endif
}

/* Filter one row with `settings`: top_k in (0, n); top_p 0 when off; min_p 0 when off; inv_t, one over
   the temperature; banned[n_banned]: ids that count as -inf (--ignore-eos; those outside [0, n) are
   ignored), as in a masked row. out[4 * top_k + 1]: the survivors' ids (int64) by ascending id in
   out[0, top_k), their scores (logit * inv_t) in out[top_k, 2 top_k), the row's maximum in
   out[4 top_k]; the rest is scratch (top_k candidates).

   Returns the number of survivors, or -1 where sampling.py must decide (a NaN or infinite logit, for
   its errors; no memory). */
typedef struct {
    int64_t top_k;
    double top_p, min_p, inv_t;
    int64_t n_banned;
    const int64_t *banned;
} filter_settings; /* native.FilterSettings: one per sampling setting, so a call passes four arguments */

/* Scratch memory for one call, kept per thread between calls: a malloc and free on caches a decode
   has just emptied cost ~1.5 us a row here. NULL where there is no memory. */
static void *scratch(size_t size) {
    static __thread void *kept;
    static __thread size_t kept_size;
    if (size > kept_size) {
        free(kept);
        kept = malloc(size);
        kept_size = kept ? size : 0;
    }
    return kept;
}

long specli_filter(const float *row, long n, const filter_settings *settings, double *out) {
    long top_k = (long)settings->top_k, n_banned = (long)settings->n_banned;
    double top_p = settings->top_p, min_p = settings->min_p, inv_t = settings->inv_t;
    const int64_t *banned = settings->banned;
    int64_t *out_ids = (int64_t *)out;
    double *out_scores = out + top_k, *out_m = out + 4 * top_k;
    cand *heap = (cand *)(out + 2 * top_k);
    long n_blocks = (n + BLOCK - 1) / BLOCK;
    /* each block's maximum, then the blocks that reach the k-th of them */
    float *bm = scratch((size_t)n_blocks * (sizeof(float) + sizeof(int32_t)));
    if (!bm) return -1;
    int32_t *reaching = (int32_t *)(bm + n_blocks);
    int nan = block_maxima(row, n, bm);
    /* a banned id's block: its maximum over the others (a masked row's, as the numpy path masks it) */
    for (long j = 0; j < n_banned; j++) {
        if (banned[j] < 0 || banned[j] >= n) continue;
        long b = banned[j] / BLOCK, stop = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
        float others = -INFINITY;
        for (long i = b * BLOCK; i < stop; i++)
            if (row[i] > others && !is_banned(i, banned, n_banned)) others = row[i];
        bm[b] = others;
    }

    /* The maximum, and the top_k-th largest block maximum ("reach"): every top-k id lies in a block
       that reaches it. A min-heap of floats (in out_scores' room) keeps the k largest maxima seen; a
       maximum that does not beat the smallest is passed over in one comparison. */
    float m = -INFINITY, reach = -INFINITY;
    float *best = (float *)out_scores;
    long size = 0, n_blocks_scanned = 0;
#ifdef HAVE_AVX2_PATH
    if (top_k <= 64 && top_k < n_blocks && __builtin_cpu_supports("avx2")) {
        reach = kth_largest_avx2(bm, n_blocks, top_k, &m);
        n_blocks_scanned = n_blocks;
    }
#endif
    for (long b = n_blocks_scanned; b < n_blocks; b++) {
#ifdef __SSE2__
        if ((b & 3) == 0) { /* four at a time while none of them beats the smallest kept */
            __m128 bar = _mm_set1_ps(reach);
            while (b + 4 <= n_blocks && !_mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(bm + b), bar)))
                b += 4;
            if (b >= n_blocks) break;
        }
#endif
        float v = bm[b];
        if (v <= reach) continue;
        if (v > m) m = v;
        if (top_k >= n_blocks) continue;
        if (size < top_k) {
            long i = size++;
            best[i] = v;
            while (i > 0 && best[(i - 1) / 2] > best[i]) {
                float t = best[i];
                best[i] = best[(i - 1) / 2];
                best[(i - 1) / 2] = t;
                i = (i - 1) / 2;
            }
            if (size == top_k) reach = best[0];
        } else {
            long i = 0;
            for (;;) { /* replace the smallest, sift it down */
                long l = 2 * i + 1, r = l + 1, w = i;
                float wv = v;
                if (l < size && best[l] < wv) w = l, wv = best[l];
                if (r < size && best[r] < wv) w = r, wv = best[r];
                if (w == i) break;
                best[i] = wv;
                i = w;
            }
            best[i] = v;
            reach = best[0];
        }
    }
    *out_m = (double)m;
    if (nan || isinf(m)) {
        if (nan) *out_m = NAN;
        return -1;
    }

    /* The top k of the blocks that reach it (the k-th largest is at least reach: nothing below it
       ranks). Those at or above it are gathered and sorted where there are few (usually a few more
       than k), else kept in a heap (the set does not depend on the order offered). Within a block,
       four at a time while none reaches it. */
    /* The blocks that reach it, listed once (four maxima a comparison: a loop over every block with a
       branch each cost as much as the gathering), and their memory asked for all at once: the row
       has mostly left the core's cache since the pass, and one block at a time each waits a full
       trip to the shared cache. */
    long n_reaching = 0, b = 0;
#ifdef __SSE2__
    for (__m128 bar = _mm_set1_ps(reach); b + 4 <= n_blocks; b += 4)
        for (int mask = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(bm + b), bar)); mask; mask &= mask - 1)
            reaching[n_reaching++] = (int32_t)(b + __builtin_ctz((unsigned)mask));
#endif
    for (; b < n_blocks; b++)
        if (bm[b] >= reach) reaching[n_reaching++] = (int32_t)b;
    for (long r = 0; r < n_reaching; r++)
        for (int line = 0; line < BLOCK; line += 16) __builtin_prefetch(row + (long)reaching[r] * BLOCK + line);
    cand few[256];
    long n_few = 0;
    size = 0;
    for (int pass = 0; pass < 2; pass++) { /* the second only where more than 256 reach */
        for (long r = 0; r < n_reaching; r++) {
            long i = (long)reaching[r] * BLOCK, stop = i + BLOCK < n ? i + BLOCK : n;
            for (; i < stop; i++) {
#ifdef __SSE2__
                if ((i & 3) == 0) {
                    __m128 bar = _mm_set1_ps(reach);
                    while (i + 4 <= stop && !_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(row + i), bar)))
                        i += 4;
                    if (i >= stop) break;
                }
#endif
                if (row[i] >= reach) {
                    cand c = {row[i], i};
                    if (n_banned && is_banned(i, banned, n_banned)) {
                        c.v = -INFINITY; /* masked, as the numpy path masks the row */
                        if (reach > -INFINITY) continue;
                    }
                    if (pass == 1)
                        offer(heap, top_k, &size, c);
                    else if (n_few < 256)
                        few[n_few++] = c;
                    else
                        n_few++;
                }
            }
        }
        if (pass == 0 && n_few <= 256) {
            sort_cands(few, n_few, 0);
            size = n_few < top_k ? n_few : top_k;
            for (long j = 0; j < size; j++) heap[j] = few[j];
            break;
        }
    }
    if (n_few > 256) sort_cands(heap, size, 0);

    long cut = size;
    if (top_p > 0.0) {
        /* the smallest best-first prefix whose share of the top-k mass reaches top_p, summed in order */
        double *z = out_scores; /* room for top_k: scratch until the survivors are written */
        double total = 0.0, mass = 0.0;
        for (long j = 0; j < size; j++) {
            z[j] = exp((double)heap[j].v - (double)m);
            total += z[j];
        }
        for (long j = 0; j < size; j++) {
            mass += z[j];
            if (mass / total >= top_p) {
                cut = j + 1;
                break;
            }
        }
    }
    /* min-p's floor rounded to a float32 once (sampling._min_p_floor), so that numpy's comparisons of
       float32 logits with it and Python's in float64 agree */
    float floor = min_p > 0.0 ? (float)((double)m + log(min_p)) : -INFINITY;
    long kept = 0;
    for (long j = 0; j < cut; j++) {
        if (heap[j].v >= floor) {
            heap[kept++] = heap[j];
        }
    }
    sort_cands(heap, kept, 1);
    for (long j = 0; j < kept; j++) {
        out_ids[j] = heap[j].id;
        out_scores[j] = (double)heap[j].v * inv_t;
    }
    return kept;
}

/* Whether specli_filter's passes over the row are vectorized here; without, numpy's are faster. */
int specli_filter_vectorized(void) {
#ifdef __SSE2__
    return 1;
#else
    return 0;
#endif
}

/* -- keyed noise: Noise in sampling.py --------------------------------------------------------------- */

static const uint64_t GOLDEN = 0x9E3779B97F4A7C15ULL;

static inline uint64_t mix(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* Noise._base: the key of one (position, stream, salt) */
static uint64_t noise_base(uint64_t key, uint64_t position, uint64_t stream, uint64_t salt) {
    uint64_t h = mix(key ^ (position * GOLDEN));
    h = mix(h ^ ((stream << 48) + 1));
    return mix(h ^ (salt * 0xD6E8FEB86659FD93ULL));
}

/* Gumbel(0) noise keyed by an id (Noise.gumbel_few: the C library's log, as Python's math.log) */
static inline double keyed_gumbel(int64_t id, uint64_t base) {
    uint64_t bits = mix((uint64_t)id * GOLDEN + base);
    double u = ((double)(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    return -log(-log(u));
}

void specli_keyed_gumbel(const int64_t *ids, long n, uint64_t base, double *out) {
    for (long j = 0; j < n; j++) out[j] = keyed_gumbel(ids[j], base);
}

/* argmax over the support of score + its noise at (position, stream, salt); the first of equal values
   wins, as list.index(max(...)) and numpy's argmax. */
long specli_keyed_argmax(const int64_t *ids, const double *scores, long n, uint64_t key, uint64_t position,
                         uint64_t stream, uint64_t salt) {
    uint64_t base = noise_base(key, position, stream, salt);
    long best = 0;
    double best_value = -INFINITY;
    for (long j = 0; j < n; j++) {
        double value = scores[j] + keyed_gumbel(ids[j], base);
        if (j == 0 || value > best_value) {
            best = j;
            best_value = value;
        }
    }
    return best;
}

/* A plain round's token (nothing drafted): specli_filter, then specli_keyed_argmax over its survivors
   at (position, stream, salt), in one call: Dist.draw of sampling.distribution's Dist, the same token.
   A call from Python after a decode costs a few microseconds more for each step it takes there (the
   decode has evicted what it touches), more than the steps themselves. out as specli_filter's.
   Returns the token, or -1 where sampling.py must decide (what specli_filter refuses, a temperature
   too small to divide the logits by). */
long specli_filter_draw(const float *row, long n, const filter_settings *settings, double *out, uint64_t key,
                        uint64_t position, uint64_t stream, uint64_t salt) {
    long count = specli_filter(row, n, settings, out);
    long top_k = (long)settings->top_k;
    if (count < 1 || !isfinite(settings->inv_t * fmax(1.0, fabs(out[4 * top_k])))) return -1;
    const int64_t *ids = (const int64_t *)out;
    return (long)ids[specli_keyed_argmax(ids, out + top_k, count, key, position, stream, salt)];
}

/* -- draws over the whole row (no filter): Dist.draw's dense branch ---------------------------------- */

#define NOISE_BLOCK 256 /* sampling.BLOCK: the blocks the whole-row noise is built on */

/* scores[i] = row[i] * inv_t (float32, as numpy's row * np.float32(inv_t)) and each NOISE_BLOCK block's
   largest score into bm. Returns the row's maximum, or NaN where the row holds a NaN (a sum of the row
   is NaN then, or where it holds both infinities: refused as well). */
static double dense_scores_scalar(const float *row, long n, long i, float inv_t, float *scores, float *bm,
                                  float sum, float m) {
    for (; i < n; i++) {
        sum += row[i];
        scores[i] = row[i] * inv_t;
        if (row[i] > m) m = row[i];
        if (i % NOISE_BLOCK == 0 || scores[i] > bm[i / NOISE_BLOCK])
            bm[i / NOISE_BLOCK] = scores[i];
    }
    return sum != sum ? NAN : (double)m;
}

#ifdef HAVE_AVX2_PATH
__attribute__((target("avx2"))) static double dense_scores_avx2(const float *row, long n, float inv_t,
                                                                float *scores, float *bm) {
    long full = n / NOISE_BLOCK;
    __m256 acc = _mm256_setzero_ps(), scale = _mm256_set1_ps(inv_t), top = _mm256_set1_ps(-INFINITY);
    for (long b = 0; b < full; b++) {
        const float *p = row + b * NOISE_BLOCK;
        float *s = scores + b * NOISE_BLOCK;
        __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
        for (int i = 0; i < NOISE_BLOCK; i += 16) {
            __m256 v0 = _mm256_loadu_ps(p + i), v1 = _mm256_loadu_ps(p + i + 8);
            acc = _mm256_add_ps(acc, _mm256_add_ps(v0, v1));
            m0 = _mm256_max_ps(m0, v0);
            m1 = _mm256_max_ps(m1, v1);
            _mm256_storeu_ps(s + i, _mm256_mul_ps(v0, scale));
            _mm256_storeu_ps(s + i + 8, _mm256_mul_ps(v1, scale));
        }
        __m256 m = _mm256_max_ps(m0, m1);
        top = _mm256_max_ps(top, m);
        /* a positive scale keeps the order (rounding is monotone): the block's largest score is its
           largest logit scaled */
        bm[b] = hmax4(_mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1))) * inv_t;
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    float m = hmax4(_mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1)));
    return dense_scores_scalar(row, n, full * NOISE_BLOCK, inv_t, scores, bm, hsum4(s), m);
}
#endif

double specli_dense_scores(const float *row, long n, float inv_t, float *scores, float *bm) {
#ifdef HAVE_AVX2_PATH
    if (__builtin_cpu_supports("avx2")) return dense_scores_avx2(row, n, inv_t, scores, bm);
#endif
    return dense_scores_scalar(row, n, 0, inv_t, scores, bm, 0.0f, -INFINITY);
}

static inline double unit(uint64_t bits) { return ((double)(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/* Noise.block_gumbel: a block's largest per-id Gumbel, Gumbel(log NOISE_BLOCK) */
static inline double block_gumbel(long block, uint64_t base) {
    return log((double)NOISE_BLOCK) - log(-log(unit(mix((uint64_t)block * GOLDEN + base))));
}

/* Noise.gumbel_blocked for one id, given its block's largest noise `top`: the holder of the block's
   maximum has it, the others a Gumbel truncated below it */
static inline double blocked_gumbel(long id, double top, uint64_t holder_base, uint64_t own_base) {
    long block = id / NOISE_BLOCK;
    if ((uint64_t)(id % NOISE_BLOCK) == mix((uint64_t)block * GOLDEN + holder_base) % NOISE_BLOCK) return top;
    double own = -log(-log(unit(mix((uint64_t)id * GOLDEN + own_base))));
    return -log(exp(-top) + exp(-own));
}

typedef struct {
    double bound;
    long block;
} block_bound;

/* Rounding room for a bound: the noise is computed with a few roundings; a block or an id is passed
   over only where it falls short by more than this. */
static inline double slack(double x) { return 1e-9 * (1.0 + fabs(x)); }

static const double LN2 = 0.69314718055994530942;

/* The keyed Gumbel-max draw argmax(scores[i] + noise(i)) over all n ids (Dist.draw with no support),
   with the noise built top-down by blocks (Noise's docstring in sampling.py): the same token as the
   numpy path, which evaluates every id of every block whose bound (its largest score plus its largest
   noise) reaches the top-scoring id's value. Here the blocks are taken best bound first, and a block
   or an id is evaluated only where its bound reaches the best value found so far, so a few ids are
   (numpy evaluates whole blocks). A block's largest noise needs two logs; most blocks are passed over
   on its uniform alone: a noise above log NOISE_BLOCK + g needs u >= exp(-e^-g) >= 1 - e^-g >= 1 - 2^-k
   for k <= g / ln 2. `stream`: family * 4. Returns the token, or -1 where nothing can be drawn (no
   finite score), -2 with no memory. */
long specli_dense_draw(const float *scores, long n, const float *bm, uint64_t key, uint64_t position,
                       uint64_t stream, uint64_t salt) {
    long n_blocks = (n + NOISE_BLOCK - 1) / NOISE_BLOCK;
    uint64_t block_base = noise_base(key, position, stream + 1, salt);
    uint64_t holder_base = noise_base(key, position, stream + 2, salt);
    uint64_t own_base = noise_base(key, position, stream + 3, salt);
    const double log_block = log((double)NOISE_BLOCK);

    /* the top-scoring id (the first of equals) and its value: a floor for the winner's */
    long top_block = 0;
    for (long b = 1; b < n_blocks; b++)
        if (bm[b] > bm[top_block]) top_block = b;
    long best_id = top_block * NOISE_BLOCK;
    while (scores[best_id] != bm[top_block]) best_id++;
    double best = (double)scores[best_id] + blocked_gumbel(best_id, block_gumbel(top_block, block_base),
                                                          holder_base, own_base);
    if (!isfinite(best)) return -1;

    block_bound stack_room[256], *reach = stack_room;
    if (n_blocks > 256 && !(reach = scratch((size_t)n_blocks * sizeof(block_bound)))) return -2;
    long count = 0;
    for (long b = 0; b < n_blocks; b++) {
        if (bm[b] == -INFINITY) continue; /* no mass */
        /* what the block's noise must exceed over log NOISE_BLOCK, less rounding room */
        double gap = best - (double)bm[b] - log_block - slack(best);
        if (gap >= LN2) {
            long k = gap >= 53 * LN2 ? 53 : (long)(gap / LN2);
            if (unit(mix((uint64_t)b * GOLDEN + block_base)) < 1.0 - ldexp(1.0, (int)-k)) continue;
        }
        double bound = (double)bm[b] + block_gumbel(b, block_base);
        if (bound + slack(bound) < best) continue;
        block_bound c = {bound, b};
        long j = count++;
        for (; j > 0 && reach[j - 1].bound < bound; j--) reach[j] = reach[j - 1]; /* best bound first */
        reach[j] = c;
    }
    for (long j = 0; j < count; j++) {
        double bound = reach[j].bound;
        if (bound + slack(bound) < best) break; /* nor any after it */
        long b = reach[j].block, stop = (b + 1) * NOISE_BLOCK < n ? (b + 1) * NOISE_BLOCK : n;
        double top = block_gumbel(b, block_base);
        for (long i = b * NOISE_BLOCK; i < stop; i++) {
            double s = (double)scores[i];
            if (!(s + top + slack(s + top) >= best)) continue; /* its noise is at most the block's */
            double value = s + blocked_gumbel(i, top, holder_base, own_base);
            if (value > best || (value == best && i < best_id)) {
                best = value;
                best_id = i;
            }
        }
    }
    return best_id;
}
