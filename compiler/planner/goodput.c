/* goodput.c — what each policy of `ntpc goodput` runs for a set of failed and slow GPUs
 * (docs/goodput.md): the best whole-micro-batch split of the global batch over replicas of
 * different speeds, the packing of degraded groups into replicas, and ntp-3d's layers moved
 * between a replica's stages. The run over weeks is goodput_run.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "goodput.h"

const char *gp_policy_name(gp_policy p) {
  static const char *const n[] = {"dp-drop", "uniform", "two-degree", "ntp-uni", "ntp", "ntp-3d"};
  return (unsigned)p < GP_NPOLICIES ? n[p] : "?";
}

const char *gp_policy_title(gp_policy p) {
  static const char *const n[] = {
      "drop every replica that lost a GPU (restart)",
      "restart at the best uniform TP degree",
      "restart, degraded groups at one lower degree (Megatron NTP)",
      "re-plan each degraded group at uniform TP, live",
      "re-plan each degraded group per layer, live (the NTP paper's)",
      "and move layers between stages, re-split around stragglers, live",
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

/* ------------------------------- ntp-3d: layers between stages ------------------------------- */

/* seconds stage i takes a micro-batch holding n layers: its share of its own n <= L, or for a
 * healthy group the planner's price of L + k (INFINITY where they do not fit) */
static double stage_time(const gp_config *c, double tau, bool healthy, int32_t n) {
  int32_t L = c->stage_layers;
  if (n <= L) return tau * n / L;
  if (!healthy || n - L > GP_MORE_LAYERS || !(c->tau_more[n - L] > 0)) return INFINITY;
  return c->tau_more[n - L];
}

static int64_t layers_held(const gp_config *c, int32_t P, const double *tau, const bool *healthy, double T) {
  int64_t s = 0;
  for (int32_t i = 0; i < P; i++) {
    int32_t n = c->stage_layers + GP_MORE_LAYERS;
    while (n > 0 && stage_time(c, tau[i], healthy[i], n) > T * (1 + 1e-12)) n--;
    s += n;
  }
  return s;
}

static int cmp_asc(const void *a, const void *b) { return -cmp_desc(a, b); }

double gp_replica_time(const gp_config *c, int32_t P, const double *tau, const bool *healthy) {
  double worst = 0;
  for (int32_t i = 0; i < P; i++)
    if (tau[i] > worst) worst = tau[i];
  int32_t L = c->stage_layers, per = L + GP_MORE_LAYERS;
  if (L < 2 || P < 2) return worst;
  /* the optimum is some stage's time at some number of layers: the least of those candidates
   * at which the stages hold the replica's P L layers */
  double *cand = malloc((size_t)P * (size_t)per * sizeof *cand);
  if (!cand) return worst;
  int64_t n = 0, total = (int64_t)P * L;
  for (int32_t i = 0; i < P; i++)
    for (int32_t k = 1; k <= per; k++) {
      double t = stage_time(c, tau[i], healthy[i], k);
      if (t < worst) cand[n++] = t;
    }
  qsort(cand, (size_t)n, sizeof *cand, cmp_asc);
  int64_t lo = 0, hi = n; /* the first feasible candidate; n: none below worst */
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (layers_held(c, P, tau, healthy, cand[mid]) >= total) hi = mid;
    else lo = mid + 1;
  }
  double best = lo < n ? cand[lo] : worst;
  free(cand);
  return best;
}

/* ------------------------------- the live policies ------------------------------- */

typedef struct live_group {
  double tau;   /* seconds a micro-batch of the stage */
  int32_t gpus; /* the GPUs it runs on */
} live_group;

static int cmp_group_desc(const void *a, const void *b) {
  return cmp_desc(&((const live_group *)a)->tau, &((const live_group *)b)->tau);
}

/* A group under a live policy: its GPUs left; for ntp-3d a straggler's share cut to its speed (t
 * GPUs doing t - 1 + 1/f GPUs' work, the split uneven) or the group without it (as if it had
 * failed), whichever is faster. tau 0: the group is dropped. */
static live_group live_tau(const gp_config *c, gp_policy p, int32_t lost, double slow) {
  const double *tab = p == GP_NTP_UNI ? c->tau_uni : c->tau_ntp;
  if (!kept(c, tab, lost)) return (live_group){0, 0};
  int32_t t = c->tp - lost;
  live_group g = {lost ? tab[t] : c->tau_ntp[c->tp], t};
  if (p != GP_NTP_3D || !(slow > 1)) return g;
  double base = g.tau;
  g.tau = t > 1 ? base * t / (t - 1 + 1 / slow) : base * slow;
  if (kept(c, c->tau_ntp, lost + 1) && c->tau_ntp[t - 1] < g.tau) g = (live_group){c->tau_ntp[t - 1], t - 1};
  return g;
}

/* ntp-3d: the replicas' times with the degraded groups d[0..n) (slowest first) packed pp to a
 * replica (spread = false) or one to a replica (true), layers moved in each; into tau[]. The
 * number of degraded replicas, -1 when out of memory. */
static int32_t moved_replicas(const gp_config *c, const live_group *d, int32_t n, int32_t reps, bool spread, double *tau) {
  int32_t P = c->pp, k = 0, per = spread ? 1 : P;
  double *st = malloc((size_t)P * sizeof *st);
  bool *healthy = malloc((size_t)P * sizeof *healthy);
  if (!st || !healthy) {
    free(st), free(healthy);
    return -1;
  }
  for (int32_t i = 0; i < n && k < reps; i += per, k++) {
    for (int32_t s = 0; s < P; s++) {
      healthy[s] = !(s < per && i + s < n);
      st[s] = healthy[s] ? c->tau_ntp[c->tp] : d[i + s].tau;
    }
    tau[k] = gp_replica_time(c, P, st, healthy);
  }
  free(st), free(healthy);
  return k;
}

static gp_state_eval eval_classes(const gp_config *c, int32_t n, double *tau, int32_t healthy_reps, int32_t degraded) {
  int32_t *count = malloc((size_t)(n + 1) * sizeof *count);
  if (!count) return (gp_state_eval){.replicas = -1};
  /* replicas of equal speed as one class: the whole-micro-batch split is quadratic in classes */
  qsort(tau, (size_t)n, sizeof *tau, cmp_desc);
  int32_t m = 0;
  for (int32_t i = 0; i < n; i++) {
    if (m && tau[m - 1] == tau[i]) count[m - 1]++;
    else count[m] = 1, tau[m++] = tau[i];
  }
  count[m] = healthy_reps, tau[m] = c->tau_ntp[c->tp];
  gp_state_eval e = finish(c, m + 1, count, tau, degraded, c->tp);
  free(count);
  return e;
}

static gp_state_eval eval_live(const gp_config *c, gp_policy p, const int32_t *lost, const double *slow) {
  int32_t G = gp_groups(c), healthy = 0, n = 0;
  live_group *d = malloc((size_t)G * sizeof *d);
  double *tau = malloc((size_t)(G + 1) * sizeof *tau);
  gp_state_eval best = {.replicas = -1};
  if (!d || !tau) goto out;
  for (int32_t g = 0; g < G; g++) {
    double f = slow && p == GP_NTP_3D ? slow[g] : 1;
    if (lost[g] == 0 && !(f > 1)) healthy++;
    else if ((d[n] = live_tau(c, p, lost[g], f)).tau > 0) n++;
  }
  qsort(d, (size_t)n, sizeof *d, cmp_group_desc);
  int32_t reps = (healthy + n) / c->pp;
  bool moves = p == GP_NTP_3D && c->pp > 1 && c->stage_layers > 1;
  for (int spread = 0; spread < (moves ? 2 : 1); spread++) {
    int32_t k;
    if (moves) {
      if (spread && (int64_t)n > reps) continue; /* one a replica needs as many replicas */
      k = moved_replicas(c, d, n, reps, spread, tau);
      if (k < 0) goto out;
    } else { /* slowest first, pp to a replica: a replica runs at its slowest stage */
      k = 0;
      for (int32_t i = 0; i < n && k < reps; i += c->pp) tau[k++] = d[i].tau;
    }
    gp_state_eval e = eval_classes(c, k, tau, reps - k, k);
    if (e.replicas < 0) goto out;
    if (best.replicas < 0 || e.throughput > best.throughput) best = e;
  }
out:
  free(d), free(tau);
  return best;
}

/* A synchronous step waits for the slowest GPU in use: the factor a policy that does not re-split
 * around stragglers runs slower by, and the domains holding the ones it uses. */
static void slow_down(const gp_config *c, gp_policy p, const int32_t *lost, const double *slow, gp_state_eval *e) {
  e->slowed = 1, e->slow_domains = 0;
  if (!slow || p == GP_NTP_3D) return;
  int32_t last = -1, per = groups_per_domain(c);
  for (int32_t g = 0; g < gp_groups(c); g++)
    if (slow[g] > 1 && gp_in_use(c, p, lost, e->degree, g)) {
      if (slow[g] > e->slowed) e->slowed = slow[g];
      if (g / per != last) e->slow_domains++, last = g / per;
    }
  e->throughput /= e->slowed;
}

gp_state_eval gp_evaluate_slow(const gp_config *c, gp_policy p, const int32_t *lost, const double *slow) {
  gp_state_eval e;
  switch (p) {
  case GP_DP_DROP: e = eval_dp_drop(c, lost); break;
  case GP_UNIFORM: e = eval_uniform(c, lost); break;
  case GP_TWO_DEGREE: e = eval_two_degree(c, lost); break;
  default: e = eval_live(c, p, lost, slow); break;
  }
  if (e.replicas >= 0) slow_down(c, p, lost, slow, &e);
  return e;
}

gp_state_eval gp_evaluate(const gp_config *c, gp_policy p, const int32_t *lost) {
  return gp_evaluate_slow(c, p, lost, NULL);
}

int32_t gp_spare_domains(const gp_config *c, double throughput) {
  double short_reps = (1 - throughput) * gp_replicas(c);
  if (short_reps <= 1e-9) return 0;
  int64_t reps = (int64_t)ceil(short_reps - 1e-9), gpus = reps * c->pp * c->tp;
  return (int32_t)((gpus + c->domain - 1) / c->domain);
}

int32_t gp_state_spares(const gp_config *c, const gp_state_eval *e) {
  return gp_spare_domains(c, e->throughput * e->slowed) + e->slow_domains;
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
  case GP_TWO_DEGREE:
  case GP_NTP_UNI: return kept(c, c->tau_uni, cfg_lost[g]);
  default: return kept(c, c->tau_ntp, cfg_lost[g]);
  }
}
