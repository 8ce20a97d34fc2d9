/* cpu_grad.c — the CPU reference's backward kernels: the vector-Jacobian products of every
 * primitive op, for the ops the gradient pass emits (compiler/grad/). fp32 in and out; sums
 * over many terms accumulate in double (see cpu_kernels.h). */
#include "cpu_kernels.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { PAR_MIN = NTP_CPU_PAR_MIN };

void ntp_cpu_matmul_ta(const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t k, int64_t n,
                       bool trans_b, int64_t b_batch_stride) {
  if (batch <= 0 || m <= 0 || n <= 0) return;
  if (k <= 0) {
    memset(c, 0, (size_t)(batch * m * n) * sizeof *c);
    return;
  }
  for (int64_t bt = 0; bt < batch; bt++)
    cblas_sgemm(CblasRowMajor, CblasTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f,
                a + bt * k * m, (int)m, b + bt * b_batch_stride, trans_b ? (int)k : (int)n, 0.0f, c + bt * m * n,
                (int)n);
}

void ntp_cpu_sum_to(const float *x, const int64_t *xdim, int xnd, float *y, const int64_t *ydim, int ynd) {
  int64_t nx = 1, ny = 1, ystride[8] = {0}, st = 1;
  for (int d = 0; d < xnd; d++) nx *= xdim[d];
  for (int d = 0; d < ynd; d++) ny *= ydim[d];
  /* the stride in y of each of x's dims: 0 where y broadcasts (a 1, or a dim y lacks) */
  for (int d = xnd - 1; d >= 0; d--) {
    int yd = d - (xnd - ynd);
    if (yd >= 0 && ydim[yd] == xdim[d] && xdim[d] != 1) ystride[d] = st;
    if (yd >= 0) st *= ydim[yd];
  }
  double *acc = calloc((size_t)(ny ? ny : 1), sizeof *acc);
  if (!acc) { /* the rare path: the same sums in fp32, in place */
    memset(y, 0, (size_t)ny * sizeof *y);
    for (int64_t i = 0; i < nx; i++) {
      int64_t rem = i, off = 0;
      for (int d = xnd - 1; d >= 0; d--) {
        off += (rem % xdim[d]) * ystride[d];
        rem /= xdim[d];
      }
      y[off] += x[i];
    }
    return;
  }
  int64_t idx[8] = {0}, off = 0;
  for (int64_t i = 0; i < nx; i++) {
    acc[off] += x[i];
    for (int d = xnd - 1; d >= 0; d--) { /* odometer */
      off += ystride[d];
      if (++idx[d] < xdim[d]) break;
      off -= ystride[d] * xdim[d];
      idx[d] = 0;
    }
  }
  for (int64_t j = 0; j < ny; j++) y[j] = (float)acc[j];
  free(acc);
}

void ntp_cpu_act_grad(char of, const float *u, const float *dy, float *dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    double x = u[i], g = dy[i], d;
    switch (of) {
    case 'g': { /* the tanh approximation's derivative */
      const double c = 0.7978845608028654, a = 0.044715;
      double t = tanh(c * (x + a * x * x * x));
      d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x * x);
      break;
    }
    case 'r': d = x > 0 ? 1.0 : 0.0; break;
    case 's': {
      double sg = 1.0 / (1.0 + exp(-x));
      d = sg * (1.0 + x * (1.0 - sg));
      break;
    }
    case 'S': d = x * (1.0 - x); break; /* u = y = sigmoid(x) */
    case 't': d = 1.0 - x * x; break;   /* u = y = tanh(x) */
    case 'e': d = x; break;             /* u = y = exp(x) */
    default: d = -1.0; break;           /* neg */
    }
    dx[i] = (float)(g * d);
  }
}

void ntp_cpu_softmax_grad(const float *y, const float *dy, float *dx, int64_t rows, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d >= PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *yr = y + r * d, *gr = dy + r * d;
    double s = 0;
    for (int64_t i = 0; i < d; i++) s += (double)yr[i] * gr[i];
    for (int64_t i = 0; i < d; i++) dx[r * d + i] = (float)((double)yr[i] * ((double)gr[i] - s));
  }
}

void ntp_cpu_layernorm_grad(const float *x, const float *dy, float *dx, int64_t rows, int64_t d, float eps) {
  if (d <= 0) return;
#pragma omp parallel for schedule(static) if (rows * d >= PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d, *gr = dy + r * d;
    double mean = 0, var = 0, mg = 0, mgx = 0;
    for (int64_t i = 0; i < d; i++) mean += xr[i];
    mean /= (double)d;
    for (int64_t i = 0; i < d; i++) var += (xr[i] - mean) * (xr[i] - mean);
    var /= (double)d;
    double inv = 1.0 / sqrt(var + (double)eps);
    for (int64_t i = 0; i < d; i++) {
      mg += gr[i];
      mgx += gr[i] * (xr[i] - mean) * inv;
    }
    mg /= (double)d;
    mgx /= (double)d;
    for (int64_t i = 0; i < d; i++) dx[r * d + i] = (float)(inv * ((double)gr[i] - mg - (xr[i] - mean) * inv * mgx));
  }
}

void ntp_cpu_rmsnorm_grad(const float *x, const float *dy, float *dx, int64_t rows, int64_t d, float eps) {
  if (d <= 0) return;
#pragma omp parallel for schedule(static) if (rows * d >= PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d, *gr = dy + r * d;
    double ms = 0, gx = 0;
    for (int64_t i = 0; i < d; i++) {
      ms += (double)xr[i] * xr[i];
      gx += (double)gr[i] * xr[i];
    }
    double inv = 1.0 / sqrt(ms / (double)d + (double)eps);
    for (int64_t i = 0; i < d; i++) dx[r * d + i] = (float)(inv * gr[i] - inv * inv * inv * xr[i] * gx / (double)d);
  }
}

/* One (batch, query head) of attention's backward, in double with the BLAS: P = softmax(scale
 * q k^T) (causal), then dV += P^T dy, dS = P * (dy v^T - rowsum(dy * O)) * scale, dq = dS k,
 * dk += dS^T q. Only the gradient `which` is accumulated, into acc [s][hd]. w: scratch of
 * 2 s^2 + 4 s hd doubles. */
static void attention_head_grad(const float *q, const float *k, const float *v, const float *dy, double *acc,
                                int which, int64_t s, int64_t qrow, int64_t kvrow, int64_t hd, bool causal,
                                float scale, double *w) {
  double *p = w, *dp = p + s * s, *qd = dp + s * s, *kd = qd + s * hd, *vd = kd + s * hd, *gd = vd + s * hd;
  for (int64_t i = 0; i < s; i++)
    for (int64_t e = 0; e < hd; e++) {
      qd[i * hd + e] = q[i * qrow + e];
      kd[i * hd + e] = k[i * kvrow + e];
      vd[i * hd + e] = v[i * kvrow + e];
      gd[i * hd + e] = dy[i * qrow + e];
    }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)s, (int)s, (int)hd, (double)scale, qd, (int)hd, kd,
              (int)hd, 0.0, p, (int)s);
  for (int64_t i = 0; i < s; i++) { /* softmax of row i over its visible keys */
    double *pr = p + i * s, mx = -INFINITY, sum = 0;
    int64_t tn = causal ? i + 1 : s;
    for (int64_t t = 0; t < tn; t++) mx = pr[t] > mx ? pr[t] : mx;
    for (int64_t t = 0; t < tn; t++) sum += (pr[t] = exp(pr[t] - mx));
    for (int64_t t = 0; t < s; t++) pr[t] = t < tn ? pr[t] / sum : 0.0;
  }
  if (which == 2) { /* dv += P^T dy */
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)s, (int)hd, (int)s, 1.0, p, (int)s, gd, (int)hd, 1.0,
                acc, (int)hd);
    return;
  }
  /* dP = dy v^T; dS = P (dP - rowsum(P dP)) scale */
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)s, (int)s, (int)hd, 1.0, gd, (int)hd, vd, (int)hd, 0.0, dp,
              (int)s);
  for (int64_t i = 0; i < s; i++) {
    double dpo = 0;
    for (int64_t t = 0; t < s; t++) dpo += p[i * s + t] * dp[i * s + t];
    for (int64_t t = 0; t < s; t++) dp[i * s + t] = p[i * s + t] * (dp[i * s + t] - dpo) * (double)scale;
  }
  if (which == 0) /* dq = dS k */
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)s, (int)hd, (int)s, 1.0, dp, (int)s, kd, (int)hd, 1.0,
                acc, (int)hd);
  else /* dk += dS^T q */
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)s, (int)hd, (int)s, 1.0, dp, (int)s, qd, (int)hd, 1.0,
                acc, (int)hd);
}

int ntp_cpu_attention_grad(const float *q, const float *k, const float *v, const float *dy, float *out, int which,
                           int64_t b, int64_t s, int64_t h, int64_t kv, int64_t hd, bool causal, float scale,
                           int64_t q_off, int64_t group, int64_t kv_off) {
  if (b <= 0 || s <= 0 || h <= 0 || kv <= 0 || hd <= 0 || group <= 0) return -1;
  for (int64_t n = 0; n < h; n++) {
    int64_t j = (q_off + n) / group - kv_off;
    if (j < 0 || j >= kv) return -1;
  }
  /* per (batch, head of the output): dq by query head, dk and dv by kv head summing its group */
  int64_t heads_out = which == 0 ? h : kv, qrow = h * hd, kvrow = kv * hd;
  int failed = 0;
#pragma omp parallel for schedule(dynamic) if (b * heads_out * s * s * hd >= PAR_MIN)
  for (int64_t bo = 0; bo < b * heads_out; bo++) {
    int64_t bb = bo / heads_out, ho = bo % heads_out;
    double *p = malloc(((size_t)2 * s * s + (size_t)4 * s * hd) * sizeof *p), *acc = calloc((size_t)s * hd, sizeof *acc);
    if (!p || !acc) {
#pragma omp atomic write
      failed = 1;
      free(p);
      free(acc);
      continue;
    }
    for (int64_t n = 0; n < h; n++) {
      int64_t j = (q_off + n) / group - kv_off;
      if (which == 0 ? n != ho : j != ho) continue;
      attention_head_grad(q + bb * s * qrow + n * hd, k + bb * s * kvrow + j * hd, v + bb * s * kvrow + j * hd,
                          dy + bb * s * qrow + n * hd, acc, which, s, qrow, kvrow, hd, causal, scale, p);
    }
    int64_t orow = which == 0 ? qrow : kvrow;
    for (int64_t t = 0; t < s; t++)
      for (int64_t e = 0; e < hd; e++) out[bb * s * orow + t * orow + ho * hd + e] = (float)acc[t * hd + e];
    free(p);
    free(acc);
  }
  return failed ? -1 : 0;
}

int ntp_cpu_scatter_add(const int32_t *idx, const float *rows, float *table, int64_t n_idx, int64_t d, int64_t lo,
                        int64_t vrows) {
  int64_t cells = vrows * d;
  double *acc = calloc((size_t)(cells > 0 ? cells : 1), sizeof *acc);
  if (!acc) return -1;
  for (int64_t i = 0; i < n_idx; i++) {
    int64_t r = (int64_t)idx[i] - lo;
    if (r < 0 || r >= vrows) continue;
    for (int64_t e = 0; e < d; e++) acc[r * d + e] += rows[i * d + e];
  }
  for (int64_t j = 0; j < vrows * d; j++) table[j] = (float)acc[j];
  free(acc);
  return 0;
}

int ntp_cpu_cross_entropy(const float *logits, const int32_t *targets, int64_t rows, int64_t v, int64_t ignore,
                          double *loss, int64_t *count, int64_t *bad) {
  double sum = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < rows; r++) {
    int64_t t = targets[r];
    if (t == ignore) continue;
    if (t < 0 || t >= v) {
      *bad = r;
      return -1;
    }
    const float *l = logits + r * v;
    double mx = -INFINITY, se = 0;
    for (int64_t i = 0; i < v; i++)
      if (l[i] > mx) mx = l[i];
    for (int64_t i = 0; i < v; i++) se += exp((double)l[i] - mx);
    sum += log(se) + mx - l[t];
    n++;
  }
  *loss = n ? sum / (double)n : 0.0;
  *count = n;
  return 0;
}

void ntp_cpu_cross_entropy_grad(const float *logits, const int32_t *targets, float g, float *dlogits, int64_t rows,
                                int64_t v, int64_t ignore) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; r++) n += targets[r] != ignore && targets[r] >= 0 && targets[r] < v;
  double scale = n ? (double)g / (double)n : 0.0;
#pragma omp parallel for schedule(static) if (rows * v >= PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *l = logits + r * v;
    float *o = dlogits + r * v;
    int64_t t = targets[r];
    if (t == ignore || t < 0 || t >= v) {
      memset(o, 0, (size_t)v * sizeof *o);
      continue;
    }
    double mx = -INFINITY, se = 0;
    for (int64_t i = 0; i < v; i++)
      if (l[i] > mx) mx = l[i];
    for (int64_t i = 0; i < v; i++) se += (o[i] = (float)exp((double)l[i] - mx)); /* e^(l - max) <= 1: fp32 holds it */
    for (int64_t i = 0; i < v; i++) o[i] = (float)(((double)o[i] / se - (i == t)) * scale);
  }
}
