/* zero.c — a training step's costs (forward, backward, gradient sync, optimizer state) and the
 * distributed optimizer, 'optimizer zero Z redundancy K;' (docs/planner.md, "Training").
 *
 * Every parameter element is held by one rank of each group of its layer's placement: its n
 * replicas. Without ZeRO (zero 0) each replica keeps the element's gradient, fp32 master and two
 * fp32 moments, and the gradients are all-reduced over the replicas. With zero 1 the optimizer
 * state (12 bytes an element) is split into n parts, each kept by K of the replicas: a rank keeps
 * 12·K/n bytes per element it holds; the sync becomes a reduce-scatter to the owners (plus the
 * K − 1 extra copies of each part) and an all-gather of the updated parameters. Zero 2 keeps only
 * the owned parts' gradients too, the whole gradient of one layer living while it is scattered.
 * The stage and K are plan-wide, so the search runs once per candidate over tables built once:
 * only the per-layer entries the stage changes are re-priced (the transitions are not). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner_internal.h"

/* Within this fraction of the fastest candidate's step, the more resilient candidate is taken
 * (redundancy 2, or every replica keeping all, over state a single GPU's loss would take). */
#define ZERO_SLACK 0.04

/* What layer i at state s keeps and sends in a training step, at T's ZeRO stage. */
typedef struct zero_price {
  double sync;             /* seconds: the gradient sync and, with ZeRO, the parameter all-gather */
  double sync_bytes, gather_bytes; /* per rank: sent in the sync; received in the all-gather */
  double grad, opt, saved; /* bytes kept: gradients, optimizer state, saved activations */
  double pmax, amax;       /* the search's entries: bytes kept across the step; the working set */
  int32_t n;               /* replicas: groups with rows (each holds the parameters) */
} zero_price;

/* the sync runs over the inter-node link when the replicas are on different nodes */
static plan_level sync_level(const plan_tables *T, const plan_place *pl) {
  int32_t gs[NTP_MAX_GROUPS + 1];
  pl_group_starts(pl, gs);
  plan_level lv = PLAN_INTRA;
  for (int g = 1; g < pl->ngroups; g++)
    if (T->node[gs[g]] != T->node[gs[0]]) lv = PLAN_INTER;
  return lv;
}

static int32_t groups_with_rows(const plan_place *pl, int64_t nrows) {
  int64_t rows[NTP_MAX_GROUPS + 1];
  pl_place_rows(pl, nrows, rows);
  int32_t n = 0;
  for (int g = 0; g < pl->ngroups; g++) n += rows[g + 1] > rows[g];
  return n;
}

/* P: the parameter bytes of the layer's most-loaded rank; act: its forward working set. */
static void price(const plan_tables *T, int32_t i, int32_t s, double P, double act, zero_price *z) {
  const chain_layer *c = &T->pm->L[i];
  const plan_place *pl = &T->st[s];
  double eb = (double)dtype_bytes(c->wdt), state = eb + 12.0;
  *z = (zero_price){.saved = pl->rc ? 0.0 : act, .amax = act, .grad = P, .opt = 12.0 * P / eb};
  /* a pipeline's replicas (the 3D search: T is one stage of one replica) hold the same slices */
  int32_t outer = T->outer > 1 ? T->outer : 1;
  plan_level lv = outer > 1 && T->outer_lv == PLAN_INTER ? PLAN_INTER : sync_level(T, pl);
  if (T->zero == 0) { /* every replica keeps all: the expressions the planner always used */
    int32_t n = z->n = pl->ngroups * outer;
    if (n > 1 && P > 0) {
      z->sync = plan_allreduce_time(T->prof, lv, n, P);
      z->sync_bytes = 2.0 * (n - 1) / n * P;
    }
    z->pmax = P * (1.0 + state / eb) + z->saved; /* recomputed: no activations kept */
    return;
  }
  int32_t n = z->n = groups_with_rows(pl, c->rows) * outer, K = T->red < n ? T->red : n;
  double share = n > 0 ? (double)K / n : 1;
  z->opt *= share;
  if (T->zero == 2) {
    z->grad *= share;
    z->amax = act + P; /* the layer's whole gradient while it is scattered to its owners */
  }
  z->pmax = P + z->grad + z->opt + z->saved;
  if (n > 1 && P > 0) {
    z->sync_bytes = (double)(n - 1 + K - 1) / n * P; /* the reduce-scatter, then K - 1 more copies */
    z->gather_bytes = (double)(n - 1) / n * P;
    z->sync = plan_coll_time(T->prof, lv, COMM_REDUCE_SCATTER, P, z->sync_bytes) +
              plan_coll_time(T->prof, lv, COMM_ALL_GATHER, P, z->gather_bytes);
  }
}

/* A training step's costs of layer i at state s, from its forward's (u, changed in place); the
 * gradient sync's time is returned. The backward runs about twice the forward's kernels (each
 * GEMM's dgrad and wgrad; the elementwise and norm backward read twice what their forward
 * reads) and sends what the forward's collectives send once more (each has a conjugate: the
 * row-parallel all-reduce becomes the column-parallel input gradient's). Every parameter's
 * gradient is summed over the groups that hold it (replicas at different degrees, over the
 * common refinement of their slices: a ring collective among the groups of what the busiest
 * rank holds). Beside its parameters a rank keeps their gradients (storage dtype), fp32 master
 * weights and two fp32 AdamW moments (train.c keeps a master for fp32 parameters too; with ZeRO
 * the shares above), and the layer's activations from its forward until its backward: additive
 * over the layers, where the forward's working set is a peak. A recomputed state ('recompute',
 * pl->rc) keeps no activations and pays the forward's kernels and transfers once more. */
double pl_train_costs(plan_tables *T, int32_t i, int32_t s, unary_out *u) {
  const plan_place *pl = &T->st[s];
  size_t k = (size_t)i * T->S + s;
  u->comp *= pl->rc ? 4 : 3; /* recomputed: the forward once more */
  u->comm *= pl->rc ? 3 : 2;
  T->tbase[k] = u->comm;
  T->famax[k] = u->amax;
  zero_price z;
  price(T, i, s, u->pmax, u->amax, &z);
  T->tsaved[k] = z.saved;
  u->comm += z.sync;
  u->pmax = z.pmax;
  u->amax = z.amax;
  return z.sync;
}

/* Re-prices T's training entries at another ZeRO stage and redundancy (the forward's costs and
 * the transitions stay). */
void pl_zero_set(plan_tables *T, int32_t zero, int32_t red) {
  T->zero = zero;
  T->red = red > 0 ? red : 1;
  if (!T->train) return;
  T->act_reserve = T->const_act;
  for (int32_t i = 0; i < T->pm->n; i++)
    for (int32_t s = 0; s < T->S; s++) {
      size_t k = (size_t)i * T->S + s;
      if (!T->legal[k]) continue;
      zero_price z;
      price(T, i, s, T->pbytes[k], T->famax[k], &z);
      T->tsync[k] = z.sync;
      T->tsaved[k] = z.saved;
      T->tcomm[k] = T->tbase[k] + z.sync;
      T->pmax[k] = z.pmax;
      T->amax[k] = z.amax;
      if (z.amax > T->act_reserve) T->act_reserve = z.amax;
    }
}

/* The fewest failure domains among the holders of any one element of a layer at pl: rank j of
 * every group with rows holds the same slice (balanced groups; unequal ones nearly). */
static int32_t holder_domains(const plan_tables *T, const plan_place *pl, int64_t nrows) {
  int64_t rows[NTP_MAX_GROUPS + 1];
  int32_t gs[NTP_MAX_GROUPS + 1], fewest = INT32_MAX, D = T->domain > 0 ? T->domain : 1;
  pl_place_rows(pl, nrows, rows);
  pl_group_starts(pl, gs);
  for (int32_t j = 0; j < pl->size[pl->ngroups - 1]; j++) { /* the last group is the smallest */
    int32_t seen[NTP_MAX_GROUPS], nd = 0;
    for (int g = 0; g < pl->ngroups; g++) {
      if (rows[g + 1] == rows[g]) continue;
      int32_t d = (gs[g] + j) / D;
      bool dup = false;
      for (int32_t e = 0; e < nd && !dup; e++) dup = seen[e] == d;
      if (!dup) seen[nd++] = d;
    }
    if (nd < fewest) fewest = nd;
  }
  return fewest == INT32_MAX ? 1 : fewest;
}

/* The training split of every layer of a plan, the sums, and which failures lose optimizer
 * state: a single GPU's, where an element's state has one copy (one replica, or redundancy 1);
 * a whole domain's, where every copy lies in it (ZeRO places the K owners of a part in different
 * domains when its holders span two or more). */
void pl_zero_fill(const plan_tables *T, const int32_t *choice, plan_solution *out) {
  out->zero = T->zero;
  out->redundancy = T->zero ? T->red : 0;
  out->domain_size = T->domain;
  out->grad_bytes = out->opt_bytes = out->saved_bytes = out->grad_full = out->opt_full = 0;
  out->sync_bytes = out->gather_bytes = 0;
  out->lone_layers = out->domain_layers = 0;
  if (!T->train) return;
  for (int32_t i = 0; i < T->pm->n; i++) {
    size_t k = (size_t)i * T->S + choice[i];
    const chain_layer *c = &T->pm->L[i];
    plan_layer_out *lo = &out->layers[i];
    zero_price z;
    price(T, i, choice[i], T->pbytes[k], T->famax[k], &z);
    lo->grad_bytes = z.grad;
    lo->opt_bytes = z.opt;
    lo->saved_bytes = z.saved;
    lo->sync_bytes = z.sync_bytes;
    lo->gather_bytes = z.gather_bytes;
    lo->replicas = z.n;
    lo->domains = holder_domains(T, &T->st[choice[i]], c->rows);
    if (T->outer > 1 && T->outer_lv == PLAN_INTER && lo->domains < 2) lo->domains = 2; /* replicas on other nodes */
    out->grad_bytes += z.grad;
    out->opt_bytes += z.opt;
    out->saved_bytes += z.saved;
    out->grad_full += T->pbytes[k];
    out->opt_full += 12.0 * T->pbytes[k] / (double)dtype_bytes(c->wdt);
    out->sync_bytes += z.sync_bytes;
    out->gather_bytes += z.gather_bytes;
    int32_t copies = T->zero == 0 ? z.n : (T->red < z.n ? T->red : z.n);
    out->lone_layers += copies < 2 && T->pbytes[k] > 0;
    out->domain_layers += (copies < 2 || lo->domains < 2) && T->pbytes[k] > 0;
  }
}

/* the candidates a request allows, in the order they are searched and preferred on a tie */
int32_t pl_zero_candidates(const plan_request *rq, struct plan_zero_alt *alt) {
  int32_t n = 0;
  for (int32_t z = 0; z <= 2; z++) {
    if (rq->zero != PLAN_ZERO_AUTO && rq->zero != z) continue;
    if (z == 0 && (rq->redundancy <= 0 || rq->zero == 0)) alt[n++] = (struct plan_zero_alt){.zero = 0, .redundancy = 0};
    for (int32_t k = 1; z > 0 && k <= 2; k++)
      if (rq->redundancy <= 0 || rq->redundancy == k) alt[n++] = (struct plan_zero_alt){.zero = z, .redundancy = k};
    if (z > 0 && rq->redundancy > 2) alt[n++] = (struct plan_zero_alt){.zero = z, .redundancy = rq->redundancy};
  }
  return n;
}

/* how much of the state survives failures: 2 a domain's, 1 a GPU's, 0 neither */
int pl_resilience(const plan_solution *s) { return s->domain_layers == 0 ? 2 : s->lone_layers == 0 ? 1 : 0; }

/* Training: the plan at each ZeRO candidate the request allows (the tables built once, re-priced
 * for each), and the choice: of the candidates within ZERO_SLACK of the fastest step, the one
 * whose optimizer state survives the most failures, then the fastest, then the first. A candidate
 * whose lower bound is already slower than that margin is not searched (T->cutoff). */
void pl_zero_solve(plan_tables *T, const plan_request *rq, plan_solution *out) {
  struct plan_zero_alt alt[PLAN_ZERO_MAX_ALTS];
  int32_t na = pl_zero_candidates(rq, alt), best = -1;
  plan_solution sol[PLAN_ZERO_MAX_ALTS] = {0};
  double fastest = INFINITY;
  if (rq->domain_size > 0) T->domain = rq->domain_size;
  for (int32_t a = 0; a < na; a++) {
    memset(&sol[a], 0, sizeof sol[a]);
    pl_zero_set(T, alt[a].zero, alt[a].redundancy);
    T->cutoff = fastest < INFINITY ? fastest * (1 + ZERO_SLACK) : 0;
    double t0 = pl_now_ms();
    pl_solve_and_fill(T, pl_cap_of(rq), rq->quanta, &sol[a]);
    alt[a].search_ms = pl_now_ms() - t0;
    alt[a].feasible = sol[a].feasible;
    alt[a].pruned = !sol[a].feasible && T->cutoff > 0 && sol[a].lower_bound_s > T->cutoff;
    alt[a].step_s = sol[a].step_s;
    alt[a].mem_peak = sol[a].mem_peak;
    if (sol[a].feasible && sol[a].step_s < fastest) fastest = sol[a].step_s;
  }
  T->cutoff = 0;
  for (int32_t a = 0; a < na; a++) {
    if (!sol[a].feasible || sol[a].step_s > fastest * (1 + ZERO_SLACK)) continue;
    if (best < 0 || pl_resilience(&sol[a]) > pl_resilience(&sol[best]) ||
        (pl_resilience(&sol[a]) == pl_resilience(&sol[best]) && sol[a].step_s < sol[best].step_s))
      best = a;
  }
  int32_t pick = best;
  if (pick < 0) { /* none fits: the report of the candidate whose smallest plan needs least */
    pick = 0;
    for (int32_t a = 1; a < na; a++)
      if (sol[a].need_min < sol[pick].need_min) pick = a;
  }
  double search_ms = 0;
  int32_t dps = 0;
  for (int32_t a = 0; a < na; a++) search_ms += alt[a].search_ms, dps += sol[a].full_dps;
  *out = sol[pick];
  out->search_ms = search_ms; /* every candidate's */
  out->full_dps = dps;
  out->nalts = na;
  for (int32_t a = 0; a < na; a++)
    if (a != pick) plan_solution_free(&sol[a]);
  memcpy(out->alts, alt, (size_t)na * sizeof *alt);
  pl_zero_set(T, alt[pick].zero, alt[pick].redundancy); /* the tables as the plan was priced */
}
