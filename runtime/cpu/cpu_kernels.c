/* CPU kernels; see cpu_kernels.h for the contract of each one. GEMMs go to the BLAS, the other
 * kernels are OpenMP loops over rows or elements. */
#include "cpu_kernels.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { PAR_MIN = NTP_CPU_PAR_MIN };

/* ---- bit helpers (memcpy is the defined way to type-pun in C) ---------- */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- rounding ---------------------------------------------------------- */

/* Branch-free, so that ntp_round_buf's loop vectorises. */
static inline float round_bf16(float x)
{
    uint32_t u = f2u(x);
    /* NaN: truncating could clear every payload bit and give inf, so force the quiet bit.
     * Otherwise RNE on the low 16 bits; a carry into the exponent is the correct result
     * (including rounding past the bf16 max to inf). inf has zero low bits. */
    uint32_t nan = (u | 0x00400000u) & 0xFFFF0000u;
    uint32_t rne = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    return u2f((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rne);
}

float ntp_round_bf16(float x) { return round_bf16(x); }

float ntp_round_fp16(float x)
{
    uint32_t u = f2u(x);
    uint32_t sign = u & 0x80000000u;
    uint32_t mag = u & 0x7FFFFFFFu;
    if (mag > 0x7F800000u)
        return u2f(u | 0x00400000u); /* NaN stays (quiet) NaN */
    if (mag >= 0x477FF000u)          /* |x| >= 65520: halfway to 2^16, ties go to even = inf */
        return u2f(sign | 0x7F800000u);
    if (mag >= 0x38800000u) {
        /* |x| >= 2^-14: a normal half keeps 10 of fp32's 23 mantissa bits; RNE on the low 13.
         * The carry into the exponent is correct, and the check above keeps us below inf. */
        mag += 0x0FFFu + ((mag >> 13) & 1u);
        return u2f(sign | (mag & 0xFFFFE000u));
    }
    /* Subnormal half: the result is q * 2^-24 for an integer q in [0, 1024]. */
    int e = (int)(mag >> 23);
    if (e < 102) /* |x| < 2^-25: below half a quantum, rounds to (signed) zero */
        return u2f(sign);
    uint32_t mant = (mag & 0x007FFFFFu) | 0x00800000u; /* e >= 102 so x is a normal float */
    /* |x| = mant * 2^(e-150); in quanta that is mant >> (126 - e), shift in [14, 24]. */
    unsigned shift = (unsigned)(126 - e);
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    float r = (float)q * 0x1p-24f; /* exact: q <= 1024 */
    return sign ? -r : r;
}

void ntp_round_buf(float *x, size_t n, ntp_round_mode m)
{
    const int64_t len = (int64_t)n;
    switch (m) {
    case NTP_ROUND_BF16:
        /* in blocks copied to integers and back: the bit operations then vectorise, which they
         * do not through the per-element memcpy of round_bf16 */
#pragma omp parallel for schedule(static) if (len >= PAR_MIN)
        for (int64_t b0 = 0; b0 < len; b0 += 256) {
            uint32_t u[256] = {0};
            const int64_t nb = len - b0 < 256 ? len - b0 : 256;
            memcpy(u, x + b0, (size_t)nb * sizeof *u);
            for (int i = 0; i < 256; i++) { /* a fixed count, which GCC's -O2 cost model vectorises */
                uint32_t nan = (u[i] | 0x00400000u) & 0xFFFF0000u;
                uint32_t rne = (u[i] + 0x7FFFu + ((u[i] >> 16) & 1u)) & 0xFFFF0000u;
                u[i] = (u[i] & 0x7FFFFFFFu) > 0x7F800000u ? nan : rne; /* as round_bf16 */
            }
            memcpy(x + b0, u, (size_t)nb * sizeof *u);
        }
        break;
    case NTP_ROUND_FP16:
#pragma omp parallel for schedule(static) if (len >= PAR_MIN)
        for (int64_t i = 0; i < len; i++)
            x[i] = ntp_round_fp16(x[i]);
        break;
    case NTP_ROUND_NONE:
    default:
        break;
    }
}

/* ---- init -------------------------------------------------------------- */

uint64_t ntp_name_hash(const char *name)
{
    uint64_t h = 0xCBF29CE484222325u; /* FNV-1a 64 offset basis */
    if (name)
        for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
            h ^= *p;
            h *= 0x100000001B3u; /* FNV prime */
        }
    return h;
}

/* splitmix64 step: the golden-ratio increment keeps mix(0) != 0, then the
 * finaliser spreads every input bit over the whole word. */
static uint64_t mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15u;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

/* Element bits are mix64(mix64(mix64(seed) ^ name_hash) ^ index): chained so seed, name and
 * index each pass through a full mix, with no shared state, so any element can be produced
 * independently. The first two mixes depend on the tensor only (its key), so loops hoist them. */

uint64_t ntp_init_key(uint64_t seed, uint64_t name_hash) { return mix64(mix64(seed) ^ name_hash); }

float ntp_init_uniform_key(uint64_t key, uint64_t index)
{
    uint64_t u = mix64(key ^ index) >> 40; /* 24 bits */
    /* (2u + 1 - 2^24) * 2^-24: an odd integer below 2^24 in magnitude times a
     * power of two, so exact in fp32, never 0, and in (-1, 1). */
    double v = ((double)u + 0.5) * 0x1p-23 - 1.0;
    return (float)v;
}

double ntp_init_normal_key(uint64_t key, uint64_t index)
{
    /* Box-Muller on two 53-bit uniforms of their own streams (2i, 2i + 1): u1 in (0, 1], so the
     * log is finite; one normal per element, whatever the slice it is drawn in */
    uint64_t a = mix64(key ^ (2 * index + 0x5bd1e995ULL)) >> 11, b = mix64(key ^ (2 * index + 1 + 0x5bd1e995ULL)) >> 11;
    double u1 = ((double)a + 1.0) * 0x1p-53, u2 = (double)b * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

float ntp_init_uniform(uint64_t seed, uint64_t name_hash, uint64_t index)
{
    return ntp_init_uniform_key(ntp_init_key(seed, name_hash), index);
}

void ntp_init_uniform_run(uint64_t key, uint64_t index0, int64_t n, float center, float scale, float *out)
{
    for (int64_t j = 0; j < n; j++)
        out[j] = center + scale * ntp_init_uniform_key(key, index0 + (uint64_t)j);
}

/* The integer stream: a different one from init_uniform's, by perturbing the seed. */
uint64_t ntp_init_int_key(uint64_t seed, uint64_t name_hash) { return ntp_init_key(seed ^ 0xA5A5A5A5A5A5A5A5u, name_hash); }

int32_t ntp_init_int_at(uint64_t key, uint64_t index, int32_t range)
{
    if (range <= 0)
        return 0;
    /* multiply-shift maps 32 random bits onto [0, range) without a modulo
     * (bias <= range / 2^32, irrelevant for test data) */
    uint64_t r = mix64(key ^ index) >> 32;
    return (int32_t)((r * (uint64_t)range) >> 32);
}

int32_t ntp_init_int(uint64_t seed, uint64_t name_hash, uint64_t index, int32_t range)
{
    return ntp_init_int_at(ntp_init_int_key(seed, name_hash), index, range);
}

/* ---- elementwise ------------------------------------------------------- */

float ntp_gelu(float x)
{
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

float ntp_relu(float x) { return x > 0.0f ? x : 0.0f; }

float ntp_sigmoid(float x)
{
    /* Only ever exponentiate a non-positive number, so exp cannot overflow. */
    if (x >= 0.0f)
        return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

float ntp_silu(float x) { return x * ntp_sigmoid(x); }

/* ---- matmul ------------------------------------------------------------ */

/* Row-major C[m][n] = A[m][k] * op(B) through the BLAS. cblas takes int sizes, so the rows are
 * done in chunks that fit; k and n are bounded by the header's contract. */
static void gemm_rows(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t n, bool trans_b)
{
    const int64_t chunk = INT_MAX;
    for (int64_t r0 = 0; r0 < m; r0 += chunk) {
        int64_t rows = m - r0 < chunk ? m - r0 : chunk;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)rows, (int)n, (int)k,
                    1.0f, a + r0 * k, (int)k, b, trans_b ? (int)k : (int)n, 0.0f, c + r0 * n, (int)n);
    }
}

void ntp_cpu_matmul(const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t k,
                    int64_t n, bool trans_b, int64_t b_batch_stride)
{
    if (batch <= 0 || m <= 0 || n <= 0)
        return;
    if (k <= 0) { /* the empty sum; not left to the BLAS, which may skip writing C */
        memset(c, 0, (size_t)(batch * m * n) * sizeof *c);
        return;
    }
    if (b_batch_stride == 0) {
        /* one B for the whole batch and a dense A: a single GEMM of batch*m rows, which the
         * BLAS blocks and threads better than `batch` small ones */
        gemm_rows(a, b, c, batch * m, k, n, trans_b);
        return;
    }
    for (int64_t bt = 0; bt < batch; bt++)
        gemm_rows(a + bt * m * k, b + bt * b_batch_stride, c + bt * m * n, m, k, n, trans_b);
}

/* ---- norms / softmax --------------------------------------------------- */

void ntp_cpu_layernorm(const float *x, float *y, int64_t rows, int64_t d, float eps)
{
    if (d <= 0)
        return;
#pragma omp parallel for schedule(static) if (rows * d >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        /* two-pass: subtracting the mean first avoids E[x^2]-E[x]^2 cancellation */
        double mean = 0.0;
        for (int64_t i = 0; i < d; i++)
            mean += xr[i];
        mean /= (double)d;
        double var = 0.0;
        for (int64_t i = 0; i < d; i++) {
            double t = xr[i] - mean;
            var += t * t;
        }
        var /= (double)d;
        double inv = 1.0 / sqrt(var + (double)eps);
        for (int64_t i = 0; i < d; i++)
            yr[i] = (float)((xr[i] - mean) * inv);
    }
}

void ntp_cpu_rmsnorm(const float *x, float *y, int64_t rows, int64_t d, float eps)
{
    if (d <= 0)
        return;
#pragma omp parallel for schedule(static) if (rows * d >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double ss = 0.0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)xr[i] * xr[i];
        double inv = 1.0 / sqrt(ss / (double)d + (double)eps);
        for (int64_t i = 0; i < d; i++)
            yr[i] = (float)(xr[i] * inv);
    }
}

/* One row; x may equal y. exp in fp32 on max-subtracted input (never > 1),
 * the normaliser summed in double. */
static void softmax_row(const float *x, float *y, int64_t d)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < d; i++)
        if (x[i] > mx)
            mx = x[i];
    if (mx == -INFINITY) { /* fully masked: defined as zeros, not NaN */
        for (int64_t i = 0; i < d; i++)
            y[i] = 0.0f;
        return;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < d; i++) {
        y[i] = expf(x[i] - mx);
        sum += y[i];
    }
    /* sum >= 1 (the max element contributes exp(0)), so the division is safe */
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < d; i++)
        y[i] *= inv;
}

void ntp_cpu_softmax(const float *x, float *y, int64_t rows, int64_t d)
{
    if (d <= 0)
        return;
#pragma omp parallel for schedule(static) if (rows * d >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        softmax_row(x + r * d, y + r * d, d);
}

/* ---- rope -------------------------------------------------------------- */

void ntp_cpu_rope(const float *x, float *y, int64_t b, int64_t s, int64_t h, int64_t hd, float theta)
{
    ntp_cpu_rope_at(x, y, b, s, h, hd, theta, 0);
}

void ntp_cpu_rope_at(const float *x, float *y, int64_t b, int64_t s, int64_t h, int64_t hd, float theta,
                     int64_t pos0)
{
    ntp_cpu_rope_turn(x, y, b, s, h, hd, theta, pos0, false);
}

void ntp_cpu_rope_turn(const float *x, float *y, int64_t b, int64_t s, int64_t h, int64_t hd, float theta,
                       int64_t pos0, bool inverse)
{
    if (b <= 0 || s <= 0 || h <= 0 || hd <= 0)
        return;
    const int64_t half = hd / 2;
    const int64_t row = h * hd; /* elements per (b, s) */
#pragma omp parallel for schedule(static) if (b * s * row >= PAR_MIN)
    for (int64_t bs = 0; bs < b * s; bs++) {
        const int64_t pos = bs % s;
        const float *xs = x + bs * row;
        float *ys = y + bs * row;
        /* one cos/sin per (pos, i), shared by every head */
        for (int64_t i = 0; i < half; i++) {
            double ang = (double)(pos0 + pos) * pow((double)theta, -2.0 * (double)i / (double)hd);
            double cs = cos(ang), sn = inverse ? -sin(ang) : sin(ang); /* inverse: by the opposite angle */
            for (int64_t hh = 0; hh < h; hh++) {
                const float *xh = xs + hh * hd;
                float *yh = ys + hh * hd;
                double x1 = xh[i], x2 = xh[i + half]; /* read both before writing: in-place safe */
                yh[i] = (float)(x1 * cs - x2 * sn);
                yh[i + half] = (float)(x2 * cs + x1 * sn);
            }
        }
        if (hd & 1)
            for (int64_t hh = 0; hh < h; hh++)
                ys[hh * hd + hd - 1] = xs[hh * hd + hd - 1];
    }
}

/* ---- attention --------------------------------------------------------- */

int ntp_cpu_attention(const float *q, const float *k, const float *v, float *out, int64_t b, int64_t s,
                      int64_t h, int64_t kv, int64_t hd, bool causal, float scale)
{
    if (kv <= 0 || h < 0 || h % kv != 0)
        return -1;
    return ntp_cpu_attention_heads(q, k, v, out, b, s, h, kv, hd, causal, scale, 0, h > 0 ? h / kv : 1, 0);
}

/* Query rows per tile: the scores of one tile (ATT_TILE x s floats) stay in cache between the
 * two GEMMs, and under a causal mask a tile only multiplies the keys up to its last row. */
enum { ATT_TILE = 64 };

int ntp_cpu_attention_heads(const float *q, const float *k, const float *v, float *out, int64_t b, int64_t s,
                            int64_t h, int64_t kv, int64_t hd, bool causal, float scale, int64_t q_off,
                            int64_t group, int64_t kv_off)
{
    if (kv <= 0 || h < 0 || group <= 0 || q_off / group - kv_off < 0 || (q_off + h - 1) / group - kv_off >= kv)
        return -1;
    if (b <= 0 || s <= 0 || h <= 0 || hd <= 0)
        return 0;
    /* One (batch row, query head, query tile) per job. Q of a head is a strided [s][hd] matrix
     * (row stride h*hd) and K, V of its kv head are [s][hd] with stride kv*hd, so both products
     * run on the tensors in place: scores = scale * Q K^T, softmax per row, out = P V. */
    const int64_t ldq = h * hd, ldk = kv * hd, tiles = (s + ATT_TILE - 1) / ATT_TILE, jobs = b * h * tiles;
    int failed = 0;
    /* threads only for work that outweighs waking them (toy sizes in the tests stay serial) */
#pragma omp parallel reduction(| : failed) if (b * h * s * s * hd >= (int64_t)PAR_MIN * 16)
    {
        float *p = malloc((size_t)(ATT_TILE * s) * sizeof *p); /* one tile's scores, then probabilities */
        failed = !p;
        /* every thread reaches the loop (a worksharing construct must be met by all); one
         * without scratch skips its jobs and the call fails, out then holds no promise */
#pragma omp for schedule(dynamic)
        for (int64_t job = 0; job < jobs; job++) {
            if (!p)
                continue;
            const int64_t tile = job % tiles, j = job / tiles % h, bi = job / (tiles * h);
            const int64_t t0 = tile * ATT_TILE, tq = s - t0 < ATT_TILE ? s - t0 : ATT_TILE;
            const int64_t nk = causal ? t0 + tq : s; /* keys any row of the tile may see */
            const int64_t g = (q_off + j) / group - kv_off; /* this query head's kv head, locally */
            const float *qt = q + ((bi * s + t0) * h + j) * hd;
            const float *kg = k + (bi * s * kv + g) * hd, *vg = v + (bi * s * kv + g) * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tq, (int)nk, (int)hd, scale, qt, (int)ldq, kg,
                        (int)ldk, 0.0f, p, (int)nk);
            for (int64_t r = 0; r < tq; r++) {
                float *pr = p + r * nk;
                /* masked keys take no part in the softmax and get probability 0, as -inf would */
                const int64_t seen = causal ? t0 + r + 1 : nk;
                softmax_row(pr, pr, seen);
                for (int64_t u = seen; u < nk; u++)
                    pr[u] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)tq, (int)hd, (int)nk, 1.0f, p, (int)nk, vg,
                        (int)ldk, 0.0f, out + ((bi * s + t0) * h + j) * hd, (int)ldq);
        }
        free(p);
    }
    return failed ? -1 : 0;
}

/* ---- gather ------------------------------------------------------------ */

void ntp_cpu_gather_range(const float *table, const int32_t *idx, float *out, int64_t n_idx, int64_t d, int64_t lo,
                          int64_t hi)
{
#pragma omp parallel for schedule(static) if (n_idx * d >= PAR_MIN)
    for (int64_t i = 0; i < n_idx; i++) {
        if (idx[i] >= lo && idx[i] < hi)
            memcpy(out + i * d, table + ((int64_t)idx[i] - lo) * d, (size_t)d * sizeof *out);
        else
            memset(out + i * d, 0, (size_t)d * sizeof *out);
    }
}

int ntp_cpu_gather(const float *table, const int32_t *idx, float *out, int64_t n_idx, int64_t d,
                   int64_t vocab)
{
    /* find the first bad index before copying, so the rows written are exactly those before it */
    int64_t good = 0;
    while (good < n_idx && idx[good] >= 0 && (int64_t)idx[good] < vocab)
        good++;
    if (d > 0) {
#pragma omp parallel for schedule(static) if (good * d >= PAR_MIN)
        for (int64_t i = 0; i < good; i++)
            memcpy(out + i * d, table + (int64_t)idx[i] * d, (size_t)d * sizeof *out);
    }
    return good < n_idx ? -1 : 0;
}
