/* failover.c — failure re-planning: the survivors' plan (degraded groups, batch shares by
 * throughput) and the alternatives that drop degraded replicas. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner_internal.h"

/* ======================================================================================
 * failure re-planning
 * ====================================================================================== */

/* Batch rows of each group in proportion to its predicted throughput on the whole model
 * (every layer at that group size): rows by throughput, then the remainder one row at a time
 * to the group that finishes soonest with it. Equal to the default split: no shares. */
static void throughput_shares(const plan_model *pm, const plan_profile *prof, int32_t W, int32_t *node, plan_place *pl) {
  int64_t B = pm->L[0].rows;
  int ng = pl->ngroups;
  pl->share[0] = 0;
  if (ng < 2 || B < ng) return;
  plan_tables T = {.pm = pm, .prof = prof, .W = W, .node = node};
  int32_t gs[NTP_MAX_GROUPS + 1];
  pl_group_starts(pl, gs);
  /* distinct layers, with counts */
  int32_t *rep = malloc((size_t)pm->n * sizeof *rep), *cnt = calloc((size_t)pm->n, sizeof *cnt), nd = 0;
  if (!rep || !cnt) {
    free(rep);
    free(cnt);
    return;
  }
  for (int32_t i = 0; i < pm->n; i++) {
    int32_t k = 0;
    for (; k < nd; k++)
      if (pl_layers_alike(&pm->L[i], &pm->L[rep[k]])) break;
    if (k == nd) rep[nd++] = i;
    cnt[k]++;
  }
#define GROUP_TIME(g, r, out)                                                                    \
  do {                                                                                           \
    double acc_ = 0;                                                                             \
    for (int32_t k_ = 0; k_ < nd; k_++) {                                                        \
      double tm_, rb_;                                                                           \
      pl_core_rank(&T, &pm->L[rep[k_]], pl->size[g], 0, (r), pl->sp, &tm_, NULL, NULL);             \
      acc_ += cnt[k_] * (tm_ + pl_group_reduce(&T, &pm->L[rep[k_]], pl, gs[g], pl->size[g], (r), &rb_)); \
    }                                                                                            \
    (out) = acc_;                                                                                \
  } while (0)
  double theta[NTP_MAX_GROUPS], sum = 0;
  int64_t rows[NTP_MAX_GROUPS], given = 0;
  for (int g = 0; g < ng; g++) {
    int64_t guess = B * pl->size[g] / W > 0 ? B * pl->size[g] / W : 1;
    double t;
    GROUP_TIME(g, guess, t);
    theta[g] = t > 0 ? (double)guess / t : 1;
    sum += theta[g];
  }
  for (int g = 0; g < ng; g++) {
    rows[g] = (int64_t)floor((double)B * theta[g] / sum);
    if (rows[g] < 1) rows[g] = 1;
    given += rows[g];
  }
  while (given > B) { /* the floor of 1 row each may overshoot: take from the largest */
    int big = 0;
    for (int g = 1; g < ng; g++)
      if (rows[g] > rows[big]) big = g;
    rows[big]--;
    given--;
  }
  while (given < B) {
    int best = -1;
    double bt = 0;
    for (int g = 0; g < ng; g++) {
      double t;
      GROUP_TIME(g, rows[g] + 1, t);
      if (best < 0 || t < bt) {
        best = g;
        bt = t;
      }
    }
    rows[best]++;
    given++;
  }
#undef GROUP_TIME
  free(rep);
  free(cnt);
  for (int g = 0; g < ng; g++) pl->share[g] = rows[g];
  if (pl_default_shares(pl, B)) pl->share[0] = 0;
}

/* Degrade a healthy group structure (physical ranges) for the survivors: intact groups stay,
 * a group that lost GPUs keeps its survivors as one group, or as balanced groups of at most
 * `cap` GPUs. False when nothing is left or too many groups. */
static bool degrade(const int32_t *start, int ng, const bool *gone, int32_t cap, plan_place *pl) {
  *pl = (plan_place){0};
  for (int g = 0; g < ng; g++) {
    int32_t s = 0, t = start[g + 1] - start[g];
    for (int32_t p = start[g]; p < start[g + 1]; p++) s += !gone[p];
    if (s == 0) continue;
    int32_t parts = s == t || cap <= 0 ? 1 : (s + cap - 1) / cap;
    for (int32_t k = 0; k < parts; k++) {
      if (pl->ngroups == NTP_MAX_GROUPS) return false;
      int64_t lo, hi;
      split_range(s, parts, k, &lo, &hi);
      pl->size[pl->ngroups++] = (int32_t)(hi - lo);
    }
  }
  return pl->ngroups > 0;
}

/* The survivors' states: healthy group structures (every divisor degree, and the healthy
 * plan's own placements), each degraded for the lost GPUs (one group per replica, or groups of
 * at most c), and every balanced split of the N survivors. false when out of memory. */
static bool degraded_states(int32_t W, int32_t N, int32_t n, const plan_solution *healthy, const bool *gone,
                            plan_place **st, int32_t *ns, int32_t *cs) {
  int32_t nstruct = 0, (*starts)[NTP_MAX_GROUPS + 1] = malloc((size_t)(W + n + 1) * sizeof *starts);
  int32_t *nstart = malloc((size_t)(W + n + 1) * sizeof *nstart);
  bool ok = starts && nstart;
  for (int32_t t = 1; ok && t <= W; t++) {
    if (W % t || W / t > NTP_MAX_GROUPS) continue;
    nstart[nstruct] = W / t;
    for (int32_t g = 0; g <= W / t; g++) starts[nstruct][g] = g * t;
    nstruct++;
  }
  for (int32_t i = 0; ok && healthy && healthy->feasible && i < n; i++) {
    pl_group_starts(&healthy->layers[i].place, starts[nstruct]);
    nstart[nstruct++] = healthy->layers[i].place.ngroups;
  }
  for (int32_t k = 0; ok && k < nstruct; k++) {
    int32_t tmax = 0;
    for (int32_t g = 0; g < nstart[k]; g++)
      if (starts[k][g + 1] - starts[k][g] > tmax) tmax = starts[k][g + 1] - starts[k][g];
    for (int32_t c = 0; c < tmax; c++) { /* c = 0: one group per replica; else groups of at most c */
      if (c > 0 && (W % c || c >= tmax)) continue;
      plan_place pl;
      if (!degrade(starts[k], nstart[k], gone, c, &pl)) continue;
      ok &= pl_add_state(st, ns, cs, &pl) >= 0;
    }
  }
  for (int32_t k = 1; ok && k <= N && k <= NTP_MAX_GROUPS; k++) {
    plan_place pl = plan_place_balanced(N, k, false);
    ok &= pl_add_state(st, ns, cs, &pl) >= 0;
  }
  free(starts);
  free(nstart);
  return ok;
}

/* pins: the pinned placement's groups, degraded, as states; pins[i] = -2 - the state (resolved
 * after the sp copies), or -1. false when out of memory or reported. */
static bool degraded_pins(const plan_model *pm, const ir_module *m, const plan_request *rq, const bool *gone,
                          int32_t *pins, plan_place **st, int32_t *ns, int32_t *cs, diag_sink *diags) {
  int32_t n = pm->n;
  plan_place *hpin = malloc((size_t)(n + 1) * sizeof *hpin);
  bool *free_ = malloc((size_t)(n + 1) * sizeof *free_);
  bool ok;
  if (!hpin || !free_) {
    ok = false;
    diag_out_of_memory(diags);
  } else {
    ok = pl_pins(pm, m, rq->world, rq->fixed, hpin, free_, diags);
  }
  for (int32_t i = 0; ok && i < n; i++) {
    plan_place hp = hpin[i], pl;
    pins[i] = -1;
    if (free_[i]) continue;
    int32_t gs[NTP_MAX_GROUPS + 1];
    pl_group_starts(&hp, gs);
    if (!degrade(gs, hp.ngroups, gone, 0, &pl)) continue;
    pl.sp = hp.sp;
    pl.rc = hp.rc;
    int32_t idx = pl_add_state(st, ns, cs, &pl);
    ok &= idx >= 0;
    pins[i] = -2 - idx;
  }
  free(hpin);
  free(free_);
  return ok;
}

/* Every structure with and without sequence parallelism, batch rows by throughput, the
 * recomputing states of training; then the pins resolved to their states. */
static bool finish_states(const plan_model *pm, const plan_request *rq, int32_t N, int32_t *node,
                          int32_t *pins, plan_place **st, int32_t *ns, int32_t *cs) {
  bool ok = true;
  int32_t base = *ns;
  for (int32_t k = 0; ok && k < base; k++) {
    if ((*st)[k].sp) continue;
    plan_place b = (*st)[k];
    b.sp = true;
    if (pl_place_max(&b) > 1) ok &= pl_add_state(st, ns, cs, &b) >= 0;
  }
  for (int32_t k = 0; ok && k < *ns; k++) throughput_shares(pm, rq->prof, N, node, &(*st)[k]);
  if (ok && rq->train) ok = pl_add_recompute_states(st, ns, cs);
  for (int32_t i = 0; ok && i < pm->n; i++)
    if (pins[i] <= -2) pins[i] = -2 - pins[i];
  return ok;
}

static bool survivors_solve(const plan_model *pm, const ir_module *m, const plan_request *rq, const plan_solution *healthy,
                            const bool *gone, plan_solution *out, diag_sink *diags) {
  memset(out, 0, sizeof *out);
  int32_t W = rq->world, N = 0, n = pm->n, nodes_of = rq->nodes_of > 0 ? rq->nodes_of : 8;
  for (int32_t p = 0; p < W; p++) N += !gone[p];
  out->mem_cap = pl_cap_of(rq);
  if (N == 0) {
    out->feasible = false;
    snprintf(out->why, sizeof out->why, "no GPU left");
    return true;
  }
  int32_t *phys = malloc((size_t)N * sizeof *phys), *node = malloc((size_t)N * sizeof *node);
  int32_t *pins = malloc((size_t)n * sizeof *pins);
  plan_place *st = NULL;
  int32_t ns = 0, cs = 0;
  bool ok = phys && node && pins;
  for (int32_t p = 0, k = 0; ok && p < W; p++)
    if (!gone[p]) {
      phys[k] = p;
      node[k++] = p / nodes_of;
    }
  ok = ok && degraded_states(W, N, n, healthy, gone, &st, &ns, &cs);
  ok = ok && degraded_pins(pm, m, rq, gone, pins, &st, &ns, &cs, diags);
  ok = ok && finish_states(pm, rq, N, node, pins, &st, &ns, &cs);
  if (!ok || ns > 255) {
    if (ok) diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "too many placements to search (%d)", ns);
    else if (!diags->errors) diag_out_of_memory(diags);
    free(phys);
    free(node);
    free(pins);
    free(st);
    return false;
  }
  double t0 = pl_now_ms();
  plan_tables *T = pl_tables_build(pm, rq->prof, N, node, nodes_of, st, ns, pins, rq->train, diags);
  free(pins);
  free(st);
  free(node);
  if (!T) {
    free(phys);
    return false;
  }
  double tms = pl_now_ms() - t0;
  out->phys = phys;
  if (rq->train && healthy) { /* the survivors keep the healthy plan's optimizer stage */
    if (rq->domain_size > 0) T->domain = rq->domain_size;
    pl_zero_set(T, healthy->zero, healthy->redundancy);
  }
  pl_solve_and_fill(T, pl_cap_of(rq), rq->quanta, out);
  out->tables_ms = tms;
  plan_tables_free(T);
  return true;
}

void plan_failover_free(plan_failover *f) {
  if (!f) return;
  plan_solution_free(&f->healthy);
  plan_solution_free(&f->survivors);
  for (int i = 0; i <= f->ndegraded && i <= NTP_MAX_GROUPS; i++) plan_solution_free(&f->drop[i]);
  memset(f, 0, sizeof *f);
}

bool plan_failover_solve_unguarded(const plan_model *pm, const ir_module *m, const plan_request *rq,
                                          plan_failover *out, diag_sink *diags) {
  memset(out, 0, sizeof *out);
  int32_t W = rq->world;
  bool *gone = calloc((size_t)W + 1, 1);
  if (!gone) {
    diag_out_of_memory(diags);
    return false;
  }
  for (int32_t k = 0; k < rq->nfailed; k++) {
    int32_t r = rq->failed[k];
    if (r < 0 || r >= W) {
      diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "failed rank %d is not in the world (ranks 0 to %d)", r, W - 1);
      free(gone);
      return false;
    }
    if (gone[r]) {
      diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "failed rank %d is listed twice", r);
      free(gone);
      return false;
    }
    gone[r] = true;
  }
  if (rq->nfailed >= W) {
    diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "every GPU failed: nothing to plan");
    free(gone);
    return false;
  }
  plan_request h = *rq;
  h.failed = NULL;
  h.nfailed = 0;
  if (!plan_solve(pm, m, &h, &out->healthy, diags)) {
    free(gone);
    return false;
  }
  /* replicas: the groups of the healthy plan's widest placement */
  plan_place rp = plan_place_balanced(W, 1, false);
  if (out->healthy.feasible) {
    int32_t best = -1;
    for (int32_t i = 0; i < out->healthy.nlayers; i++)
      if (best < 0 || pl_place_max(&out->healthy.layers[i].place) > pl_place_max(&out->healthy.layers[best].place)) best = i;
    rp = out->healthy.layers[best].place;
  }
  out->nreplicas = rp.ngroups;
  out->replica_size = pl_place_max(&rp);
  pl_group_starts(&rp, out->replica_start);
  for (int32_t g = 0; g < rp.ngroups; g++) {
    bool hit = false;
    for (int32_t p = out->replica_start[g]; p < out->replica_start[g + 1]; p++) hit |= gone[p];
    if (hit) out->degraded[out->ndegraded++] = g;
  }
  bool ok = survivors_solve(pm, m, rq, out->healthy.feasible ? &out->healthy : NULL, gone, &out->survivors, diags);
  out->survivors.phys_world = W; /* the picture marks the GPUs that are gone */
  bool *drop = malloc((size_t)W + 1);
  for (int32_t d = 0; ok && drop && d <= out->ndegraded; d++) {
    if (d == out->ndegraded && out->ndegraded < 2) break; /* "all of them" is the one already listed */
    memcpy(drop, gone, (size_t)W);
    for (int32_t j = 0; j < out->ndegraded; j++) {
      if (d < out->ndegraded && j != d) continue;
      int32_t g = out->degraded[j];
      for (int32_t p = out->replica_start[g]; p < out->replica_start[g + 1]; p++) drop[p] = true;
    }
    ok = survivors_solve(pm, m, rq, out->healthy.feasible ? &out->healthy : NULL, drop, &out->drop[d], diags);
  }
  free(drop);
  free(gone);
  return ok;
}
