/* goodput_run.c — the run over weeks behind `ntpc goodput` (docs/goodput.md): GPUs fail, are
 * repaired and slow down, drawn from a seeded process; each policy stops (a restart) or
 * reconfigures live when an event touches what it runs, and the time at each configuration's
 * throughput adds up to its throughput, goodput and the spare domains it would need. The
 * policies themselves are goodput.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "goodput.h"

double gp_mean_repair_h(const gp_failures *f) {
  return f->hw_frac * 0.5 * (f->hw_min_h + f->hw_max_h) + (1 - f->hw_frac) * f->sw_h;
}

double gp_steady_fraction(const gp_failures *f) {
  double x = f->rate_per_gpu_h * gp_mean_repair_h(f);
  return x / (1 + x);
}

double gp_rate_for_fraction(const gp_failures *f, double frac) {
  return frac / ((1 - frac) * gp_mean_repair_h(f));
}

/* splitmix64: a small, well-mixed generator; the run is a function of the seed */
static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double uniform01(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }
static int32_t below(uint64_t *s, int32_t n) { return (int32_t)(uniform01(s) * n); }

typedef struct pending {
  double at; /* hours */
  int32_t gpu;
} pending;

typedef enum { EV_FAIL, EV_REPAIR, EV_SLOW, EV_FAST, EV_END } event_kind;

/* The cluster's state as the run goes: which GPUs are down or slow, and the events to come. */
typedef struct cluster {
  const gp_config *c;
  int32_t N, G, ndown, nrep, nfast;
  uint8_t *down;
  float *factor;    /* per GPU: 1, or its slowdown */
  int32_t *lost;    /* per group */
  double *slow;     /* per group: its slowest up GPU's factor */
  bool slow_changed; /* by the last event */
  pending *rep;     /* repairs to come */
  pending *fast;    /* slowdowns' ends to come */
} cluster;

static bool cluster_new(cluster *k, const gp_config *c) {
  *k = (cluster){.c = c, .N = c->gpus, .G = gp_groups(c)};
  k->down = calloc((size_t)k->N, 1);
  k->factor = malloc((size_t)k->N * sizeof *k->factor);
  k->lost = calloc((size_t)k->G, sizeof *k->lost);
  k->slow = malloc((size_t)k->G * sizeof *k->slow);
  k->rep = malloc((size_t)k->N * sizeof *k->rep);
  k->fast = malloc((size_t)k->N * sizeof *k->fast);
  if (!k->down || !k->factor || !k->lost || !k->slow || !k->rep || !k->fast) return false;
  for (int32_t i = 0; i < k->N; i++) k->factor[i] = 1;
  for (int32_t g = 0; g < k->G; g++) k->slow[g] = 1;
  return true;
}

static void cluster_free(cluster *k) {
  free(k->down), free(k->factor), free(k->lost), free(k->slow), free(k->rep), free(k->fast);
}

static void group_slow(cluster *k, int32_t g) {
  double f = 1;
  for (int32_t i = g * k->c->tp; i < (g + 1) * k->c->tp; i++)
    if (!k->down[i] && k->factor[i] > f) f = k->factor[i];
  k->slow_changed = k->slow[g] != f;
  k->slow[g] = f;
}

static int32_t earliest(const pending *p, int32_t n) {
  int32_t e = -1;
  for (int32_t i = 0; i < n; i++)
    if (e < 0 || p[i].at < p[e].at) e = i;
  return e;
}

/* The next event after t (at most t1): a failure or a slowdown of an up GPU, a repair, or the end
 * of a slowdown; applied to the cluster. The GPU in *gpu, the time in *t. Failures draw from the
 * generator exactly as before stragglers were modelled, so a run without them is unchanged. */
static event_kind next_event(cluster *k, const gp_failures *f, uint64_t *rng, double *t, double t1, int32_t *gpu) {
  double up = k->N - k->ndown, rate = f->rate_per_gpu_h * up;
  double tf = rate > 0 ? *t - log(1 - uniform01(rng)) / rate : INFINITY;
  double srate = f->slow_rate_per_gpu_h * up;
  double ts = srate > 0 ? *t - log(1 - uniform01(rng)) / srate : INFINITY;
  int32_t ir = earliest(k->rep, k->nrep), ie = earliest(k->fast, k->nfast);
  double tr = ir >= 0 ? k->rep[ir].at : INFINITY, te = ie >= 0 ? k->fast[ie].at : INFINITY;
  double at = fmin(fmin(tf, ts), fmin(tr, te));
  if (at >= t1) {
    *t = t1;
    return EV_END;
  }
  *t = at;
  if (at == tr) {
    *gpu = k->rep[ir].gpu;
    k->rep[ir] = k->rep[--k->nrep];
    k->down[*gpu] = 0, k->ndown--, k->lost[*gpu / k->c->tp]--;
    group_slow(k, *gpu / k->c->tp);
    return EV_REPAIR;
  }
  if (at == te) {
    *gpu = k->fast[ie].gpu;
    k->fast[ie] = k->fast[--k->nfast];
    k->factor[*gpu] = 1;
    group_slow(k, *gpu / k->c->tp);
    return EV_FAST;
  }
  do *gpu = below(rng, k->N);
  while (k->down[*gpu]);
  if (at == tf) {
    k->down[*gpu] = 1, k->ndown++, k->lost[*gpu / k->c->tp]++;
    double h = uniform01(rng) < f->hw_frac ? f->hw_min_h + (f->hw_max_h - f->hw_min_h) * uniform01(rng) : f->sw_h;
    k->rep[k->nrep++] = (pending){at + h, *gpu};
    group_slow(k, *gpu / k->c->tp);
    return EV_FAIL;
  }
  /* a slowdown: by a factor uniform in the range, for a time log-uniform in its range (minutes
   * to hours); a GPU already slow takes the new slowdown in place of the old */
  double x = f->slow_min + (f->slow_max - f->slow_min) * uniform01(rng);
  double h = f->slow_min_h * exp(log(f->slow_max_h / f->slow_min_h) * uniform01(rng));
  int32_t i = 0;
  while (i < k->nfast && k->fast[i].gpu != *gpu) i++;
  if (i == k->nfast) k->nfast++;
  k->fast[i] = (pending){at + h, *gpu};
  k->factor[*gpu] = (float)x;
  group_slow(k, *gpu / k->c->tp);
  return EV_SLOW;
}

typedef struct policy_run {
  int32_t *cfg;        /* the failure state its configuration was chosen for */
  gp_state_eval e;     /* what it runs now (stragglers included) */
  double paused_until; /* hours */
  double work, run;    /* throughput x hours: less the pauses and redone work, and not */
  double *spare_h;     /* hours at each number of spare domains */
} policy_run;

/* Whether the event stops policy p (a restart, or a live reconfiguration): a failure of a GPU it
 * runs; a repair, only the live policies (the others take the GPU back at their next restart);
 * a slowdown or its end, only ntp-3d (the others do not see stragglers). */
static bool stops(const gp_config *c, gp_policy p, const policy_run *r, const int32_t *lost, event_kind ev, int32_t g) {
  switch (ev) {
  case EV_FAIL: return gp_in_use(c, p, r->cfg, r->e.degree, g);
  case EV_REPAIR: return gp_policy_live(p) && gp_in_use(c, p, lost, r->e.degree, g);
  case EV_SLOW:
  case EV_FAST: return p == GP_NTP_3D && gp_in_use(c, p, lost, r->e.degree, g);
  default: return false;
  }
}

/* The pause and the work redone of a stop at t (measured from t0, the run ending at t1). */
static void charge_stop(policy_run *r, gp_policy p, event_kind ev, const gp_costs *k, double before, double t,
                        double t0, double t1, gp_run_result *out) {
  bool live = gp_policy_live(p);
  double notice = ev == EV_FAIL || ev == EV_SLOW ? k->detect_s : 0;
  double pause_h = live ? (notice + k->resume_s) / 3600 : k->restart_s / 3600, redo_h = live ? 0 : k->ckpt_s / 2 / 3600;
  /* redone: what ran since the last resume, at most (at `before`: only a stop changes a
   * restart-based policy's configuration); paused: the part of [t, t + pause) not paused already */
  double since = t > r->paused_until ? t - (r->paused_until > t0 ? r->paused_until : t0) : 0;
  if (redo_h > since) redo_h = since;
  double end = t + pause_h < t1 ? t + pause_h : t1, from = r->paused_until > t ? r->paused_until : t;
  pause_h = end > from ? end - from : 0;
  if (end > r->paused_until) r->paused_until = end;
  r->work -= before * redo_h;
  out->stops[p]++;
  out->paused_h[p] += pause_h + redo_h;
}

static void spare_quantiles(const double *hours, int32_t n, double span, int32_t *max, int32_t *p99) {
  double sum = 0;
  *max = *p99 = 0;
  for (int32_t s = 0; s <= n; s++) {
    if (hours[s] > 0) *max = s;
    if (sum < 0.99 * span * (1 - 1e-12)) *p99 = s;
    sum += hours[s];
  }
}

bool gp_simulate(const gp_config *c, const gp_failures *f, const gp_costs *k, double days, double burn_days,
                 uint64_t seed, gp_run_result *out) {
  memset(out, 0, sizeof *out);
  int32_t ND = c->gpus / c->domain;
  cluster cl;
  policy_run pr[GP_NPOLICIES] = {{0}};
  bool ok = cluster_new(&cl, c);
  for (int p = 0; ok && p < GP_NPOLICIES; p++)
    ok = (pr[p].cfg = calloc((size_t)cl.G, sizeof(int32_t))) && (pr[p].spare_h = calloc((size_t)ND + 1, sizeof(double)));
  for (int p = 0; ok && p < GP_NPOLICIES; p++) ok = (pr[p].e = gp_evaluate(c, (gp_policy)p, cl.lost)).replicas >= 0;
  double t0 = burn_days * 24, t1 = (burn_days + days) * 24, t = 0, failed_h = 0;
  uint64_t rng = seed;
  while (ok && t < t1) {
    double from_t = t;
    int32_t gpu = -1;
    event_kind ev = next_event(&cl, f, &rng, &t, t1, &gpu);
    /* the interval [from_t, t) at the running configurations, measured where it is after the burn-in */
    double a = from_t > t0 ? from_t : t0, dt = t > a ? t - a : 0;
    for (int p = 0; p < GP_NPOLICIES; p++) { /* paused: no work */
      double from = pr[p].paused_until > a ? pr[p].paused_until : a, run = t > from ? t - from : 0;
      pr[p].work += pr[p].e.throughput * (run < dt ? run : dt), pr[p].run += pr[p].e.throughput * dt;
      int32_t sd = gp_state_spares(c, &pr[p].e);
      pr[p].spare_h[sd < ND ? sd : ND] += dt;
    }
    /* the failed fraction over the interval: the events since have changed ndown by at most one */
    double nd = cl.ndown - (ev == EV_FAIL) + (ev == EV_REPAIR);
    failed_h += nd / cl.N * dt;
    if (nd / cl.N > out->max_failed_frac && t > t0) out->max_failed_frac = nd / cl.N;
    if (ev == EV_END) break;
    bool measuring = t >= t0;
    out->failures += measuring && ev == EV_FAIL, out->repairs += measuring && ev == EV_REPAIR;
    out->slowdowns += measuring && ev == EV_SLOW;
    int32_t g = gpu / c->tp;
    for (int p = 0; ok && p < GP_NPOLICIES; p++) {
      double before = pr[p].e.throughput;
      bool stop = stops(c, (gp_policy)p, &pr[p], cl.lost, ev, g);
      if (stop) memcpy(pr[p].cfg, cl.lost, (size_t)cl.G * sizeof *cl.lost);
      /* every policy's rate follows the stragglers; its configuration changes only at a stop: where
       * neither changed, its rate is what it was */
      if (stop || cl.slow_changed) pr[p].e = gp_evaluate_slow(c, (gp_policy)p, pr[p].cfg, cl.slow);
      ok = pr[p].e.replicas >= 0;
      if (stop && measuring) charge_stop(&pr[p], (gp_policy)p, ev, k, before, t, t0, t1, out);
    }
  }
  double span = t1 - t0;
  out->hours = span;
  out->mean_failed_frac = span > 0 ? failed_h / span : 0;
  for (int p = 0; ok && p < GP_NPOLICIES; p++) {
    out->throughput[p] = span > 0 ? pr[p].run / span : 0;
    out->goodput[p] = span > 0 ? pr[p].work / span : 0;
    spare_quantiles(pr[p].spare_h, ND, span, &out->spares_max[p], &out->spares_p99[p]);
  }
  for (int p = 0; p < GP_NPOLICIES; p++) free(pr[p].cfg), free(pr[p].spare_h);
  cluster_free(&cl);
  return ok;
}

bool gp_static_loss(const gp_config *c, double frac, int32_t samples, uint64_t seed, double *out, int32_t *spares) {
  int32_t N = c->gpus, G = gp_groups(c), nf = (int32_t)llround(frac * N);
  uint8_t *down = malloc((size_t)N);
  int32_t *lost = malloc((size_t)G * sizeof *lost);
  bool ok = down && lost && nf <= N;
  uint64_t rng = seed;
  for (int p = 0; p < GP_NPOLICIES; p++) {
    out[p] = 0;
    if (spares) spares[p] = 0;
  }
  for (int32_t s = 0; ok && s < samples; s++) {
    memset(down, 0, (size_t)N);
    memset(lost, 0, (size_t)G * sizeof *lost);
    for (int32_t i = 0; i < nf; i++) {
      int32_t gpu;
      do gpu = below(&rng, N);
      while (down[gpu]);
      down[gpu] = 1;
      lost[gpu / c->tp]++;
    }
    for (int p = 0; ok && p < GP_NPOLICIES; p++) {
      gp_state_eval e = gp_evaluate(c, (gp_policy)p, lost);
      ok = e.replicas >= 0;
      out[p] += e.throughput / samples;
      int32_t sd = gp_spare_domains(c, e.throughput);
      if (spares && sd > spares[p]) spares[p] = sd;
    }
  }
  free(down), free(lost);
  return ok;
}
