/* search.c — the search: the dynamic program over layers, placements and memory units (exact for
 * the quantised problem), and the exhaustive search it is tested against. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner_internal.h"

/* ======================================================================================
 * the search
 * ====================================================================================== */

double plan_problem_eval(const plan_problem *pb, const int32_t *choice, int64_t *units) {
  int32_t S = pb->nstates;
  float t = pb->time[choice[0]];
  int64_t u = pb->units[choice[0]];
  for (int32_t l = 1; l < pb->nlayers; l++) {
    size_t k = (size_t)l * S + choice[l];
    t = (t + pb->trans[l][(size_t)choice[l - 1] * S + choice[l]]) + pb->time[k];
    u += pb->units[k];
  }
  if (units) *units = u;
  return t;
}

/* The DP's inner loops: vectorised at O3, and on x86-64 also built for AVX2 and AVX-512,
 * chosen when the program loads (GCC function multiversioning). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define PLAN_HOT __attribute__((optimize("O3"), target_clones("avx512f", "avx2", "default")))
#elif defined(__GNUC__) && !defined(__clang__)
#define PLAN_HOT __attribute__((optimize("O3")))
#else
#define PLAN_HOT
#endif

/* row[m] = min(row[m], p[m - u] + r) for m in [u, Q] (vectorises: no branch, no index) */
static PLAN_HOT void relax(const float *restrict p, float r, int64_t u, int64_t Q, float *restrict row) {
  const float *q = p - u;
  for (int64_t m = u; m <= Q; m++) {
    float v = q[m] + r;
    row[m] = v < row[m] ? v : row[m];
  }
}

static PLAN_HOT void add_time(float *restrict row, int64_t lo, int64_t Q, float t) {
  for (int64_t m = lo; m <= Q; m++) row[m] += t;
}

static PLAN_HOT void fill(float *restrict row, int64_t lo, int64_t hi, float v) {
  for (int64_t m = lo; m <= hi; m++) row[m] = v;
}

/* a DP table reused by the searches of one plan (its pages are touched once) */


/* The DP's table: layer l's rows, one per state, span memory units [0, hi[l]] and start at
 * D + off[l]. */
typedef struct dp_grid {
  const plan_problem *pb;
  int64_t Q;
  bool use_units;
  int64_t *hi;
  size_t *off;
  float *D;
} dp_grid;

static int64_t state_units(const dp_grid *g, size_t k) { return g->use_units ? g->pb->units[k] : 0; }

/* Layer l's rows stop at hi[l], the most units layers 0..l can use (at most Q); returns the
 * table's cells. */
static size_t dp_layout(dp_grid *g) {
  const plan_problem *pb = g->pb;
  int32_t L = pb->nlayers, S = pb->nstates;
  int64_t Q = g->Q, *hi = g->hi;
  size_t total = 0;
  for (int32_t l = 0; l < L; l++) {
    int64_t top = 0;
    for (int32_t s = 0; s < S && g->use_units; s++) {
      size_t k = (size_t)l * S + s;
      if (pb->legal[k] && pb->units[k] <= Q && pb->units[k] > top) top = pb->units[k];
    }
    hi[l] = (l ? hi[l - 1] : 0) + top < Q ? (l ? hi[l - 1] : 0) + top : Q;
    g->off[l] = total;
    total += (size_t)S * (size_t)(hi[l] + 1);
  }
  return total;
}

static void dp_first_layer(dp_grid *g) {
  const plan_problem *pb = g->pb;
  const float inf = INFINITY;
  int64_t top = g->hi[0];
  for (int32_t s = 0; s < pb->nstates; s++) {
    float *row = g->D + (size_t)s * (size_t)(top + 1);
    int64_t u = state_units(g, (size_t)s);
    if (pb->legal[s] && u <= top) {
      fill(row, 0, u - 1, inf);
      fill(row, u, top, pb->time[s]);
    } else {
      fill(row, 0, top, inf);
    }
  }
}

/* Layer l's rows from layer l - 1's: the best predecessor through its transition, plus the
 * state's own time; constant beyond the most units the row can use. */
static void dp_layer(dp_grid *g, int32_t l) {
  const plan_problem *pb = g->pb;
  int32_t S = pb->nstates;
  const int64_t *hi = g->hi;
  const float inf = INFINITY;
  const float *tr = pb->trans[l], *prev = g->D + g->off[l - 1];
  size_t ps = (size_t)(hi[l - 1] + 1), cs = (size_t)(hi[l] + 1);
  for (int32_t s = 0; s < S; s++) {
    float *row = g->D + g->off[l] + (size_t)s * cs;
    size_t k = (size_t)l * S + s;
    int64_t u = state_units(g, k);
    if (!pb->legal[k] || u > g->Q) {
      fill(row, 0, (int64_t)cs - 1, inf);
      continue;
    }
    int64_t end = hi[l - 1] + u < hi[l] ? hi[l - 1] + u : hi[l];
    fill(row, 0, end, inf);
    for (int32_t s2 = 0; s2 < S; s2++)
      if (pb->legal[(size_t)(l - 1) * S + s2]) relax(prev + (size_t)s2 * ps, tr[(size_t)s2 * S + s], u, end, row);
    add_time(row, u, end, pb->time[k]);
    fill(row, end + 1, hi[l], row[end]);
  }
}

/* The best last state, and the plan traced back from it: at each layer, a predecessor whose
 * value reproduces the entry exactly (the same float operations). false: no plan. */
static bool dp_trace(const dp_grid *g, int32_t *choice) {
  const plan_problem *pb = g->pb;
  int32_t L = pb->nlayers, S = pb->nstates;
  const int64_t *hi = g->hi;
  const float *D = g->D;
  size_t ls = (size_t)(hi[L - 1] + 1);
  const float *last = D + g->off[L - 1];
  int32_t best = -1;
  for (int32_t s = 0; s < S; s++) {
    float v = last[(size_t)s * ls + (size_t)hi[L - 1]];
    if (v < INFINITY && (best < 0 || v < last[(size_t)best * ls + (size_t)hi[L - 1]])) best = s;
  }
  if (best < 0) return false;
  bool ok = true;
  int64_t m = hi[L - 1];
  int32_t s = best;
  for (int32_t l = L - 1; l >= 1 && ok; l--) {
    choice[l] = s;
    size_t k = (size_t)l * S + s;
    int64_t u = state_units(g, k);
    int64_t end = hi[l - 1] + u < hi[l] ? hi[l - 1] + u : hi[l];
    if (m > end) m = end; /* the row is constant beyond its end */
    float want = D[g->off[l] + (size_t)s * (size_t)(hi[l] + 1) + (size_t)m];
    const float *prev = D + g->off[l - 1];
    size_t ps = (size_t)(hi[l - 1] + 1);
    int32_t from = -1;
    for (int32_t s2 = 0; s2 < S && from < 0; s2++) {
      if (!pb->legal[(size_t)(l - 1) * S + s2]) continue;
      float v = prev[(size_t)s2 * ps + (size_t)(m - u)] + pb->trans[l][(size_t)s2 * S + s];
      v = v + pb->time[k];
      if (v == want) from = s2;
    }
    ok = from >= 0;
    m -= u;
    s = from;
  }
  if (ok) choice[0] = s;
  return ok;
}

/* D[l][s][m] = least time of layers 0..l ending in state s with at most m units; the memory
 * axis is [0, Q] (Q = 0 and use_units = false: the unconstrained problem). Layer l's rows stop
 * at hi[l], the most units layers 0..l can use (beyond, every row is constant). Every layer's
 * table is kept; the plan is traced back by finding, at each layer, a predecessor whose value
 * reproduces the entry exactly (the same float operations). */
bool pl_dp_core(const plan_problem *pb, int64_t Q, bool use_units, int32_t *choice, dp_ws *ws) {
  int32_t L = pb->nlayers;
  dp_grid g = {.pb = pb, .Q = Q, .use_units = use_units};
  g.hi = malloc((size_t)L * sizeof *g.hi);
  g.off = malloc((size_t)L * sizeof *g.off);
  bool ok = g.hi && g.off;
  size_t total = ok ? dp_layout(&g) : 0;
  if (ok && (double)total * sizeof(float) > (double)PLAN_DP_BYTES) ok = false;
  if (ok && ws->cap < total) {
    free(ws->D);
    ws->D = malloc(total * sizeof *ws->D);
    ws->cap = ws->D ? total : 0;
  }
  g.D = ws->D;
  if (ok && g.D) {
    dp_first_layer(&g);
    for (int32_t l = 1; l < L; l++) dp_layer(&g, l);
    ok = dp_trace(&g, choice);
  } else {
    ok = false;
  }
  free(g.hi);
  free(g.off);
  return ok;
}

bool pl_dp_solve_ws(const plan_problem *pb, int32_t *choice, double *time, int64_t *units, dp_ws *ws) {
  if (pb->nlayers <= 0 || pb->nstates <= 0 || pb->nstates > 255 || pb->budget < 0) return false;
  int64_t u;
  /* memory that does not bind: the unconstrained optimum fits */
  if (!pl_dp_core(pb, 0, false, choice, ws)) return false;
  double t = plan_problem_eval(pb, choice, &u);
  if (u > pb->budget) {
    int64_t most = 0; /* no plan uses more units than the sum of each layer's largest */
    for (int32_t l = 0; l < pb->nlayers; l++) {
      int64_t mx = 0;
      for (int32_t s = 0; s < pb->nstates; s++)
        if (pb->legal[(size_t)l * pb->nstates + s] && pb->units[(size_t)l * pb->nstates + s] > mx)
          mx = pb->units[(size_t)l * pb->nstates + s];
      most += mx;
    }
    int64_t Q = pb->budget < most ? pb->budget : most;
    if (!pl_dp_core(pb, Q, true, choice, ws)) return false;
    t = plan_problem_eval(pb, choice, &u);
  }
  if (time) *time = t;
  if (units) *units = u;
  return true;
}

bool plan_dp_solve(const plan_problem *pb, int32_t *choice, double *time, int64_t *units) {
  dp_ws ws = {0};
  bool ok = pl_dp_solve_ws(pb, choice, time, units, &ws);
  free(ws.D);
  return ok;
}

bool plan_exhaustive_solve(const plan_problem *pb, int32_t *choice, double *time, int64_t *units) {
  int32_t L = pb->nlayers, S = pb->nstates;
  if (L <= 0 || S <= 0 || pb->budget < 0) return false;
  int32_t *c = calloc((size_t)L, sizeof *c);
  if (!c) return false;
  bool found = false;
  double best = 0;
  /* the same float sums as the DP, so that ties and values compare exactly */
  int64_t bu = 0;
  for (int32_t l = 0; l < L; l++) { /* first legal state of every layer */
    while (c[l] < S && !pb->legal[(size_t)l * S + c[l]]) c[l]++;
    if (c[l] == S) {
      free(c);
      return false;
    }
  }
  for (;;) {
    int64_t u;
    double t = plan_problem_eval(pb, c, &u);
    if (u <= pb->budget && (!found || t < best)) {
      found = true;
      best = t;
      bu = u;
      memcpy(choice, c, (size_t)L * sizeof *c);
    }
    int32_t l = L - 1;
    for (; l >= 0; l--) {
      do c[l]++;
      while (c[l] < S && !pb->legal[(size_t)l * S + c[l]]);
      if (c[l] < S) break;
      c[l] = 0;
      while (!pb->legal[(size_t)l * S + c[l]]) c[l]++;
    }
    if (l < 0) break;
  }
  free(c);
  if (found) {
    if (time) *time = best;
    if (units) *units = bu;
  }
  return found;
}
