/*
 * The planes transform of format/codec.py (codecs planes16, planes32, planes64) as one
 * fused pass over a block, for k = 2, 4 and 8-byte little-endian elements.
 *
 * split: each element rotated left by one bit; its top byte less c (mod 256) is the
 *   exponent byte, written whole (ex) and/or as two nibble planes (lo, hi: two elements
 *   per byte, the first in the low nibble, an odd count padded with a zero nibble);
 *   byte j < k-1 of the rotated element is written to mant[j]. A NULL plane is skipped.
 * join: the inverse, from the exponent (lo and hi, or ex), c and every mantissa plane.
 *
 * Plain C99 without Python headers: format/planes_kernel.py loads it with ctypes (which
 * releases the GIL for the call) and codec.py falls back to numpy when it is not built.
 * The work runs over CHUNK elements at a time in small scratch arrays, so that every
 * inner loop is a simple one the compiler vectorises and stays in the L1 cache.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* x86-64: an AVX2 build of each function besides the baseline one, picked at load time by
 * the CPU (GCC and Clang function multi-versioning); elsewhere the baseline build only. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(SHARDSAFE_NO_CLONES)
#define VECTOR __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR
#endif

#define CHUNK 2048 /* elements per inner pass; even, so nibble pairs never straddle */

/* Bumped whenever a signature or the transform changes: the loader refuses a stale build. */
int shardsafe_planes_abi(void) { return 1; }

#define PLANES(K, T, BITS)                                                                  \
    VECTOR void shardsafe_planes_split##K(const uint8_t *src, size_t n, uint8_t c,          \
                                          uint8_t *lo, uint8_t *hi, uint8_t *ex,            \
                                          uint8_t *const *mant) {                           \
        T x[CHUNK];                                                                         \
        uint8_t e[CHUNK + 1];                                                               \
        for (size_t s = 0; s < n; s += CHUNK) {                                             \
            size_t m = n - s < CHUNK ? n - s : CHUNK;                                       \
            memcpy(x, src + s * K, m * K);                                                  \
            for (size_t i = 0; i < m; i++) {                                                \
                T r = (T)((T)(x[i] << 1) | (T)(x[i] >> (BITS - 1)));                        \
                x[i] = r;                                                                   \
                e[i] = (uint8_t)((uint8_t)(r >> (BITS - 8)) - c);                           \
            }                                                                               \
            for (int j = 0; j < K - 1; j++) {                                               \
                uint8_t *d = mant[j];                                                       \
                if (d)                                                                      \
                    for (size_t i = 0; i < m; i++)                                          \
                        d[s + i] = (uint8_t)(x[i] >> (8 * j));                              \
            }                                                                               \
            if (ex)                                                                         \
                memcpy(ex + s, e, m);                                                       \
            e[m] = 0; /* the padding nibble of an odd count */                              \
            size_t h = (m + 1) / 2;                                                         \
            if (lo)                                                                         \
                for (size_t p = 0; p < h; p++)                                              \
                    lo[s / 2 + p] = (uint8_t)((e[2 * p] & 0x0F) | (e[2 * p + 1] << 4));     \
            if (hi)                                                                         \
                for (size_t p = 0; p < h; p++)                                              \
                    hi[s / 2 + p] = (uint8_t)((e[2 * p] >> 4) | (e[2 * p + 1] & 0xF0));     \
        }                                                                                   \
    }                                                                                       \
                                                                                            \
    VECTOR void shardsafe_planes_join##K(uint8_t *dst, size_t n, uint8_t c,                 \
                                         const uint8_t *lo, const uint8_t *hi,             \
                                         const uint8_t *ex, const uint8_t *const *mant) {  \
        T x[CHUNK];                                                                         \
        uint8_t e[CHUNK];                                                                   \
        for (size_t s = 0; s < n; s += CHUNK) {                                             \
            size_t m = n - s < CHUNK ? n - s : CHUNK;                                       \
            const uint8_t *q[K - 1];                                                        \
            for (int j = 0; j < K - 1; j++)                                                 \
                q[j] = mant[j] + s;                                                         \
            if (lo) {                                                                       \
                const uint8_t *l = lo + s / 2, *g = hi + s / 2;                             \
                for (size_t p = 0; p < m / 2; p++) {                                        \
                    e[2 * p] = (uint8_t)((l[p] & 0x0F) | (g[p] << 4));                      \
                    e[2 * p + 1] = (uint8_t)((l[p] >> 4) | (g[p] & 0xF0));                  \
                }                                                                           \
                if (m & 1)                                                                  \
                    e[m - 1] = (uint8_t)((l[m / 2] & 0x0F) | (g[m / 2] << 4));              \
            } else {                                                                        \
                memcpy(e, ex + s, m);                                                       \
            }                                                                               \
            for (size_t i = 0; i < m; i++) {                                                \
                T r = (T)((T)(uint8_t)(e[i] + c) << (BITS - 8));                            \
                for (int j = 0; j < K - 1; j++)                                             \
                    r |= (T)((T)q[j][i] << (8 * j));                                        \
                x[i] = (T)((T)(r >> 1) | (T)(r << (BITS - 1)));                             \
            }                                                                               \
            memcpy(dst + s * K, x, m * K);                                                  \
        }                                                                                   \
    }

PLANES(2, uint16_t, 16)
PLANES(4, uint32_t, 32)
PLANES(8, uint64_t, 64)
