/* pipeline_solve.c — the 3D search's structures: the stage tables of each (stage GPUs, micro-batch
 * rows), every structure the request allows enumerated (and the hopeless ones skipped), the ZeRO
 * stage chosen on the best, the chosen plan as a solution, the entry point beside the flat search
 * (docs/planner.md, "Pipelines: the 3D search"). One structure's search is pipeline.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
/* ---- the stage tables: one per (stage GPUs, micro-batch rows), built when first needed ---- */

static pp_table *table_of(pp_ctx *C, const plan_model *pm0, int32_t g, int64_t b) {
  for (int32_t t = 0; t < C->ntabs; t++)
    if (C->tabs[t]->g == g && C->tabs[t]->b == b) return C->tabs[t]->T ? C->tabs[t] : NULL;
  pp_table **nt = realloc(C->tabs, (size_t)(C->ntabs + 1) * sizeof *nt), *pt = calloc(1, sizeof *pt);
  if (nt) C->tabs = nt;
  if (!nt || !pt) {
    free(pt);
    return NULL;
  }
  C->tabs[C->ntabs++] = pt;
  *pt = (pp_table){.g = g, .b = b};
  pt->pm = b == pm0->samples ? pm0 : C->rq->model_at_rows(C->rq->rows_ctx, b);
  if (!pt->pm || pt->pm->n != C->n) return NULL;
  plan_place *st = NULL;
  int32_t ns = 0, cs = 0;
  bool ok = true;
  for (int32_t k = 1; ok && k <= g && k <= NTP_MAX_GROUPS; k++) {
    plan_place a = plan_place_balanced(g, k, false), c = plan_place_balanced(g, k, true);
    ok = pl_add_state(&st, &ns, &cs, &a) >= 0 && (k == g || pl_add_state(&st, &ns, &cs, &c) >= 0);
  }
  if (ok && C->train) ok = pl_add_recompute_states(&st, &ns, &cs);
  diag_sink quiet = {.pool = C->diags->pool}; /* a stage too small for a layer: not this structure */
  if (ok) pt->T = pl_tables_build(pt->pm, C->rq->prof, g, NULL, C->N, st, ns, NULL, C->train, &quiet);
  if (quiet.out_of_memory) C->diags->out_of_memory = true;
  diag_free(&quiet);
  free(st);
  if (!pt->T) return NULL;
  plan_tables *T = pt->T;
  size_t ns2 = (size_t)C->n * T->S;
  for (int lv = 0; lv < PLAN_NLEVELS; lv++) pt->bnd[lv] = calloc(ns2, sizeof(double));
  if (!pt->bnd[PLAN_INTRA] || !pt->bnd[PLAN_INTER]) {
    plan_tables_free(pt->T);
    pt->T = NULL;
    return NULL;
  }
  for (int32_t l = 1; l < C->n; l++)
    for (int32_t s = 0; s < T->S; s++) {
      size_t k = (size_t)l * T->S + s;
      double bytes = T->legal[k] ? pl_stage_input_bytes(T, l, s) : 0;
      for (int lv = 0; lv < PLAN_NLEVELS && bytes > 0; lv++) /* the activation, and its gradient back */
        pt->bnd[lv][k] = (C->train ? 2 : 1) * plan_coll_time(C->rq->prof, (plan_level)lv, COMM_SEND_RECV, bytes, bytes);
    }
  return pt;
}

/* no structure can beat this: its fastest placements, its stages perfectly balanced */
static double lower_bound(const pp_ctx *C, const pp_shape *sh) {
  const plan_tables *T = sh->pt->T;
  double sum = 0;
  for (int32_t l = 0; l < C->n; l++) {
    double best = INFINITY;
    for (int32_t s = 0; s < T->S; s++) {
      size_t k = (size_t)l * T->S + s;
      if (pp_usable(sh, T, l, s) && pp_f(T, k) < best) best = pp_f(T, k);
    }
    sum += best;
  }
  return sum * (sh->m + (sh->p - 1) * pp_bubble_share(sh)) / sh->p + sh->m * T->const_time;
}

static void progress(pp_ctx *C, bool last) {
  FILE *f = C->rq->progress;
  double now = pl_now_ms();
  if (!f || (!last && now - C->shown < 1000) || (last && C->shown == 0)) return;
  if (now - C->t0 < 2000 && !last) return; /* short searches print nothing */
  C->shown = now;
  fprintf(f, "\rntpc plan: %d of %d pipeline structures priced, %.1f s", C->priced, C->total, (now - C->t0) / 1e3);
  if (C->top[0].ok) fprintf(f, "; best step so far %.3f s", C->top[0].step);
  fprintf(f, last ? "\n" : "   ");
  fflush(f);
}

/* keeps the PP_TOP fastest plans, fastest first (their choice arrays move with them) */
static void keep_top(pp_ctx *C, const pp_plan *r) {
  int32_t at = PP_TOP;
  while (at > 0 && (!C->top[at - 1].ok || r->step < C->top[at - 1].step)) at--;
  if (at >= PP_TOP) return;
  int32_t *spare = C->top[PP_TOP - 1].choice;
  memmove(&C->top[at + 1], &C->top[at], (size_t)(PP_TOP - 1 - at) * sizeof *C->top);
  C->top[at] = *r;
  C->top[at].choice = spare;
  memcpy(spare, r->choice, (size_t)C->n * sizeof *spare);
}

/* the micro-batch sizes tried for r rows: powers of two dividing them (or the one a forced count gives) */
static int32_t micro_rows(const plan_request *rq, int64_t r, int64_t *out) {
  int32_t n = 0;
  if (rq->micro_batches > 0) {
    if (r % rq->micro_batches == 0) out[n++] = r / rq->micro_batches;
    return n;
  }
  for (int64_t b = 1; b <= r && n < 40; b *= 2)
    if (r % b == 0) out[n++] = b;
  return n;
}

/* whether a structure of p stages is priced under ZB-H1 (zb) or 1F1B: ZB-H1 only for training in
 * stages; --schedule 1f1b (2) or zb-h1 (4) leaves the other out where both apply */
static bool schedule_tried(const plan_request *rq, bool train, int32_t p, bool zb) {
  bool both = train && p > 1;
  if (zb) return both && rq->schedule != 2;
  return !both || rq->schedule != 4;
}

/* every structure the request allows, searched at one optimizer stage; the best few kept */
static void search_structures(pp_ctx *C, const plan_model *pm, int32_t zero, int32_t red) {
  const plan_request *rq = C->rq;
  int64_t B = pm->samples;
  for (int pass = 0; pass < 2; pass++) /* count, then search */
    for (int32_t g = C->N < C->W ? C->N : C->W; g >= 1; g--) {
      if (C->W % g) continue;
      int32_t Wg = C->W / g;
      for (int32_t d = 1; d <= Wg && d <= NTP_MAX_PIPES; d++) {
        int32_t p = Wg / d;
        if (Wg % d || B % d || p > PP_MAX_STAGES || p > C->n || (rq->stages > 1 && p != rq->stages)) continue;
        if (p == 1 && d == 1 && C->W <= PLAN_FLAT_MAX && rq->micro_batches <= 1) continue; /* the flat search's */
        int64_t bs[40];
        int32_t nb = micro_rows(rq, B / d, bs);
        for (int32_t j = 0; j < nb; j++) {
          int64_t m = B / d / bs[j];
          if (m > NTP_MAX_MICRO_BATCHES || (!C->train && m > 1 && p == 1)) continue;
          if (!pass) {
            C->total++;
            continue;
          }
          pp_table *pt = table_of(C, pm, g, bs[j]);
          C->priced++;
          progress(C, false);
          if (!pt) continue;
          for (int zb = 0; zb < 2; zb++) { /* 1F1B, and for training pipelines ZB-H1 */
            if (!schedule_tried(rq, C->train, p, zb)) continue;
            pp_shape sh = {.g = g, .p = p, .d = d, .m = (int32_t)m, .b = bs[j], .zero = zero, .red = red, .zb = zb,
                           .pt = pt, .rq = rq};
            if (C->top[PP_TOP - 1].ok && lower_bound(C, &sh) >= C->top[PP_TOP - 1].step) continue;
            pp_plan r = {.choice = malloc((size_t)C->n * sizeof(int32_t))};
            if (!r.choice) continue;
            pp_search_shape(C, &sh, &r);
            if (r.ok) keep_top(C, &r);
            else pp_note_need(C, &sh);
            free(r.choice);
          }
        }
      }
    }
}

/* ---- the chosen structure as a solution ---- */

/* A pipelined plan's solution: its layers placed on a stage's GPUs and timed per micro-batch
 * (pl_fill_solution on the stage tables), then the stages, the step and the memory of the busiest
 * stage; the per-GPU arrays over the whole world (rank r is in stage (r / g) mod p). */
static bool fill(pp_ctx *C, const pp_plan *r, plan_solution *out) {
  const pp_shape *sh = &r->sh;
  plan_tables *T = sh->pt->T;
  pp_set_pricing(C, sh);
  memset(out, 0, sizeof *out);
  pl_fill_solution(T, r->choice, C->cap, out);
  int32_t p = sh->p, W = C->W, g = sh->g, busiest = 0;
  out->stage_first = malloc((size_t)(p + 1) * sizeof *out->stage_first);
  out->stage_time = malloc((size_t)p * sizeof *out->stage_time);
  out->stage_sync = malloc((size_t)p * sizeof *out->stage_sync);
  out->stage_mem = malloc((size_t)p * sizeof *out->stage_mem);
  out->stage_inflight = malloc((size_t)p * sizeof *out->stage_inflight);
  double *rp = realloc(out->rank_params, (size_t)W * sizeof *rp), *ra = realloc(out->rank_act, (size_t)W * sizeof *ra);
  if (rp) out->rank_params = rp;
  if (ra) out->rank_act = ra;
  free(out->phys);
  out->phys = malloc((size_t)W * sizeof *out->phys);
  if (!out->feasible || !out->stage_first || !out->stage_time || !out->stage_sync || !out->stage_mem ||
      !out->stage_inflight || !rp || !ra || !out->phys) {
    plan_solution_free(out);
    return false;
  }
  out->pp_stages = p, out->pp_replicas = sh->d, out->pp_stage_world = g, out->micro_batches = sh->m;
  out->schedule = sh->zb ? 4 : 2;
  out->micro_rows = sh->b;
  out->pm_stage = sh->pt->pm;
  memcpy(out->stage_first, r->first, (size_t)(p + 1) * sizeof *out->stage_first);
  double compute = 0, stage_params[PP_MAX_STAGES] = {0}, stage_state[PP_MAX_STAGES] = {0};
  for (int32_t i = 0; i < p; i++) {
    stage_sum s = pp_stage_of(C, sh, r->choice, i, r->first[i], r->first[i + 1]);
    out->stage_time[i] = s.t, out->stage_sync[i] = s.y, out->stage_mem[i] = s.mem;
    out->stage_inflight[i] = pp_inflight(C, sh, i);
    if (s.mem > out->stage_mem[busiest]) busiest = i;
    for (int32_t l = r->first[i]; l < r->first[i + 1]; l++) {
      const plan_layer_out *lo = &out->layers[l];
      stage_params[i] += lo->param_bytes;
      stage_state[i] += lo->grad_bytes + lo->opt_bytes + lo->saved_bytes * out->stage_inflight[i];
    }
  }
  for (int32_t l = 0; l < C->n; l++) compute += out->layers[l].compute_s;
  /* the training state of the busiest stage: its layers' shares, its micro-batches in flight */
  out->grad_bytes = out->opt_bytes = out->saved_bytes = out->grad_full = out->opt_full = 0;
  for (int32_t l = r->first[busiest]; l < r->first[busiest + 1]; l++) {
    const plan_layer_out *lo = &out->layers[l];
    double eb = (double)dtype_bytes(sh->pt->pm->L[l].wdt);
    out->grad_bytes += lo->grad_bytes, out->opt_bytes += lo->opt_bytes;
    out->saved_bytes += lo->saved_bytes * out->stage_inflight[busiest];
    out->grad_full += lo->param_bytes, out->opt_full += 12.0 * lo->param_bytes / eb;
  }
  out->train_bytes = C->train ? out->grad_bytes + out->opt_bytes + out->saved_bytes : 0;
  double *rs = out->rank_state ? realloc(out->rank_state, (size_t)W * sizeof *rs) : NULL;
  if (rs || !out->rank_state) out->rank_state = rs;
  for (int32_t q = 0; q < W; q++) {
    int32_t i = (q / g) % p;
    out->phys[q] = q;
    out->rank_params[q] = stage_params[i];
    out->rank_act[q] = out->stage_mem[i] - stage_params[i] - stage_state[i];
    if (rs) rs[q] = stage_state[i];
  }
  out->world = W;
  out->step_s = r->step;
  out->sync_s = r->sync;
  out->p2p_s = r->p2p;
  out->bubble_s = r->step - r->sync - sh->m * (r->slowest + T->const_time);
  out->mem_peak = r->mem;
  out->compute_s = compute * sh->m / p + sh->m * T->const_time; /* a stage's share, on average */
  out->comm_s = r->step - out->compute_s;
  return true;
}

/* ---- the entry point ---- */

typedef struct zero_try {
  pp_plan r;
  int32_t alt, resilience;
} zero_try;

/* The optimizer's stage on the best structures: every candidate the request allows; of those
 * within PP_SLACK of the fastest, the most resilient, then the fastest (as the flat search). */
static bool choose_zero(pp_ctx *C, pp_plan *pick, struct plan_zero_alt *alt, int32_t *nalt) {
  zero_try tries[PP_TOP * PLAN_ZERO_MAX_ALTS];
  int32_t nt = 0, na = pl_zero_candidates(C->rq, alt);
  double fastest = INFINITY;
  for (int32_t t = 0; t < PP_TOP && C->top[t].ok; t++)
    for (int32_t a = 0; a < na; a++) {
      pp_shape sh = C->top[t].sh;
      sh.zero = alt[a].zero, sh.red = alt[a].redundancy;
      zero_try *z = &tries[nt];
      z->r = (pp_plan){.choice = malloc((size_t)C->n * sizeof(int32_t))};
      z->alt = a;
      if (!z->r.choice) continue;
      pp_search_shape(C, &sh, &z->r);
      if (!z->r.ok) {
        free(z->r.choice);
        continue;
      }
      if (z->r.step < fastest) fastest = z->r.step;
      nt++;
    }
  int32_t best = -1;
  for (int32_t t = 0; t < nt; t++) {
    tries[t].resilience = -1;
    if (tries[t].r.step > fastest * (1 + PP_SLACK)) continue;
    plan_solution s;
    if (fill(C, &tries[t].r, &s)) tries[t].resilience = pl_resilience(&s);
    plan_solution_free(&s);
    if (best < 0 || tries[t].resilience > tries[best].resilience ||
        (tries[t].resilience == tries[best].resilience && tries[t].r.step < tries[best].r.step))
      best = t;
  }
  for (int32_t a = 0; a < na; a++) alt[a].feasible = false;
  for (int32_t t = 0; best >= 0 && t < nt; t++) { /* the chosen structure at each stage, for the report */
    pp_shape *s = &tries[t].r.sh, *b = &tries[best].r.sh;
    if (s->g == b->g && s->p == b->p && s->d == b->d && s->m == b->m) {
      alt[tries[t].alt].feasible = true;
      alt[tries[t].alt].step_s = tries[t].r.step;
      alt[tries[t].alt].mem_peak = tries[t].r.mem;
    }
  }
  *nalt = na;
  for (int32_t t = 0; t < nt; t++) {
    if (t == best) *pick = tries[t].r;
    else free(tries[t].r.choice);
  }
  return best >= 0;
}

static void free_ctx(pp_ctx *C) {
  for (int32_t t = 0; t < C->ntabs; t++) {
    plan_tables_free(C->tabs[t]->T);
    for (int lv = 0; lv < PLAN_NLEVELS; lv++) free(C->tabs[t]->bnd[lv]);
    free(C->tabs[t]);
  }
  free(C->tabs);
  for (int32_t t = 0; t < PP_TOP; t++) free(C->top[t].choice);
  free(C->cur);
  free(C->prev);
  free(C->from);
  free(C->work);
}

/* The pipelined search; out: its best plan, or infeasible (need_min: the least memory seen). */
static bool solve_pipelined(const plan_model *pm, const plan_request *rq, plan_solution *out, diag_sink *diags) {
  pp_ctx C = {.rq = rq, .cap = pl_cap_of(rq), .W = rq->world, .N = rq->nodes_of > 0 ? rq->nodes_of : 8, .n = pm->n,
              .train = rq->train, .diags = diags, .t0 = pl_now_ms(), .need_min = INFINITY};
  C.Smax = 4 * (C.N < C.W ? C.N : C.W) + 8;
  C.cur = malloc((size_t)C.Smax * sizeof *C.cur);
  C.prev = malloc((size_t)C.Smax * sizeof *C.prev);
  C.from = malloc((size_t)C.n * C.Smax * sizeof *C.from);
  C.work = malloc((size_t)C.n * sizeof *C.work);
  bool ok = C.cur && C.prev && C.from && C.work;
  for (int32_t t = 0; ok && t < PP_TOP; t++) ok = (C.top[t].choice = malloc((size_t)C.n * sizeof(int32_t))) != NULL;
  if (!ok) {
    free_ctx(&C);
    diag_out_of_memory(diags);
    return false;
  }
  int32_t zero = !rq->train ? 0 : rq->zero == PLAN_ZERO_AUTO ? 2 : rq->zero;
  int32_t red = rq->redundancy > 0 ? rq->redundancy : 1;
  search_structures(&C, pm, zero, red);
  pp_plan pick = C.top[0];
  bool found = pick.ok;
  pick.choice = NULL; /* top[0]'s stays the context's; the pick gets a copy */
  struct plan_zero_alt alt[PLAN_ZERO_MAX_ALTS];
  int32_t nalt = 0;
  if (found && rq->train && (rq->zero == PLAN_ZERO_AUTO || rq->redundancy <= 0)) {
    found = choose_zero(&C, &pick, alt, &nalt);
  } else if (found) {
    pick.choice = malloc((size_t)C.n * sizeof(int32_t));
    if ((found = pick.choice != NULL)) memcpy(pick.choice, C.top[0].choice, (size_t)C.n * sizeof(int32_t));
  }
  progress(&C, true);
  memset(out, 0, sizeof *out);
  if (found && fill(&C, &pick, out)) {
    out->nalts = nalt;
    memcpy(out->alts, alt, (size_t)nalt * sizeof *alt);
  } else {
    out->feasible = false;
    out->need_min = C.need_min;
  }
  free(pick.choice);
  out->structures = C.priced;
  out->search_ms = pl_now_ms() - C.t0;
  free_ctx(&C);
  return !diags->out_of_memory;
}

bool plan_solve_3d(const plan_model *pm, const ir_module *m, const plan_request *rq, plan_solution *out,
                   diag_sink *diags) {
  memset(out, 0, sizeof *out);
  bool pipelines = rq->model_at_rows && rq->stages != 1 && rq->nfailed == 0 && !rq->fixed && m->active_plan < 0;
  bool flat = rq->stages <= 1 && rq->micro_batches <= 1 && (!pipelines || rq->world <= PLAN_FLAT_MAX);
  plan_solution fs = {0}, ps = {0};
  if (!pipelines || flat) {
    if (!plan_solve(pm, m, rq, &fs, diags)) return false;
    if (!pipelines) {
      *out = fs;
      return true;
    }
  }
  if (!solve_pipelined(pm, rq, &ps, diags)) {
    plan_solution_free(&fs);
    return false;
  }
  bool take_flat = flat && fs.feasible && (!ps.feasible || fs.step_s <= ps.step_s);
  if (take_flat || (flat && !ps.feasible && fs.need_min <= ps.need_min)) {
    fs.structures = ps.structures;
    *out = fs;
    plan_solution_free(&ps);
  } else {
    ps.flat_step_s = flat && fs.feasible ? fs.step_s : 0;
    ps.tables_ms = fs.tables_ms;
    if (!ps.feasible) {
      char b1[32], b2[32];
      ps.mem_cap = pl_cap_of(rq);
      ps.world = rq->world;
      int32_t N = rq->nodes_of > 0 ? rq->nodes_of : 8;
      if (!ps.structures) /* nothing to price: the request's numbers leave no structure */
        snprintf(ps.why, sizeof ps.why,
                 "no pipeline structure for %d GPUs: stage GPUs (dividing them, at most %d a node) x stages (at most "
                 "the %d layers%s) x replicas (at most 64, dividing the batch's %lld rows)%s",
                 rq->world, N, pm->n, rq->stages > 1 ? ", as --stages says" : "", (long long)pm->samples,
                 rq->micro_batches > 0 ? ", with --micro-batches dividing each replica's rows" : "");
      else if (isfinite(ps.need_min))
        snprintf(ps.why, sizeof ps.why, "does not fit: the smallest plan needs %s per GPU (pipeline stages, the "
                 "parameters at the highest degrees), the cap is %s", pl_fmt_bytes(ps.need_min, b1, sizeof b1),
                 pl_fmt_bytes(ps.mem_cap, b2, sizeof b2));
      else
        snprintf(ps.why, sizeof ps.why, "no pipeline of %d structure%s has a placement for every layer (the cap is %s)",
                 ps.structures, ps.structures == 1 ? "" : "s", pl_fmt_bytes(ps.mem_cap, b2, sizeof b2));
    }
    *out = ps;
    plan_solution_free(&fs);
  }
  return true;
}

double plan_pipeline_shape(const plan_model *pm, const plan_request *rq, int32_t g, int32_t p, int32_t d, int32_t m,
                           bool exhaustive, diag_sink *diags) {
  pp_ctx C = {.rq = rq, .cap = pl_cap_of(rq), .W = g * p * d, .N = rq->nodes_of > 0 ? rq->nodes_of : 8, .n = pm->n,
              .train = rq->train, .diags = diags, .t0 = pl_now_ms(), .need_min = INFINITY};
  C.Smax = 4 * g + 8;
  C.cur = malloc((size_t)C.Smax * sizeof *C.cur);
  C.prev = malloc((size_t)C.Smax * sizeof *C.prev);
  C.from = malloc((size_t)C.n * C.Smax * sizeof *C.from);
  C.work = malloc((size_t)C.n * sizeof *C.work);
  double step = INFINITY;
  int64_t B = pm->samples;
  pp_table *pt = C.cur && C.prev && C.from && C.work && B % ((int64_t)d * m) == 0 && p <= C.n && p <= PP_MAX_STAGES
                     ? table_of(&C, pm, g, B / d / m) : NULL;
  pp_plan r = {.choice = malloc((size_t)C.n * sizeof(int32_t))};
  if (pt && r.choice) {
    int32_t zero = rq->zero == PLAN_ZERO_AUTO ? 0 : rq->zero;
    pp_shape sh = {.g = g, .p = p, .d = d, .m = m, .b = B / d / m, .zero = zero, .red = rq->redundancy > 0 ? rq->redundancy : 1,
                   .zb = !schedule_tried(rq, rq->train, p, false), .pt = pt, .rq = rq};
    pp_set_pricing(&C, &sh);
    if (exhaustive) pp_exhaust(&C, &sh, &r);
    else pp_search_shape(&C, &sh, &r);
    if (r.ok) step = r.step;
  }
  free(r.choice);
  free_ctx(&C);
  return step;
}

