/* mcpc._kernels: exact f16 <-> f32 conversions and f16/f32 elementwise arithmetic for the simulator.
 *
 * Optional: `mcpc.arch.kernels` uses this module when it was built and falls back to numpy when it
 * was not (or when a call returns NOT_HANDLED); every function here gives the very bits numpy gives:
 *
 *   convert(dst, src)            dst[...] = src, f16 <-> f32 (or the same dtype), rounding half to even
 *   binary(op, dst, a, b, imm)   dst[...] = f32(a) op f32(b), rounded to dst's dtype (op 0-3: add,
 *                                sub, mul, div); b None: the f32 immediate `imm` in b's place, or,
 *                                with op 4-7, first (imm - a, imm / a, imm + a, imm * a: the
 *                                operand order decides which NaN an x86 operation returns)
 *
 *   special(fn, dst, src)        fn 0: dst[...] = f32(erf(f64(src))) for f32 arrays, as scipy.special.erf's
 *                                f64 erf rounded to f32; fn 1: numpy's f64 exp rounded to f32.
 *                                Returns (flat indices as int64 bytes, their inputs as f32 bytes)
 *                                of the values it could not round with certainty, which the caller
 *                                computes with scipy / numpy (see "erf" and "exp" below), or None
 *                                (not handled)
 *
 *   all_finite(x)                whether every value of a 2-D f16/f32 array is finite
 *
 * Operands are 2-D numpy arrays (views of the simulator's SRAM): float16 or float32, any byte
 * strides; a source may have a dimension of 1 where dst has more (broadcast).  Both return 1 when
 * every value written is finite, 0 when some is not, and NOT_HANDLED (-1), writing nothing, when a
 * source overlaps dst without being exactly dst (numpy then computes it with its own buffering) or
 * the floating-point control register is not in its default state (round to nearest, no flushing
 * of subnormals).
 *
 * Exactness: f32 arithmetic is IEEE single precision (no contraction: -ffp-contract=off); the f16
 * -> f32 widening is exact; f32 -> f16 rounds half to even with overflow to infinity, as numpy's
 * software conversion does.  NaNs follow numpy's rules bit for bit: a NaN is converted by the
 * software routines below (numpy keeps a signalling NaN's payload where F16C would quiet it).  On
 * x86-64 CPUs with AVX2 and F16C, contiguous rows go eight values at a time through F16C; elsewhere
 * a scalar loop with the same routines.  tests/sim/test_kernels.py compares every f16 value and
 * (marked slow) every f32 value with numpy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__)
#define MCPC_X86 1
#include <immintrin.h>
#else
#define MCPC_X86 0
#endif

#define NOT_HANDLED (-1)

enum { OP_ADD = 0, OP_SUB = 1, OP_MUL = 2, OP_DIV = 3, OP_RSUB = 4, OP_RDIV = 5, OP_RADD = 6, OP_RMUL = 7, N_OPS = 8 };
enum { DT_F32 = 0, DT_F16 = 1 };

/* -- exact scalar conversions (numpy's results, NaNs included) ---------------------------------- */
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float h2f(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = h & 0x7c00u, sig = h & 0x03ffu;
    if (exp == 0x7c00u) /* infinity or NaN: payload kept, never quieted */
        return bits_f32(sign | 0x7f800000u | (sig << 13));
    if (exp == 0) { /* zero or subnormal: sig * 2^-24, exact in f32 */
        float v = (float)sig * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return bits_f32(sign | (((uint32_t)(h & 0x7fffu) + 0x1c000u) << 13));
}

static inline uint16_t f2h(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u & 0x80000000u) >> 16);
    uint32_t a = u & 0x7fffffffu;
    uint32_t e = a >> 23;
    if (e == 0xffu) {
        uint32_t sig = a & 0x007fffffu;
        if (sig == 0) return sign | 0x7c00u;
        uint16_t h = (uint16_t)(0x7c00u + (sig >> 13)); /* payload truncated, kept a NaN */
        if (h == 0x7c00u) h++;
        return sign | h;
    }
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to 2^16 or more: infinity */
    if (e >= 113) { /* a normal half: drop 13 bits, half to even */
        uint32_t r = a - (112u << 23);
        uint32_t h = r >> 13, rem = r & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return sign | (uint16_t)h;
    }
    if (e < 102) return sign; /* below 2^-25: zero */
    { /* a subnormal half (or the smallest normal after rounding) */
        uint32_t m = (a & 0x007fffffu) | 0x00800000u;
        uint32_t s = 126u - e; /* 14 .. 24 */
        uint32_t h = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return sign | (uint16_t)h;
    }
}

static inline float apply(int op, float x, float y) {
    switch (op) {
    case OP_ADD: return x + y;
    case OP_SUB: return x - y;
    case OP_MUL: return x * y;
    case OP_DIV: return x / y;
    case OP_RSUB: return y - x;
    case OP_RDIV: return y / x;
    case OP_RADD: return y + x;
    default: return y * x;
    }
}

/* -- operands --------------------------------------------------------------------------------- */
typedef struct {
    char *ptr;
    Py_ssize_t rs, cs; /* byte strides; 0 along a broadcast dimension */
    int dt;
    Py_ssize_t lo, hi; /* byte extent, for the overlap test */
    Py_buffer buf;
    int held;
} Operand;

static int dtype_of(const Py_buffer *b) {
    const char *f = b->format ? b->format : "B";
    size_t n = strlen(f);
    if (n == 0 || n > 2) return -1;
    if (n == 2 && f[0] != '<' && f[0] != '=' && f[0] != '@') return -1;
    char c = f[n - 1];
    if (c == 'f' && b->itemsize == 4) return DT_F32;
    if (c == 'e' && b->itemsize == 2) return DT_F16;
    return -1;
}

/* Fill `o` from numpy array `obj`, broadcast to (rows, cols).  Returns 0, or -1 with an exception. */
static int get_operand(PyObject *obj, Operand *o, int writable, Py_ssize_t rows, Py_ssize_t cols) {
    o->held = 0;
    if (PyObject_GetBuffer(obj, &o->buf, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) < 0) return -1;
    o->held = 1;
    Py_buffer *b = &o->buf;
    o->dt = dtype_of(b);
    if (o->dt < 0 || b->ndim != 2) {
        PyErr_SetString(PyExc_TypeError, "mcpc._kernels: operands are 2-D float16 or float32 arrays");
        return -1;
    }
    Py_ssize_t r = b->shape[0], c = b->shape[1];
    if (writable ? (r != rows || c != cols) : ((r != rows && r != 1) || (c != cols && c != 1))) {
        PyErr_SetString(PyExc_ValueError, "mcpc._kernels: operand shapes do not broadcast to dst");
        return -1;
    }
    o->ptr = (char *)b->buf;
    o->rs = (r == 1) ? 0 : b->strides[0];
    o->cs = (c == 1) ? 0 : b->strides[1];
    Py_ssize_t lo = 0, hi = b->itemsize;
    if (r > 0 && c > 0) {
        Py_ssize_t dr = (r - 1) * b->strides[0], dc = (c - 1) * b->strides[1];
        if (dr < 0) lo += dr; else hi += dr;
        if (dc < 0) lo += dc; else hi += dc;
    }
    o->lo = (Py_ssize_t)(intptr_t)o->ptr + lo;
    o->hi = (Py_ssize_t)(intptr_t)o->ptr + hi;
    return 0;
}

static void release(Operand *o) {
    if (o->held) PyBuffer_Release(&o->buf);
    o->held = 0;
}

/* A source that shares bytes with dst is allowed only when it is dst itself (element i read, then
 * written, by the same step): the same start, strides and element size. */
static int separable(const Operand *d, const Operand *s, Py_ssize_t rows, Py_ssize_t cols) {
    if (rows == 0 || cols == 0) return 1;
    if (s->hi <= d->lo || d->hi <= s->lo) return 1;
    return s->ptr == d->ptr && s->dt == d->dt && s->rs == d->rs && s->cs == d->cs;
}

static int fp_env_default(void) {
#if MCPC_X86
    return (_mm_getcsr() & 0xe040u) == 0; /* rounding control 00, FTZ 0, DAZ 0 */
#else
    return 1;
#endif
}

static inline float load_at(const char *p, int dt) {
    if (dt == DT_F32) { float v; memcpy(&v, p, 4); return v; }
    uint16_t h; memcpy(&h, p, 2); return h2f(h);
}

static inline int store_at(char *p, int dt, float v) {
    if (dt == DT_F32) { memcpy(p, &v, 4); }
    else { uint16_t h = f2h(v); memcpy(p, &h, 2); return (h & 0x7c00u) != 0x7c00u; }
    return (f32_bits(v) & 0x7f800000u) != 0x7f800000u;
}

/* -- the row loops ----------------------------------------------------------------------------- */
/* One row, scalar: dst[j] = a[j] op b[j] (op < 0: a copy of a). Returns whether all are finite. */
static int row_scalar(int op, const Operand *d, const Operand *a, const Operand *b, float imm,
                      Py_ssize_t i, Py_ssize_t cols) {
    int finite = 1;
    char *pd = d->ptr + i * d->rs;
    const char *pa = a->ptr + i * a->rs;
    const char *pb = b ? b->ptr + i * b->rs : NULL;
    for (Py_ssize_t j = 0; j < cols; j++) {
        float x = load_at(pa + j * a->cs, a->dt);
        float v = x;
        if (op >= 0) v = apply(op, x, pb ? load_at(pb + j * b->cs, b->dt) : imm);
        finite &= store_at(pd + j * d->cs, d->dt, v);
    }
    return finite;
}

/* `row_scalar` on the n values of d, a and b that start at pd, pa and pb (pb NULL: the immediate). */
static int scalar_at(int op, const Operand *d, const Operand *a, const Operand *b, float imm, char *pd,
                     const char *pa, const char *pb, Py_ssize_t n) {
    Operand dj = *d, aj = *a, bj;
    dj.ptr = pd;
    aj.ptr = (char *)pa;
    if (pb) {
        bj = *b;
        bj.ptr = (char *)pb;
    }
    return row_scalar(op, &dj, &aj, pb ? &bj : NULL, imm, 0, n);
}

#if MCPC_X86
static int have_f16c = 0;

/* Eight values of a contiguous (cs = itemsize) or broadcast (cs = 0) operand, widened to f32;
 * *special set when an f16 lane is a NaN or infinity bit pattern (widened by software instead). */
__attribute__((target("avx2,f16c"))) static inline __m256 load8(const char *p, Py_ssize_t cs, int dt,
                                                                  int *special) {
    if (cs == 0) return _mm256_set1_ps(load_at(p, dt));
    if (dt == DT_F32) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    __m128i e = _mm_and_si128(h, _mm_set1_epi16(0x7c00));
    if (_mm_movemask_epi8(_mm_cmpeq_epi16(e, _mm_set1_epi16(0x7c00)))) *special = 1;
    return _mm256_cvtph_ps(h);
}

__attribute__((target("avx2,f16c"))) static int row_vector(int op, const Operand *d, const Operand *a,
                                                             const Operand *b, float imm, Py_ssize_t i,
                                                             Py_ssize_t cols) {
    char *pd = d->ptr + i * d->rs;
    const char *pa = a->ptr + i * a->rs;
    const char *pb = b ? b->ptr + i * b->rs : NULL;
    const Py_ssize_t da = a->cs ? (a->dt == DT_F32 ? 4 : 2) : 0;
    const Py_ssize_t db = b && b->cs ? (b->dt == DT_F32 ? 4 : 2) : 0;
    const Py_ssize_t dd = d->dt == DT_F32 ? 4 : 2;
    const __m256 vimm = _mm256_set1_ps(imm);
    const __m256 expmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
    __m256 bad = _mm256_setzero_ps(); /* lanes whose result is not finite */
    int finite = 1;
    Py_ssize_t j = 0;
    for (; j + 8 <= cols; j += 8) {
        int special = 0;
        __m256 x = load8(pa + j * da, a->cs, a->dt, &special);
        __m256 v = x;
        if (op >= 0) {
            __m256 y = pb ? load8(pb + j * db, b->cs, b->dt, &special) : vimm;
            switch (op) {
            case OP_ADD: v = _mm256_add_ps(x, y); break;
            case OP_SUB: v = _mm256_sub_ps(x, y); break;
            case OP_MUL: v = _mm256_mul_ps(x, y); break;
            case OP_DIV: v = _mm256_div_ps(x, y); break;
            case OP_RSUB: v = _mm256_sub_ps(y, x); break;
            case OP_RDIV: v = _mm256_div_ps(y, x); break;
            case OP_RADD: v = _mm256_add_ps(y, x); break;
            default: v = _mm256_mul_ps(y, x); break;
            }
        }
        __m256 ve = _mm256_and_ps(v, expmask);
        __m256 nonfinite = _mm256_cmp_ps(ve, expmask, _CMP_EQ_OQ);
        if (special || (d->dt == DT_F16 && _mm256_movemask_ps(nonfinite))) {
            /* an f16 Inf/NaN bit pattern read, or a NaN/Inf to narrow: numpy's routines, per value */
            finite &= scalar_at(op, d, a, b, imm, pd + j * dd, pa + j * da, pb ? pb + j * db : NULL, 8);
            continue;
        }
        if (d->dt == DT_F32) {
            _mm256_storeu_ps((float *)(pd + j * 4), v);
            bad = _mm256_or_ps(bad, nonfinite);
        } else {
            /* finite f32 values: F16C rounds half to even and overflows to infinity, as numpy does */
            __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128((__m128i *)(pd + j * 2), h);
            __m128i he = _mm_and_si128(h, _mm_set1_epi16(0x7c00));
            if (_mm_movemask_epi8(_mm_cmpeq_epi16(he, _mm_set1_epi16(0x7c00)))) finite = 0;
        }
    }
    if (_mm256_movemask_ps(bad)) finite = 0;
    if (j < cols) finite &= scalar_at(op, d, a, b, imm, pd + j * dd, pa + j * da, pb ? pb + j * db : NULL, cols - j);
    return finite;
}

static int have_avx512 = 0;

/* All-f32 rows with AVX-512, sixteen values at a time (a and b contiguous or one broadcast value;
 * b NULL: the immediate), the finiteness test in the same pass.  One loop per operation. */
#define F32_ROW_LOOP(EXPR)                                                                        \
    for (; j + 16 <= cols; j += 16) {                                                             \
        __m512 x = a->cs ? _mm512_loadu_ps(pa + j) : xa;                                          \
        __m512 y = pb && b->cs ? _mm512_loadu_ps(pb + j) : yb;                                    \
        __m512 v = EXPR;                                                                          \
        _mm512_storeu_ps(pd + j, v);                                                              \
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), em), em);         \
    }                                                                                             \
    if (j < cols) {                                                                               \
        __mmask16 k = (__mmask16)((1u << (cols - j)) - 1u);                                       \
        __m512 x = a->cs ? _mm512_maskz_loadu_ps(k, pa + j) : xa;                                 \
        __m512 y = pb && b->cs ? _mm512_maskz_loadu_ps(k, pb + j) : yb;                           \
        __m512 v = EXPR;                                                                          \
        _mm512_mask_storeu_ps(pd + j, k, v);                                                      \
        bad |= _mm512_mask_cmpeq_epi32_mask(k, _mm512_and_si512(_mm512_castps_si512(v), em), em); \
    }

__attribute__((target("avx512f"))) static int row_f32_avx512(int op, const Operand *d, const Operand *a,
                                                             const Operand *b, float imm, Py_ssize_t i,
                                                             Py_ssize_t cols) {
    float *pd = (float *)(d->ptr + i * d->rs);
    const float *pa = (const float *)(a->ptr + i * a->rs);
    const float *pb = b ? (const float *)(b->ptr + i * b->rs) : NULL;
    const __m512 xa = _mm512_set1_ps(pa[0]), yb = _mm512_set1_ps(pb ? pb[0] : imm);
    const __m512i em = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0;
    Py_ssize_t j = 0;
    switch (op) {
    case OP_ADD: F32_ROW_LOOP(_mm512_add_ps(x, y)) break;
    case OP_SUB: F32_ROW_LOOP(_mm512_sub_ps(x, y)) break;
    case OP_MUL: F32_ROW_LOOP(_mm512_mul_ps(x, y)) break;
    case OP_DIV: F32_ROW_LOOP(_mm512_div_ps(x, y)) break;
    case OP_RSUB: F32_ROW_LOOP(_mm512_sub_ps(y, x)) break;
    case OP_RDIV: F32_ROW_LOOP(_mm512_div_ps(y, x)) break;
    case OP_RADD: F32_ROW_LOOP(_mm512_add_ps(y, x)) break;
    default: F32_ROW_LOOP(_mm512_mul_ps(y, x)) break;
    }
    return bad == 0;
}
#undef F32_ROW_LOOP
#endif

static int run(int op, const Operand *d, const Operand *a, const Operand *b, float imm, Py_ssize_t rows,
               Py_ssize_t cols) {
    int finite = 1;
#if MCPC_X86
    if (have_avx512 && op >= 0 && d->dt == DT_F32 && a->dt == DT_F32 && (!b || b->dt == DT_F32) && d->cs == 4 &&
        (a->cs == 0 || a->cs == 4) && (!b || b->cs == 0 || b->cs == 4) && cols > 0) {
        for (Py_ssize_t i = 0; i < rows; i++) finite &= row_f32_avx512(op, d, a, b, imm, i, cols);
        return finite;
    }
    int contiguous = d->cs == (d->dt == DT_F32 ? 4 : 2) &&
                     (a->cs == 0 || a->cs == (a->dt == DT_F32 ? 4 : 2)) &&
                     (!b || b->cs == 0 || b->cs == (b->dt == DT_F32 ? 4 : 2));
    if (have_f16c && contiguous) {
        for (Py_ssize_t i = 0; i < rows; i++) finite &= row_vector(op, d, a, b, imm, i, cols);
        return finite;
    }
#endif
    for (Py_ssize_t i = 0; i < rows; i++) finite &= row_scalar(op, d, a, b, imm, i, cols);
    return finite;
}

/* -- erf ------------------------------------------------------------------------------------------
 * erf_f64 is our own f64 erf, accurate to a few f64 ulps: for |x| < 1 its Taylor series at 0
 * (x * sum of c_n x^2n, n <= 17: the first term left out is below 5e-18); on [1, 4.5) the Taylor
 * polynomial of degree 20 at the centre of each of four intervals of width 7/8 (coefficients from
 * erf(c) and the Hermite recurrence erf^(j)(c) = 2/sqrt(pi) (-1)^(j-1) H_(j-1)(c) exp(-c^2); the
 * remainder is below 1e-15 by Cramer's bound on Hermite functions); and +-1 from 4.5 on (erf(4.5)
 * is 1 - 2e-10: every f32 rounding of it is 1).  The f32 value is the rounding of erf_f64(x); it is
 * scipy's rounding of its own f64 erf whenever every value within a relative 2^-40 of erf_f64(x)
 * rounds to the same f32, which holds unless erf(x) lies that close to a rounding boundary: such
 * values (a few in 100,000) and NaNs are returned to the caller, who computes them with scipy.
 * The agreement |erf_f64 - scipy's erf| < 2^-40 |erf| is what the slow test checks on every f32.
 * With AVX2 and FMA, four values at a time (each interval's coefficient picked by a permute);
 * the two paths may differ in the last f64 bits, never in the f32 results they return as sure. */
#define ERF_TAYLOR 18
#define ERF_SEGMENTS 4
#define ERF_DEGREE 20
#define ERF_WIDTH 0.875
/* With AVX-512, eight intervals of width 7/16 and degree 13 (remainder below 1e-13), one permute
 * picking each coefficient for eight values. */
#define ERF8_SEGMENTS 8
#define ERF8_DEGREE 13
#define ERF8_WIDTH 0.4375
static double erf_c0[ERF_TAYLOR];
static double erf_seg[ERF_DEGREE + 1][ERF_SEGMENTS]; /* [j][s]: a column per coefficient */
static double erf_seg8[ERF8_DEGREE + 1][ERF8_SEGMENTS];
static const double ERF_TOL = 9.094947017729282e-13; /* 2^-40 */

/* tab[j * segs + s]: the degree-j Taylor coefficient of erf at the centre of interval s of [1, ...). */
static void taylor_table(double *tab, int segs, int degree, double width) {
    const double k = 1.1283791670955126; /* 2 / sqrt(pi) */
    for (int s = 0; s < segs; s++) {
        double c = 1.0 + (s + 0.5) * width, g = k * exp(-c * c);
        double h_prev = 0.0, h = 1.0, jfact = 1.0; /* H_(j-1)(c), H_(j-2)(c), j! */
        tab[s] = erf(c);
        for (int j = 1; j <= degree; j++) {
            if (j > 1) { /* H_(j-1) = 2c H_(j-2) - 2(j-2) H_(j-3) */
                double next = 2.0 * c * h - 2.0 * (j - 2) * h_prev;
                h_prev = h;
                h = next;
            }
            jfact *= j;
            tab[j * segs + s] = ((j & 1) ? g : -g) * h / jfact;
        }
    }
}

static void erf_init(void) {
    const double k = 1.1283791670955126; /* 2 / sqrt(pi) */
    double fact = 1.0;
    for (int n = 0; n < ERF_TAYLOR; n++) {
        if (n > 0) fact *= n;
        erf_c0[n] = ((n & 1) ? -k : k) / (fact * (2 * n + 1));
    }
    taylor_table(&erf_seg[0][0], ERF_SEGMENTS, ERF_DEGREE, ERF_WIDTH);
    taylor_table(&erf_seg8[0][0], ERF8_SEGMENTS, ERF8_DEGREE, ERF8_WIDTH);
}

static inline double erf_f64(double x) {
    double a = fabs(x), r;
    if (a < 1.0) {
        double z = a * a, p = erf_c0[ERF_TAYLOR - 1];
        for (int n = ERF_TAYLOR - 2; n >= 0; n--) p = p * z + erf_c0[n];
        r = a * p;
    } else if (a < 4.5) {
        int s = (int)((a - 1.0) / ERF_WIDTH);
        double h = a - (1.0 + (s + 0.5) * ERF_WIDTH), p = erf_seg[ERF_DEGREE][s];
        for (int j = ERF_DEGREE - 1; j >= 0; j--) p = p * h + erf_seg[j][s];
        r = p;
    } else {
        r = 1.0;
    }
    return copysign(r, x); /* -0 stays -0 */
}

/* The values left to the caller: flat index and the f32 input (which an in-place call overwrote). */
typedef struct {
    int64_t *idx;
    float *x;
    Py_ssize_t n, cap;
    int oom;
} Flags;

static void flag(Flags *f, int64_t i, float x) {
    if (f->oom) return;
    if (f->n == f->cap) {
        Py_ssize_t cap = f->cap ? 2 * f->cap : 256;
        int64_t *p = realloc(f->idx, (size_t)cap * sizeof(int64_t));
        if (p) f->idx = p;
        float *q = p ? realloc(f->x, (size_t)cap * sizeof(float)) : NULL;
        if (q) f->x = q;
        if (!p || !q) { f->oom = 1; return; }
        f->cap = cap;
    }
    f->idx[f->n] = i;
    f->x[f->n++] = x;
}

#if MCPC_X86
static int have_avx2_fma = 0;

/* erf_f64 of four values at once (NaN lanes give 1 with x's sign: flagged by the caller). */
__attribute__((target("avx2,fma"))) static inline __m256d erf4(__m256d x) {
    const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    const __m256d one = _mm256_set1_pd(1.0);
    __m256d a = _mm256_and_pd(x, absmask);
    /* |x| < 1: a * P(a^2) */
    __m256d z = _mm256_mul_pd(a, a), p0 = _mm256_set1_pd(erf_c0[ERF_TAYLOR - 1]);
    for (int n = ERF_TAYLOR - 2; n >= 0; n--) p0 = _mm256_fmadd_pd(p0, z, _mm256_set1_pd(erf_c0[n]));
    p0 = _mm256_mul_pd(a, p0);
    /* 1 <= |x| < 4.5: the interval's Taylor polynomial (index clamped to 0..3) */
    __m256d sd = _mm256_floor_pd(_mm256_mul_pd(_mm256_sub_pd(a, one), _mm256_set1_pd(1.0 / ERF_WIDTH)));
    sd = _mm256_min_pd(_mm256_max_pd(sd, _mm256_setzero_pd()), _mm256_set1_pd(ERF_SEGMENTS - 1));
    __m256d h = _mm256_sub_pd(a, _mm256_fmadd_pd(_mm256_add_pd(sd, _mm256_set1_pd(0.5)),
                                                 _mm256_set1_pd(ERF_WIDTH), one));
    __m256i t = _mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm256_cvttpd_epi32(sd)), 1);
    __m256i idx = _mm256_or_si256(t, _mm256_slli_epi64(_mm256_add_epi64(t, _mm256_set1_epi64x(1)), 32));
#define ERF_PICK(jj) _mm256_castps_pd(_mm256_permutevar8x32_ps(_mm256_castpd_ps(_mm256_loadu_pd(erf_seg[jj])), idx))
    __m256d p1 = ERF_PICK(ERF_DEGREE);
    for (int k = ERF_DEGREE - 1; k >= 0; k--) p1 = _mm256_fmadd_pd(p1, h, ERF_PICK(k));
#undef ERF_PICK
    __m256d r = _mm256_blendv_pd(p1, p0, _mm256_cmp_pd(a, one, _CMP_LT_OQ));
    r = _mm256_blendv_pd(one, r, _mm256_cmp_pd(a, _mm256_set1_pd(4.5), _CMP_LT_OQ));
    return _mm256_or_pd(r, _mm256_andnot_pd(absmask, x)); /* the sign of x */
}

/* Store four rounded values; flag the lanes whose rounding is not certain, and NaNs. */
__attribute__((target("avx2,fma"))) static inline void erf4_store(float *out, __m256d x, __m256d y,
                                                                   Py_ssize_t at, Flags *f) {
    const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    __m256d tt = _mm256_mul_pd(_mm256_and_pd(y, absmask), _mm256_set1_pd(ERF_TOL));
    _mm_storeu_ps(out, _mm256_cvtpd_ps(y));
    __m128 lo = _mm256_cvtpd_ps(_mm256_sub_pd(y, tt)), hi = _mm256_cvtpd_ps(_mm256_add_pd(y, tt));
    int m = _mm_movemask_ps(_mm_cmpneq_ps(lo, hi)) | _mm256_movemask_pd(_mm256_cmp_pd(x, x, _CMP_UNORD_Q));
    if (m) {
        float xs[4];
        _mm_storeu_ps(xs, _mm256_cvtpd_ps(x));
        while (m) {
            int lane = __builtin_ctz(m);
            flag(f, at + lane, xs[lane]);
            m &= m - 1;
        }
    }
}

/* erf_f64 of eight values (the eight-interval table), with their certain-rounding mask. */
__attribute__((target("avx512f,avx2,fma"))) static void erf_row_avx512(char *pd, const char *pa,
                                                                        Py_ssize_t cols, Py_ssize_t base,
                                                                        Flags *f) {
    const float *src = (const float *)pa;
    float *dst = (float *)pd;
    const __m512d one = _mm512_set1_pd(1.0);
    const __m512i sign = _mm512_set1_epi64((long long)0x8000000000000000ULL);
    Py_ssize_t j = 0;
    for (; j + 8 <= cols; j += 8) {
        __m256 xf = _mm256_loadu_ps(src + j); /* kept: an in-place call overwrites src below */
        __m512d x = _mm512_cvtps_pd(xf);
        __m512d a = _mm512_abs_pd(x);
        __m512d z = _mm512_mul_pd(a, a), p0 = _mm512_set1_pd(erf_c0[ERF_TAYLOR - 1]);
        for (int n = ERF_TAYLOR - 2; n >= 0; n--) p0 = _mm512_fmadd_pd(p0, z, _mm512_set1_pd(erf_c0[n]));
        p0 = _mm512_mul_pd(a, p0);
        __m512d sd = _mm512_roundscale_pd(_mm512_mul_pd(_mm512_sub_pd(a, one), _mm512_set1_pd(1.0 / ERF8_WIDTH)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        sd = _mm512_min_pd(_mm512_max_pd(sd, _mm512_setzero_pd()), _mm512_set1_pd(ERF8_SEGMENTS - 1));
        __m512d h = _mm512_sub_pd(a, _mm512_fmadd_pd(_mm512_add_pd(sd, _mm512_set1_pd(0.5)),
                                                     _mm512_set1_pd(ERF8_WIDTH), one));
        __m512i idx = _mm512_cvtepi32_epi64(_mm512_cvttpd_epi32(sd));
        __m512d p1 = _mm512_permutexvar_pd(idx, _mm512_loadu_pd(erf_seg8[ERF8_DEGREE]));
        for (int k = ERF8_DEGREE - 1; k >= 0; k--)
            p1 = _mm512_fmadd_pd(p1, h, _mm512_permutexvar_pd(idx, _mm512_loadu_pd(erf_seg8[k])));
        __m512d r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, one, _CMP_LT_OQ), p1, p0);
        r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, _mm512_set1_pd(4.5), _CMP_LT_OQ), one, r);
        __m512d y = _mm512_castsi512_pd(_mm512_or_si512(_mm512_castpd_si512(r),
                                                        _mm512_and_si512(_mm512_castpd_si512(x), sign)));
        __m512d tt = _mm512_mul_pd(r, _mm512_set1_pd(ERF_TOL)); /* r >= 0 */
        _mm256_storeu_ps(dst + j, _mm512_cvtpd_ps(y));
        __m256 lo = _mm512_cvtpd_ps(_mm512_sub_pd(y, tt)), hi = _mm512_cvtpd_ps(_mm512_add_pd(y, tt));
        int m = _mm256_movemask_ps(_mm256_cmp_ps(lo, hi, _CMP_NEQ_UQ)) | (int)_mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q);
        if (m) {
            float xs[8];
            _mm256_storeu_ps(xs, xf);
            while (m) {
                int lane = __builtin_ctz(m);
                flag(f, base + j + lane, xs[lane]);
                m &= m - 1;
            }
        }
    }
    for (; j < cols; j++) {
        float xv = src[j];
        double y = erf_f64((double)xv), tt = fabs(y) * ERF_TOL;
        float v = (float)y;
        dst[j] = v;
        if (xv != xv || (float)(y - tt) != (float)(y + tt)) flag(f, base + j, xv);
    }
}

/* A contiguous row, eight values an iteration (two independent chains of four). */
__attribute__((target("avx2,fma"))) static void erf_row_vector(char *pd, const char *pa, Py_ssize_t cols,
                                                                Py_ssize_t base, Flags *f) {
    const float *src = (const float *)pa;
    float *dst = (float *)pd;
    Py_ssize_t j = 0;
    for (; j + 8 <= cols; j += 8) {
        __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(src + j)), x1 = _mm256_cvtps_pd(_mm_loadu_ps(src + j + 4));
        __m256d y0 = erf4(x0), y1 = erf4(x1);
        erf4_store(dst + j, x0, y0, base + j, f);
        erf4_store(dst + j + 4, x1, y1, base + j + 4, f);
    }
    for (; j < cols; j++) {
        float xv = src[j];
        double y = erf_f64((double)xv), tt = fabs(y) * ERF_TOL;
        float v = (float)y;
        dst[j] = v;
        if (xv != xv || (float)(y - tt) != (float)(y + tt)) flag(f, base + j, xv);
    }
}
#endif

static void erf_rows(const Operand *d, const Operand *a, Py_ssize_t rows, Py_ssize_t cols, Flags *f) {
#if MCPC_X86
    if (have_avx512 && d->cs == 4 && a->cs == 4) {
        for (Py_ssize_t i = 0; i < rows; i++) erf_row_avx512(d->ptr + i * d->rs, a->ptr + i * a->rs, cols, i * cols, f);
        return;
    }
    if (have_avx2_fma && d->cs == 4 && a->cs == 4) {
        for (Py_ssize_t i = 0; i < rows; i++) erf_row_vector(d->ptr + i * d->rs, a->ptr + i * a->rs, cols, i * cols, f);
        return;
    }
#endif
    for (Py_ssize_t i = 0; i < rows; i++) {
        char *pd = d->ptr + i * d->rs;
        const char *pa = a->ptr + i * a->rs;
        for (Py_ssize_t j = 0; j < cols; j++) {
            float x;
            memcpy(&x, pa + j * a->cs, 4);
            double y = erf_f64((double)x), t = fabs(y) * ERF_TOL;
            float v = (float)y;
            memcpy(pd + j * d->cs, &v, 4);
            if (x != x || (float)(y - t) != (float)(y + t)) flag(f, (int64_t)i * cols + j, x);
        }
    }
}

/* -- exp ------------------------------------------------------------------------------------------
 * The simulator's exp is numpy's f64 exp of the f32 operand (clamped to -200, which changes no
 * f32 result: arch/numerics.py) rounded to f32.  With AVX-512 the kernel evaluates its own f64
 * exp — x clamped to [-200, 200], x = n ln2 + r (ln2 in two parts, so n ln2 is exact), the Taylor
 * polynomial of degree 11 of exp(r) for |r| <= ln2/2 (remainder below 1e-14), times 2^n — and
 * keeps its f32 rounding where every value within a relative 2^-40 rounds the same (numpy's exp
 * is within an f64 ulp or two); the rest, and NaNs, go back to the caller, who uses numpy.  The
 * slow test checks every f32 input.  Without AVX-512 the call is declined (numpy computes it). */
#define EXP_DEGREE 11
static double exp_c[EXP_DEGREE + 1];

static void exp_init(void) {
    double fact = 1.0;
    for (int k = 0; k <= EXP_DEGREE; k++) {
        if (k > 0) fact *= k;
        exp_c[k] = 1.0 / fact;
    }
}

#if MCPC_X86
__attribute__((target("avx512f,avx2,fma"))) static void exp_row_avx512(char *pd, const char *pa,
                                                                        Py_ssize_t cols, Py_ssize_t base,
                                                                        Flags *f) {
    const float *src = (const float *)pa;
    float *dst = (float *)pd;
    const double ln2_hi = 0.693147180369123816490, ln2_lo = 1.90821492927058770002e-10;
    Py_ssize_t j = 0;
    for (; j + 8 <= cols; j += 8) {
        __m256 xf = _mm256_loadu_ps(src + j); /* kept: an in-place call overwrites src below */
        __m512d x = _mm512_cvtps_pd(xf);
        __m512d xc = _mm512_min_pd(_mm512_max_pd(x, _mm512_set1_pd(-200.0)), _mm512_set1_pd(200.0));
        __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(xc, _mm512_set1_pd(1.4426950408889634)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(ln2_hi), xc);
        r = _mm512_fnmadd_pd(n, _mm512_set1_pd(ln2_lo), r);
        __m512d p = _mm512_set1_pd(exp_c[EXP_DEGREE]);
        for (int k = EXP_DEGREE - 1; k >= 0; k--) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(exp_c[k]));
        __m512d y = _mm512_scalef_pd(p, n);
        __m512d tt = _mm512_mul_pd(y, _mm512_set1_pd(ERF_TOL)); /* y > 0 */
        _mm256_storeu_ps(dst + j, _mm512_cvtpd_ps(y));
        __m256 lo = _mm512_cvtpd_ps(_mm512_sub_pd(y, tt)), hi = _mm512_cvtpd_ps(_mm512_add_pd(y, tt));
        int m = _mm256_movemask_ps(_mm256_cmp_ps(lo, hi, _CMP_NEQ_UQ)) | (int)_mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q);
        if (m) {
            float xs[8];
            _mm256_storeu_ps(xs, xf);
            while (m) {
                int lane = __builtin_ctz(m);
                flag(f, base + j + lane, xs[lane]);
                m &= m - 1;
            }
        }
    }
    for (; j < cols; j++) flag(f, base + j, src[j]); /* the last few: the caller's numpy */
}
#endif

/* -- all finite ------------------------------------------------------------------------------------
 * Whether every value of a 2-D f16/f32 array is finite: the numeric guard's test after each
 * instruction, one pass without the temporary array numpy's isfinite(x).all() makes. */
static int row_finite_scalar(const char *p, Py_ssize_t cs, int dt, Py_ssize_t cols) {
    for (Py_ssize_t j = 0; j < cols; j++) {
        if (dt == DT_F32) {
            uint32_t u;
            memcpy(&u, p + j * cs, 4);
            if ((u & 0x7f800000u) == 0x7f800000u) return 0;
        } else {
            uint16_t h;
            memcpy(&h, p + j * cs, 2);
            if ((h & 0x7c00u) == 0x7c00u) return 0;
        }
    }
    return 1;
}

#if MCPC_X86
__attribute__((target("avx2"))) static int row_finite_avx2(const char *p, int dt, Py_ssize_t cols) {
    Py_ssize_t bytes = cols * (dt == DT_F32 ? 4 : 2), j = 0;
    const __m256i m32 = _mm256_set1_epi32(0x7f800000), m16 = _mm256_set1_epi16(0x7c00);
    __m256i bad = _mm256_setzero_si256();
    for (; j + 32 <= bytes; j += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(p + j));
        if (dt == DT_F32) bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(v, m32), m32));
        else bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(v, m16), m16));
    }
    if (!_mm256_testz_si256(bad, bad)) return 0;
    Py_ssize_t done = j / (dt == DT_F32 ? 4 : 2);
    return row_finite_scalar(p + j, dt == DT_F32 ? 4 : 2, dt, cols - done);
}
#endif

static PyObject *kernels_all_finite(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_RECORDS_RO) < 0) return NULL;
    int dt = dtype_of(&b);
    if (dt < 0 || b.ndim != 2) {
        PyBuffer_Release(&b);
        Py_RETURN_NONE; /* not handled */
    }
    Py_ssize_t rows = b.shape[0], cols = b.shape[1], rs = b.strides[0], cs = b.strides[1];
    const char *base = (const char *)b.buf;
    int finite = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < rows && finite; i++) {
#if MCPC_X86
        if (have_f16c && cs == b.itemsize) {
            finite = row_finite_avx2(base + i * rs, dt, cols);
            continue;
        }
#endif
        finite = row_finite_scalar(base + i * rs, cs, dt, cols);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyBool_FromLong(finite);
}

/* -- Python entry points ----------------------------------------------------------------------- */
/* The (rows, cols) of the destination array `obj`; -1 with an exception when it is not 2-D. */
static int dst_shape(PyObject *obj, Py_ssize_t *rows, Py_ssize_t *cols) {
    Py_buffer probe;
    if (PyObject_GetBuffer(obj, &probe, PyBUF_RECORDS) < 0) return -1;
    int ok = probe.ndim == 2;
    if (ok) {
        *rows = probe.shape[0];
        *cols = probe.shape[1];
    }
    PyBuffer_Release(&probe);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "mcpc._kernels: operands are 2-D float16 or float32 arrays");
        return -1;
    }
    return 0;
}

/* The destination and source operands of a call (rows and cols from dst); -1 with an exception,
 * both released, when either is not a 2-D float16/float32 array that fits. */
static int get_dst_src(PyObject *dobj, PyObject *aobj, Operand *d, Operand *a, Py_ssize_t *rows,
                       Py_ssize_t *cols) {
    d->held = a->held = 0;
    if (dst_shape(dobj, rows, cols) < 0) return -1;
    if (get_operand(dobj, d, 1, *rows, *cols) < 0 || get_operand(aobj, a, 0, *rows, *cols) < 0) {
        release(d);
        release(a);
        return -1;
    }
    return 0;
}

static PyObject *kernels_convert(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "convert(dst, src)");
        return NULL;
    }
    Operand d, a;
    Py_ssize_t rows, cols;
    if (get_dst_src(args[0], args[1], &d, &a, &rows, &cols) < 0) return NULL;
    long result = NOT_HANDLED;
    if (separable(&d, &a, rows, cols) && fp_env_default()) {
        Py_BEGIN_ALLOW_THREADS
        result = run(-1, &d, &a, NULL, 0.0f, rows, cols);
        Py_END_ALLOW_THREADS
    }
    release(&d);
    release(&a);
    return PyLong_FromLong(result);
}

static PyObject *kernels_binary(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "binary(op, dst, a, b, imm)");
        return NULL;
    }
    long op = PyLong_AsLong(args[0]);
    if (op == -1 && PyErr_Occurred()) return NULL;
    double immd = PyFloat_AsDouble(args[4]);
    if (immd == -1.0 && PyErr_Occurred()) return NULL;
    if (op < 0 || op >= N_OPS || (args[3] != Py_None && op >= OP_RSUB)) {
        PyErr_SetString(PyExc_ValueError, "mcpc._kernels: unknown operation");
        return NULL;
    }
    Operand d, a, b;
    b.held = 0;
    Py_ssize_t rows, cols;
    if (get_dst_src(args[1], args[2], &d, &a, &rows, &cols) < 0) return NULL;
    long result = NOT_HANDLED;
    int has_b = args[3] != Py_None;
    if (has_b && get_operand(args[3], &b, 0, rows, cols) < 0) {
        release(&d);
        release(&a);
        release(&b);
        return NULL;
    }
    if (separable(&d, &a, rows, cols) && (!has_b || separable(&d, &b, rows, cols)) && fp_env_default()) {
        float imm = (float)immd; /* the caller passes an f32 value: exact */
        Py_BEGIN_ALLOW_THREADS
        result = run((int)op, &d, &a, has_b ? &b : NULL, imm, rows, cols);
        Py_END_ALLOW_THREADS
    }
    release(&d);
    release(&a);
    release(&b);
    return PyLong_FromLong(result);
}

/* special(fn, dst, src): fn 0 erf, 1 exp (see above). */
static PyObject *kernels_special(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "special(fn, dst, src)");
        return NULL;
    }
    long fn = PyLong_AsLong(args[0]);
    if (fn == -1 && PyErr_Occurred()) return NULL;
    if (fn != 0 && fn != 1) {
        PyErr_SetString(PyExc_ValueError, "mcpc._kernels: unknown function");
        return NULL;
    }
    Operand d, a;
    Py_ssize_t rows, cols;
    if (get_dst_src(args[1], args[2], &d, &a, &rows, &cols) < 0) return NULL;
    PyObject *result;
    int exp_ok = 0;
#if MCPC_X86
    exp_ok = have_avx512 && d.cs == 4 && a.cs == 4;
#endif
    if (d.dt != DT_F32 || a.dt != DT_F32 || !separable(&d, &a, rows, cols) || !fp_env_default() ||
        (fn == 1 && !exp_ok)) {
        Py_INCREF(Py_None);
        result = Py_None;
    } else {
        Flags f = {NULL, NULL, 0, 0, 0};
        Py_BEGIN_ALLOW_THREADS
        if (fn == 0) {
            erf_rows(&d, &a, rows, cols, &f);
        } else {
#if MCPC_X86
            for (Py_ssize_t i = 0; i < rows; i++) exp_row_avx512(d.ptr + i * d.rs, a.ptr + i * a.rs, cols, i * cols, &f);
#endif
        }
        Py_END_ALLOW_THREADS
        if (f.oom) {
            result = PyErr_NoMemory();
        } else {
            result = Py_BuildValue("(y#y#)", (const char *)f.idx, f.n * (Py_ssize_t)sizeof(int64_t),
                                   (const char *)f.x, f.n * (Py_ssize_t)sizeof(float));
        }
        free(f.idx);
        free(f.x);
    }
    release(&d);
    release(&a);
    return result;
}

static PyObject *kernels_f32_vectorized(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
#if MCPC_X86
    return PyBool_FromLong(have_avx512);
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"convert", (PyCFunction)(void (*)(void))kernels_convert, METH_FASTCALL,
     "convert(dst, src) -> 1 all finite, 0 not, -1 not handled: dst[...] = src (f16 <-> f32)"},
    {"binary", (PyCFunction)(void (*)(void))kernels_binary, METH_FASTCALL,
     "binary(op, dst, a, b, imm) -> 1 all finite, 0 not, -1 not handled: dst[...] = f32(a) op f32(b)"},
    {"special", (PyCFunction)(void (*)(void))kernels_special, METH_FASTCALL,
     "special(fn, dst, src), fn 0 erf / 1 exp -> (int64 bytes of flat indices, f32 bytes of their inputs) "
     "left to the caller, or None (not handled)"},
    {"all_finite", kernels_all_finite, METH_O,
     "all_finite(x) -> whether every value of the 2-D f16/f32 array x is finite; None: not handled"},
    {"f32_vectorized", kernels_f32_vectorized, METH_NOARGS,
     "whether all-f32 arithmetic goes through AVX-512 (as fast as numpy's, with the finiteness test)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "mcpc._kernels",
                                    "Exact f16/f32 conversions and elementwise arithmetic.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernels(void) {
    erf_init();
    exp_init();
#if MCPC_X86
    __builtin_cpu_init();
    have_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    have_avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    have_avx512 = have_avx2_fma && __builtin_cpu_supports("avx512f") && !getenv("MCPC_KERNELS_NO_AVX512");
#endif
    return PyModule_Create(&module);
}
