/* Independent checks of the CPU reference kernels: closed forms, invariants,
 * exhaustive bit-pattern sweeps and naive double-precision re-implementations.
 * Standalone: exit 0 on success, 1 (with messages on stderr) on any failure. */
#include "cpu_kernels.h"

#include <complex.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail;
static int g_checks;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        g_checks++;                                                                                \
        if (!(cond)) {                                                                             \
            g_fail++;                                                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

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

/* bitwise equality so -0 vs +0 and exact values are distinguished */
#define CHECK_BITS(got, want, what)                                                                \
    CHECK(f2u(got) == f2u(want), "%s: got %a (0x%08x) want %a (0x%08x)", what, (double)(got),      \
          (unsigned)f2u(got), (double)(want), (unsigned)f2u(want))

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        exit(2);
    }
    return p;
}

/* random test data: never zeros, reproducible */
static float *rand_buf(const char *name, size_t n, float scale)
{
    float *p = xmalloc(n * sizeof *p);
    uint64_t h = ntp_name_hash(name);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * ntp_init_uniform(1234, h, i);
    return p;
}

/* ---------------------------------------------------------------- rounding */

/* independent binary16 decoder */
static float half_to_float(uint16_t hbits)
{
    int sign = hbits >> 15, e = (hbits >> 10) & 0x1F, m = hbits & 0x3FF;
    double v;
    if (e == 0x1F)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, e - 25);
    return (float)(sign ? -v : v);
}

static void test_bf16(void)
{
    CHECK_BITS(ntp_round_bf16(1.0f), 1.0f, "bf16 1");
    CHECK_BITS(ntp_round_bf16(u2f(0x3F808000u)), u2f(0x3F800000u), "bf16 tie to even (down)");
    CHECK_BITS(ntp_round_bf16(u2f(0x3F818000u)), u2f(0x3F820000u), "bf16 tie to even (up)");
    CHECK_BITS(ntp_round_bf16(u2f(0x3F808001u)), u2f(0x3F810000u), "bf16 above half");
    CHECK_BITS(ntp_round_bf16(u2f(0x3F807FFFu)), u2f(0x3F800000u), "bf16 below half");
    CHECK_BITS(ntp_round_bf16(u2f(0xBF808000u)), u2f(0xBF800000u), "bf16 negative tie");
    CHECK_BITS(ntp_round_bf16(u2f(0xBF818000u)), u2f(0xBF820000u), "bf16 negative tie up");
    CHECK_BITS(ntp_round_bf16(u2f(0x3FFF8000u)), 2.0f, "bf16 carry into exponent");
    CHECK_BITS(ntp_round_bf16(FLT_MAX), INFINITY, "bf16 overflow to inf");
    CHECK_BITS(ntp_round_bf16(u2f(0x7F7F7FFFu)), u2f(0x7F7F0000u), "bf16 max finite");
    CHECK_BITS(ntp_round_bf16(INFINITY), INFINITY, "bf16 inf");
    CHECK_BITS(ntp_round_bf16(-INFINITY), -INFINITY, "bf16 -inf");
    CHECK_BITS(ntp_round_bf16(-0.0f), -0.0f, "bf16 -0");
    CHECK_BITS(ntp_round_bf16(u2f(0x00008000u)), 0.0f, "bf16 subnormal tie to 0");
    CHECK_BITS(ntp_round_bf16(u2f(0x00018000u)), u2f(0x00020000u), "bf16 subnormal tie up");
    /* NaNs whose payload sits only in the low bits must not become inf */
    CHECK(isnan(ntp_round_bf16(u2f(0x7F800001u))), "bf16 low-payload NaN stays NaN");
    CHECK(isnan(ntp_round_bf16(u2f(0xFF800001u))), "bf16 negative NaN stays NaN");
    CHECK(isnan(ntp_round_bf16(NAN)), "bf16 NaN");
    CHECK(isnan(ntp_round_bf16(u2f(0x7FFFFFFFu))), "bf16 all-ones NaN (no carry into sign)");

    /* exhaustive: every finite bf16 value is a fixed point, and the exact midpoint
     * between neighbours goes to the one with an even mantissa */
    int bad = 0;
    for (uint32_t hb = 0; hb < 0x10000u; hb++) {
        uint32_t u = hb << 16;
        float f = u2f(u);
        if (isnan(f)) {
            if (!isnan(ntp_round_bf16(f)))
                bad++;
            continue;
        }
        if (f2u(ntp_round_bf16(f)) != u)
            bad++;
        if ((hb & 0x7FFFu) >= 0x7F80u)
            continue; /* inf: no midpoint above */
        uint32_t mid = u + 0x8000u;
        uint32_t even = (hb & 1u) ? (u + 0x10000u) : u;
        if (f2u(ntp_round_bf16(u2f(mid))) != even)
            bad++;
        if (f2u(ntp_round_bf16(u2f(mid - 1u))) != u) /* just below the midpoint */
            bad++;
        if (f2u(ntp_round_bf16(u2f(mid + 1u))) != u + 0x10000u)
            bad++;
    }
    CHECK(bad == 0, "bf16 exhaustive sweep: %d mismatches", bad);
}

static void test_fp16(void)
{
    const float q = 0x1p-24f; /* smallest subnormal half */
    CHECK_BITS(ntp_round_fp16(1.0f), 1.0f, "fp16 1");
    CHECK_BITS(ntp_round_fp16(1.0f + 0x1p-11f), 1.0f, "fp16 tie to even (down)");
    CHECK_BITS(ntp_round_fp16(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f, "fp16 tie to even (up)");
    CHECK_BITS(ntp_round_fp16(1.0f + 0x1p-11f + 0x1p-20f), 1.0f + 0x1p-10f, "fp16 above half");
    CHECK_BITS(ntp_round_fp16(-(1.0f + 0x1p-11f)), -1.0f, "fp16 negative tie");
    CHECK_BITS(ntp_round_fp16(0.1f), half_to_float(0x2E66), "fp16 0.1");
    CHECK_BITS(ntp_round_fp16(65504.0f), 65504.0f, "fp16 max");
    CHECK_BITS(ntp_round_fp16(65519.0f), 65504.0f, "fp16 just below overflow midpoint");
    CHECK_BITS(ntp_round_fp16(65520.0f), INFINITY, "fp16 overflow tie goes to inf");
    CHECK_BITS(ntp_round_fp16(-65520.0f), -INFINITY, "fp16 -overflow tie");
    CHECK_BITS(ntp_round_fp16(1e10f), INFINITY, "fp16 overflow");
    CHECK_BITS(ntp_round_fp16(-70000.0f), -INFINITY, "fp16 -overflow");
    CHECK_BITS(ntp_round_fp16(FLT_MAX), INFINITY, "fp16 FLT_MAX");
    CHECK_BITS(ntp_round_fp16(INFINITY), INFINITY, "fp16 inf");
    CHECK_BITS(ntp_round_fp16(-INFINITY), -INFINITY, "fp16 -inf");
    CHECK(isnan(ntp_round_fp16(NAN)), "fp16 NaN");
    CHECK(isnan(ntp_round_fp16(u2f(0x7F800001u))), "fp16 low-payload NaN");
    /* subnormal halves */
    CHECK_BITS(ntp_round_fp16(0x1p-14f), 0x1p-14f, "fp16 min normal");
    CHECK_BITS(ntp_round_fp16(q), q, "fp16 min subnormal");
    CHECK_BITS(ntp_round_fp16(0x1p-25f), 0.0f, "fp16 half-quantum tie to 0");
    CHECK_BITS(ntp_round_fp16(-0x1p-25f), -0.0f, "fp16 -half-quantum tie to -0");
    CHECK_BITS(ntp_round_fp16(0x1p-25f + 0x1p-35f), q, "fp16 just above half quantum");
    CHECK_BITS(ntp_round_fp16(3 * 0x1p-25f), 2 * q, "fp16 subnormal tie 1.5q -> 2q");
    CHECK_BITS(ntp_round_fp16(5 * 0x1p-25f), 2 * q, "fp16 subnormal tie 2.5q -> 2q");
    CHECK_BITS(ntp_round_fp16(0x1p-14f - 0x1p-25f), 0x1p-14f, "fp16 1023.5q -> min normal");
    CHECK_BITS(ntp_round_fp16(1000.3f * q), 1000 * q, "fp16 subnormal round down");
    CHECK_BITS(ntp_round_fp16(1e-10f), 0.0f, "fp16 underflow");
    CHECK_BITS(ntp_round_fp16(-1e-10f), -0.0f, "fp16 underflow keeps sign");
    CHECK_BITS(ntp_round_fp16(1e-40f), 0.0f, "fp16 fp32-subnormal input");
    CHECK_BITS(ntp_round_fp16(-0.0f), -0.0f, "fp16 -0");

    /* exhaustive over all halves: fixed points, and midpoints (computed in double,
     * exact in fp32) go to the even neighbour */
    int bad = 0;
    for (uint32_t hb = 0; hb < 0x10000u; hb++) {
        float f = half_to_float((uint16_t)hb);
        if (isnan(f)) {
            if (!isnan(ntp_round_fp16(f)))
                bad++;
            continue;
        }
        if (f2u(ntp_round_fp16(f)) != f2u(f))
            bad++;
        if ((hb & 0x7FFFu) >= 0x7C00u)
            continue;
        float next = half_to_float((uint16_t)(hb + 1)); /* away from zero; 0x7BFF+1 = inf */
        double lo = f, hi = isinf(next) ? copysign(65536.0, f) : (double)next;
        float mid = (float)((lo + hi) / 2);
        float even = (hb & 1u) ? next : f;
        if (f2u(ntp_round_fp16(mid)) != f2u(even))
            bad++;
        if (f2u(ntp_round_fp16(nextafterf(mid, 0.0f))) != f2u(f))
            bad++;
        if (f2u(ntp_round_fp16(nextafterf(mid, (float)hi * 2))) != f2u(next))
            bad++;
    }
    CHECK(bad == 0, "fp16 exhaustive sweep: %d mismatches", bad);

#ifdef __FLT16_MAX__
    /* the compiler's own float->_Float16 conversion is an independent RNE oracle */
    bad = 0;
    uint64_t h = ntp_name_hash("fp16.cmp");
    for (uint64_t i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)ntp_init_int(7, h, i, 0x7FFFFFFF) * 2u + (uint32_t)(i & 1);
        float f = u2f(u);
        if (isnan(f))
            continue;
        float ref = (float)(_Float16)f;
        if (f2u(ntp_round_fp16(f)) != f2u(ref))
            bad++;
    }
    CHECK(bad == 0, "fp16 vs _Float16 on random bit patterns: %d mismatches", bad);
#endif
}

static void test_round_buf(void)
{
    float x[4] = {1.0f + 0x1p-11f, u2f(0x3F808001u), 0.1f, 70000.0f};
    float y[4];
    memcpy(y, x, sizeof x);
    ntp_round_buf(y, 4, NTP_ROUND_NONE);
    CHECK(memcmp(x, y, sizeof x) == 0, "round_buf NONE changes data");
    ntp_round_buf(y, 4, NTP_ROUND_BF16);
    for (int i = 0; i < 4; i++)
        CHECK_BITS(y[i], ntp_round_bf16(x[i]), "round_buf bf16");
    memcpy(y, x, sizeof x);
    ntp_round_buf(y, 4, NTP_ROUND_FP16);
    for (int i = 0; i < 4; i++)
        CHECK_BITS(y[i], ntp_round_fp16(x[i]), "round_buf fp16");
    ntp_round_buf(NULL, 0, NTP_ROUND_FP16); /* n = 0 touches nothing */
}

/* -------------------------------------------------------------------- init */

static void test_init(void)
{
    CHECK(ntp_name_hash("") == 0xCBF29CE484222325u, "FNV-1a of empty string");
    CHECK(ntp_name_hash("a") == 0xAF63DC4C8601EC8Cu, "FNV-1a of \"a\"");
    CHECK(ntp_name_hash("foobar") == 0x85944171F73967E8u, "FNV-1a of \"foobar\"");
    uint64_t ha = ntp_name_hash("blk.0.attn.wq"), hb = ntp_name_hash("blk.1.attn.wq");
    CHECK(ha != hb, "name hashes differ");

    const int N = 200000;
    double sum = 0, sum2 = 0;
    float mn = 2, mx = -2;
    int same_next = 0, same_name = 0, same_seed = 0, zeros = 0, nonexact = 0;
    for (int i = 0; i < N; i++) {
        float v = ntp_init_uniform(42, ha, (uint64_t)i);
        CHECK_BITS(v, ntp_init_uniform(42, ha, (uint64_t)i), "init deterministic");
        if (v < mn)
            mn = v;
        if (v > mx)
            mx = v;
        zeros += v == 0.0f;
        sum += v;
        sum2 += (double)v * v;
        /* on the documented grid: v = odd * 2^-24 */
        double g = ((double)v) * 0x1p24;
        nonexact += g != floor(g) || fmod(fabs(g), 2.0) != 1.0;
        same_next += v == ntp_init_uniform(42, ha, (uint64_t)i + 1);
        same_name += v == ntp_init_uniform(42, hb, (uint64_t)i);
        same_seed += v == ntp_init_uniform(43, ha, (uint64_t)i);
    }
    CHECK(mn > -1.0f && mx < 1.0f, "init range (%g, %g)", (double)mn, (double)mx);
    CHECK(mn < -0.999f && mx > 0.999f, "init covers the range (%g, %g)", (double)mn, (double)mx);
    CHECK(zeros == 0, "init produced %d exact zeros", zeros);
    CHECK(nonexact == 0, "init off-grid values: %d", nonexact);
    double mean = sum / N, var = sum2 / N - mean * mean;
    CHECK(fabs(mean) < 0.01, "init mean %g", mean);
    CHECK(fabs(var - 1.0 / 3.0) < 0.01, "init variance %g (want 1/3)", var);
    /* 24-bit values: chance agreement is ~N/2^24 ~ 0.012 expected hits */
    CHECK(same_next <= 3 && same_name <= 3 && same_seed <= 3,
          "init streams not independent: next %d name %d seed %d", same_next, same_name, same_seed);

    /* symmetric histogram over 8 bins */
    int bins[8] = {0};
    for (int i = 0; i < N; i++) {
        int bi = (int)((ntp_init_uniform(9, ha, (uint64_t)i) + 1.0f) * 4.0f);
        bins[bi < 0 ? 0 : bi > 7 ? 7 : bi]++;
    }
    for (int i = 0; i < 8; i++)
        CHECK(abs(bins[i] - N / 8) < N / 80, "init bin %d has %d (want ~%d)", i, bins[i], N / 8);

    /* integers */
    int counts[7] = {0};
    int out_of_range = 0;
    for (int i = 0; i < 70000; i++) {
        int32_t r = ntp_init_int(5, ha, (uint64_t)i, 7);
        CHECK(r == ntp_init_int(5, ha, (uint64_t)i, 7), "init_int deterministic");
        if (r < 0 || r >= 7)
            out_of_range++;
        else
            counts[r]++;
    }
    CHECK(out_of_range == 0, "init_int out of range %d times", out_of_range);
    for (int i = 0; i < 7; i++)
        CHECK(abs(counts[i] - 10000) < 500, "init_int value %d seen %d times (want ~10000)", i, counts[i]);
    CHECK(ntp_init_int(5, ha, 0, 1) == 0, "init_int range 1");
    CHECK(ntp_init_int(5, ha, 0, 0) == 0 && ntp_init_int(5, ha, 0, -3) == 0, "init_int range <= 0");
    int big_ok = 1, diff = 0;
    for (int i = 0; i < 1000; i++) {
        int32_t r = ntp_init_int(5, ha, (uint64_t)i, 50257);
        big_ok &= r >= 0 && r < 50257;
        diff += r != ntp_init_int(5, hb, (uint64_t)i, 50257);
    }
    CHECK(big_ok, "init_int vocab-sized range");
    CHECK(diff > 990, "init_int: different names should differ (%d/1000 differ)", diff);
}

/* ------------------------------------------------------------- elementwise */

static void test_elementwise(void)
{
    CHECK(ntp_relu(-2.5f) == 0.0f && ntp_relu(3.25f) == 3.25f && ntp_relu(0.0f) == 0.0f, "relu");
    CHECK(ntp_sigmoid(0.0f) == 0.5f, "sigmoid(0)");
    CHECK(ntp_sigmoid(100.0f) == 1.0f, "sigmoid(100)");
    float sm = ntp_sigmoid(-1000.0f);
    CHECK(sm >= 0.0f && sm < 1e-30f && !isnan(sm), "sigmoid(-1000) = %g", (double)sm);
    CHECK(ntp_gelu(0.0f) == 0.0f && ntp_silu(0.0f) == 0.0f, "gelu/silu(0)");
    CHECK(fabsf(ntp_gelu(20.0f) - 20.0f) < 1e-5f && fabsf(ntp_gelu(-20.0f)) < 1e-5f, "gelu tails");
    double worst_g = 0, worst_s = 0, worst_si = 0;
    for (int i = -800; i <= 800; i++) {
        double x = i / 100.0 + 0.003;
        float xf = (float)x;
        x = xf;
        double g = 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
        double s = 1 / (1 + exp(-x));
        worst_g = fmax(worst_g, fabs(ntp_gelu(xf) - g) / fmax(1.0, fabs(g)));
        worst_s = fmax(worst_s, fabs(ntp_sigmoid(xf) - s));
        worst_si = fmax(worst_si, fabs(ntp_silu(xf) - x * s) / fmax(1.0, fabs(x * s)));
    }
    CHECK(worst_g < 1e-6, "gelu vs double formula: %g", worst_g);
    CHECK(worst_s < 1e-6, "sigmoid vs double formula: %g", worst_s);
    CHECK(worst_si < 1e-6, "silu vs double formula: %g", worst_si);
    /* known value: gelu_tanh(1) = 0.841191990... */
    CHECK(fabs(ntp_gelu(1.0f) - 0.8411919906) < 1e-6, "gelu(1) = %.9f", (double)ntp_gelu(1.0f));
}

/* ------------------------------------------------------------------ matmul */

static void check_matmul(int64_t batch, int64_t m, int64_t k, int64_t n, int trans_b, int shared_b)
{
    int64_t bstride = shared_b ? 0 : k * n;
    int64_t nb = shared_b ? 1 : batch;
    float *a = rand_buf("mm.a", (size_t)(batch * m * k), 1.0f);
    float *b = rand_buf("mm.b", (size_t)(nb * k * n), 1.0f);
    float *c = xmalloc((size_t)(batch * m * n) * sizeof *c);
    for (int64_t i = 0; i < batch * m * n; i++)
        c[i] = NAN; /* every element must be written */
    ntp_cpu_matmul(a, b, c, batch, m, k, n, trans_b, bstride);
    int bad = 0;
    double worst = 0;
    for (int64_t bt = 0; bt < batch; bt++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double ref = 0, mag = 0;
                for (int64_t p = 0; p < k; p++) {
                    double bv = trans_b ? b[bt * bstride + j * k + p] : b[bt * bstride + p * n + j];
                    double t = (double)a[(bt * m + i) * k + p] * bv;
                    ref += t;
                    mag += fabs(t);
                }
                /* fp32 sequential-sum error bound: gamma_k * sum|a||b| */
                double tol = (double)(k + 1) * FLT_EPSILON * mag + 1e-30;
                double err = fabs(c[(bt * m + i) * n + j] - ref);
                if (!(err <= tol))
                    bad++;
                worst = fmax(worst, err / (mag + 1e-30));
            }
    CHECK(bad == 0, "matmul batch=%lld m=%lld k=%lld n=%lld trans_b=%d shared=%d: %d bad (worst rel %g)",
          (long long)batch, (long long)m, (long long)k, (long long)n, trans_b, shared_b, bad, worst);
    free(a);
    free(b);
    free(c);
}

static void test_matmul(void)
{
    for (int tb = 0; tb < 2; tb++) {
        check_matmul(1, 7, 13, 5, tb, 1);
        check_matmul(1, 1, 1, 1, tb, 1);
        check_matmul(1, 1, 17, 3, tb, 1);
        check_matmul(1, 9, 1, 11, tb, 1);
        check_matmul(3, 5, 7, 9, tb, 1); /* shared b (stride 0) */
        check_matmul(3, 5, 7, 9, tb, 0); /* batched b */
        check_matmul(2, 33, 65, 17, tb, 0);
        check_matmul(1, 31, 257, 63, tb, 1);
    }
    /* both layouts sum in the same order, so they agree bit for bit */
    int64_t m = 6, k = 21, n = 10;
    float *a = rand_buf("mmt.a", (size_t)(m * k), 1.0f);
    float *b = rand_buf("mmt.b", (size_t)(k * n), 1.0f);
    float *bt = xmalloc((size_t)(k * n) * sizeof *bt);
    for (int64_t p = 0; p < k; p++)
        for (int64_t j = 0; j < n; j++)
            bt[j * k + p] = b[p * n + j];
    float *c1 = xmalloc((size_t)(m * n) * sizeof *c1), *c2 = xmalloc((size_t)(m * n) * sizeof *c2);
    ntp_cpu_matmul(a, b, c1, 1, m, k, n, false, 0);
    ntp_cpu_matmul(a, bt, c2, 1, m, k, n, true, 0);
    CHECK(memcmp(c1, c2, (size_t)(m * n) * sizeof *c1) == 0, "matmul trans_b differs from plain layout");
    /* k = 0: empty sum is 0 */
    for (int64_t i = 0; i < m * n; i++)
        c1[i] = 5.0f;
    ntp_cpu_matmul(a, b, c1, 1, m, 0, n, false, 0);
    int nz = 0;
    for (int64_t i = 0; i < m * n; i++)
        nz += c1[i] != 0.0f;
    CHECK(nz == 0, "matmul k=0 should give zeros");
    free(a);
    free(b);
    free(bt);
    free(c1);
    free(c2);
}

/* ------------------------------------------------------- norms and softmax */

static void test_norms(void)
{
    const int64_t rows = 6, d = 37;
    float *x = rand_buf("ln.x", (size_t)(rows * d), 3.0f);
    for (int64_t i = 0; i < d; i++)
        x[i] += 1000.0f; /* row 0 has a large offset: the mean must not swamp the variance */
    float *y = xmalloc((size_t)(rows * d) * sizeof *y);

    ntp_cpu_layernorm(x, y, rows, d, 0.0f);
    for (int64_t r = 0; r < rows; r++) {
        double s = 0, s2 = 0;
        for (int64_t i = 0; i < d; i++)
            s += y[r * d + i];
        double mean = s / d;
        for (int64_t i = 0; i < d; i++)
            s2 += (y[r * d + i] - mean) * (y[r * d + i] - mean);
        CHECK(fabs(mean) < 1e-6, "layernorm row %lld mean %g", (long long)r, mean);
        CHECK(fabs(s2 / d - 1.0) < 1e-5, "layernorm row %lld var %g", (long long)r, s2 / d);
    }
    const float eps = 0.25f;
    ntp_cpu_layernorm(x, y, rows, d, eps);
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; i++)
            mean += x[r * d + i];
        mean /= d;
        for (int64_t i = 0; i < d; i++)
            var += (x[r * d + i] - mean) * (x[r * d + i] - mean);
        var /= d;
        for (int64_t i = 0; i < d; i++)
            worst = fmax(worst, fabs(y[r * d + i] - (x[r * d + i] - mean) / sqrt(var + eps)));
    }
    CHECK(worst < 1e-5, "layernorm with eps vs formula: %g", worst);
    /* in place */
    float *z = xmalloc((size_t)(rows * d) * sizeof *z);
    memcpy(z, x, (size_t)(rows * d) * sizeof *z);
    ntp_cpu_layernorm(z, z, rows, d, eps);
    CHECK(memcmp(z, y, (size_t)(rows * d) * sizeof *z) == 0, "layernorm in place");

    ntp_cpu_rmsnorm(x, y, rows, d, 0.0f);
    for (int64_t r = 0; r < rows; r++) {
        double s2 = 0;
        for (int64_t i = 0; i < d; i++)
            s2 += (double)y[r * d + i] * y[r * d + i];
        CHECK(fabs(sqrt(s2 / d) - 1.0) < 1e-6, "rmsnorm row %lld rms %g", (long long)r, sqrt(s2 / d));
    }
    ntp_cpu_rmsnorm(x, y, rows, d, eps);
    worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double ms = 0;
        for (int64_t i = 0; i < d; i++)
            ms += (double)x[r * d + i] * x[r * d + i];
        ms /= d;
        for (int64_t i = 0; i < d; i++)
            worst = fmax(worst, fabs(y[r * d + i] - x[r * d + i] / sqrt(ms + eps)) /
                                    fmax(1.0, fabs(x[r * d + i] / sqrt(ms + eps))));
    }
    CHECK(worst < 1e-6, "rmsnorm with eps vs formula: %g", worst);
    memcpy(z, x, (size_t)(rows * d) * sizeof *z);
    ntp_cpu_rmsnorm(z, z, rows, d, eps);
    CHECK(memcmp(z, y, (size_t)(rows * d) * sizeof *z) == 0, "rmsnorm in place");
    free(x);
    free(y);
    free(z);
}

static void test_softmax(void)
{
    const int64_t rows = 5, d = 29;
    float *x = rand_buf("sm.x", (size_t)(rows * d), 4.0f);
    for (int64_t i = 0; i < d; i++)
        x[d + i] = x[d + i] * 100.0f + 1000.0f; /* row 1 would overflow a naive exp */
    x[2 * d + 3] = -INFINITY;                   /* masked entries */
    x[2 * d + 7] = -INFINITY;
    float *y = xmalloc((size_t)(rows * d) * sizeof *y);
    ntp_cpu_softmax(x, y, rows, d);
    for (int64_t r = 0; r < rows; r++) {
        double mx = -INFINITY, sum = 0, ysum = 0, worst = 0;
        for (int64_t i = 0; i < d; i++)
            mx = fmax(mx, x[r * d + i]);
        for (int64_t i = 0; i < d; i++)
            sum += exp((double)x[r * d + i] - mx);
        for (int64_t i = 0; i < d; i++) {
            double ref = exp((double)x[r * d + i] - mx) / sum;
            worst = fmax(worst, fabs(y[r * d + i] - ref) / fmax(ref, 1e-30) * (ref > 1e-30));
            worst = fmax(worst, fabs(y[r * d + i] - ref) * 1e6 * (ref <= 1e-30));
            ysum += y[r * d + i];
        }
        CHECK(fabs(ysum - 1.0) < 1e-6, "softmax row %lld sums to %.9g", (long long)r, ysum);
        CHECK(worst < 1e-5, "softmax row %lld vs direct formula: rel %g", (long long)r, worst);
    }
    CHECK(y[2 * d + 3] == 0.0f && y[2 * d + 7] == 0.0f, "softmax -inf -> 0");
    /* closed form: two equal entries -> 1/2 each; shift invariance */
    float two[2] = {3.0f, 3.0f}, out2[2];
    ntp_cpu_softmax(two, out2, 1, 2);
    CHECK(out2[0] == 0.5f && out2[1] == 0.5f, "softmax of equal entries");
    float pair[2] = {0.0f, logf(3.0f)};
    ntp_cpu_softmax(pair, out2, 1, 2);
    CHECK(fabsf(out2[0] - 0.25f) < 1e-7f && fabsf(out2[1] - 0.75f) < 1e-7f, "softmax [0, ln 3]");
    float allmask[3] = {-INFINITY, -INFINITY, -INFINITY}, out3[3];
    ntp_cpu_softmax(allmask, out3, 1, 3);
    CHECK(out3[0] == 0.0f && out3[1] == 0.0f && out3[2] == 0.0f, "softmax all-masked row -> zeros");
    /* in place */
    float *z = xmalloc((size_t)(rows * d) * sizeof *z);
    memcpy(z, x, (size_t)(rows * d) * sizeof *z);
    ntp_cpu_softmax(z, z, rows, d);
    CHECK(memcmp(z, y, (size_t)(rows * d) * sizeof *z) == 0, "softmax in place");
    free(x);
    free(y);
    free(z);
}

/* -------------------------------------------------------------------- rope */

static void test_rope(void)
{
    const int64_t B = 2, S = 9, H = 3, HD = 16, half = HD / 2;
    const float theta = 10000.0f;
    const size_t n = (size_t)(B * S * H * HD);
    float *x = rand_buf("rope.x", n, 1.0f);
    float *y = xmalloc(n * sizeof *y);
    ntp_cpu_rope(x, y, B, S, H, HD, theta);
    double worst_norm = 0, worst_rot = 0;
    int pos0 = 0;
    for (int64_t bi = 0; bi < B; bi++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                const float *xr = x + ((bi * S + s) * H + h) * HD;
                const float *yr = y + ((bi * S + s) * H + h) * HD;
                for (int64_t i = 0; i < half; i++) {
                    double nx = hypot(xr[i], xr[i + half]), ny = hypot(yr[i], yr[i + half]);
                    worst_norm = fmax(worst_norm, fabs(nx - ny));
                    /* complex rotation: (x_i + i x_{i+half}) * exp(i * pos * theta^(-2i/hd)) */
                    double freq = exp(-(2.0 * i / HD) * log((double)theta));
                    double complex z = (xr[i] + I * xr[i + half]) * cexp(I * (s * freq));
                    worst_rot = fmax(worst_rot, cabs(z - (yr[i] + I * yr[i + half])));
                    if (s == 0)
                        pos0 += yr[i] != xr[i] || yr[i + half] != xr[i + half];
                }
            }
    CHECK(worst_norm < 1e-6, "rope pair norms changed by %g", worst_norm);
    CHECK(worst_rot < 1e-6, "rope vs complex rotation: %g", worst_rot);
    CHECK(pos0 == 0, "rope is not the identity at pos 0 (%d pairs differ)", pos0);
    /* closed form: pair 0 at pos 1 rotates by exactly 1 radian */
    float one[4] = {1.0f, 0.5f, 0.0f, 0.25f}; /* [s=2][h=1][hd=2]: pos 0 then pos 1 */
    float r1[4];
    ntp_cpu_rope(one, r1, 1, 2, 1, 2, theta);
    CHECK(r1[0] == 1.0f && r1[1] == 0.5f, "rope pos 0 identity (hd=2)");
    CHECK(fabs(r1[2] - (0.0 * cos(1.0) - 0.25 * sin(1.0))) < 1e-7 &&
              fabs(r1[3] - (0.25 * cos(1.0) + 0.0 * sin(1.0))) < 1e-7,
          "rope pos 1 pair 0 rotates by 1 rad");
    /* in place */
    float *z = xmalloc(n * sizeof *z);
    memcpy(z, x, n * sizeof *z);
    ntp_cpu_rope(z, z, B, S, H, HD, theta);
    CHECK(memcmp(z, y, n * sizeof *z) == 0, "rope in place");
    free(x);
    free(y);
    free(z);
}

/* --------------------------------------------------------------- attention */

static void naive_attention(const float *q, const float *k, const float *v, double *out, int64_t B,
                            int64_t S, int64_t H, int64_t KV, int64_t HD, int causal, double scale)
{
    double *sc = xmalloc((size_t)(S * S) * sizeof *sc);
    for (int64_t bi = 0; bi < B; bi++)
        for (int64_t h = 0; h < H; h++) {
            int64_t g = h / (H / KV);
            for (int64_t t = 0; t < S; t++)
                for (int64_t u = 0; u < S; u++) {
                    double d = 0;
                    for (int64_t e = 0; e < HD; e++)
                        d += (double)q[((bi * S + t) * H + h) * HD + e] * k[((bi * S + u) * KV + g) * HD + e];
                    sc[t * S + u] = (causal && u > t) ? -INFINITY : d * scale;
                }
            for (int64_t t = 0; t < S; t++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t u = 0; u < S; u++)
                    mx = fmax(mx, sc[t * S + u]);
                for (int64_t u = 0; u < S; u++)
                    sum += (sc[t * S + u] = exp(sc[t * S + u] - mx));
                for (int64_t e = 0; e < HD; e++) {
                    double o = 0;
                    for (int64_t u = 0; u < S; u++)
                        o += sc[t * S + u] / sum * v[((bi * S + u) * KV + g) * HD + e];
                    out[((bi * S + t) * H + h) * HD + e] = o;
                }
            }
        }
    free(sc);
}

static void check_attention(int64_t B, int64_t S, int64_t H, int64_t KV, int64_t HD, int causal)
{
    size_t nq = (size_t)(B * S * H * HD), nk = (size_t)(B * S * KV * HD);
    float *q = rand_buf("att.q", nq, 2.0f), *k = rand_buf("att.k", nk, 2.0f), *v = rand_buf("att.v", nk, 1.0f);
    float *out = xmalloc(nq * sizeof *out);
    double *ref = xmalloc(nq * sizeof *ref);
    float scale = 1.0f / sqrtf((float)HD);
    int rc = ntp_cpu_attention(q, k, v, out, B, S, H, KV, HD, causal, scale);
    CHECK(rc == 0, "attention returned %d", rc);
    naive_attention(q, k, v, ref, B, S, H, KV, HD, causal, scale);
    double worst = 0;
    for (size_t i = 0; i < nq; i++)
        worst = fmax(worst, fabs(out[i] - ref[i]));
    CHECK(worst < 2e-6, "attention B=%lld S=%lld H=%lld KV=%lld HD=%lld causal=%d: max err %g",
          (long long)B, (long long)S, (long long)H, (long long)KV, (long long)HD, causal, worst);
    /* structural: with causal masking, (or s = 1) query 0 sees only key 0, so its output is v[0] */
    if (causal || S == 1) {
        int bad = 0;
        for (int64_t bi = 0; bi < B; bi++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t e = 0; e < HD; e++)
                    bad += fabsf(out[((bi * S) * H + h) * HD + e] - v[((bi * S) * KV + h / (H / KV)) * HD + e]) >
                           1e-6f;
        CHECK(bad == 0, "attention: first query should copy its kv head's v[0] (%d bad)", bad);
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(ref);
}

static void test_attention(void)
{
    for (int causal = 0; causal < 2; causal++) {
        check_attention(2, 5, 4, 2, 8, causal);  /* GQA */
        check_attention(2, 7, 4, 4, 6, causal);  /* MHA */
        check_attention(1, 11, 6, 1, 4, causal); /* MQA */
        check_attention(3, 1, 4, 2, 8, causal);  /* s = 1 */
        check_attention(1, 64, 8, 2, 32, causal);
    }
    /* GQA really shares: heads in one group see the same kv head, so with equal q rows they agree */
    {
        const int64_t B = 1, S = 4, H = 4, KV = 2, HD = 4;
        float *q = rand_buf("gqa.q", (size_t)(B * S * H * HD), 1.0f);
        float *k = rand_buf("gqa.k", (size_t)(B * S * KV * HD), 1.0f);
        float *v = rand_buf("gqa.v", (size_t)(B * S * KV * HD), 1.0f);
        for (int64_t s = 0; s < S; s++) /* head 1 := head 0, head 3 := head 2 */
            for (int64_t e = 0; e < HD; e++) {
                q[(s * H + 1) * HD + e] = q[(s * H + 0) * HD + e];
                q[(s * H + 3) * HD + e] = q[(s * H + 2) * HD + e];
            }
        float out[64];
        CHECK(ntp_cpu_attention(q, k, v, out, B, S, H, KV, HD, true, 0.5f) == 0, "gqa rc");
        int same01 = 1, same23 = 1, diff02 = 0;
        for (int64_t s = 0; s < S; s++)
            for (int64_t e = 0; e < HD; e++) {
                same01 &= out[(s * H + 0) * HD + e] == out[(s * H + 1) * HD + e];
                same23 &= out[(s * H + 2) * HD + e] == out[(s * H + 3) * HD + e];
                diff02 += out[(s * H + 0) * HD + e] != out[(s * H + 2) * HD + e];
            }
        CHECK(same01 && same23 && diff02 > 0, "gqa head grouping (h/(H/KV))");
        free(q);
        free(k);
        free(v);
    }
    float dummy[8] = {0};
    CHECK(ntp_cpu_attention(dummy, dummy, dummy, dummy, 1, 1, 3, 2, 1, false, 1.0f) == -1,
          "attention rejects h %% kv != 0");
    CHECK(ntp_cpu_attention(dummy, dummy, dummy, dummy, 1, 1, 2, 0, 1, false, 1.0f) == -1,
          "attention rejects kv = 0");
    CHECK(ntp_cpu_attention(dummy, dummy, dummy, dummy, 1, 0, 2, 1, 1, false, 1.0f) == 0,
          "attention s = 0 is a no-op");
}

/* ------------------------------------------------------------------ gather */

static void test_gather(void)
{
    const int64_t V = 10, D = 5;
    float *table = rand_buf("g.table", (size_t)(V * D), 1.0f);
    int32_t idx[6] = {3, 0, 9, 3, 7, 1};
    float out[6 * 5];
    CHECK(ntp_cpu_gather(table, idx, out, 6, D, V) == 0, "gather ok");
    int bad = 0;
    for (int i = 0; i < 6; i++)
        bad += memcmp(out + i * D, table + idx[i] * D, (size_t)D * sizeof(float)) != 0;
    CHECK(bad == 0, "gather rows wrong (%d)", bad);

    int32_t bad_hi[4] = {2, 4, 10, 1}; /* 10 == vocab: out of range */
    for (int i = 0; i < 4 * 5; i++)
        out[i] = -7.0f;
    CHECK(ntp_cpu_gather(table, bad_hi, out, 4, D, V) == -1, "gather idx == vocab -> -1");
    CHECK(memcmp(out, table + 2 * D, (size_t)D * sizeof(float)) == 0 &&
              memcmp(out + D, table + 4 * D, (size_t)D * sizeof(float)) == 0,
          "gather writes rows before the bad index");
    int untouched = 1;
    for (int i = 2 * 5; i < 4 * 5; i++)
        untouched &= out[i] == -7.0f;
    CHECK(untouched, "gather writes nothing at or after the bad index");
    int32_t bad_neg[2] = {-1, 0};
    CHECK(ntp_cpu_gather(table, bad_neg, out, 2, D, V) == -1, "gather negative idx -> -1");
    CHECK(ntp_cpu_gather(table, idx, out, 0, D, V) == 0, "gather n_idx = 0");
    free(table);
}

int main(void)
{
    test_bf16();
    test_fp16();
    test_round_buf();
    test_init();
    test_elementwise();
    test_matmul();
    test_norms();
    test_softmax();
    test_rope();
    test_attention();
    test_gather();
    if (g_fail) {
        fprintf(stderr, "test_cpu_kernels: %d of %d checks FAILED\n", g_fail, g_checks);
        return 1;
    }
    printf("test_cpu_kernels: all %d checks passed\n", g_checks);
    return 0;
}
