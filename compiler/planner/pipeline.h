/* pipeline.h — what the 3D search's files share (compiler/planner/pipeline.c: one structure's
 * search; pipeline_solve.c: the structures enumerated, the choice, the solution). docs/planner.md,
 * "Pipelines: the 3D search". */
#ifndef NTP_PLANNER_PIPELINE_H
#define NTP_PLANNER_PIPELINE_H

#include "planner_internal.h"

#define PP_MAX_STAGES 128 /* stages a pipeline is cut into, at most */
#define PP_TOP 4          /* the structures re-searched at every ZeRO candidate */
#define PP_SLACK 0.04     /* within this of the fastest, the more resilient optimizer state (zero.c) */

typedef struct pp_table { /* a stage of g GPUs at micro-batches of b rows */
  int32_t g;
  int64_t b;
  const plan_model *pm;
  plan_tables *T;
  double *bnd[PLAN_NLEVELS]; /* [n*S]: a stage starting at layer i in state s receives its input (F and B) */
} pp_table;

/* ZB-H1's bubble against 1F1B's: (F + B - W) / (F + B + W) with a micro-batch's forward, its
 * activations' gradients and its weights' gradients equal (the zero-bubble paper's H1) */
#define PP_ZB_BUBBLE (1.0 / 3.0)

typedef struct pp_shape {
  int32_t g, p, d, m, zero, red;
  bool zb; /* ZB-H1 (training): the backward split, W filling the waits; else 1F1B */
  int64_t b;
  pp_table *pt;
  const plan_request *rq;
} pp_shape;

typedef struct pp_plan {
  bool ok;
  pp_shape sh;
  double step, slowest, sync, p2p, mem;
  int32_t first[PP_MAX_STAGES + 1];
  int32_t *choice;
} pp_plan;

typedef struct pp_ctx {
  const plan_request *rq;
  double cap;
  int32_t W, N, n, Smax;
  bool train;
  pp_table **tabs; /* each allocated once: shapes point at them */
  int32_t ntabs;
  diag_sink *diags;
  double *cur, *prev; /* [Smax] */
  int32_t *from;      /* [n * Smax] */
  int32_t *work;      /* [n] */
  pp_plan top[PP_TOP];
  int32_t priced, total;
  double t0, shown, need_min;
} pp_ctx;


/* a structure's per-layer numbers, read from its stage tables: the time of a micro-batch's forward and
 * backward (the sync aside), the sync, the saved activations, the rest of what is kept */
static inline double pp_f(const plan_tables *T, size_t k) { return T->tcomp[k] + T->tcomm[k] - (T->train ? T->tsync[k] : 0); }
static inline double pp_y(const plan_tables *T, size_t k) { return T->train ? T->tsync[k] : 0; }
static inline double pp_sv(const plan_tables *T, size_t k) { return T->train ? T->tsaved[k] : 0; }
static inline double pp_st(const plan_tables *T, size_t k) { return T->pmax[k] - pp_sv(T, k); }

typedef struct stage_sum {
  double t, y, mem;
} stage_sum;

/* the share of the 1F1B bubble a shape's schedule keeps */
static inline double pp_bubble_share(const pp_shape *sh) { return sh->zb ? PP_ZB_BUBBLE : 1.0; }

/* pipeline.c */
bool pp_usable(const pp_shape *sh, const plan_tables *T, int32_t l, int32_t s);
int32_t pp_inflight(const pp_ctx *C, const pp_shape *sh, int32_t i);
plan_level pp_boundary_level(const pp_ctx *C, const pp_shape *sh);
void pp_set_pricing(const pp_ctx *C, const pp_shape *sh);
stage_sum pp_stage_of(const pp_ctx *C, const pp_shape *sh, const int32_t *choice, int32_t i, int32_t a, int32_t e);
bool pp_evaluate(const pp_ctx *C, const pp_shape *sh, const int32_t *choice, const int32_t *first, pp_plan *r);
void pp_search_shape(pp_ctx *C, const pp_shape *sh, pp_plan *best);
void pp_note_need(pp_ctx *C, const pp_shape *sh);
void pp_exhaust(pp_ctx *C, const pp_shape *sh, pp_plan *best);

#endif
