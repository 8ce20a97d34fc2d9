/* pipeline.c — the 3D search: pipelines of stages, replicated, with micro-batches
 * (docs/planner.md, "Pipelines").
 *
 * Searched by structure, not by enumerating placements over the whole world: a pipeline is `p`
 * stages of `g` GPUs (g divides the world and fits a node: tensor parallelism stays on the fast
 * links), the world holds `d = W / (g p)` replicas of it, and each replica's rows are cut into `m`
 * micro-batches of `b` rows. For one (g, b) the per-layer tables are the flat planner's, built for
 * a world of g GPUs on the model recompiled at b rows (rq->model_at_rows): every placement inside a
 * stage (non-uniform groups included), its kernels, collectives, parameters, training state and
 * saved activations per micro-batch. Each structure then chooses
 *   - every layer's placement: a dynamic program over the chain (transitions inside a stage, the
 *     stage input's point-to-point transfer at a boundary) minimising the step's time plus
 *     lambda x memory, lambda raised by bisection until every stage fits;
 *   - the stage boundaries (uneven layer counts): the slowest stage minimised under each stage's
 *     memory, stage i keeping min(p - i, m) micro-batches' activations (1F1B), by bisection on the
 *     slowest stage's time with a greedy packing (exact for that bound: both limits hold for any
 *     part of a stage that fits).
 * The step is sum(stage times) + (m - 1) x the slowest + the slowest stage's gradient sync (once per
 * step, after the last micro-batch), the 1F1B critical path with unequal stages; training also
 * prices ZB-H1 (the zero-bubble schedule): a third of that bubble, sum - slowest, with every stage
 * keeping up to p + 1 micro-batches' activations. Structures whose
 * lower bound (the fastest placements, perfectly balanced) is no better than the best so far are
 * not searched. The optimizer's ZeRO stage is searched on the best few structures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"

/* a state a structure may take: legal on the stage, and its groups over every replica within the
 * compiler's NTP_MAX_GROUPS */
bool pp_usable(const pp_shape *sh, const plan_tables *T, int32_t l, int32_t s) {
  const plan_place *pl = &T->st[s];
  const plan_request *rq = sh->rq;
  if (rq->stage_tp > 0 && (pl->ngroups != 1 || pl->size[0] != rq->stage_tp)) return false;
  if ((rq->recompute < 0 && pl->rc) || (rq->recompute > 0 && !pl->rc)) return false;
  if ((rq->seq_parallel < 0 && pl->sp) || (rq->seq_parallel > 0 && !pl->sp)) return false;
  return T->legal[(size_t)l * T->S + s] && sh->d * pl->ngroups <= NTP_MAX_GROUPS;
}

/* the micro-batches whose activations stage i keeps: 1F1B p - i; ZB-H1 up to p + 1 on every stage
 * (a micro-batch's W may wait after its B: the schedule keeps at most p + 1 with W to come) */
int32_t pp_inflight(const pp_ctx *C, const pp_shape *sh, int32_t i) {
  if (!C->train) return 1;
  int32_t k = sh->zb ? sh->p + 1 : sh->p - i;
  return k < sh->m ? k : sh->m;
}

/* stage inputs cross nodes when the pipeline spans more than one */
plan_level pp_boundary_level(const pp_ctx *C, const pp_shape *sh) { return sh->g * sh->p > C->N ? PLAN_INTER : PLAN_INTRA; }

void pp_set_pricing(const pp_ctx *C, const pp_shape *sh) {
  plan_tables *T = sh->pt->T;
  T->outer = sh->d;
  T->outer_lv = sh->d > 1 && sh->d * sh->p * sh->g > C->N ? PLAN_INTER : PLAN_INTRA;
  if (C->train) pl_zero_set(T, sh->zero, sh->red);
}

/* ---- the stages of a placement vector ---- */

/* layers [a, e) as stage i */
stage_sum pp_stage_of(const pp_ctx *C, const pp_shape *sh, const int32_t *choice, int32_t i, int32_t a, int32_t e) {
  const plan_tables *T = sh->pt->T;
  int32_t S = T->S;
  double st = 0, sv = 0, am = 0;
  stage_sum r = {0};
  for (int32_t l = a; l < e; l++) {
    size_t k = (size_t)l * S + choice[l];
    r.t += pp_f(T, k) + (l > a ? T->trans[l][(size_t)choice[l - 1] * S + choice[l]] : 0);
    r.y += pp_y(T, k);
    st += pp_st(T, k);
    sv += pp_sv(T, k);
    if (T->amax[k] > am) am = T->amax[k];
  }
  if (i > 0) r.t += sh->pt->bnd[pp_boundary_level(C, sh)][(size_t)a * S + choice[a]];
  r.mem = st + pp_inflight(C, sh, i) * sv + am + T->const_mem;
  return r;
}

/* Greedy packing: each stage takes layers while its time stays within tau and its memory within
 * the cap. The stage count, or -1 when a single layer does not fit or more than p are needed. */
static int32_t pack(const pp_ctx *C, const pp_shape *sh, const int32_t *choice, double tau, int32_t *first) {
  const plan_tables *T = sh->pt->T;
  int32_t S = T->S, n = C->n, i = 0, a = 0;
  plan_level lv = pp_boundary_level(C, sh);
  double t = 0, st = 0, sv = 0, am = 0;
  first[0] = 0;
  for (int32_t l = 0; l < n; l++) {
    size_t k = (size_t)l * S + choice[l];
    for (int pass = 0; pass < 2; pass++) {
      bool head = l == a;
      double tt = t + pp_f(T, k) + (head ? (i > 0 ? sh->pt->bnd[lv][k] : 0) : T->trans[l][(size_t)choice[l - 1] * S + choice[l]]);
      double sst = st + pp_st(T, k), ssv = sv + pp_sv(T, k), aam = T->amax[k] > am ? T->amax[k] : am;
      double mem = sst + pp_inflight(C, sh, i) * ssv + aam + T->const_mem;
      if (tt <= tau && mem <= C->cap) {
        t = tt, st = sst, sv = ssv, am = aam;
        break;
      }
      if (head || ++i >= sh->p) return -1; /* a layer alone does not fit, or too many stages */
      first[i] = a = l;
      t = st = sv = am = 0;
    }
  }
  first[i + 1] = n;
  return i + 1;
}

/* The boundaries for a placement vector: the least slowest stage under the memory cap (bisection
 * on its time), then stages split further until there are p, the slowest first. false when no
 * cut fits. */
static bool split(const pp_ctx *C, const pp_shape *sh, const int32_t *choice, int32_t *first) {
  int32_t p = sh->p, q;
  if (p > C->n) return false;
  int32_t tmp[PP_MAX_STAGES + 2];
  double hi = pp_stage_of(C, sh, choice, 0, 0, C->n).t; /* one stage, plus every boundary paid */
  for (int32_t l = 0; l < C->n; l++) hi += sh->pt->bnd[pp_boundary_level(C, sh)][(size_t)l * sh->pt->T->S + choice[l]];
  hi = hi * 1.000001 + 1e-12;
  if (pack(C, sh, choice, hi, tmp) < 0) return false;
  double lo = 0;
  for (int it = 0; it < 48 && hi - lo > 1e-9 * hi; it++) {
    double mid = 0.5 * (lo + hi);
    if (pack(C, sh, choice, mid, tmp) > 0) hi = mid;
    else lo = mid;
  }
  q = pack(C, sh, choice, hi, first);
  if (q < 0) return false;
  while (q < p) { /* more stages than the bound needs: split the slowest stage that can be split */
    int32_t worst = -1;
    double wt = -1;
    for (int32_t i = 0; i < q; i++) {
      double t = pp_stage_of(C, sh, choice, i, first[i], first[i + 1]).t;
      if (first[i + 1] - first[i] > 1 && t > wt) wt = t, worst = i;
    }
    if (worst < 0) return false;
    int32_t a = first[worst], e = first[worst + 1], cut = a + 1;
    double bestmax = INFINITY;
    for (int32_t c = a + 1; c < e; c++) {
      double l = pp_stage_of(C, sh, choice, worst, a, c).t, r = pp_stage_of(C, sh, choice, worst + 1, c, e).t;
      double mx = l > r ? l : r;
      if (mx < bestmax) bestmax = mx, cut = c;
    }
    memmove(first + worst + 2, first + worst + 1, (size_t)(q - worst) * sizeof *first);
    first[worst + 1] = cut;
    q++;
  }
  return true;
}

/* The step of a placement vector cut at `first`; false when a stage exceeds the cap. */
bool pp_evaluate(const pp_ctx *C, const pp_shape *sh, const int32_t *choice, const int32_t *first, pp_plan *r) {
  double sum = 0, slow = 0, sync = 0, p2p = 0, mem = 0;
  int32_t S = sh->pt->T->S;
  for (int32_t i = 0; i < sh->p; i++) {
    stage_sum s = pp_stage_of(C, sh, choice, i, first[i], first[i + 1]);
    if (s.mem > C->cap) return false;
    sum += s.t;
    if (s.t > slow) slow = s.t;
    if (s.y > sync) sync = s.y;
    if (s.mem > mem) mem = s.mem;
    if (i > 0) p2p += sh->pt->bnd[pp_boundary_level(C, sh)][(size_t)first[i] * S + choice[first[i]]];
  }
  /* 1F1B: the bubble is (sum - slow), the fill and drain of the other stages; ZB-H1 keeps a third */
  r->step = pp_bubble_share(sh) * (sum - slow) + sh->m * slow + sync + sh->m * sh->pt->T->const_time;
  r->slowest = slow, r->sync = sync, r->p2p = p2p, r->mem = mem;
  return true;
}

/* The placements minimising (m + (p - 1) x the bubble's share) x time + sync + lam x memory over the chain cut at
 * `first` (a stage's first layer pays its input's transfer instead of a transition). */
static void place(pp_ctx *C, const pp_shape *sh, const int32_t *first, double lam, int32_t *choice) {
  const plan_tables *T = sh->pt->T;
  int32_t S = T->S, n = C->n, i = 0;
  double wf = sh->m + (sh->p - 1) * pp_bubble_share(sh);
  plan_level lv = pp_boundary_level(C, sh);
  for (int32_t l = 0; l < n; l++) {
    while (i + 1 < sh->p && first[i + 1] <= l) i++;
    bool head = l == first[i];
    double kf = pp_inflight(C, sh, i), pmin = INFINITY;
    int32_t pbest = 0;
    if (l > 0 && head)
      for (int32_t s = 0; s < S; s++)
        if (C->prev[s] < pmin) pmin = C->prev[s], pbest = s;
    for (int32_t s = 0; s < S; s++) {
      size_t k = (size_t)l * S + s;
      C->cur[s] = INFINITY;
      if (!pp_usable(sh, T, l, s)) continue;
      double cost = wf * (pp_f(T, k) + (head && i > 0 ? sh->pt->bnd[lv][k] : 0)) + pp_y(T, k) +
                    lam * (pp_st(T, k) + kf * pp_sv(T, k));
      if (l == 0) {
        C->cur[s] = cost;
      } else if (head) {
        C->cur[s] = pmin + cost;
        C->from[(size_t)l * S + s] = pbest;
      } else {
        const double *tr = T->trans[l];
        double best = INFINITY;
        int32_t arg = 0;
        for (int32_t q = 0; q < S; q++) {
          double v = C->prev[q] + wf * tr[(size_t)q * S + s];
          if (v < best) best = v, arg = q;
        }
        C->cur[s] = best + cost;
        C->from[(size_t)l * S + s] = arg;
      }
    }
    double *x = C->prev;
    C->prev = C->cur, C->cur = x;
  }
  int32_t s = 0;
  for (int32_t q = 1; q < S; q++)
    if (C->prev[q] < C->prev[s]) s = q;
  for (int32_t l = n - 1; l >= 0; l--) {
    choice[l] = s;
    if (l > 0) s = C->from[(size_t)l * S + s];
  }
}

/* One try at lam: placements, boundaries for them, placements again at those boundaries. */
static bool try_lambda(pp_ctx *C, const pp_shape *sh, double lam, int32_t *first, pp_plan *best) {
  int32_t *choice = C->work;
  bool any = false;
  for (int round = 0; round < 2; round++) {
    place(C, sh, first, lam, choice);
    int32_t cut[PP_MAX_STAGES + 2];
    if (!split(C, sh, choice, cut)) continue;
    memcpy(first, cut, (size_t)(sh->p + 1) * sizeof *first);
    pp_plan r = {.sh = *sh};
    if (!pp_evaluate(C, sh, choice, first, &r)) continue;
    any = true;
    if (!best->ok || r.step < best->step) {
      int32_t *keep = best->choice;
      *best = r;
      best->ok = true;
      best->choice = keep;
      memcpy(best->choice, choice, (size_t)C->n * sizeof *choice);
      memcpy(best->first, first, (size_t)(sh->p + 1) * sizeof *first);
    }
  }
  return any;
}

/* Local improvement of a structure's best plan under the step's own formula (the DP weighs an
 * approximation of it, the cut balances the slowest stage alone): each boundary moved anywhere
 * between its neighbours, each layer put in each other state, the better kept, until neither
 * helps (at most 4 rounds). */
/* best's placements and cut as they now stand: true, with their figures taken, when faster */
static bool improves(const pp_ctx *C, const pp_shape *sh, pp_plan *best) {
  pp_plan r = {.sh = *sh};
  if (!pp_evaluate(C, sh, best->choice, best->first, &r) || !(r.step < best->step * (1 - 1e-12))) return false;
  best->step = r.step, best->slowest = r.slowest, best->sync = r.sync, best->p2p = r.p2p, best->mem = r.mem;
  return true;
}

static void polish(pp_ctx *C, const pp_shape *sh, pp_plan *best) {
  const plan_tables *T = sh->pt->T;
  int32_t n = C->n, p = sh->p, *ch = best->choice, *first = best->first;
  for (int round = 0; round < 4; round++) {
    bool better = false;
    for (int32_t i = 1; i < p; i++) {
      for (int32_t c = first[i - 1] + 1; c < first[i + 1]; c++) {
        if (c == first[i]) continue;
        int32_t was = first[i];
        first[i] = c;
        if (improves(C, sh, best)) better = true;
        else first[i] = was;
      }
    }
    for (int32_t l = 0; l < n; l++)
      for (int32_t s = 0; s < T->S; s++) {
        int32_t was = ch[l];
        if (s == was || !pp_usable(sh, T, l, s)) continue;
        ch[l] = s;
        if (improves(C, sh, best)) better = true;
        else ch[l] = was;
      }
    if (!better) break;
  }
}

/* The best plan of one structure (best->choice: n entries, the caller's). */
void pp_search_shape(pp_ctx *C, const pp_shape *sh, pp_plan *best) {
  pp_set_pricing(C, sh);
  best->ok = false;
  int32_t first[PP_MAX_STAGES + 2];
  for (int32_t i = 0; i <= sh->p; i++) first[i] = (int32_t)((int64_t)C->n * i / sh->p);
  if (try_lambda(C, sh, 0, first, best)) { /* memory does not bind */
    polish(C, sh, best);
    return;
  }
  /* the scale of lambda: seconds per byte of the fastest placements */
  const plan_tables *T = sh->pt->T;
  double tsum = 0, msum = 0;
  for (int32_t l = 0; l < C->n; l++) {
    size_t k = (size_t)l * T->S + C->work[l];
    tsum += pp_f(T, k);
    msum += pp_st(T, k) + pp_sv(T, k);
  }
  double lo = 0, hi = msum > 0 ? (sh->m + sh->p) * tsum / msum * 1e-3 : 1;
  int it = 0;
  while (!try_lambda(C, sh, hi, first, best) && it++ < 40) lo = hi, hi *= 4;
  if (!best->ok) return;
  for (it = 0; it < 14; it++) {
    double mid = 0.5 * (lo + hi);
    if (try_lambda(C, sh, mid, first, best)) hi = mid;
    else lo = mid;
  }
  polish(C, sh, best);
}

/* the least memory any cut of the fastest-to-smallest placements needs (the report when nothing fits) */
void pp_note_need(pp_ctx *C, const pp_shape *sh) {
  pp_set_pricing(C, sh);
  int32_t first[PP_MAX_STAGES + 2];
  for (int32_t i = 0; i <= sh->p; i++) first[i] = (int32_t)((int64_t)C->n * i / sh->p);
  place(C, sh, first, 1e12, C->work);
  double save = C->cap, lo = 0, hi = 1e15;
  for (int it = 0; it < 60; it++) {
    double mid = 0.5 * (lo + hi);
    C->cap = mid;
    int32_t cut[PP_MAX_STAGES + 2];
    if (split(C, sh, C->work, cut)) hi = mid;
    else lo = mid;
  }
  C->cap = save;
  if (hi < C->need_min) C->need_min = hi;
}

/* ---- tests: one structure, searched and enumerated ---- */

/* every placement of every layer (an odometer over the usable states) and every cut into p stages */
void pp_exhaust(pp_ctx *C, const pp_shape *sh, pp_plan *best) {
  const plan_tables *T = sh->pt->T;
  int32_t n = C->n, S = T->S, p = sh->p, *ch = C->work, first[PP_MAX_STAGES + 2];
  for (int32_t l = 0; l < n; l++) ch[l] = 0;
  for (;;) {
    bool legal = true;
    for (int32_t l = 0; l < n && legal; l++) legal = pp_usable(sh, T, l, ch[l]);
    for (int32_t i = 0; legal && i <= p; i++) first[i] = i < p ? i : n; /* the first cut */
    while (legal) {
      pp_plan r = {.sh = *sh};
      if (pp_evaluate(C, sh, ch, first, &r) && (!best->ok || r.step < best->step)) {
        int32_t *keep = best->choice;
        *best = r;
        best->ok = true, best->choice = keep;
        memcpy(best->choice, ch, (size_t)n * sizeof *ch);
        memcpy(best->first, first, (size_t)(p + 1) * sizeof *first);
      }
      int32_t i = p - 1; /* the next cut: the last boundary that can move right, the ones after it reset */
      while (i >= 1 && first[i] >= n - (p - i)) i--;
      if (i < 1) break;
      first[i]++;
      for (int32_t j = i + 1; j < p; j++) first[j] = first[j - 1] + 1;
    }
    int32_t l = 0;
    while (l < n && ++ch[l] == S) ch[l++] = 0;
    if (l == n) break;
  }
}

