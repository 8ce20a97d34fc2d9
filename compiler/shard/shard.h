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
  int32_t group_start[NTP_MAX_GROUPS + 1]; /* group g = ranks [start[g], start[g+1]) */
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
  arena pool;
} sh_program;

/* The sharding passes (api.c runs them as rows of its pipeline):
 * shard_plan.c: the world (--world, the active plan's) and every layer's placement from inline
 * @tp annotations and the active plan's rules; a 'tp auto' layer is marked is_auto (one group of
 * the whole world until the planner chooses). placements: [m->n_layers]. false if reported. */
bool shard_place(const ir_module *m, int32_t world_opt, int32_t *world, sh_placement *placements, diag_sink *diags);
/* false + message when a placement does not partition the world (the place pass's verifier) */
bool sh_verify_placements(const ir_module *m, int32_t world, const sh_placement *placements, char *err, size_t cap);
/* shard.c: lowering with the given placements (copied; none may be is_auto when world > 1).
 * NULL on error (diagnostics reported). The memory plan is a pass of its own (sh_plan_memory). */
sh_program *shard_lower(const ir_module *m, int32_t world, const sh_placement *placements, diag_sink *diags);
void sh_program_free(sh_program *p);
/* the sharded program's verifier: shape rules on local shapes, transfers inside tensors */
bool sh_verify(const sh_program *p, char *err, size_t cap);
/* memplan.c */
void sh_plan_memory(sh_program *p);
/* false + message if two tensors live at once overlap in a rank's arena */
bool sh_check_memory(const sh_program *p, char *err, size_t cap);
/* shard_print.c */
void sh_print(const sh_program *p, FILE *out);                /* --emit=sharded-ir */
void sh_print_rank(const sh_program *p, int32_t rank, FILE *out); /* --emit=rank:N */
void sh_print_report(const sh_program *p, FILE *out);         /* ntpc report */

#endif
