/* goodput.c — the failure simulation behind `ntpc goodput` (docs/goodput.md): what each policy
 * runs for a set of failed GPUs, the best whole-micro-batch split of the global batch over
 * replicas of different speeds, and an event-driven run of failures and repairs over weeks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "goodput.h"

const char *gp_policy_name(gp_policy p) {
  static const char *const n[] = {"dp-drop", "uniform", "two-degree", "ntp"};
  return (unsigned)p < GP_NPOLICIES ? n[p] : "?";
}

const char *gp_policy_title(gp_policy p) {
  static const char *const n[] = {
      "drop every replica that lost a GPU (restart)",
      "restart at the best uniform TP degree",
      "restart, degraded groups at one lower degree (Megatron NTP)",
      "re-plan each degraded group per layer, live (ntp)",
  };
  return (unsigned)p < GP_NPOLICIES ? n[p] : "?";
}

const char *gp_config_check(const gp_config *c) {
  if (c->domain < 1 || c->domain > GP_MAX_DOMAIN) return "the domain size must be 1 to 1024 GPUs";
  if (c->tp < 1 || c->tp > c->domain || c->domain % c->tp) return "the TP degree must divide the domain size";
  if (c->gpus < c->domain || c->gpus % c->domain) return "the cluster must be whole domains";
  if (c->pp < 1 || gp_groups(c) % c->pp) return "the pipeline depth must divide the number of TP groups";
  if (c->micro < 0) return "micro-batches per replica: 0 (the batch divides freely) or more";
  if (c->max_lost < 0 || c->max_lost >= c->tp) return "a group can lose 0 to tp-1 GPUs";
  if (!(c->tau_ntp[c->tp] > 0)) return "no plan fits the healthy TP group";
  /* fewer GPUs are never faster: the healthy group could run the smaller group's plan and leave
   * the rest idle, so a table that says otherwise would price a failure as a gain */
  for (int32_t t = c->tp - c->max_lost; t < c->tp; t++)
    if ((c->tau_ntp[t] > 0 && c->tau_ntp[t] < c->tau_ntp[c->tp]) ||
        (c->tau_uni[t] > 0 && c->tau_uni[t] < c->tau_ntp[c->tp]))
      return "a degraded group's step is priced below the healthy group's (the healthy group can run its plan)";
  return NULL;
}

/* ------------------------------- the batch over replicas ------------------------------- */

static int64_t mb_done(int32_t n, const int32_t *count, const double *tau, double S) {
  int64_t s = 0;
  /* S is m tau[j] for some class: the tolerance keeps floor(m tau / tau) at m */
  for (int32_t k = 0; k < n; k++)
    if (count[k] > 0 && tau[k] > 0) s += (int64_t)count[k] * (int64_t)floor(S / tau[k] * (1 + 1e-12));
  return s;
}

double gp_step_time(int32_t n, const int32_t *count, const double *tau, int64_t total) {
  /* the optimum is a whole number of some class's micro-batches: per class the least m whose
   * m tau[j] lets every replica together take `total`, then the least of those */
  double best = 0;
  for (int32_t j = 0; j < n; j++) {
    if (count[j] <= 0 || !(tau[j] > 0)) continue;
    int64_t lo = 1, hi = (total + count[j] - 1) / count[j]; /* this class alone takes all at hi */
    if (hi < 1) hi = 1;
    while (lo < hi) {
      int64_t mid = lo + (hi - lo) / 2;
      if (mb_done(n, count, tau, (double)mid * tau[j]) >= total) hi = mid;
      else lo = mid + 1;
    }
    double S = (double)lo * tau[j];
    if (best == 0 || S < best) best = S;
  }
  return best;
}

/* ------------------------------- a policy for a failure state ------------------------------- */

static int32_t groups_per_domain(const gp_config *c) { return c->domain / c->tp; }

static int32_t domain_lost(const gp_config *c, const int32_t *lost, int32_t d) {
  int32_t s = 0, k = groups_per_domain(c);
  for (int32_t g = d * k; g < (d + 1) * k; g++) s += lost[g];
  return s;
}

static bool kept(const gp_config *c, const double *tau, int32_t lost) {
  return lost == 0 || (lost <= c->max_lost && tau[c->tp - lost] > 0);
}

static double healthy_step(const gp_config *c) { return c->micro * c->tau_ntp[c->tp]; }

static gp_state_eval finish(const gp_config *c, int32_t n, const int32_t *count, const double *tau, int32_t degraded,
                            int32_t degree) {
  gp_state_eval e = {.degraded = degraded, .degree = degree};
  for (int32_t j = 0; j < n; j++) e.replicas += count[j];
  if (!c->micro) { /* shares in proportion to speed: every replica's rate adds up */
    for (int32_t j = 0; j < n; j++)
      if (count[j] > 0 && tau[j] > 0) e.throughput += count[j] * c->tau_ntp[c->tp] / tau[j];
    e.throughput /= gp_replicas(c);
    return e;
  }
  double S = gp_step_time(n, count, tau, (int64_t)gp_replicas(c) * c->micro);
  e.throughput = S > 0 ? healthy_step(c) / S : 0;
  return e;
}

static gp_state_eval eval_dp_drop(const gp_config *c, const int32_t *lost) {
  int32_t alive = 0;
  for (int32_t r = 0; r < gp_replicas(c); r++) {
    bool ok = true;
    for (int32_t g = r * c->pp; g < (r + 1) * c->pp; g++) ok = ok && lost[g] == 0;
    alive += ok;
  }
  double tau = c->tau_ntp[c->tp];
  return finish(c, 1, &alive, &tau, 0, c->tp);
}

static gp_state_eval eval_uniform(const gp_config *c, const int32_t *lost) {
  gp_state_eval best = {.degree = c->tp};
  int32_t nd = c->gpus / c->domain;
  /* from the healthy degree down to what a kept group has left (docs/goodput.md) */
  for (int32_t u = c->tp - c->max_lost; u <= c->tp; u++) {
    double tau = u == c->tp ? c->tau_ntp[u] : c->tau_uni[u];
    if (!(tau > 0)) continue;
    int64_t groups = 0;
    /* no more groups a domain than the healthy plan's: more replicas would be a larger batch */
    for (int32_t d = 0; d < nd; d++) {
      int32_t fit = (c->domain - domain_lost(c, lost, d)) / u;
      groups += fit < groups_per_domain(c) ? fit : groups_per_domain(c);
    }
    int32_t reps = (int32_t)(groups / c->pp);
    gp_state_eval e = finish(c, 1, &reps, &tau, 0, u);
    if (e.throughput > best.throughput) best = e;
  }
  return best;
}

static gp_state_eval eval_two_degree(const gp_config *c, const int32_t *lost) {
  int32_t G = gp_groups(c), healthy = 0, deg = 0, s = 0;
  for (int32_t g = 0; g < G; g++) {
    if (lost[g] == 0) healthy++;
    else if (kept(c, c->tau_uni, lost[g])) deg++, s = lost[g] > s ? lost[g] : s;
  }
  /* every degraded group runs at the lowest degree any of them needs (Megatron pads the
   * others to it), packed into as few replicas as possible at the restart */
  int32_t reps = (healthy + deg) / c->pp, dreps = (deg + c->pp - 1) / c->pp;
  if (dreps > reps) dreps = reps;
  int32_t count[2] = {reps - dreps, dreps};
  double tau[2] = {c->tau_ntp[c->tp], s ? c->tau_uni[c->tp - s] : 0};
  return finish(c, 2, count, tau, dreps, c->tp);
}

static int cmp_desc(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x < y) - (x > y);
}

static gp_state_eval eval_ntp(const gp_config *c, const int32_t *lost) {
  int32_t G = gp_groups(c), healthy = 0, deg = 0;
  double *t = malloc((size_t)G * sizeof *t);
  int32_t *count = malloc((size_t)(G + 1) * sizeof *count);
  double *tau = malloc((size_t)(G + 1) * sizeof *tau);
  if (!t || !count || !tau) {
    free(t), free(count), free(tau);
    return (gp_state_eval){.replicas = -1};
  }
  for (int32_t g = 0; g < G; g++) {
    if (lost[g] == 0) healthy++;
    else if (kept(c, c->tau_ntp, lost[g])) t[deg++] = c->tau_ntp[c->tp - lost[g]];
  }
  /* each degraded group at its own size, slowest first, pp to a replica (a replica runs at its
   * slowest stage), the last filled with healthy groups */
  qsort(t, (size_t)deg, sizeof *t, cmp_desc);
  int32_t n = 0, reps = (healthy + deg) / c->pp, dreps = 0;
  for (int32_t i = 0; i < deg && dreps < reps; i += c->pp, dreps++) {
    if (n && tau[n - 1] == t[i]) count[n - 1]++;
    else count[n] = 1, tau[n++] = t[i];
  }
  count[n] = reps - dreps, tau[n++] = c->tau_ntp[c->tp];
  gp_state_eval e = finish(c, n, count, tau, dreps, c->tp);
  free(t), free(count), free(tau);
  return e;
}

gp_state_eval gp_evaluate(const gp_config *c, gp_policy p, const int32_t *lost) {
  switch (p) {
  case GP_DP_DROP: return eval_dp_drop(c, lost);
  case GP_UNIFORM: return eval_uniform(c, lost);
  case GP_TWO_DEGREE: return eval_two_degree(c, lost);
  default: return eval_ntp(c, lost);
  }
}

bool gp_in_use(const gp_config *c, gp_policy p, const int32_t *cfg_lost, int32_t degree, int32_t g) {
  switch (p) {
  case GP_DP_DROP: {
    int32_t r = g / c->pp;
    for (int32_t h = r * c->pp; h < (r + 1) * c->pp; h++)
      if (cfg_lost[h]) return false;
    return true;
  }
  case GP_UNIFORM: {
    int32_t d = g / groups_per_domain(c);
    return (c->domain - domain_lost(c, cfg_lost, d)) / degree > 0;
  }
  case GP_TWO_DEGREE: return kept(c, c->tau_uni, cfg_lost[g]);
  default: return kept(c, c->tau_ntp, cfg_lost[g]);
  }
}

/* ---------------------------------- the failure process ---------------------------------- */

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

typedef struct policy_run {
  int32_t *cfg;     /* the failure state its configuration was chosen for */
  gp_state_eval e;
} policy_run;

bool gp_simulate(const gp_config *c, const gp_failures *f, const gp_costs *k, double days, double burn_days,
                 uint64_t seed, gp_run_result *out) {
  memset(out, 0, sizeof *out);
  int32_t N = c->gpus, G = gp_groups(c);
  uint8_t *down = calloc((size_t)N, 1);
  int32_t *lost = calloc((size_t)G, sizeof *lost);
  pending *rep = malloc((size_t)N * sizeof *rep);
  policy_run pr[GP_NPOLICIES] = {{0}};
  bool ok = down && lost && rep;
  for (int p = 0; ok && p < GP_NPOLICIES; p++) ok = (pr[p].cfg = calloc((size_t)G, sizeof(int32_t))) != NULL;
  for (int p = 0; ok && p < GP_NPOLICIES; p++) ok = (pr[p].e = gp_evaluate(c, (gp_policy)p, lost)).replicas >= 0;
  double work[GP_NPOLICIES] = {0}, run_time[GP_NPOLICIES] = {0};
  /* a policy's pauses and redone work never overlap: a failure during a pause extends it, and
   * what is redone is at most what ran since the policy last resumed */
  double paused_until[GP_NPOLICIES] = {0};
  double t0 = burn_days * 24, t1 = (burn_days + days) * 24, t = 0, failed_h = 0;
  int32_t ndown = 0, npend = 0;
  uint64_t rng = seed;
  while (ok && t < t1) {
    /* the next event: a failure of one of the up GPUs, or the earliest repair */
    double rate = f->rate_per_gpu_h * (N - ndown);
    double tf = rate > 0 ? t - log(1 - uniform01(&rng)) / rate : INFINITY;
    int32_t ir = -1;
    for (int32_t i = 0; i < npend; i++)
      if (ir < 0 || rep[i].at < rep[ir].at) ir = i;
    double te = ir >= 0 && rep[ir].at < tf ? rep[ir].at : tf;
    if (te > t1) te = t1;
    /* the interval [t, te) at the running configurations, measured where it is after the burn-in */
    double a = t > t0 ? t : t0, dt = te > a ? te - a : 0;
    for (int p = 0; p < GP_NPOLICIES; p++) { /* paused: no work */
      double from = paused_until[p] > a ? paused_until[p] : a, run = te > from ? te - from : 0;
      work[p] += pr[p].e.throughput * (run < dt ? run : dt), run_time[p] += pr[p].e.throughput * dt;
    }
    failed_h += (double)ndown / N * dt;
    if ((double)ndown / N > out->max_failed_frac && te > t0) out->max_failed_frac = (double)ndown / N;
    t = te;
    if (t >= t1) break;
    bool measuring = t >= t0;
    bool is_repair = ir >= 0 && rep[ir].at <= tf;
    int32_t gpu;
    if (is_repair) {
      gpu = rep[ir].gpu;
      rep[ir] = rep[--npend];
      down[gpu] = 0, ndown--;
      lost[gpu / c->tp]--;
      out->repairs += measuring;
    } else {
      do gpu = below(&rng, N);
      while (down[gpu]);
      down[gpu] = 1, ndown++;
      lost[gpu / c->tp]++;
      double h = uniform01(&rng) < f->hw_frac ? f->hw_min_h + (f->hw_max_h - f->hw_min_h) * uniform01(&rng) : f->sw_h;
      rep[npend++] = (pending){t + h, gpu};
      out->failures += measuring;
    }
    int32_t g = gpu / c->tp;
    for (int p = 0; ok && p < GP_NPOLICIES; p++) {
      bool live = p == GP_NTP;
      /* restart-based policies stop only for a failure in what they run, and take repaired GPUs
       * back at their next restart; ntp reconfigures for both, live */
      if (is_repair ? !live || !kept(c, c->tau_ntp, lost[g]) : !gp_in_use(c, (gp_policy)p, pr[p].cfg, pr[p].e.degree, g))
        continue;
      double before = pr[p].e.throughput;
      memcpy(pr[p].cfg, lost, (size_t)G * sizeof *lost);
      pr[p].e = gp_evaluate(c, (gp_policy)p, lost);
      ok = pr[p].e.replicas >= 0;
      if (!measuring) continue;
      double pause_h = live ? ((is_repair ? 0 : k->detect_s) + k->resume_s) / 3600 : k->restart_s / 3600,
             redo_h = live ? 0 : k->ckpt_s / 2 / 3600;
      /* redone: what ran since the last resume, at most (at `before`: only a stop changes a
       * restart-based policy's rate); paused: the part of [t, t + pause) not paused already */
      double since = t > paused_until[p] ? t - (paused_until[p] > t0 ? paused_until[p] : t0) : 0;
      if (redo_h > since) redo_h = since;
      double end = t + pause_h < t1 ? t + pause_h : t1, from = paused_until[p] > t ? paused_until[p] : t;
      pause_h = end > from ? end - from : 0;
      if (end > paused_until[p]) paused_until[p] = end;
      work[p] -= before * redo_h;
      out->stops[p]++;
      out->paused_h[p] += pause_h + redo_h;
    }
  }
  double span = t1 - t0;
  out->hours = span;
  out->mean_failed_frac = span > 0 ? failed_h / span : 0;
  for (int p = 0; p < GP_NPOLICIES; p++) {
    out->throughput[p] = span > 0 ? run_time[p] / span : 0;
    out->goodput[p] = span > 0 ? work[p] / span : 0;
  }
  for (int p = 0; p < GP_NPOLICIES; p++) free(pr[p].cfg);
  free(down), free(lost), free(rep);
  return ok;
}

bool gp_static_loss(const gp_config *c, double frac, int32_t samples, uint64_t seed, double *out) {
  int32_t N = c->gpus, G = gp_groups(c), nf = (int32_t)llround(frac * N);
  uint8_t *down = malloc((size_t)N);
  int32_t *lost = malloc((size_t)G * sizeof *lost);
  bool ok = down && lost && nf <= N;
  uint64_t rng = seed;
  for (int p = 0; p < GP_NPOLICIES; p++) out[p] = 0;
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
    }
  }
  free(down), free(lost);
  return ok;
}
