/*
 * fastfeed._resize: bilinear resize of 8-bit RGB (HWC) crops into a batch row, flipped or not.
 *
 * The last resize step of every CPU image path (fastfeed/decode/resize.py): a crop of at
 * most 2x the output on each side (larger ones are halved by OpenCV's INTER_AREA first)
 * to the output size, e.g. 224 x 224. OpenCV's INTER_LINEAR spends ~80 us on that here
 * (2-core Xeon VM), 70% of a raw-pixel loader worker's time; this kernel does it in about
 * half with SSSE3 or AVX2 shuffles and byte multiply-adds (chosen at run time), and writes
 * the mirrored image when asked, so no separate flip pass is needed.
 *
 * Method (separable, vertical pass first):
 *   1. For each output row y, the two source rows around its centre are blended into a
 *      row buffer (crop width, 8 bits), with 7-bit weights wa + wb = 127.
 *   2. The buffer is resampled horizontally: each output pixel blends the two source
 *      pixels around its centre, two output pixels per 16-byte shuffle.
 * Coordinates are OpenCV's (pixel centres: sx = (x + 0.5) * cw / ow - 0.5, clamped to the
 * crop). Weights have 7 bits and each pass rounds to 8 bits: a value is within 3 levels of
 * exact bilinear (2.2 on noise; OpenCV 0.8) and 0.37 off on average (OpenCV 0.27; tests/decode/test_resize_kernel.py).
 * The scalar path computes exactly the same integers as the SIMD path.
 *
 * Python API (fastfeed/decode/resize.py is the only caller):
 *
 *   resize(src, dst, flip) -> None
 *       src: any (h, w, 3) uint8 buffer whose pixels are 3 bytes apart and channels
 *       adjacent (a crop view of a larger image is fine: any row stride); dst: a writable
 *       C-contiguous (oh, ow, 3) uint8 buffer; h < 2 * oh and w < 2 * ow are not
 *       required, but each output pixel reads only its two nearest source pixels per
 *       side (no anti-aliasing), so shrink by more than 2x first.
 *   simd() -> str
 *       "avx2", "ssse3" or "scalar": the path resize() takes on this CPU.
 *   limit(name) -> None
 *       Use at most that instruction set ("scalar", "ssse3", "avx2"), for tests and benchmarks.
 *
 * The GIL is released while it runs. Memory: one row buffer per call (crop width x 3 +
 * 64 bytes), on the stack up to 16 KiB.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define RS_X86 1
#include <immintrin.h>
#else
#define RS_X86 0
#endif

#define RS_W 127     /* weights of a pair sum to this */
#define RS_PAD 64    /* slack after the row buffer: 16-byte loads may read past the crop's last pixel */

/* The instruction sets, best last; rs_limit caps the one used (tests compare them). */
enum { RS_SCALAR = 0, RS_SSSE3 = 1, RS_AVX2 = 2 };
static const char *rs_names[] = {"scalar", "ssse3", "avx2"};
static int rs_limit = RS_AVX2;

static int rs_level(void) {
    int level = RS_SCALAR;
#if RS_X86
    if (__builtin_cpu_supports("ssse3")) level = RS_SSSE3;
    if (__builtin_cpu_supports("avx2")) level = RS_AVX2;
#endif
    return level < rs_limit ? level : rs_limit;
}

/* OpenCV's source coordinate of output index i (of n) over a source of m: (index, 7-bit weight of index + 1). */
static void rs_coord(int i, int n, int m, int *idx, int *wb) {
    double f = ((double)i + 0.5) * ((double)m / (double)n) - 0.5;
    int s = (int)floor(f);
    double frac = f - s;
    if (s < 0) {
        s = 0;
        frac = 0.0;
    }
    if (s >= m - 1) {
        s = m - 1;
        frac = 0.0;
    }
    *idx = s;
    *wb = (int)lrint(frac * RS_W);
}

/* a * wa + b * wb over 127, rounded as pmulhrsw(x, 258) does: (x * 258 + 2^14) >> 15. */
static inline uint8_t rs_blend(int a, int b, int wa, int wb) {
    int x = a * wa + b * wb;
    return (uint8_t)((x * 258 + 16384) >> 15);
}

typedef struct {
    int oh, ow, ch, cw;
    int flip;
    const uint8_t *src;
    Py_ssize_t sstride;
    uint8_t *dst;
} rs_job;

static void rs_vertical_scalar(const uint8_t *r0, const uint8_t *r1, uint8_t *out, int n, int wb) {
    int wa = RS_W - wb;
    for (int k = 0; k < n; k++) out[k] = rs_blend(r0[k], r1[k], wa, wb);
}

static void rs_horizontal_scalar(const uint8_t *row, uint8_t *out, int ow, const int *xs, const int *wx) {
    for (int x = 0; x < ow; x++) {
        const uint8_t *p = row + 3 * xs[x];
        int wb = wx[x], wa = RS_W - wb;
        out[3 * x + 0] = rs_blend(p[0], p[3], wa, wb);
        out[3 * x + 1] = rs_blend(p[1], p[4], wa, wb);
        out[3 * x + 2] = rs_blend(p[2], p[5], wa, wb);
    }
}

#if RS_X86
__attribute__((target("ssse3"))) static void rs_vertical_ssse3(const uint8_t *r0, const uint8_t *r1, uint8_t *out,
                                                               int n, int wb) {
    const __m128i w = _mm_set1_epi16((short)(((RS_W - wb) & 0xff) | (wb << 8)));
    const __m128i k = _mm_set1_epi16(258);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(r0 + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(r1 + i));
        __m128i lo = _mm_mulhrs_epi16(_mm_maddubs_epi16(_mm_unpacklo_epi8(a, b), w), k);
        __m128i hi = _mm_mulhrs_epi16(_mm_maddubs_epi16(_mm_unpackhi_epi8(a, b), w), k);
        _mm_storeu_si128((__m128i *)(out + i), _mm_packus_epi16(lo, hi));
    }
    rs_vertical_scalar(r0 + i, r1 + i, out + i, n - i, wb);
}

/* Two output pixels per step: one 16-byte load from the row buffer at the lower of their
 * two source pixels, a shuffle to (a0 b0) pairs per channel, a multiply-add by the pair's
 * weights, /127, pack. masks/weights: 16 bytes per step, made by rs_tables. */
__attribute__((target("ssse3"))) static void rs_horizontal_ssse3(const uint8_t *row, uint8_t *out, int ow,
                                                                 const int *base, const uint8_t *masks,
                                                                 const uint8_t *weights) {
    const __m128i k = _mm_set1_epi16(258);
    int steps = ow / 2;
    for (int s = 0; s < steps; s++) {
        __m128i px = _mm_loadu_si128((const __m128i *)(row + base[s]));
        __m128i m = _mm_loadu_si128((const __m128i *)(masks + 16 * s));
        __m128i w = _mm_loadu_si128((const __m128i *)(weights + 16 * s));
        __m128i v = _mm_mulhrs_epi16(_mm_maddubs_epi16(_mm_shuffle_epi8(px, m), w), k);
        v = _mm_packus_epi16(v, v);
        if (s + 1 < steps || (ow & 1)) {
            _mm_storel_epi64((__m128i *)(out + 6 * s), v); /* 6 bytes + 2 the next step overwrites */
        } else {
            uint8_t tmp[8];
            _mm_storel_epi64((__m128i *)tmp, v);
            memcpy(out + 6 * s, tmp, 6);
        }
    }
}

/* The same two passes 32 bytes / four output pixels at a time; the last one or two steps of
 * a row go through the SSSE3 code (which writes the row's last bytes exactly). */
__attribute__((target("avx2"))) static void rs_vertical_avx2(const uint8_t *r0, const uint8_t *r1, uint8_t *out,
                                                             int n, int wb) {
    const __m256i w = _mm256_set1_epi16((short)(((RS_W - wb) & 0xff) | (wb << 8)));
    const __m256i k = _mm256_set1_epi16(258);
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(r0 + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(r1 + i));
        __m256i lo = _mm256_mulhrs_epi16(_mm256_maddubs_epi16(_mm256_unpacklo_epi8(a, b), w), k);
        __m256i hi = _mm256_mulhrs_epi16(_mm256_maddubs_epi16(_mm256_unpackhi_epi8(a, b), w), k);
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_packus_epi16(lo, hi)); /* in-lane: order kept */
    }
    rs_vertical_ssse3(r0 + i, r1 + i, out + i, n - i, wb);
}

__attribute__((target("avx2"))) static void rs_horizontal_avx2(const uint8_t *row, uint8_t *out, int ow,
                                                               const int *base, const uint8_t *masks,
                                                               const uint8_t *weights) {
    const __m256i k = _mm256_set1_epi16(258);
    const int steps = ow / 2;
    int s = 0;
    for (; s + 2 < steps; s += 2) { /* at least one step follows, so the 2-byte overrun is rewritten */
        __m256i px = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(row + base[s]))),
            _mm_loadu_si128((const __m128i *)(row + base[s + 1])), 1);
        __m256i m = _mm256_loadu_si256((const __m256i *)(masks + 16 * s));
        __m256i w = _mm256_loadu_si256((const __m256i *)(weights + 16 * s));
        __m256i v = _mm256_mulhrs_epi16(_mm256_maddubs_epi16(_mm256_shuffle_epi8(px, m), w), k);
        v = _mm256_packus_epi16(v, v);
        _mm_storel_epi64((__m128i *)(out + 6 * s), _mm256_castsi256_si128(v));
        _mm_storel_epi64((__m128i *)(out + 6 * s + 6), _mm256_extracti128_si256(v, 1));
    }
    rs_horizontal_ssse3(row, out + 6 * s, ow - 2 * s, base + s, masks + 16 * s, weights + 16 * s);
}
#endif

/* Source rows are short streams (a crop's width, ~1 KB) that the hardware prefetcher
 * barely sees before they end, and a raw-pixel crop comes from the page cache, not the
 * CPU cache: fetching the rows of output row y + RS_AHEAD while row y is computed takes
 * ~88 -> ~55 us per 224 x 224 crop of a real 500 x 375 image (2-core VM). */
#define RS_AHEAD 3

static inline void rs_prefetch(const rs_job *j, int y) {
#if RS_X86
    int sy, wy;
    rs_coord(y, j->oh, j->ch, &sy, &wy);
    const char *r0 = (const char *)j->src + (Py_ssize_t)sy * j->sstride;
    const Py_ssize_t n = 3 * (Py_ssize_t)j->cw;
    const int rows = (wy != 0 && sy + 1 < j->ch) ? 2 : 1;
    for (int r = 0; r < rows; r++) {
        const char *p = r0 + r * j->sstride;
        for (Py_ssize_t k = 0; k < n; k += 64) _mm_prefetch(p + k, _MM_HINT_T0);
        _mm_prefetch(p + n - 1, _MM_HINT_T0);
    }
#else
    (void)j;
    (void)y;
#endif
}

/* The resize itself (no Python objects: runs without the GIL). Returns 0, or -1 on allocation failure. */
static int rs_run(const rs_job *j) {
    const int ow = j->ow, cw = j->cw, n = 3 * cw;
    int simd = rs_level();
    /* per output column: source pixel and weight; the output is mirrored by reading the table backwards */
    int xs_stack[1024], wx_stack[1024], base_stack[512];
    uint8_t mask_stack[512 * 16], weight_stack[512 * 16], row_stack[16384];
    int *xs = xs_stack, *wx = wx_stack, *base = base_stack;
    uint8_t *masks = mask_stack, *weights = weight_stack, *row = row_stack;
    void *heap = NULL;
    size_t row_bytes = (size_t)n + RS_PAD;
    if (ow > 1024 || row_bytes > sizeof(row_stack)) {
        size_t steps = (size_t)ow / 2 + 1;
        heap = calloc(1, sizeof(int) * (size_t)ow * 2 + sizeof(int) * steps + 32 * steps + row_bytes + 16);
        if (!heap) return -1;
        xs = (int *)heap;
        wx = xs + ow;
        base = wx + ow;
        masks = (uint8_t *)(base + steps);
        weights = masks + 16 * steps;
        row = weights + 16 * steps;
    } else {
        memset(row + n, 0, RS_PAD);
    }
    for (int x = 0; x < ow; x++) {
        int s, w;
        rs_coord(j->flip ? ow - 1 - x : x, ow, cw, &s, &w);
        xs[x] = s;
        wx[x] = w;
    }
#if RS_X86
    if (simd) {
        for (int s = 0; s < ow / 2; s++) {
            int s0 = xs[2 * s], s1 = xs[2 * s + 1];
            int lo = s0 < s1 ? s0 : s1, hi = s0 < s1 ? s1 : s0;
            if (hi - lo > 2) { /* wider than one load (shrinking > 2x): scalar path */
                simd = 0;
                break;
            }
            base[s] = 3 * lo;
            uint8_t *m = masks + 16 * s, *w = weights + 16 * s;
            for (int p = 0; p < 2; p++) {
                int o = 3 * (xs[2 * s + p] - lo), wb = wx[2 * s + p];
                for (int c = 0; c < 3; c++) {
                    m[6 * p + 2 * c] = (uint8_t)(o + c);
                    m[6 * p + 2 * c + 1] = (uint8_t)(o + c + 3);
                    w[6 * p + 2 * c] = (uint8_t)(RS_W - wb);
                    w[6 * p + 2 * c + 1] = (uint8_t)wb;
                }
            }
            for (int b = 12; b < 16; b++) {
                m[b] = 0x80; /* zero */
                w[b] = 0;
            }
        }
    }
#endif
    for (int y = 0; y < j->oh; y++) {
        int sy, wy;
        rs_coord(y, j->oh, j->ch, &sy, &wy);
        if (y + RS_AHEAD < j->oh) rs_prefetch(j, y + RS_AHEAD);
        const uint8_t *r0 = j->src + (Py_ssize_t)sy * j->sstride;
        const uint8_t *r1 = sy + 1 < j->ch ? r0 + j->sstride : r0;
        uint8_t *out = j->dst + (size_t)y * ow * 3;
#if RS_X86
        if (simd == RS_AVX2) {
            if (wy == 0)
                memcpy(row, r0, n);
            else
                rs_vertical_avx2(r0, r1, row, n, wy);
            rs_horizontal_avx2(row, out, ow, base, masks, weights);
            if (ow & 1) rs_horizontal_scalar(row, out + 3 * (ow - 1), 1, xs + ow - 1, wx + ow - 1);
            continue;
        }
        if (simd) {
            if (wy == 0)
                memcpy(row, r0, n);
            else
                rs_vertical_ssse3(r0, r1, row, n, wy);
            rs_horizontal_ssse3(row, out, ow, base, masks, weights);
            if (ow & 1) rs_horizontal_scalar(row, out + 3 * (ow - 1), 1, xs + ow - 1, wx + ow - 1);
            continue;
        }
#endif
        if (wy == 0)
            memcpy(row, r0, n);
        else
            rs_vertical_scalar(r0, r1, row, n, wy);
        rs_horizontal_scalar(row, out, ow, xs, wx);
    }
    free(heap);
    return 0;
}

static PyObject *rs_resize(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    int flip = 0;
    if (!PyArg_ParseTuple(args, "OO|p", &src_obj, &dst_obj, &flip)) return NULL;
    Py_buffer src, dst;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *ret = NULL;
    const char *why = NULL;
    if (src.ndim != 3 || dst.ndim != 3 || src.itemsize != 1 || dst.itemsize != 1)
        why = "src and dst must be 3-dimensional uint8 buffers (h, w, 3)";
    else if (src.shape[2] != 3 || dst.shape[2] != 3)
        why = "src and dst must have 3 channels";
    else if (src.strides[2] != 1 || src.strides[1] != 3)
        why = "src pixels must be 3 adjacent bytes (a view that keeps the last two axes contiguous)";
    else if (src.shape[0] < 1 || src.shape[1] < 1 || dst.shape[0] < 1 || dst.shape[1] < 1)
        why = "src and dst must not be empty";
    else if (src.strides[0] < 3 * src.shape[1])
        why = "src rows must not overlap";
    if (why) {
        PyErr_SetString(PyExc_ValueError, why);
        goto done;
    }
    rs_job job = {(int)dst.shape[0], (int)dst.shape[1], (int)src.shape[0], (int)src.shape[1], flip,
                  (const uint8_t *)src.buf, src.strides[0], (uint8_t *)dst.buf};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rs_run(&job);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return ret;
}

static PyObject *rs_simd(PyObject *self, PyObject *noargs) { return PyUnicode_FromString(rs_names[rs_level()]); }

static PyObject *rs_set_limit(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    for (int i = 0; i <= RS_AVX2; i++) {
        if (strcmp(name, rs_names[i]) == 0) {
            rs_limit = i;
            Py_RETURN_NONE;
        }
    }
    PyErr_Format(PyExc_ValueError, "limit(%R): choose scalar, ssse3 or avx2", PyTuple_GET_ITEM(args, 0));
    return NULL;
}

static PyMethodDef rs_methods[] = {
    {"resize", rs_resize, METH_VARARGS,
     "resize(src, dst, flip=False): bilinear resize of the (h, w, 3) uint8 src into the C-contiguous "
     "(oh, ow, 3) uint8 dst, mirrored when flip"},
    {"simd", rs_simd, METH_NOARGS, "simd() -> 'avx2', 'ssse3' or 'scalar': the path resize() takes on this CPU"},
    {"limit", rs_set_limit, METH_VARARGS,
     "limit(name): use at most this instruction set ('scalar', 'ssse3', 'avx2'; for tests and benchmarks)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rs_module = {
    PyModuleDef_HEAD_INIT, "_resize",
    "Bilinear resize of 8-bit RGB crops into a batch row (see fastfeed/decode/resize.py).", -1, rs_methods,
};

PyMODINIT_FUNC PyInit__resize(void) { return PyModule_Create(&rs_module); }
