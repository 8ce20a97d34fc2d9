/* shard.h — the sharded program: what every rank computes and what moves between ranks.
 *
 * The global IR says what the model computes; the sharded program says who computes
 * which part. Every tensor here lives on one rank and holds a box (a hyper-rectangle of
 * global indices) of one global value. Steps run in order: a compute step is one
 * primitive op on one rank's local tensors; a comm step moves or reduces boxes between
 * ranks (a collective). The per-rank programs are this list filtered by rank, and the
 * CPU simulator and the CUDA backend execute the same list.
 */
#ifndef NTP_SHARD_H
#define NTP_SHARD_H

#include "ir.h"

/* ntp_box and its basics: runtime/core/ntp_types.h */
/* The box of an operand of shape `os` that a result box `rb` needs, NumPy broadcasting undone. */
ntp_box box_project(ntp_box rb, ntp_shape os);

/* The cells that cut `need` along every boundary of some source boxes lying inside it: each
 * cell lies within one source or outside all of them (slice intersection). */
typedef struct box_grid {
  int nd;
  int64_t *cut[NTP_MAX_RANK]; /* per dim: sorted distinct cut points, need's own ends included */
  int ncut[NTP_MAX_RANK];
  int idx[NTP_MAX_RANK];
  bool started, done;
  int64_t *mem;
} box_grid;

bool box_grid_init(box_grid *g, const ntp_box *need, const ntp_box *srcs, size_t nsrcs); /* false: no memory */
/* The next cell (row-major order); false when all have been given. */
bool box_grid_next(box_grid *g, ntp_box *cell);
void box_grid_free(box_grid *g);

/* A box of a value held by one rank. */
typedef struct rank_box {
  int32_t rank;
  ntp_box box;
} rank_box;

/* The default placement of a value of shape s on W ranks: dim 0 split over the ranks (ranks
 * whose part is empty hold nothing); a scalar on rank 0. Returns how many it wrote. */
int box_default_split(ntp_shape s, int32_t W, rank_box *out);

/* Balanced split of n units into parts: part i gets [lo, hi); sizes differ by at most one. */
void split_range(int64_t n, int64_t parts, int64_t i, int64_t *lo, int64_t *hi);
/* The same in units of `unit` elements (the last unit may be short). */
void split_units(int64_t n, int64_t unit, int64_t parts, int64_t i, int64_t *lo, int64_t *hi);

/* ---- placement of a layer: ranks partitioned into TP groups, batch rows split ---- */
typedef struct sh_placement {
  int32_t ngroups;
  int32_t group_start[NTP_MAX_GROUPS + 1]; /* group g = ranks [group_start[g], group_end[g]) */
  int32_t group_end[NTP_MAX_GROUPS];       /* contiguous placements: group_end[g] = group_start[g + 1] */
  /* pipelines (a plan's stages): group g belongs to pipeline group_pipe[g]; the batch rows are
   * split over the pipelines by pipe_share first, then over each pipeline's groups. npipes 0:
   * no stages (one pipeline of the whole world) */
  int32_t npipes;
  int32_t group_pipe[NTP_MAX_GROUPS];
  int64_t pipe_share[NTP_MAX_PIPES];
  int32_t chunk[NTP_MAX_PIPES];            /* the layer's stage (chunk) in each pipeline */
  int64_t share[NTP_MAX_GROUPS];           /* batch shares of the groups (default: their sizes) */
  bool shares_given;                       /* by a plan's 'batch (...)' */
  int64_t row_start[NTP_MAX_GROUPS + 1];   /* set by the sharder: group g takes batch rows [row_start[g], row_start[g+1]) */
  bool seq_parallel;
  bool recompute;                          /* training: its forward steps run again before its backward */
  bool is_auto;                            /* 'tp auto': the planner's to choose (the autoplan pass) */
  int32_t rule; /* plan rule that set it, -1 = inline @tp or the default */
  const char *tp_file;                     /* where its degree was written (messages) */
  ntp_loc tp_loc;
} sh_placement;

/* What a step is part of, for the pipeline schedule: a micro-batch's forward (F), its backward
 * to the activations (B), its weight gradients (W); steps of no micro-batch run when their
 * operands are ready. */
typedef enum { SH_PHASE_F, SH_PHASE_B, SH_PHASE_W } sh_phase;

/* ---- pipelines: a plan's stages, resolved (shard_stages.c) ---- */
/* How a pipelined program's micro-batches are ordered on each rank (shard_schedule.c). */
/* (in ir_schedule_code's order: a plan's or the command line's name maps to one) */
typedef enum { SH_SCHED_DEFAULT, SH_SCHED_GPIPE, SH_SCHED_1F1B, SH_SCHED_INTERLEAVED, SH_SCHED_ZBH1 } sh_schedule_kind;
typedef struct sh_pipe_options {
  int32_t micro_batches;       /* 0: the plan's 'micro_batches' (else the batch whole) */
  sh_schedule_kind schedule;   /* default: 1F1B, interleaved 1F1B when a rank holds several chunks */
  const char *schedule_csv;    /* a schedule table from a file (overrides `schedule`) */
  /* the distributed optimizer (shard_zero.c): set_optimizer overrides the plan's 'optimizer' line */
  bool set_optimizer;
  int32_t zero, redundancy;
  int32_t domain_size; /* GPUs per failure domain (a node, an NVL domain); 0: the plan's (else 1) */
  const int32_t *gpu_of_rank; /* [n_gpu_of_rank]: the GPU each rank runs on (survivors); NULL: its number */
  int32_t n_gpu_of_rank;      /* used when it is the world lowered for */
} sh_pipe_options;
#define NTP_MAX_STAGES 256
typedef struct sh_stage {
  int32_t first_layer, last_layer; /* global layers [first, last] */
  int32_t rank_lo, rank_hi;        /* ranks [lo, hi) */
  int32_t set;                     /* the rank set (physical stage) that runs it: chunk c runs on set c % nsets */
} sh_stage;
typedef struct sh_pipeline {
  int32_t nstages; /* chunks, in layer order */
  int32_t nsets;   /* physical stages: distinct rank sets */
  int32_t v;       /* chunks per rank set (interleaved: v > 1) */
  int64_t share;   /* batch share (default: its rank count) */
  sh_stage *stages;
} sh_pipeline;
typedef struct sh_pipes {
  int32_t npipes; /* 0: no stages (the whole world is one pipeline of one stage) */
  sh_pipeline pipe[NTP_MAX_PIPES];
  int32_t *pipe_of_rank; /* [world], -1 for none */
  int32_t *set_of_rank;  /* [world] */
} sh_pipes;
/* The active plan's pipelines for `world` ranks (none when it has no stages); false if reported. */
bool shard_resolve_pipes(const ir_module *m, int32_t world, sh_pipes *out, diag_sink *diags);
void sh_pipes_free(sh_pipes *p);
/* The stage (chunk) of pipeline pp holding layer l; -1 when none. */
int32_t sh_pipe_chunk(const sh_pipeline *pp, int32_t l);

/* A schedule: for every rank set (physical stage) of every pipeline, its actions in order. */
typedef struct sh_action {
  sh_phase phase; /* F, B (with W when the table has no W of it), W */
  int32_t mb, chunk;
} sh_action;
typedef struct sh_schedule {
  const char *name;     /* "1F1B", "GPipe", ...; the file of a CSV table */
  int32_t nrows;        /* one per rank set of every pipeline */
  int32_t *row_pipe, *row_set;
  sh_action **acts;     /* [nrows][nacts[row]] */
  int32_t *nacts;
  bool split_w;         /* B and W are separate actions */
} sh_schedule;
void sh_schedule_free(sh_schedule *s);

typedef struct sh_tensor {
  int32_t rank;
  int32_t global; /* the global value it holds a box of; -1 for a layer-internal temporary */
  ntp_box box;    /* in the global value's coordinates (temporaries: their own) */
  ntp_dtype dtype;
  bool persistent; /* a parameter or input slice: lives for the whole program, outside the arena */
  const char *name;
  int32_t init_value; /* persistent: the input/param it is a slice of, and the box in its coordinates */
  ntp_box init_box;
  int32_t def, last_use; /* steps */
  int64_t offset;        /* byte offset: in the rank's arena, or in its parameter block if persistent */
  int32_t mb;            /* the micro-batch whose rows it holds; -1: none (parameters, inputs, sums over all) */
  bool act_grad;         /* the gradient of a forward activation: what pipelines call B, not W */
} sh_tensor;

/* The collectives (SH_COMMS, sh_comm_kind): runtime/core/ntp_types.h */

/* One box moved from tensor src to tensor dst (global coordinates of the value). For
 * reductions, the dst receives the sum over all srcs of the step that share its box. */
typedef struct sh_xfer {
  int32_t src, dst;
  ntp_box box;
} sh_xfer;

typedef struct sh_step {
  sh_step_kind kind;
  int32_t layer; /* global layer, -1 = model level */
  int32_t mb;    /* micro-batch, -1: none (pipelined programs only; else always -1) */
  sh_phase phase;
  int32_t at_layer; /* the layer it belongs to in layer order (the last one begun when its forward
                       was lowered; -1 before the first): which chunk of a rank runs it */
  ntp_loc loc;
  /* compute: op.code and op.attr as in the global IR; op.args / op.result are tensor ids */
  int32_t rank;
  ir_op op;
  /* comm */
  sh_comm_kind comm;
  int32_t *ranks; /* participants, ascending */
  int32_t nranks;
  sh_xfer *xfers;
  size_t nxfers;
  int64_t elems;      /* logical size: the reduced / gathered tensor's elements */
  int64_t *bytes_out; /* per participant: bytes sent (ring algorithms for reductions) */
  int64_t *bytes_in;  /* per participant: bytes received */
  const char *why;    /* what asked for it: "attn: row-parallel partial sums", "redistribute x" */
} sh_step;

typedef struct sh_rank_mem {
  int64_t arena_bytes;  /* peak activation memory (the arena's size) */
  int64_t param_bytes;  /* parameter slices held */
  int64_t input_bytes;
  int64_t bytes_sent, bytes_received;
} sh_rank_mem;

typedef struct sh_output {
  const char *name;
  int32_t value; /* global */
} sh_output;

typedef struct sh_program {
  const ir_module *global;
  int32_t world;
  sh_placement *placements; /* per global layer */
  IR_TABLE(sh_tensor, tensors);
  IR_TABLE(sh_step, steps);
  sh_rank_mem *mem; /* per rank */
  /* where each global value's pieces live: tensors holding boxes of it */
  int32_t **pieces;
  size_t *npieces, *cap_pieces;
  IR_TABLE(char *, notes); /* decisions worth reporting: matmul rules chosen */
  /* pipelines (a plan's stages), micro-batches and the schedule that ordered the steps */
  sh_pipes pipes;
  int32_t micro_batches; /* 1: the batch whole */
  bool pipelined;        /* stages or micro-batches: the steps are in the schedule's order */
  sh_schedule sched;
  /* the distributed optimizer: each parameter element's AdamW state on `redundancy` of the ranks
     that hold it (zero >= 1), failure domains of domain_size ranks */
  int32_t zero, redundancy, domain_size;
  int32_t *gpu_of_rank; /* [world] the GPU each rank runs on, for its failure domain; NULL: rank r on GPU r */
  arena pool;
} sh_program;

static inline int32_t sh_group_size(const sh_placement *pl, int g) { return pl->group_end[g] - pl->group_start[g]; }
/* Groups of the given sizes over consecutive ranks from 0. */
void sh_placement_set_groups(sh_placement *pl, const int64_t *sizes, int32_t n);

/* The sharding passes (api.c runs them as rows of its pipeline):
 * shard_plan.c: the world (--world, the active plan's) and every layer's placement from inline
 * @tp annotations and the active plan's rules; a 'tp auto' layer is marked is_auto (one group of
 * the whole world until the planner chooses). placements: [m->n_layers]. false if reported. */
bool shard_place(const ir_module *m, int32_t world_opt, int32_t *world, sh_placement *placements, diag_sink *diags);
/* false + message when a placement does not partition the world (the place pass's verifier) */
bool sh_verify_placements(const ir_module *m, int32_t world, const sh_placement *placements, char *err, size_t cap);
/* shard.c: lowering with the given placements (copied; none may be is_auto when world > 1).
 * NULL on error (diagnostics reported). The memory plan is a pass of its own (sh_plan_memory). */
sh_program *shard_lower(const ir_module *m, int32_t world, const sh_placement *placements, const sh_pipe_options *opt,
                        diag_sink *diags);
void sh_program_free(sh_program *p);
/* the sharded program's verifier: shape rules on local shapes, transfers inside tensors */
bool sh_verify(const sh_program *p, char *err, size_t cap);
/* shard_schedule.c: the schedule table (generated, or read from opt->schedule_csv), checked,
 * and the steps put in its order on every rank; false if reported. */
bool shard_schedule(sh_program *p, const sh_pipe_options *opt, diag_sink *diags);
/* shard_order.c: the steps put in the schedule's order (p->sched) on every rank, weight-gradient
 * steps told from the rest (W), def and last use renewed; a deadlock reported. */
bool shard_order(sh_program *p, diag_sink *diags);
/* Every tensor's def (first writer) and last use (last reader, or a later writer) from the steps
 * as they stand; a tensor whose last use was at or after step live_to_end stays live to the end. */
void sh_recount_uses(sh_program *p, int32_t live_to_end);
/* shard_zero_report.c (ntpc report --train): the training state per GPU, the sync's and the
 * parameter gather's bytes, and which failures need the checkpoint. */
void sh_print_optimizer(const sh_program *p, FILE *out);
/* weights[rank] = the bytes of the whole parameter slices each rank computes with (persistent, or
 * with the distributed optimizer gathered into its arena from the owners of their parts). */
void sh_rank_weights(const sh_program *p, int64_t *weights);
/* The failure domain of rank r: its GPU's number / domain_size (shard_zero.c). */
int32_t sh_domain_of(const sh_program *p, int32_t r);
/* "12.5 MiB" (shard_print.c) */
const char *sh_human_bytes(int64_t b, char *buf, size_t cap);
/* Backward steps on no path to an activation's gradient become W (the weight gradients). */
void sh_mark_weight_steps(sh_program *p);
/* Rank r's chunk for a step of layer `at` (0 without stages). */
int32_t sh_rank_chunk(const sh_program *p, int32_t r, int32_t at);
/* The most chunks of any pipeline (1 without stages). */
int32_t sh_max_chunks(const sh_program *p);
/* The action a step is part of on its schedule: a W is its B's when the table does not split them. */
sh_phase sh_action_phase(const sh_program *p, const sh_step *st);
/* "F", "B" or "W", as actions are written (0F1). */
const char *sh_phase_letter(sh_phase ph);
void sh_print_schedule(const sh_program *p, FILE *out); /* the table, a line per rank set */
void sh_print_pipeline(const sh_program *p, FILE *out); /* ntpc report: the table, memory, bubbles */
/* The textbook bubble of the schedule for pipeline `pipe` (NaN for a table read from a file). */
double sh_schedule_formula(const sh_program *p, int32_t pipe);
/* shard_timeline.c: when each rank runs each step, given every step's cost (seconds, flops or
 * units), and the bubble: (makespan - busy) / busy per rank. Steps of no micro-batch cost nothing. */
typedef struct sh_timeline {
  double *start, *end; /* per step */
  double *busy;        /* per rank */
  double makespan;
} sh_timeline;
bool sh_timeline_run(const sh_program *p, const double *cost, sh_timeline *t);
void sh_timeline_free(sh_timeline *t);
double sh_timeline_bubble(const sh_timeline *t, int32_t rank);
double sh_step_flops(const sh_program *p, size_t s);          /* the step's floating-point operations */
void sh_unit_costs(const sh_program *p, double *cost);        /* one unit per action (a B with its W: two) */
void sh_timeline_svg(const sh_program *p, const sh_timeline *t, const char *title, FILE *out);
/* memplan.c */
void sh_plan_memory(sh_program *p);
/* false + message if two tensors live at once overlap in a rank's arena */
bool sh_check_memory(const sh_program *p, char *err, size_t cap);
/* shard_print.c */
void sh_print(const sh_program *p, FILE *out);                /* --emit=sharded-ir */
void sh_print_rank(const sh_program *p, int32_t rank, FILE *out); /* --emit=rank:N */
void sh_print_report(const sh_program *p, FILE *out);         /* ntpc report */

#endif
