/* costs.c — primitive costs (GEMM, streaming, attention, collectives) on a device profile, and
 * placements: their rows, their text. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "planner_internal.h"

double pl_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ======================================================================================
 * primitive costs
 * ====================================================================================== */

double plan_curve_at(const plan_curve *c, double x) {
  if (!c || c->n == 0) return 1;
  if (x <= c->x[0]) return c->y[0];
  if (x >= c->x[c->n - 1]) return c->y[c->n - 1];
  int i = 0;
  while (i + 1 < c->n && x >= c->x[i + 1]) i++;
  double a = log2(c->x[i]), b = log2(c->x[i + 1]), t = (log2(x) - a) / (b - a);
  return c->y[i] + t * (c->y[i + 1] - c->y[i]);
}

static double peak_flops(const plan_profile *p, ntp_dtype dt) {
  if (p->flops[dt] > 0) return p->flops[dt];
  if (dt == NTP_BF16 && p->flops[NTP_FP16] > 0) return p->flops[NTP_FP16];
  if (dt == NTP_FP16 && p->flops[NTP_BF16] > 0) return p->flops[NTP_BF16];
  double best = 0; /* a dtype the profile does not give: the slowest rate it gives */
  for (int i = 0; i < NTP_DTYPE_COUNT; i++)
    if (p->flops[i] > 0 && (best == 0 || p->flops[i] < best)) best = p->flops[i];
  return best > 0 ? best : 1e12;
}

static double mem_rate(const plan_profile *p) { return p->mem_bw * p->mem_eff; }

double plan_gemm_time(const plan_profile *p, ntp_dtype dt, double M, double N, double K) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  double mn = M < N ? M : N;
  if (K < mn) mn = K;
  double eff = plan_curve_at(&p->gemm_eff, mn);
  double tc = 2 * M * N * K / (peak_flops(p, dt) * eff);
  double tm = (M * K + N * K + M * N) * (double)dtype_bytes(dt) / mem_rate(p);
  return p->launch + (tc > tm ? tc : tm);
}

double plan_stream_time(const plan_profile *p, double bytes) {
  if (bytes <= 0) return 0;
  return p->launch + bytes / mem_rate(p);
}

double plan_attention_time(const plan_profile *p, ntp_dtype dt, double b, double hq, double hk, double S, double HD,
                           bool causal) {
  if (b <= 0 || hq <= 0) return 0;
  double flops = 4 * b * hq * S * S * HD * (causal ? 0.5 : 1.0);
  double tc = flops / (peak_flops(p, dt) * p->attn_eff);
  double tm = b * S * (2 * hq + 2 * hk) * HD * (double)dtype_bytes(dt) / mem_rate(p);
  return p->launch + (tc > tm ? tc : tm);
}

double plan_coll_time(const plan_profile *p, plan_level lv, plan_coll c, double msg_bytes, double bytes_per_rank) {
  if (bytes_per_rank <= 0) return 0;
  double eff = plan_curve_at(&p->eff[lv][c], msg_bytes);
  return p->lat[lv][c] + bytes_per_rank / (p->link_bw[lv] * eff);
}

double plan_allreduce_time(const plan_profile *p, plan_level lv, int n, double bytes) {
  if (n <= 1) return 0;
  return plan_coll_time(p, lv, COMM_ALL_REDUCE, bytes, 2.0 * (n - 1) / n * bytes);
}

/* ======================================================================================
 * placements
 * ====================================================================================== */

plan_place plan_place_balanced(int32_t w, int32_t k, bool sp) {
  plan_place pl = {.ngroups = k, .sp = sp};
  for (int32_t g = 0; g < k; g++) {
    int64_t lo, hi;
    split_range(w, k, g, &lo, &hi);
    pl.size[g] = (int32_t)(hi - lo);
  }
  return pl;
}

int32_t pl_place_max(const plan_place *pl) {
  int32_t t = 0;
  for (int g = 0; g < pl->ngroups; g++)
    if (pl->size[g] > t) t = pl->size[g];
  return t;
}

static bool place_equal_groups(const plan_place *pl) {
  for (int g = 1; g < pl->ngroups; g++)
    if (pl->size[g] != pl->size[0]) return false;
  return true;
}

bool pl_place_same_groups(const plan_place *a, const plan_place *b) {
  if (a->ngroups != b->ngroups) return false;
  for (int g = 0; g < a->ngroups; g++)
    if (a->size[g] != b->size[g] || (a->share[0] ? a->share[g] : a->size[g]) != (b->share[0] ? b->share[g] : b->size[g]))
      return false;
  return true;
}

/* rows of each group for a batch of `rows`: shares, else group sizes (shard_split_rows) */
void pl_place_rows(const plan_place *pl, int64_t rows, int64_t *row_start) {
  int64_t shares[NTP_MAX_GROUPS] = {0};
  for (int g = 0; g < pl->ngroups; g++) shares[g] = pl->share[0] ? pl->share[g] : pl->size[g];
  shard_split_rows(rows, shares, pl->ngroups, row_start);
}

bool pl_default_shares(const plan_place *pl, int64_t rows) {
  if (!pl->share[0]) return true;
  plan_place d = *pl;
  d.share[0] = 0;
  int64_t a[NTP_MAX_GROUPS + 1], b[NTP_MAX_GROUPS + 1];
  pl_place_rows(pl, rows, a);
  pl_place_rows(&d, rows, b);
  return memcmp(a, b, (size_t)(pl->ngroups + 1) * sizeof a[0]) == 0;
}

static void list_str(char *buf, size_t cap, const char *what, const int64_t *v, int n) {
  size_t len = strlen(buf);
  snprintf(buf + len, cap > len ? cap - len : 0, "%s(", what);
  for (int i = 0; i < n; i++) {
    len = strlen(buf);
    snprintf(buf + len, cap > len ? cap - len : 0, "%s%lld", i ? ", " : "", (long long)v[i]);
  }
  len = strlen(buf);
  snprintf(buf + len, cap > len ? cap - len : 0, ")");
}

const char *pl_place_str_rows(const plan_place *pl, int64_t rows, char *buf, size_t cap) {
  buf[0] = 0;
  if (place_equal_groups(pl)) {
    snprintf(buf, cap, "tp %d", pl->size[0]);
  } else {
    int64_t v[NTP_MAX_GROUPS];
    for (int g = 0; g < pl->ngroups; g++) v[g] = pl->size[g];
    list_str(buf, cap, "tp ", v, pl->ngroups);
  }
  if (pl->share[0] && (rows <= 0 || !pl_default_shares(pl, rows))) {
    size_t len = strlen(buf);
    snprintf(buf + len, cap > len ? cap - len : 0, ", ");
    list_str(buf, cap, "batch ", pl->share, pl->ngroups);
  }
  if (pl->sp) {
    size_t len = strlen(buf);
    snprintf(buf + len, cap > len ? cap - len : 0, ", sequence_parallel");
  }
  if (pl->rc) {
    size_t len = strlen(buf);
    snprintf(buf + len, cap > len ? cap - len : 0, ", recompute");
  }
  return buf;
}

const char *plan_place_str(const plan_place *pl, char *buf, size_t cap) { return pl_place_str_rows(pl, -1, buf, cap); }

/* A step's model FLOPs, the way MFU is usually counted (PaLM, Megatron without recomputation):
 * 2 x parameters x tokens forward (every parameter element one multiply-add per token: the
 * embedding table counts once, as the tied head's GEMM), plus each attention core's
 * 4 x rows x S^2 x heads x head size (causal or not), and a training step three times that (the
 * backward's two GEMMs per forward one). Recomputation is not counted: it is overhead. */
double plan_model_flops(const plan_model *pm, bool train) {
  const ir_module *m = pm->m;
  double params = 0, attn = 0;
  for (size_t i = 0; i < m->n_ops; i++) {
    const ir_op *op = &m->ops[i];
    if (op->code == IR_PARAM) params += (double)shape_numel(&m->values[op->result].shape);
    if (op->code == IR_ATTENTION) { /* its result: [rows, S, heads, head size] */
      const ntp_shape *q = &m->values[op->result].shape;
      if (q->ndim == 4) attn += 4.0 * (double)q->dim[0] * (double)q->dim[1] * (double)q->dim[1] * (double)q->dim[2] * (double)q->dim[3];
    }
  }
  double fwd = 2.0 * params * (double)pm->tokens + attn;
  return train ? 3 * fwd : fwd;
}

/* model FLOPs per second over the GPUs' dense peak in the model's dtype */
double plan_mfu(const plan_model *pm, const plan_solution *s, const plan_profile *prof) {
  double peak = prof->flops[pm->m->dtype];
  if (!(peak > 0) || !(s->step_s > 0) || s->world < 1) return 0;
  return plan_model_flops(pm, s->train) / s->step_s / (s->world * peak);
}
