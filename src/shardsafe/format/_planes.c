/*
 * The planes transform of format/codec.py (codecs planes16, planes32, planes64) as one
 * fused pass over a block, for k = 2, 4 and 8-byte little-endian elements: the extension
 * module shardsafe.format._planes (setup.py builds it; format/planes_kernel.py loads it,
 * and codec.py runs the same transform in numpy where it is not built).
 *
 * split: each element rotated left by one bit; its top byte less c (mod 256) is the
 *   exponent byte, written whole (ex) and/or as two nibble planes (lo, hi: two elements
 *   per byte, the first in the low nibble, an odd count padded with a zero nibble);
 *   byte j < k-1 of the rotated element is written to mant[j]. A missing plane is skipped.
 * join: the inverse, from the exponent (lo and hi, or ex), c and every mantissa plane.
 *
 * The Python functions take buffer-protocol objects (numpy arrays, memoryviews, bytes),
 * check every length against the element count before touching memory, and release the
 * GIL while the kernel runs. The work runs over CHUNK elements at a time in small scratch
 * arrays, so that every inner loop is a simple one the compiler vectorises and stays in
 * the L1 cache.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
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

#define PLANES(K, T, BITS)                                                                  \
    VECTOR static void split##K(const uint8_t *src, size_t n, uint8_t c,          \
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
    VECTOR static void join##K(uint8_t *dst, size_t n, uint8_t c,                 \
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

#define MAX_K 8

typedef void (*split_fn)(const uint8_t *, size_t, uint8_t, uint8_t *, uint8_t *, uint8_t *,
                         uint8_t *const *);
typedef void (*join_fn)(uint8_t *, size_t, uint8_t, const uint8_t *, const uint8_t *,
                        const uint8_t *, const uint8_t *const *);

/* The buffers of one call: element array, the three exponent planes and k-1 mantissas. */
typedef struct {
    Py_buffer elems, lo, hi, ex, mant[MAX_K - 1];
} Buffers;

static void release(Buffers *b, int k) {
    Py_buffer *all[3 + MAX_K] = {&b->elems, &b->lo, &b->hi, &b->ex};
    for (int j = 0; j < k - 1; j++)
        all[4 + j] = &b->mant[j];
    for (int i = 0; i < 3 + k; i++)
        if (all[i]->obj != NULL)
            PyBuffer_Release(all[i]);
}

/* Takes a contiguous buffer of at least `need` bytes (writable if asked) from `o`; None
 * leaves b->obj NULL unless the buffer is required. Returns 0, or -1 with an exception. */
static int take(PyObject *o, Py_buffer *b, int writable, int required, Py_ssize_t need,
                const char *what) {
    if (o == Py_None) {
        if (required) {
            PyErr_Format(PyExc_ValueError, "the %s plane is required", what);
            return -1;
        }
        return 0;
    }
    if (PyObject_GetBuffer(o, b, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return -1;
    if (b->len < need) {
        PyErr_Format(PyExc_ValueError, "the %s plane holds %zd bytes, %zd are needed", what,
                     b->len, need);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static int element_size(int k) {
    if (k != 2 && k != 4 && k != 8) {
        PyErr_Format(PyExc_ValueError, "element size %d is not 2, 4 or 8", k);
        return -1;
    }
    return 0;
}

/* The planes of `b` (all but elems) from the arguments; `n` elements. */
static int take_planes(Buffers *b, int k, Py_ssize_t n, PyObject *lo, PyObject *hi,
                       PyObject *ex, PyObject *mant, int writable, int need_all) {
    Py_ssize_t half = (n + 1) / 2;
    if (!PyTuple_Check(mant) || PyTuple_GET_SIZE(mant) != k - 1) {
        PyErr_Format(PyExc_TypeError, "mantissa planes must be a tuple of %d", k - 1);
        return -1;
    }
    if (need_all && (lo == Py_None) != (hi == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "the lo and hi planes come together");
        return -1;
    }
    int nibbles = lo != Py_None;
    if (take(lo, &b->lo, writable, 0, half, "lo") < 0 || take(hi, &b->hi, writable, 0, half, "hi") < 0 ||
        take(ex, &b->ex, writable, need_all && !nibbles, n, "exp") < 0)
        return -1;
    for (int j = 0; j < k - 1; j++)
        if (take(PyTuple_GET_ITEM(mant, j), &b->mant[j], writable, need_all, n, "mantissa") < 0)
            return -1;
    return 0;
}

static uint8_t *ptr(Py_buffer *b) { return b->obj != NULL ? (uint8_t *)b->buf : NULL; }

PyDoc_STRVAR(split_doc,
"split(k, elements, c, lo, hi, exp, mantissas)\n\n"
"Writes the planes of the k-byte `elements` into the writable buffers given (None: skip\n"
"that plane); `mantissas` is a tuple of k-1 buffers or None.");

static PyObject *py_split(PyObject *self, PyObject *args) {
    int k, c;
    PyObject *src, *lo, *hi, *ex, *mant;
    if (!PyArg_ParseTuple(args, "iOiOOOO:split", &k, &src, &c, &lo, &hi, &ex, &mant))
        return NULL;
    if (element_size(k) < 0)
        return NULL;
    if (c < 0 || c > 255)
        return PyErr_Format(PyExc_ValueError, "offset %d is not a byte", c);
    Buffers b;
    memset(&b, 0, sizeof b);
    if (take(src, &b.elems, 0, 1, 0, "elements") < 0)
        return NULL;
    if (b.elems.len % k) {
        PyErr_Format(PyExc_ValueError, "%zd bytes are not a whole number of %d-byte elements",
                     b.elems.len, k);
        release(&b, k);
        return NULL;
    }
    Py_ssize_t n = b.elems.len / k;
    if (take_planes(&b, k, n, lo, hi, ex, mant, 1, 0) < 0) {
        release(&b, k);
        return NULL;
    }
    uint8_t *m[MAX_K - 1];
    for (int j = 0; j < k - 1; j++)
        m[j] = ptr(&b.mant[j]);
    split_fn fn = k == 2 ? split2 : k == 4 ? split4 : split8;
    Py_BEGIN_ALLOW_THREADS
    fn(b.elems.buf, (size_t)n, (uint8_t)c, ptr(&b.lo), ptr(&b.hi), ptr(&b.ex), m);
    Py_END_ALLOW_THREADS
    release(&b, k);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(join_doc,
"join(k, out, c, lo, hi, exp, mantissas)\n\n"
"Writes the k-byte elements `out` from the exponent (lo and hi, or exp; the other None)\n"
"and the tuple of k-1 mantissa planes.");

static PyObject *py_join(PyObject *self, PyObject *args) {
    int k, c;
    PyObject *dst, *lo, *hi, *ex, *mant;
    if (!PyArg_ParseTuple(args, "iOiOOOO:join", &k, &dst, &c, &lo, &hi, &ex, &mant))
        return NULL;
    if (element_size(k) < 0)
        return NULL;
    if (c < 0 || c > 255)
        return PyErr_Format(PyExc_ValueError, "offset %d is not a byte", c);
    Buffers b;
    memset(&b, 0, sizeof b);
    if (take(dst, &b.elems, 1, 1, 0, "output") < 0)
        return NULL;
    if (b.elems.len % k) {
        PyErr_Format(PyExc_ValueError, "%zd bytes are not a whole number of %d-byte elements",
                     b.elems.len, k);
        release(&b, k);
        return NULL;
    }
    Py_ssize_t n = b.elems.len / k;
    if (take_planes(&b, k, n, lo, hi, ex, mant, 0, 1) < 0) {
        release(&b, k);
        return NULL;
    }
    const uint8_t *m[MAX_K - 1];
    for (int j = 0; j < k - 1; j++)
        m[j] = ptr(&b.mant[j]);
    join_fn fn = k == 2 ? join2 : k == 4 ? join4 : join8;
    Py_BEGIN_ALLOW_THREADS
    fn(b.elems.buf, (size_t)n, (uint8_t)c, ptr(&b.lo), ptr(&b.hi), ptr(&b.ex), m);
    Py_END_ALLOW_THREADS
    release(&b, k);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"split", py_split, METH_VARARGS, split_doc},
    {"join", py_join, METH_VARARGS, join_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_planes",
    "The planes transform of shardsafe.format.codec, compiled (see _planes.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__planes(void) { return PyModule_Create(&module); }
