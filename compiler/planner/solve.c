/* solve.c — planning: the states searched, the pins a plan fixes, the peaks and the Lagrangian
 * bound, the solution; the entry points. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner_internal.h"

/* ======================================================================================
 * planning: states, pins, the solution
 * ====================================================================================== */

void plan_solution_free(plan_solution *s) {
  if (!s) return;
  free(s->phys);
  free(s->layers);
  free(s->rank_params);
  free(s->rank_act);
  free(s->rank_state);
  free(s->stage_first);
  free(s->stage_time);
  free(s->stage_sync);
  free(s->stage_mem);
  free(s->stage_inflight);
  memset(s, 0, sizeof *s);
}

int32_t pl_add_state(plan_place **st, int32_t *n, int32_t *cap, const plan_place *pl) {
  for (int32_t i = 0; i < *n; i++)
    if (memcmp(&(*st)[i], pl, sizeof *pl) == 0) return i;
  if (*n == *cap) {
    int32_t nc = *cap ? *cap * 2 : 64;
    plan_place *ns = realloc(*st, (size_t)nc * sizeof *ns);
    if (!ns) return -1;
    *st = ns;
    *cap = nc;
  }
  (*st)[*n] = *pl;
  return (*n)++;
}

/* The planner's state of a layer (plan_place) and the compiler's placement (sh_placement), the
 * two directions side by side: group sizes <-> group starts; shares 0 <-> not given. */
static plan_place place_of(const sh_placement *f) {
  plan_place p = {.ngroups = f->ngroups, .sp = f->seq_parallel, .rc = f->recompute};
  for (int g = 0; g < f->ngroups; g++) {
    p.size[g] = sh_group_size(f, g);
    p.share[g] = f->shares_given ? f->share[g] : 0;
  }
  return p;
}
static void placement_of(const plan_place *pp, sh_placement *pl) {
  int64_t sizes[NTP_MAX_GROUPS];
  for (int g = 0; g < pp->ngroups; g++) sizes[g] = pp->size[g];
  sh_placement_set_groups(pl, sizes, pp->ngroups);
  for (int g = 0; g < pp->ngroups; g++) pl->share[g] = pp->share[0] ? pp->share[g] : pp->size[g];
  pl->shares_given = pp->share[0] != 0;
  pl->seq_parallel = pp->sp;
  pl->recompute = pp->rc;
}

/* Training: the states once more with their activations recomputed, as many as the search's 255
 * states hold, the first ones first: they are the fewest groups, the largest degrees, which
 * recomputation serves best (it saves the most where the memory binds). Beyond 64 ranks the
 * balanced states alone are 128: adding none of them then (as before) left a 65-GPU plan without
 * recomputation, so more GPUs needed more memory per GPU than 64. false when memory fails. */
bool pl_add_recompute_states(plan_place **st, int32_t *n, int32_t *cap) {
  int32_t base = *n;
  for (int32_t k = 0; k < base && *n < 255; k++) {
    if ((*st)[k].rc) continue;
    plan_place r = (*st)[k];
    r.rc = true;
    if (pl_add_state(st, n, cap, &r) < 0) return false;
  }
  return true;
}

void plan_solution_placements(const plan_model *pm, const plan_solution *s, sh_placement *out) {
  for (size_t l = 0; l < pm->m->n_layers; l++)
    out[l] = (sh_placement){.ngroups = 1, .group_start = {0, s->world}, .group_end = {s->world}, .share = {s->world}, .rule = -1,
                            .tp_file = pm->m->file, .tp_loc = pm->m->layers[l].loc};
  for (int32_t i = 0; i < pm->n; i++) placement_of(&s->layers[i].place, &out[pm->L[i].ir]);
}

/* Every chain layer's pin (*free_[i]: none, the planner decides): its placement in `fixed` (the
 * autoplan pass's), else in the active plan as the place pass resolves it (shard_place: the
 * same rules, the same messages), else none (without a plan every layer is the planner's). */
bool pl_pins(const plan_model *pm, const ir_module *m, int32_t W, const sh_placement *fixed, plan_place *pin, bool *free_,
             diag_sink *diags) {
  int32_t n = pm->n;
  sh_placement *own = NULL;
  if (!fixed && m->active_plan < 0) {
    for (int32_t i = 0; i < n; i++) free_[i] = true;
    return true;
  }
  if (!fixed) {
    int32_t world;
    if (!(own = calloc(m->n_layers + 1, sizeof *own))) {
      diag_out_of_memory(diags);
      return false;
    }
    if (!shard_place(m, W, &world, own, diags)) {
      free(own);
      return false;
    }
    fixed = own;
  }
  for (size_t l = 0; l < m->n_layers; l++)
    if (fixed[l].npipes) { /* a stage's groups are not the world's: pinning them would drop the stages */
      const ir_plan *pl = &m->plans[m->active_plan];
      diag_emit(diags, NTPC_ERROR, pl->file, pl->loc,
                "plan '%s' has pipeline stages: the planner does not plan stages yet (docs/pipeline.md#not-yet)",
                pl->name);
      free(own);
      return false;
    }
  for (int32_t i = 0; i < n; i++) {
    const sh_placement *f = &fixed[plan_model_ir_layer(pm, i)];
    free_[i] = f->is_auto;
    if (f->is_auto) continue;
    pin[i] = place_of(f);
  }
  free(own);
  return true;
}

/* Bytes per GPU the DP's memory model gives an assignment (parameters of every layer on its
 * most-loaded rank, the activation reserve, what no layer places). */
static double model_bytes(const plan_tables *T, const int32_t *choice) {
  double need = T->act_reserve + T->const_mem;
  for (int32_t i = 0; i < T->pm->n; i++) need += T->pmax[(size_t)i * T->S + choice[i]];
  return need;
}

/* Byte-exact local improvement of a plan that fits: while some layer can change its state,
 * keeping the plan within the cap, and the step gets faster, make the best such change. The
 * quantised search rounds every layer's memory up; this spends the memory that rounding left. */
static void improve(const plan_tables *T, double cap, int32_t *choice) {
  int32_t n = T->pm->n, S = T->S;
  double bytes = model_bytes(T, choice);
  for (int32_t iter = 0; iter < 8 * n + 8; iter++) {
    double best = 0;
    int32_t bl = -1, bs = -1;
    for (int32_t l = 0; l < n; l++) {
      int32_t c = choice[l];
      size_t kc = (size_t)l * S + c;
      for (int32_t s = 0; s < S; s++) {
        size_t k = (size_t)l * S + s;
        if (s == c || !T->legal[k] || bytes + T->pmax[k] - T->pmax[kc] > cap) continue;
        double dt = (T->tcomp[k] + T->tcomm[k]) - (T->tcomp[kc] + T->tcomm[kc]);
        if (l > 0) dt += T->trans[l][(size_t)choice[l - 1] * S + s] - T->trans[l][(size_t)choice[l - 1] * S + c];
        if (l + 1 < n) dt += T->trans[l + 1][(size_t)s * S + choice[l + 1]] - T->trans[l + 1][(size_t)c * S + choice[l + 1]];
        if (dt < best) {
          best = dt;
          bl = l;
          bs = s;
        }
      }
    }
    if (bl < 0 || best > -1e-12) break;
    bytes += T->pmax[(size_t)bl * S + bs] - T->pmax[(size_t)bl * S + choice[bl]];
    choice[bl] = bs;
  }
}

/* min over plans of time + lam * bytes (no memory constraint): a DP over layers and states in
 * double; the plan in choice. */
static double lagrange_dp(const plan_tables *T, double lam, int32_t *choice, double *scratch, int32_t *from) {
  int32_t n = T->pm->n, S = T->S;
  double *prev = scratch, *cur = scratch + S;
  for (int32_t s = 0; s < S; s++)
    prev[s] = T->legal[s] ? T->tcomp[s] + T->tcomm[s] + lam * T->pmax[s] : INFINITY;
  for (int32_t l = 1; l < n; l++) {
    for (int32_t s = 0; s < S; s++) {
      size_t k = (size_t)l * S + s;
      double best = INFINITY;
      int32_t arg = -1;
      if (T->legal[k])
        for (int32_t s2 = 0; s2 < S; s2++) {
          double v = prev[s2] + T->trans[l][(size_t)s2 * S + s];
          if (v < best) {
            best = v;
            arg = s2;
          }
        }
      cur[s] = best + T->tcomp[k] + T->tcomm[k] + lam * T->pmax[k];
      from[(size_t)l * S + s] = arg;
    }
    double *t = prev;
    prev = cur;
    cur = t;
  }
  int32_t bs = -1;
  for (int32_t s = 0; s < S; s++)
    if (prev[s] < INFINITY && (bs < 0 || prev[s] < prev[bs])) bs = s;
  if (bs < 0) return INFINITY;
  double v = prev[bs];
  for (int32_t l = n - 1; l >= 0; l--) {
    choice[l] = bs;
    if (l) bs = from[(size_t)l * S + bs];
  }
  return v;
}

static double plan_time(const plan_tables *T, const int32_t *choice) {
  int32_t S = T->S;
  double t = 0;
  for (int32_t l = 0; l < T->pm->n; l++) {
    size_t k = (size_t)l * S + choice[l];
    t += T->tcomp[k] + T->tcomm[k] + (l ? T->trans[l][(size_t)choice[l - 1] * S + choice[l]] : 0);
  }
  return t;
}

/* The Lagrangian dual of the memory constraint: for every lam >= 0, min over plans of
 * time + lam (bytes - cap) is a lower bound on the best time within the cap; the bound is
 * maximised over lam by bisection on its slope (bytes - cap of the minimising plan). The
 * minimising plans that fit are candidates; the best is left in `best` (best_t: its time). */
static double lagrange_bound(const plan_tables *T, double cap, int32_t *best, double *best_t, double *lam_best) {
  int32_t n = T->pm->n, S = T->S;
  double *scratch = malloc(2 * (size_t)S * sizeof *scratch);
  int32_t *from = malloc((size_t)n * (size_t)S * sizeof *from), *c = malloc((size_t)n * sizeof *c);
  double bound = -INFINITY;
  *best_t = INFINITY;
  if (!scratch || !from || !c) goto done;
  double lo = 0, hi = 0;
  for (int it = 0; it < 200; it++) {
    double lam = it == 0 ? 0 : hi > 0 && lo < hi ? 0.5 * (lo + hi) : (hi > 0 ? hi : 1e-12);
    double v = lagrange_dp(T, lam, c, scratch, from);
    if (!(v < INFINITY)) break;
    double bytes = model_bytes(T, c), b = v - lam * (cap - T->act_reserve - T->const_mem);
    if (b > bound) {
      bound = b;
      if (lam_best) *lam_best = lam;
    }
    if (bytes <= cap) {
      double t = plan_time(T, c);
      if (t < *best_t) {
        *best_t = t;
        memcpy(best, c, (size_t)n * sizeof *c);
      }
      if (it == 0) break; /* memory does not bind */
      hi = lam;
    } else {
      lo = lam;
      if (hi == 0 || lam >= hi) hi = lam > 0 ? lam * 4 : 1e-12; /* no upper end yet: grow */
    }
    if (hi > 0 && lo > 0 && hi - lo <= 1e-6 * hi) break;
  }
done:
  free(scratch);
  free(from);
  free(c);
  return bound;
}

/* The activation peak of a plan (its layers' working sets, the largest), and its bytes per GPU
 * with that peak: what a plan needs to fit. */
static double plan_peak(const plan_tables *T, const int32_t *choice) {
  double a = 0;
  for (int32_t i = 0; i < T->pm->n; i++)
    if (T->amax[(size_t)i * T->S + choice[i]] > a) a = T->amax[(size_t)i * T->S + choice[i]];
  return a;
}

static double peak_bytes(const plan_tables *T, const int32_t *choice) {
  double need = plan_peak(T, choice) + T->const_mem;
  for (int32_t i = 0; i < T->pm->n; i++) need += T->pmax[(size_t)i * T->S + choice[i]];
  return need;
}

static int cmp_desc(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x < y) - (x > y);
}

/* The search over candidate peaks: the incumbent plan (choice, of time ta; ok once there is
 * one) and what every peak's search shares. */
typedef struct peak_search {
  plan_tables *T;
  double mem_cap;
  int32_t quanta; /* memory units of the DP */
  int64_t fit;    /* the most units with every layer's DP table kept */
  int32_t *choice;
  double ta;
  bool ok;
  int32_t *alt;    /* a candidate plan */
  uint8_t *legal;  /* the tables' legal states, while each peak restricts T->legal */
  double *scratch; /* for the Lagrangian DP */
  int32_t *from;
  double lam;  /* the Lagrangian multiplier of the bound (0: none) */
  double work; /* DP cells of one full DP */
  int full;    /* full DPs run */
  dp_ws ws;
  plan_solution *out;
} peak_search;

/* The candidate plan becomes the incumbent. */
static void take(peak_search *s, double t) {
  s->ta = t;
  memcpy(s->choice, s->alt, (size_t)s->T->pm->n * sizeof *s->alt);
  s->ok = true;
}

/* at most the units the DP's tables allow (at least 16) */
static int32_t clamp_quanta(int32_t quanta, int64_t fit) {
  return quanta > fit ? (fit > 16 ? (int32_t)fit : 16) : quanta;
}

/* The distinct working sets of the legal states, largest first (with repeats; returns how many). */
static int candidate_peaks(const plan_tables *T, const uint8_t *legal, double *thetas) {
  int nt = 0;
  for (size_t k = 0; k < (size_t)T->pm->n * T->S; k++)
    if (legal[k]) thetas[nt++] = T->amax[k];
  qsort(thetas, (size_t)nt, sizeof *thetas, cmp_desc);
  return nt;
}

/* The smallest activation peak any plan can have: the largest of the layers' smallest working sets. */
static double floor_activation(const plan_tables *T) {
  int32_t n = T->pm->n, S = T->S;
  double floor_act = 0;
  for (int32_t i = 0; i < n; i++) {
    double mn = INFINITY;
    for (int32_t k = 0; k < S; k++)
      if (T->legal[(size_t)i * S + k] && T->amax[(size_t)i * S + k] < mn) mn = T->amax[(size_t)i * S + k];
    if (mn > floor_act && mn < INFINITY) floor_act = mn;
  }
  return floor_act;
}

/* The bound first: with the smallest activation peak any plan can have, and every state; its
 * multiplier (s->lam) then bounds each peak's search from below. A Lagrangian plan that fits
 * is the first incumbent. */
static double first_bound(peak_search *s) {
  plan_tables *T = s->T;
  double reserve = T->act_reserve, tl = INFINITY;
  T->act_reserve = floor_activation(T);
  double lb = lagrange_bound(T, s->mem_cap, s->alt, &tl, &s->lam);
  T->act_reserve = reserve;
  if (tl < INFINITY && peak_bytes(T, s->alt) <= s->mem_cap) take(s, tl);
  return lb;
}

/* small problems get a finer memory resolution (up to 65536 units) while searching every
 * candidate peak stays under 2e7 DP cells */
static int32_t finer_quanta(const plan_tables *T, const double *thetas, int nt, int32_t quanta, int64_t fit) {
  int32_t n = T->pm->n, S = T->S;
  int distinct = 0;
  for (int it = 0; it < nt; it++) distinct += !it || thetas[it] != thetas[it - 1];
  double finer = 2e7 / ((double)(distinct > 0 ? distinct : 1) * n * S * S);
  if (finer > quanta) quanta = finer > 65536 ? 65536 : (int32_t)finer;
  return clamp_quanta(quanta, fit);
}

/* T->legal restricted to the states whose working set is at most theta; false when a layer has
 * none left. least: the fewest bytes a plan can then need (theta reserved). */
static bool restrict_to_peak(peak_search *s, double theta, double *least) {
  plan_tables *T = s->T;
  int32_t n = T->pm->n, S = T->S;
  bool any_layer = true;
  *least = theta + T->const_mem;
  for (int32_t i = 0; i < n && any_layer; i++) {
    double mn = INFINITY;
    for (int32_t k = 0; k < S; k++) {
      size_t q = (size_t)i * S + k;
      T->legal[q] = s->legal[q] && T->amax[q] <= theta;
      if (T->legal[q] && T->pmax[q] < mn) mn = T->pmax[q];
    }
    any_layer = mn < INFINITY;
    *least += mn;
  }
  return any_layer;
}

/* The parameters as the DP's knapsack (memory in units rounded up: every plan it accepts
 * fits), at finer resolutions until one succeeds, improved byte for byte by local moves. */
static void knapsack_at_peak(peak_search *s) {
  plan_tables *T = s->T;
  for (int32_t qn = s->quanta; qn <= s->quanta * 16 && qn <= s->fit; qn *= 4) {
    plan_problem pb = plan_tables_problem(T, s->mem_cap, qn, true);
    if (T->quantum > s->out->quantum) s->out->quantum = T->quantum;
    s->full++;
    if (pl_dp_solve_ws(&pb, s->alt, NULL, NULL, &s->ws)) {
      improve(T, s->mem_cap, s->alt);
      double t = plan_time(T, s->alt);
      if (t < s->ta) take(s, t);
      break;
    }
  }
}

/* The relaxation (units rounded down): its plan, if it fits, is optimal at this peak. */
static void relaxation_at_peak(peak_search *s) {
  plan_tables *T = s->T;
  plan_problem pb = plan_tables_problem(T, s->mem_cap, s->quanta, false);
  if (pl_dp_solve_ws(&pb, s->alt, NULL, NULL, &s->ws) && model_bytes(T, s->alt) <= s->mem_cap) {
    double t = plan_time(T, s->alt);
    if (t < s->ta) take(s, t);
  }
}

/* One candidate peak theta (T->legal restricted to it, theta reserved): its unconstrained
 * optimum first (no faster than the incumbent, or below the Lagrangian bound: done; fits: the
 * optimum here), else the knapsack, and the relaxation when that is cheap. */
static void search_peak(peak_search *s, double theta) {
  plan_tables *T = s->T;
  int32_t n = T->pm->n;
  T->act_reserve = theta;
  plan_problem pb = plan_tables_problem(T, s->mem_cap, s->quanta, true);
  if (!pl_dp_core(&pb, 0, false, s->alt, &s->ws)) return;
  double tu = plan_time(T, s->alt);
  if (tu >= s->ta) return; /* not even without a memory limit */
  if (s->lam > 0) {        /* the Lagrangian bound at this peak, with the multiplier found above */
    double v = lagrange_dp(T, s->lam, s->from /* as a plan buffer */, s->scratch, s->from + n);
    if (v - s->lam * (s->mem_cap - theta - T->const_mem) >= s->ta * (1 - 1e-12)) return;
  }
  if (model_bytes(T, s->alt) <= s->mem_cap) { /* the unconstrained optimum at this peak fits */
    take(s, tu);
    return;
  }
  knapsack_at_peak(s);
  if (s->work < 1e7) relaxation_at_peak(s); /* cheap */
}

/* Solves the tables. A plan fits when its parameters (each layer's on its most-loaded rank),
 * its activation peak (the largest working set of its layers) and the unplaced slices fit the
 * cap. The peak is a maximum, not a sum, so the search runs once per candidate peak theta (the
 * distinct working sets, largest first): states whose working set exceeds theta are excluded,
 * theta is reserved, and the parameters are the DP's knapsack (memory in units rounded up:
 * every plan it accepts fits), improved byte for byte by local moves. A theta is skipped when
 * even its smallest parameters do not fit, or when its unconstrained optimum is no faster than
 * the best plan so far. The Lagrangian dual (with the smallest possible peak) bounds every plan
 * that fits; a plan as fast as the bound is certified optimal. */
bool pl_solve_tables(plan_tables *T, double mem_cap, int32_t quanta, int32_t *choice, plan_solution *out) {
  int32_t n = T->pm->n, S = T->S;
  size_t ns = (size_t)n * S;
  peak_search s = {.T = T, .mem_cap = mem_cap, .choice = choice, .ta = INFINITY, .out = out};
  s.alt = malloc((size_t)n * sizeof *s.alt);
  s.legal = malloc(ns);
  double *thetas = malloc((ns + 1) * sizeof *thetas);
  double t0 = pl_now_ms(), reserve = T->act_reserve;
  if (quanta <= 0) quanta = 1024;
  out->exact = true;
  out->quantum = 0;
  s.fit = (int64_t)(PLAN_DP_BYTES / (ns * sizeof(float))) - 1; /* every layer's DP table is kept */
  quanta = clamp_quanta(quanta, s.fit);
  int nt = 0;
  s.scratch = malloc(2 * (size_t)S * sizeof *s.scratch);
  s.from = malloc((ns + (size_t)n) * sizeof *s.from);
  double lb = -INFINITY;
  if (s.alt && s.legal && thetas && s.scratch && s.from) {
    memcpy(s.legal, T->legal, ns);
    nt = candidate_peaks(T, s.legal, thetas);
    lb = first_bound(&s);
    if (T->cutoff > 0 && lb + T->const_time > T->cutoff) nt = 0; /* slower than the caller can use */
  }
  s.quanta = finer_quanta(T, thetas, nt, quanta, s.fit);
  /* every peak is searched when that is cheap; past the budget only the incumbent's own peak */
  s.work = (double)n * S * S * (s.quanta + 1);
  double budget_dps = 1e8 / (s.work > 1 ? s.work : 1);
  int max_full = budget_dps > 1 ? (int)budget_dps : 1;
  out->peaks_exact = true;
  for (int it = 0; it < nt; it++) {
    double theta = thetas[it], least;
    if (it && theta == thetas[it - 1]) continue;
    if (s.full >= max_full) { /* over budget: jump to the incumbent's peak, if it is below */
      double peak = s.ok ? plan_peak(T, choice) : -1;
      out->peaks_exact = false;
      while (it < nt && thetas[it] > peak) it++;
      if (it >= nt || thetas[it] != peak) break;
      theta = thetas[it];
    }
    if (!restrict_to_peak(&s, theta, &least)) break; /* a lower theta leaves a layer no state either */
    if (least > mem_cap) continue;                  /* nothing fits with this peak */
    search_peak(&s, theta);
  }
  if (s.legal) memcpy(T->legal, s.legal, ns);
  T->act_reserve = reserve;
  out->lower_bound_s = lb + T->const_time;
  if (s.ok) {
    out->lower_bound_s = (lb < s.ta ? lb : s.ta) + T->const_time;
    out->exact = out->quantum == 0 || s.ta <= lb * (1 + 1e-12);
  }
  out->full_dps = s.full;
  out->search_ms = pl_now_ms() - t0;
  free(s.ws.D);
  free(s.alt);
  free(s.legal);
  free(thetas);
  free(s.scratch);
  free(s.from);
  return s.ok;
}

/* Search, then the report's numbers for the best assignment (the search's own statistics kept),
 * or the infeasible report when nothing fits mem_cap. */
void pl_solve_and_fill(plan_tables *T, double mem_cap, int32_t quanta, plan_solution *out) {
  int32_t *choice = malloc((size_t)T->pm->n * sizeof *choice);
  if (choice && pl_solve_tables(T, mem_cap, quanta, choice, out)) {
    plan_solution search = *out; /* what the search measured; pl_fill_solution sets the rest */
    pl_fill_solution(T, choice, mem_cap, out);
    out->full_dps = search.full_dps;
    out->peaks_exact = search.peaks_exact;
    out->search_ms = search.search_ms;
    out->quantum = search.quantum;
    out->lower_bound_s = search.lower_bound_s;
    out->exact = search.exact;
  } else {
    pl_infeasible(T, mem_cap, out);
  }
  free(choice);
}

/* Layer i's numbers at its state into out->layers[i] and the plan's sums; its parameter bytes
 * per rank into out->rank_params, less the slices its ops read (counted once for the plan, by
 * the caller). pr: W doubles of scratch. */
static void fill_layer(plan_tables *T, const int32_t *choice, int32_t i, plan_solution *out, double *pr) {
  int32_t S = T->S, W = T->W, s = choice[i];
  size_t k = (size_t)i * S + s;
  plan_layer_out *lo = &out->layers[i];
  lo->place = T->st[s];
  lo->pinned = T->pin[i] >= 0;
  lo->compute_s = T->tcomp[k];
  lo->comm_s = T->tcomm[k];
  lo->redist_s = i ? T->trans[i][(size_t)choice[i - 1] * S + s] : 0;
  lo->param_bytes = T->pbytes[k];
  lo->train_bytes = T->pmax[k] - T->pbytes[k];
  lo->sync_s = T->tsync[k];
  out->sync_s += lo->sync_s;
  out->train_bytes += lo->train_bytes;
  lo->act_bytes = T->amax[k];
  lo->reduce_bytes = T->rbytes[k];
  lo->redist_bytes = T->ubytes[k] + (i ? T->tbytes[i][(size_t)choice[i - 1] * S + s] : 0);
  out->compute_s += lo->compute_s;
  out->comm_s += lo->comm_s + lo->redist_s;
  unary_out u;
  memset(pr, 0, (size_t)W * sizeof *pr);
  pl_unary_eval(T, i, s, &u, pr);
  for (int32_t r = 0; r < W; r++) out->rank_params[r] += pr[r];
  memset(pr, 0, (size_t)W * sizeof *pr); /* its slices read by ops: counted once below, across layers */
  pl_add_reads(T, (home){.kind = H_LAYER, .layer = i}, s, pr);
  for (int32_t r = 0; r < W; r++) out->rank_params[r] -= pr[r];
}

/* The rows of chain layer c's table that rank r holds at placement pl: [*lo, *hi); false: none. */
static bool rank_rows(const plan_place *pl, const chain_layer *c, int32_t r, int64_t *lo, int64_t *hi) {
  int64_t rows[NTP_MAX_GROUPS + 1];
  int32_t gs[NTP_MAX_GROUPS + 1];
  pl_place_rows(pl, c->rows, rows);
  pl_group_starts(pl, gs);
  bool held = false;
  for (int g = 0; g < pl->ngroups; g++)
    if (r >= gs[g] && r < gs[g + 1] && rows[g + 1] > rows[g]) {
      layer_slice sl;
      c->k->split(&c->d, pl->size[g], r - gs[g], &sl);
      *lo = sl.lo;
      *hi = sl.hi;
      held = true;
    }
  return held;
}

/* A head tied to an earlier layer's table: where a rank holds the same rows of it for both,
 * the compiler keeps one slice (the search counts both, to stay additive). */
static void count_tied_rows_once(plan_tables *T, const int32_t *choice, plan_solution *out) {
  int32_t n = T->pm->n, W = T->W;
  for (int32_t j = 0; j < n; j++) {
    const chain_layer *h = &T->pm->L[j];
    if (h->wval < 0) continue;
    for (int32_t i = 0; i < n; i++) {
      const chain_layer *e = &T->pm->L[i];
      if (i == j || T->pm->m->layers[e->ir].weight != h->wval) continue;
      const ir_value *w = &T->pm->m->values[h->wval];
      for (int32_t r = 0; r < W; r++) {
        int64_t rl[2], rh[2];
        bool held[2];
        held[0] = rank_rows(&T->st[choice[i]], e, r, &rl[0], &rh[0]);
        held[1] = rank_rows(&T->st[choice[j]], h, r, &rl[1], &rh[1]);
        if (held[0] && held[1] && rl[0] == rl[1] && rh[0] == rh[1])
          out->rank_params[r] -= plan_tensor_bytes((double)(rh[0] - rl[0]) * (double)w->shape.dim[1] *
                                                   (double)dtype_bytes(w->dtype));
      }
    }
  }
}

/* The report's numbers for an assignment of states. */
void pl_fill_solution(plan_tables *T, const int32_t *choice, double mem_cap, plan_solution *out) {
  int32_t n = T->pm->n, S = T->S, W = T->W;
  out->feasible = true;
  out->world = W;
  out->nlayers = n;
  out->layers = calloc((size_t)n, sizeof *out->layers);
  out->rank_params = calloc((size_t)W, sizeof *out->rank_params);
  out->rank_act = calloc((size_t)W, sizeof *out->rank_act);
  out->act_reserve = plan_peak(T, choice);
  out->mem_cap = mem_cap;
  out->states = S;
  out->sync_s = out->train_bytes = 0;
  if (!out->phys) {
    out->phys = malloc((size_t)W * sizeof *out->phys);
    for (int32_t r = 0; out->phys && r < W; r++) out->phys[r] = r;
  }
  double *pr = calloc((size_t)W, sizeof *pr);
  if (!out->layers || !out->rank_params || !out->rank_act || !pr) {
    out->feasible = false;
    snprintf(out->why, sizeof out->why, "out of memory");
    free(pr);
    return;
  }
  double act = 0, step = T->const_time;
  for (int32_t i = 0; i < n; i++) {
    fill_layer(T, choice, i, out, pr);
    const plan_layer_out *lo = &out->layers[i];
    step += lo->compute_s + lo->comm_s + lo->redist_s;
    if (lo->act_bytes > act) act = lo->act_bytes;
  }
  memset(pr, 0, (size_t)W * sizeof *pr);
  pl_add_reads_plan(T, choice, pr);
  for (int32_t r = 0; r < W; r++) out->rank_params[r] += pr[r];
  count_tied_rows_once(T, choice, out);
  out->mem_peak = 0;
  for (int32_t r = 0; r < W; r++) {
    out->rank_act[r] = act;
    if (out->rank_params[r] + act > out->mem_peak) out->mem_peak = out->rank_params[r] + act;
  }
  pl_zero_fill(T, choice, out);
  out->train = T->train;
  out->mem_peak += out->train_bytes;
  free(out->rank_state);
  if (T->train && (out->rank_state = malloc((size_t)W * sizeof *out->rank_state)))
    for (int32_t r = 0; r < W; r++) out->rank_state[r] = out->train_bytes; /* the busiest layers' shares */
  out->const_s = T->const_time;
  out->compute_s += T->const_time;
  out->step_s = step;
  free(pr);
}


void pl_infeasible(plan_tables *T, double mem_cap, plan_solution *out) {
  double need = T->act_reserve + T->const_mem;
  for (int32_t i = 0; i < T->pm->n; i++) {
    double pmin = INFINITY;
    for (int32_t s = 0; s < T->S; s++)
      if (T->legal[(size_t)i * T->S + s] && T->pmax[(size_t)i * T->S + s] < pmin) pmin = T->pmax[(size_t)i * T->S + s];
    need += pmin;
  }
  out->feasible = false;
  out->world = T->W;
  out->mem_cap = mem_cap;
  out->act_reserve = T->act_reserve;
  char b1[32], b2[32], b3[32];
  snprintf(out->why, sizeof out->why,
           "does not fit: the smallest plan needs %s per GPU (parameters at the highest degrees, plus %s of "
           "activations and unplaced slices), the cap is %s",
           pl_fmt_bytes(need, b1, sizeof b1), pl_fmt_bytes(T->act_reserve + T->const_mem, b2, sizeof b2),
           pl_fmt_bytes(mem_cap, b3, sizeof b3));
}

double pl_cap_of(const plan_request *rq) { return rq->mem_cap > 0 ? rq->mem_cap : rq->prof->mem_capacity; }

static bool plan_solve_unguarded(const plan_model *pm, const ir_module *m, const plan_request *rq, plan_solution *out,
                                 diag_sink *diags) {
  memset(out, 0, sizeof *out);
  int32_t W = rq->world, n = pm->n;
  if (W < 1) {
    diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "the world must have at least one rank");
    return false;
  }
  plan_place *st = NULL;
  int32_t ns = 0, cs = 0;
  int32_t *pins = malloc((size_t)n * sizeof *pins);
  bool ok = pins != NULL;
  int32_t kmax = rq->max_groups > 0 && rq->max_groups < W ? rq->max_groups : W;
  for (int32_t k = 1; ok && k <= kmax && k <= NTP_MAX_GROUPS; k++) {
    plan_place a = plan_place_balanced(W, k, false), b = plan_place_balanced(W, k, true);
    ok = pl_add_state(&st, &ns, &cs, &a) >= 0 && (k == W || pl_add_state(&st, &ns, &cs, &b) >= 0);
  }
  if (ok && rq->train) ok = pl_add_recompute_states(&st, &ns, &cs);
  plan_place *pin = malloc((size_t)(n + 1) * sizeof *pin);
  bool *free_ = malloc((size_t)(n + 1) * sizeof *free_);
  if (ok && (!pin || !free_)) {
    ok = false;
    diag_out_of_memory(diags);
  } else if (ok && !pl_pins(pm, m, W, rq->fixed, pin, free_, diags)) {
    free(pin);
    free(free_);
    free(pins);
    free(st);
    return false;
  }
  for (int32_t i = 0; ok && i < n; i++) {
    pins[i] = -1;
    if (!free_[i]) ok = (pins[i] = pl_add_state(&st, &ns, &cs, &pin[i])) >= 0;
  }
  free(pin);
  free(free_);
  if (!ok || ns > 255) {
    if (ok) diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "too many placements to search (%d)", ns);
    else diag_out_of_memory(diags);
    free(pins);
    free(st);
    return false;
  }
  double t0 = pl_now_ms();
  plan_tables *T = pl_tables_build(pm, rq->prof, W, NULL, rq->nodes_of, st, ns, pins, rq->train, diags);
  free(pins);
  free(st);
  if (!T) return false;
  out->tables_ms = pl_now_ms() - t0;
  double tms = out->tables_ms;
  if (rq->train) pl_zero_solve(T, rq, out); /* the optimizer's stage chosen (or forced) with the plan */
  else pl_solve_and_fill(T, pl_cap_of(rq), rq->quanta, out);
  out->tables_ms = tms;
  plan_tables_free(T);
  return true;
}

static plan_tables *plan_tables_new_unguarded(const plan_model *pm, const plan_request *rq, diag_sink *diags) {
  int32_t W = rq->world;
  plan_place *st = NULL;
  int32_t ns = 0, cs = 0;
  for (int32_t k = 1; k <= W && k <= NTP_MAX_GROUPS; k++) {
    plan_place a = plan_place_balanced(W, k, false), b = plan_place_balanced(W, k, true);
    pl_add_state(&st, &ns, &cs, &a);
    if (k < W) pl_add_state(&st, &ns, &cs, &b);
  }
  if (rq->train) pl_add_recompute_states(&st, &ns, &cs);
  plan_tables *T = pl_tables_build(pm, rq->prof, W, NULL, rq->nodes_of, st, ns, NULL, rq->train, diags);
  free(st);
  if (T && rq->train && rq->zero > 0) pl_zero_set(T, rq->zero, rq->redundancy); /* priced as asked */
  return T;
}

void plan_tables_bytes_in(plan_tables *T, const int32_t *choice, double *per_rank) {
  int32_t n = T->pm->n, W = T->W;
  memset(per_rank, 0, (size_t)W * sizeof *per_rank);
  for (int32_t i = 0; i < n; i++) {
    const chain_layer *c = &T->pm->L[i];
    const plan_place *pl = &T->st[choice[i]];
    int64_t rows[NTP_MAX_GROUPS + 1];
    int32_t gs[NTP_MAX_GROUPS + 1];
    pl_place_rows(pl, c->rows, rows);
    pl_group_starts(pl, gs);
    for (int g = 0; g < pl->ngroups; g++) {
      double b;
      pl_group_reduce(T, c, pl, gs[g], pl->size[g], rows[g + 1] - rows[g], &b);
      for (int k = 0; k < pl->size[g] && b > 0; k++) per_rank[gs[g] + k] += b;
    }
    const plan_model *pm = T->pm;
    for (int32_t e = pm->umove_off[i]; e < pm->umove_off[i + 1]; e++)
      pl_move_eval(T, &pm->moves[pm->umove_ix[e]], i, choice[i], choice[i], NULL, per_rank);
    for (int32_t e = pm->pmove_off[i]; i > 0 && e < pm->pmove_off[i + 1]; e++)
      pl_move_eval(T, &pm->moves[pm->pmove_ix[e]], i - 1, choice[i - 1], choice[i], NULL, per_rank);
  }
  for (int32_t e = T->pm->umove_off[n]; e < T->pm->umove_off[n + 1]; e++)
    pl_move_eval(T, &T->pm->moves[T->pm->umove_ix[e]], 0, 0, 0, NULL, per_rank);
}

/* ---- the entry points: out of memory in a table returns an error instead of aborting ---- */

plan_model *plan_model_new(const ir_module *m, diag_sink *diags) {
  NTP_OOM_GUARDED(plan_model_new_unguarded(m, diags), (diag_out_of_memory(diags), NULL));
}

bool plan_solve(const plan_model *pm, const ir_module *m, const plan_request *rq, plan_solution *out, diag_sink *diags) {
  NTP_OOM_GUARDED(plan_solve_unguarded(pm, m, rq, out, diags), (diag_out_of_memory(diags), false));
}

bool plan_failover_solve(const plan_model *pm, const ir_module *m, const plan_request *rq, plan_failover *out,
                         diag_sink *diags) {
  NTP_OOM_GUARDED(plan_failover_solve_unguarded(pm, m, rq, out, diags), (diag_out_of_memory(diags), false));
}

plan_tables *plan_tables_new(const plan_model *pm, const plan_request *rq, diag_sink *diags) {
  NTP_OOM_GUARDED(plan_tables_new_unguarded(pm, rq, diags), (diag_out_of_memory(diags), NULL));
}
