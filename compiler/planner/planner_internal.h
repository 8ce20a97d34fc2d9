/* planner_internal.h — what the planner's files share (compiler/planner/): the model read as
 * a chain of sharded layers (model.c), the cost tables of one world (tables.c), the search
 * (search.c), planning and its solution (solve.c), failure re-planning (failover.c), the writers
 * (write.c), primitive costs and placements (costs.c).
 *
 * The model is read as a chain of sharded layers (the kinds with a `shard` rule,
 * compiler/layers/), each costed per rank by its kind; norms, residual adds and other ops
 * "follow" the value they extend, exactly as the sharding pass lowers them (docs/sharding.md).
 * Every cost is then a function of one layer's placement (its kernels, its reductions, the ops
 * that follow it, the parameters it holds) or of two consecutive layers' placements (the outputs
 * of one moved to the other, counted by slice intersection, the same rule as the compiler's
 * `ensure`). That makes the search a shortest path over layers, with memory as a knapsack
 * constraint: a dynamic program over (layer, placement, memory units used) is exact for it
 * (docs/planner.md). */
#ifndef NTP_PLANNER_INTERNAL_H
#define NTP_PLANNER_INTERNAL_H

#include <math.h>

#include "layer_kind.h"
#include "planner.h"
#include "geometry.h"
#include "shard.h"
#include "shard_internal.h"

#define INF_TIME INFINITY

enum { H_SOURCE, H_DEFAULT, H_LAYER };
/* Where a value's pieces are: nowhere (a source: read where needed), rows split over all
 * ranks (a value no layer placed), or a layer's placement: the group rows on every rank of
 * the group, with the sequence split over the group under sequence parallelism (seq) and/or
 * the last dim split over the group (cols: a column-parallel linear's output). */
typedef struct home {
  int8_t kind;
  bool cols, seq;
  int32_t layer; /* chain index */
} home;

enum { XF_SAME, XF_MM_A, XF_MM_B };

typedef struct fop { /* an op computed where its home is */
  home at;
  ir_opcode code;
  ntp_shape rs;
  int32_t nargs;
  ntp_shape as[NTP_MAX_ARGS];
  bool cst[NTP_MAX_ARGS];
  ntp_dtype dt;
} fop;

typedef struct move { /* a computed value needed at another home */
  home src, at;
  ntp_shape vs, rs;
  int8_t xf;
  ntp_dtype dt;
  int32_t op;    /* the reading op, or -1: a layer's input */
  int32_t value; /* the value moved */
  /* earlier moves of the same value within the layers this one depends on: their copies are
   * sources too (the compiler reuses them) */
  int32_t prior[4];
  int32_t nprior;
} move;

typedef struct sread { /* an input or parameter slice read at a home */
  home at;
  ntp_shape vs, rs;
  int8_t xf;
  ntp_dtype dt;
  int32_t value;
} sread;

typedef struct chain_layer {
  int32_t ir;
  const layer_kind *k;
  int32_t x;
  ntp_shape xs, out;
  ntp_dtype dt, wdt;
  int64_t rows, T; /* batch rows (dim 0 of the input), tokens per row */
  bool whole;      /* the input has no batch dim: the layer's values are whole on its ranks */
  layer_dims d;    /* the kind's description: units, sizes */
  int32_t wval;    /* a weight split by units that another layer may share (a tied head), or -1 */
} chain_layer;

struct plan_model {
  const ir_module *m;
  int32_t n;
  chain_layer *L;
  fop *fops;
  size_t nfops, cfops;
  move *moves;
  size_t nmoves, cmoves;
  sread *reads;
  size_t nreads, creads;
  int64_t samples, tokens; /* per step: rows and tokens entering the first layer */
  /* indexes by layer (slot n: what no layer places): [off[i], off[i+1]) of ix */
  int32_t *fop_off, *fop_ix, *read_off, *read_ix, *umove_off, *umove_ix, *pmove_off, *pmove_ix;
};

typedef struct trans_entry {
  char *key;
  size_t keylen;
  double *time, *bytes; /* [S*S] */
  float *ftime;         /* the search's copy */
} trans_entry;

struct plan_tables {
  const plan_model *pm;
  const plan_profile *prof;
  int32_t W;
  int32_t *node; /* [W]: node of each rank (intra- vs inter-node links) */
  int32_t S;
  plan_place *st;
  int32_t *pin;   /* [n]: the one state a layer may take, or -1 */
  uint8_t *legal; /* [n*S] */
  double *tcomp, *tcomm, *pmax, *amax, *rbytes, *ubytes; /* [n*S] */
  bool train;     /* plan_request.train: the costs of a training step (train_costs) */
  double *pbytes, *tsync; /* [n*S]: parameter bytes alone (pmax adds a training step's state), gradient sync time */
  /* training: what the ZeRO pricing starts from (zero.c), so another stage re-prices without the
     forward's costs: [n*S] the working set of the forward, the collectives' time without the sync */
  double *famax, *tbase;
  double *tsaved;            /* [n*S] training: the activations kept from the forward to the backward */
  /* the 3D search: T is one stage of one pipeline replica; its parameters' other holders are the
     same ranks of `outer` replicas, reached over outer_lv */
  int32_t outer;
  plan_level outer_lv;
  int32_t zero, red, domain; /* the ZeRO stage and redundancy priced; GPUs per failure domain */
  double const_act;          /* the working set of ops no layer places (act_reserve's floor) */
  double cutoff;             /* > 0: pl_solve_tables gives up when its lower bound is slower */
  const double **trans, **tbytes;                        /* [n] */
  const float **ftrans;                                  /* [n] */
  trans_entry *cache;
  size_t ncache, ccache;
  double const_time, const_mem;
  double act_reserve;
  /* the problem's buffers */
  float *ptime;
  int64_t *punits;
  double quantum;
};

typedef rank_box rbox; /* shard.h */

/* ---- shared between the planner's files ---- */

typedef struct unary_out {
  double comp, comm, pmax, amax, rbytes, ubytes;
} unary_out;

typedef struct dp_ws {
  float *D;
  size_t cap;
} dp_ws;

/* The largest DP table the search builds, in bytes (every layer's is kept to trace back). */
#define PLAN_DP_BYTES ((size_t)192 << 20)

/* costs.c */
double pl_now_ms(void);
int32_t pl_place_max(const plan_place *pl);
bool pl_place_same_groups(const plan_place *a, const plan_place *b);
void pl_place_rows(const plan_place *pl, int64_t rows, int64_t *row_start);
bool pl_default_shares(const plan_place *pl, int64_t rows);
const char *pl_place_str_rows(const plan_place *pl, int64_t rows, char *buf, size_t cap);

/* failover.c */
bool plan_failover_solve_unguarded(const plan_model *pm, const ir_module *m, const plan_request *rq,
                                   plan_failover *out, diag_sink *diags);

/* model.c */
bool pl_model_error(const ir_module *m, ntp_loc loc, diag_sink *diags, const char *msg);
plan_model *plan_model_new_unguarded(const ir_module *m, diag_sink *diags);

/* search.c */
bool pl_dp_core(const plan_problem *pb, int64_t Q, bool use_units, int32_t *choice, dp_ws *ws);
bool pl_dp_solve_ws(const plan_problem *pb, int32_t *choice, double *time, int64_t *units, dp_ws *ws);

/* solve.c */
int32_t pl_add_state(plan_place **st, int32_t *n, int32_t *cap, const plan_place *pl);
bool pl_add_recompute_states(plan_place **st, int32_t *n, int32_t *cap);
double pl_cap_of(const plan_request *rq);
bool pl_pins(const plan_model *pm, const ir_module *m, int32_t W, const sh_placement *fixed, plan_place *pin, bool *free_,
             diag_sink *diags);
bool pl_solve_tables(plan_tables *T, double mem_cap, int32_t quanta, int32_t *choice, plan_solution *out);
void pl_fill_solution(plan_tables *T, const int32_t *choice, double mem_cap, plan_solution *out);
void pl_solve_and_fill(plan_tables *T, double mem_cap, int32_t quanta, plan_solution *out);
void pl_infeasible(plan_tables *T, double mem_cap, plan_solution *out);

/* tables.c */
void pl_core_rank(const plan_tables *T, const chain_layer *c, int t, int i, int64_t b, bool sp, double *time,
                      double *params, double *act);
double pl_group_reduce(const plan_tables *T, const chain_layer *c, const plan_place *pl, int32_t r0, int t, int64_t b,
                           double *bytes);
void pl_group_starts(const plan_place *pl, int32_t *gs);
bool pl_layers_alike(const chain_layer *a, const chain_layer *b);
/* train: a training step's costs (forward, backward, gradient sync, optimizer state) */
plan_tables *pl_tables_build(const plan_model *pm, const plan_profile *prof, int32_t W, const int32_t *node,
                                 int32_t nodes_of, const plan_place *states, int32_t S, const int32_t *pins,
                                 bool train, diag_sink *diags);
void pl_add_reads(const plan_tables *T, home h, int32_t state, double *per_rank);
void pl_add_reads_plan(const plan_tables *T, const int32_t *choice, double *per_rank);
double pl_move_eval(const plan_tables *T, const move *mv, int32_t lo, int32_t s_lo, int32_t s_hi, double *bytes,
                        double *per_rank_in);
void pl_unary_eval(const plan_tables *T, int32_t i, int32_t s, unary_out *u, double *per_rank);
double pl_stage_input_bytes(const plan_tables *T, int32_t i, int32_t s);

/* zero.c: the distributed optimizer in a training step */
double pl_train_costs(plan_tables *T, int32_t i, int32_t s, unary_out *u);
void pl_zero_set(plan_tables *T, int32_t zero, int32_t red);
void pl_zero_fill(const plan_tables *T, const int32_t *choice, plan_solution *out);
void pl_zero_solve(plan_tables *T, const plan_request *rq, plan_solution *out);
/* the ZeRO candidates a request allows, in search and preference order; how much optimizer state
   survives failures (2 a domain's, 1 a GPU's, 0 neither) */
int32_t pl_zero_candidates(const plan_request *rq, struct plan_zero_alt *alt);
int pl_resilience(const plan_solution *s);

/* write.c */
#define pl_fmt_bytes plan_fmt_bytes /* planner.h: the reports' bytes, for the CLI too */
const char *pl_fmt_time(double s, char *buf, size_t cap);
/* write_stages.c: a pipelined plan's 'micro_batches' and stage lines; its stages, step and memory
   in the report; ", MFU x% (y TFLOP/s per GPU)" and the line's end */
void pl_write_stage_lines(FILE *out, const plan_model *pm, const ir_module *m, const plan_solution *s);
void pl_write_stage_report(FILE *out, const plan_model *pm, const plan_solution *s, const plan_profile *prof);
void pl_write_mfu(FILE *out, const plan_model *pm, const plan_solution *s, const plan_profile *prof);
void pl_write_zero_report(FILE *out, const plan_solution *s);


#endif
