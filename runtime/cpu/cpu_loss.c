/* cpu_loss.c — the CPU kernels of the vocabulary-parallel loss (compiler/shard/shard_loss.c):
 * each rank's statistics of its slice of the vocabulary, a row block's loss from its ranks'
 * statistics, the mean over the blocks, and their vector-Jacobian products. Sums in double. */
#include "cpu_kernels.h"

#include <math.h>
#include <string.h>

enum { PAR_MIN = NTP_CPU_PAR_MIN };

static bool held(int64_t t, int64_t ignore, int64_t lo, int64_t v) { return t != ignore && t >= lo && t < lo + v; }

void ntp_cpu_ce_stats(const float *logits, const int32_t *targets, float *stats, int64_t rows, int64_t v, int64_t lo,
                      int64_t ignore) {
#pragma omp parallel for schedule(static) if (rows * v >= PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *l = logits + r * v;
    double mx = -INFINITY, se = 0;
    for (int64_t i = 0; i < v; i++)
      if (l[i] > mx) mx = l[i];
    for (int64_t i = 0; i < v; i++) se += exp((double)l[i] - mx);
    bool h = held(targets[r], ignore, lo, v);
    float *o = stats + 4 * r;
    o[0] = (float)mx;
    o[1] = (float)se;
    o[2] = h ? l[targets[r] - lo] : 0.0f;
    o[3] = h ? 1.0f : 0.0f;
  }
}

/* a row's logsumexp over its t ranks' statistics, and the factor each rank's sum enters it with */
static double row_lse(const float *g, int64_t t, double *max_out, double *sum_out) {
  double mx = -INFINITY, s = 0;
  for (int64_t k = 0; k < t; k++)
    if (g[4 * k] > mx) mx = g[4 * k];
  for (int64_t k = 0; k < t; k++) s += (double)g[4 * k + 1] * exp((double)g[4 * k] - mx);
  *max_out = mx;
  *sum_out = s;
  return mx + log(s);
}

void ntp_cpu_ce_rows(const float *stats, const int32_t *targets, float *part, int64_t rows, int64_t t, int64_t ignore) {
  double sum = 0;
  int64_t n = 0;
  bool bad = false;
  for (int64_t r = 0; r < rows; r++) {
    if (targets[r] == ignore) continue;
    const float *g = stats + r * 4 * t;
    double mx, s, tl = 0, h = 0;
    double lse = row_lse(g, t, &mx, &s);
    for (int64_t k = 0; k < t; k++) tl += g[4 * k + 2], h += g[4 * k + 3];
    bad |= h != 1.0; /* a target no rank holds: outside the vocabulary */
    sum += lse - tl;
    n++;
  }
  part[0] = bad ? NAN : (float)sum;
  part[1] = (float)n;
}

float ntp_cpu_ce_mean(const float *parts, int64_t blocks) {
  double s = 0, n = 0;
  for (int64_t j = 0; j < blocks; j++) s += parts[2 * j], n += parts[2 * j + 1];
  return n > 0 ? (float)(s / n) : 0.0f;
}

void ntp_cpu_ce_stats_grad(const float *logits, const int32_t *targets, const float *dstats, float *dlogits,
                           int64_t rows, int64_t v, int64_t lo, int64_t ignore) {
#pragma omp parallel for schedule(static) if (rows * v >= PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *l = logits + r * v;
    float *o = dlogits + r * v;
    double mx = -INFINITY, ds = dstats[4 * r + 1];
    for (int64_t i = 0; i < v; i++)
      if (l[i] > mx) mx = l[i];
    /* the max only shifts the sum: the loss does not depend on it (its gradient is 0) */
    for (int64_t i = 0; i < v; i++) o[i] = (float)(ds * exp((double)l[i] - mx));
    if (held(targets[r], ignore, lo, v)) o[targets[r] - lo] = (float)((double)o[targets[r] - lo] + dstats[4 * r + 2]);
  }
}

void ntp_cpu_ce_rows_grad(const float *stats, const int32_t *targets, const float *dpart, float *dstats, int64_t rows,
                          int64_t t, int64_t ignore) {
  double g0 = dpart[0];
  for (int64_t r = 0; r < rows; r++) {
    float *o = dstats + r * 4 * t;
    memset(o, 0, (size_t)(4 * t) * sizeof *o);
    if (targets[r] == ignore) continue;
    const float *g = stats + r * 4 * t;
    double mx, s;
    row_lse(g, t, &mx, &s);
    for (int64_t k = 0; k < t; k++) {
      o[4 * k + 1] = (float)(g0 * exp((double)g[4 * k] - mx) / s); /* d lse / d sum_k */
      o[4 * k + 2] = (float)-g0;
    }
  }
}

void ntp_cpu_ce_count(const int32_t *targets, float *out, int64_t rows, int64_t ignore) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; r++) n += targets[r] != ignore;
  out[0] = 0.0f;
  out[1] = (float)n;
}

/* As ce_mean_grad's with a gradient of 1: the same float. */
void ntp_cpu_ce_seed(const float *counts, float *out, int64_t n_counts) {
  double n = 0;
  for (int64_t j = 0; j < n_counts; j++) n += counts[2 * j + 1];
  out[0] = n > 0 ? (float)(1.0 / n) : 0.0f;
  out[1] = 0.0f;
}

void ntp_cpu_ce_mean_grad(const float *parts, float dloss, float *dparts, int64_t blocks) {
  double n = 0;
  for (int64_t j = 0; j < blocks; j++) n += parts[2 * j + 1];
  for (int64_t j = 0; j < blocks; j++) {
    dparts[2 * j] = n > 0 ? (float)((double)dloss / n) : 0.0f;
    dparts[2 * j + 1] = 0.0f;
  }
}
