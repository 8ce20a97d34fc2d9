/* planner.h — the planner: a cost model of a model's forward pass on a device profile, and
 * an exact search for the TP placement of every layer (docs/planner.md).
 *
 * Three layers of API:
 *  - device profiles (profiles.c): peak rates, GEMM and attention efficiency, memory, links
 *    and collectives, built in or read from a text file;
 *  - the cost model: primitive costs (GEMM, streaming, collectives) and, for a compiled model,
 *    per-layer tables of time and memory for every candidate placement and transition tables
 *    between consecutive layers (the same slice-overlap rules as the sharding pass);
 *  - the search: a dynamic program over layers with memory as an exact (quantised, conservative)
 *    constraint, the exhaustive search it is tested against, failure re-planning, and writers
 *    for the plan file, the report and the picture.
 */
#ifndef NTP_PLANNER_H
#define NTP_PLANNER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ir.h"
#include "shard.h"

/* ================================ device profiles ================================ */

#define PLAN_CURVE_MAX 16
/* y as a function of x (a size), piecewise linear in log2(x), constant beyond the ends. */
typedef struct plan_curve {
  int32_t n;
  double x[PLAN_CURVE_MAX], y[PLAN_CURVE_MAX];
} plan_curve;
double plan_curve_at(const plan_curve *c, double x); /* n == 0: 1 */

typedef enum { PLAN_INTRA, PLAN_INTER, PLAN_NLEVELS } plan_level;

/* The collectives a profile prices: the compiler's (shard.h), all but the local copy. */
typedef sh_comm_kind plan_coll;
#define PLAN_NCOLLS SH_NPRICED_COMMS
const char *plan_coll_name(plan_coll c); /* its key in a profile file */

typedef struct plan_profile {
  char name[32];
  char device[96];
  double flops[NTP_DTYPE_COUNT];          /* dense peak FLOP/s by storage dtype; 0 = not given */
  plan_curve gemm_eff;                     /* fraction of peak reached by a GEMM, by its smallest dim */
  double attn_eff;                         /* fraction of peak reached by the attention core */
  double mem_bw, mem_eff, mem_capacity;    /* bytes/s, fraction reached, bytes */
  double launch;                           /* seconds added per kernel */
  /* attention_gemm_from: the sequence length from which the GEMM attention beat the tiled kernel
   * (ntpc calibrate measures it); the codegen's rule takes it (docs/runtime.md, "Generated
   * kernels"). 0: not given (the built-ins: the codegen's default); PLAN_ATTN_GEMM_NEVER: the
   * GEMMs never won. Not a cost: the planner does not read it. */
  int64_t attn_gemm_from;
  double link_bw[PLAN_NLEVELS];            /* bytes/s per GPU and direction */
  double lat[PLAN_NLEVELS][PLAN_NCOLLS];   /* seconds per collective call */
  plan_curve eff[PLAN_NLEVELS][PLAN_NCOLLS]; /* fraction of link_bw reached, by message bytes */
} plan_profile;

#define PLAN_ATTN_GEMM_NEVER INT64_MAX /* attention_gemm_from never */

/* Built-in profiles: "h100", "h200", "a100", "b200" (also "h100-sxm", ...); NULL-terminated list. */
const char *const *plan_profile_names(void);
bool plan_profile_builtin(const char *name, plan_profile *out);
/* The text of a built-in profile (what profiles/NAME.prof holds), or NULL. */
const char *plan_profile_text(const char *name);
/* Parses profile text; false + "FILE:LINE: message" in err. */
bool plan_profile_parse(const char *text, const char *file, plan_profile *out, char *err, size_t cap);
bool plan_profile_load(const char *path, plan_profile *out, char *err, size_t cap);
/* What `--gpu NAME|FILE` names: a built-in profile by name, else the profile file at that path;
 * false + a message ("unknown GPU 'x' (built-in profiles: ...; or a profile file)", or the file's
 * error). */
bool plan_profile_find(const char *name_or_file, plan_profile *out, char *err, size_t cap);

/* ---- writing a profile (ntpc calibrate; profile_write.c) ---- */
/* Where each line of a written profile came from: its trailing comment ("measured on DEVICE at
 * DATE: ...", "from h200 (datasheet or assumption, see profiles/h200.prof)"). Empty: no comment. */
typedef struct plan_profile_notes {
  char header[512];                          /* comment lines at the top ('\n'-separated, without '#') */
  char flops[NTP_DTYPE_COUNT][384];
  char gemm[384], attn[384], attn_gemm[384], mem_bw[384], mem_cap[384], mem_eff[384], launch[384];
  char link[PLAN_NLEVELS][384];
  char coll[PLAN_NLEVELS][PLAN_NCOLLS][384];
} plan_profile_notes;
/* The profile as text plan_profile_parse reads back to the same numbers (every key, %.6g, curve
 * sizes in bytes); false when writing failed. */
bool plan_profile_write(FILE *out, const plan_profile *p, const plan_profile_notes *notes);
/* A curve from measured (x, y) pairs in any order: pairs with the same x averaged, sorted by x,
 * y clamped to the parser's [0.0001, 1]; at most PLAN_CURVE_MAX points (the first ones). */
plan_curve plan_fit_curve(const double *x, const double *y, int n);
/* A collective's efficiency curve from timings: seconds[i] to move a message of bytes[i], each
 * rank sending traffic x bytes[i] over a link of link_bw bytes/s, after a fixed latency (the
 * time of a tiny message): plan_coll_time's inverse at each size. */
plan_curve plan_fit_collective(const double *bytes, const double *seconds, int n, double traffic, double link_bw,
                               double latency);
/* The built-in profile whose name the device's name contains ("NVIDIA H200" -> h200), else NULL. */
const char *plan_profile_closest(const char *device);

/* ================================ primitive costs ================================ */

/* C[M,N] = A[M,K] B[K,N]: max(compute at the shape's efficiency, memory traffic) + launch. */
double plan_gemm_time(const plan_profile *p, ntp_dtype dt, double M, double N, double K);
/* a kernel that streams `bytes` through memory once */
double plan_stream_time(const plan_profile *p, double bytes);
/* attention core: b rows, hq query heads (hk KV heads), S positions, head size HD */
double plan_attention_time(const plan_profile *p, ntp_dtype dt, double b, double hq, double hk, double S, double HD,
                           bool causal);
/* latency + bytes_per_rank / (link bandwidth x efficiency at msg_bytes) */
double plan_coll_time(const plan_profile *p, plan_level lv, plan_coll c, double msg_bytes, double bytes_per_rank);
/* bytes of a tensor in the compiler's memory plan: every tensor starts 256-byte aligned */
static inline double plan_tensor_bytes(double bytes) { return __builtin_ceil(bytes / 256.0) * 256.0; }
/* ring all-reduce of `bytes` over n ranks: each rank sends 2(n-1)/n of it; 0 when n == 1 */
double plan_allreduce_time(const plan_profile *p, plan_level lv, int n, double bytes);

/* ================================ placements ================================ */

/* A layer's placement: groups of consecutive ranks, batch shares, sequence parallelism. */
typedef struct plan_place {
  int32_t ngroups;
  int32_t size[NTP_MAX_GROUPS];
  int64_t share[NTP_MAX_GROUPS]; /* batch shares; share[0] == 0: in proportion to the sizes */
  bool sp;
  bool rc; /* training: the layer's activations recomputed in its backward ('recompute') */
} plan_place;

/* "tp 4", "tp (3, 3, 2)", with ", batch (...)" and ", sequence_parallel" as a plan writes them */
const char *plan_place_str(const plan_place *pl, char *buf, size_t cap);
/* k balanced groups over w ranks (sizes differ by at most one, larger first) */
plan_place plan_place_balanced(int32_t w, int32_t k, bool sp);

/* ================================ the model, analysed ================================ */

typedef struct plan_model plan_model;

/* Reads the layer chain of a compiled module. NULL when the model cannot be planned (no layer
 * with a degree, explicit layouts, a layer reading an output older than the previous layer's):
 * the reasons are errors in diags, located in the source; diags->out_of_memory when that was it.
 * The other entry points below report the same way. */
plan_model *plan_model_new(const ir_module *m, struct diag_sink *diags);
void plan_model_free(plan_model *pm);
int32_t plan_model_layers(const plan_model *pm);                 /* sharded layers (the chain) */
const ir_layer *plan_model_layer(const plan_model *pm, int32_t i); /* i-th in the chain */
int32_t plan_model_ir_layer(const plan_model *pm, int32_t i);      /* its index in the module */
int64_t plan_model_rows(const plan_model *pm);                     /* batch rows entering the first layer */

/* ================================ the search ================================ */

/* The pure search problem: per layer and state a time, memory units and legality; per layer
 * (from 1) a transition table [prev state][state]; a budget of memory units. Times are float
 * (the search's tables are 4 bytes an entry) and summed in layer order, in float:
 * t = time[0][s0]; t = (t + trans[l][s_{l-1}][s_l]) + time[l][s_l]. Both solvers use exactly
 * these operations, so their optima compare bit for bit. */
typedef struct plan_problem {
  int32_t nlayers, nstates;     /* nstates <= 255 */
  const uint8_t *legal;         /* [nlayers * nstates] */
  const float *time;            /* [nlayers * nstates] */
  const int64_t *units;         /* [nlayers * nstates], >= 0 */
  const float *const *trans;    /* [nlayers]: NULL for layer 0, else [nstates * nstates] */
  int64_t budget;               /* units; < 0: infeasible */
} plan_problem;

/* Exact optimum by dynamic programming over (layer, state, memory units used). Returns false
 * when no legal assignment fits. choice[nlayers] receives the states. */
bool plan_dp_solve(const plan_problem *pb, int32_t *choice, double *time, int64_t *units);
/* The same by enumerating every assignment (tests; nstates^nlayers must be small). */
bool plan_exhaustive_solve(const plan_problem *pb, int32_t *choice, double *time, int64_t *units);
/* Time and units of one assignment, summed exactly as the solvers do. */
double plan_problem_eval(const plan_problem *pb, const int32_t *choice, int64_t *units);

/* What to plan for. */
typedef struct plan_request {
  int32_t world;              /* healthy world */
  const plan_profile *prof;
  double mem_cap;             /* bytes per GPU; 0 = the profile's capacity */
  int32_t nodes_of;           /* GPUs per node (intra- vs inter-node links); 0 = 8 */
  int32_t quanta;             /* memory resolution of the DP; 0 = 1024 */
  const int32_t *failed;      /* failed physical ranks (re-planning), or NULL */
  int32_t nfailed;
  const double *slow;         /* re-planning a staged plan: each physical rank's slowdown (>= 1; a
                                 straggler), or NULL: none */
  const double *pipe_scale;   /* and each pipeline's pace times this (measured against priced), or NULL */
  const struct sh_placement *fixed; /* [module layers], or NULL: every layer not is_auto is pinned to its
                                 placement here (the autoplan pass); NULL: pins from the active plan */
  bool train;                 /* cost a training step: forward + backward, the gradients' sync over the
                                 replicas, optimizer state and saved activations (docs/planner.md) */
  int32_t max_groups;         /* free layers get at most this many groups; 0 = no limit. 1: every layer over
                                 all the ranks (uniform TP; sequence parallelism and recomputation still chosen) */
  /* training, the distributed optimizer ('optimizer zero Z redundancy K;'): the ZeRO stage 0..2, or
     PLAN_ZERO_AUTO (each stage searched, one chosen); 0, the default, is every replica keeping all */
  int32_t zero;
  int32_t redundancy;         /* ZeRO: GPUs that keep each optimizer shard; 0 = chosen (1 or 2) */
  int32_t domain_size;        /* GPUs per failure domain (a node, an NVL domain); 0 = nodes_of */
  /* the 3D search (plan_solve_3d; docs/planner.md, "Pipelines"): the model at another batch, its
     rows entering the first layer set to `rows` (a micro-batch), or NULL (and the pipeline search is
     off); the models it returns are the caller's and live until the plan is written */
  const plan_model *(*model_at_rows)(void *ctx, int64_t rows);
  void *rows_ctx;
  int32_t stages;             /* pipeline stages: 0 chosen, 1 none (the flat search alone), N exactly N */
  int32_t micro_batches;      /* 0 chosen, else exactly this many per pipeline */
  int32_t schedule;           /* training pipelines: 0 chosen (1F1B or ZB-H1), else ir_schedule_code's 2 or 4 */
  FILE *progress;             /* a progress line on long searches (stderr), or NULL */
  /* the 3D search restricted to a known configuration (a published one, priced as it ran): every
     layer one group of stage_tp GPUs (0: any placement), recomputed (1) or not (-1) or either (0),
     sequence parallel likewise */
  int32_t stage_tp;
  int8_t recompute, seq_parallel;
} plan_request;

#define PLAN_ZERO_AUTO (-1)
/* ZeRO candidates a training plan can be priced at (zero 0; zero 1 and 2 at redundancy 1, 2) */
#define PLAN_ZERO_MAX_ALTS 5

/* One layer of a solved plan. */
typedef struct plan_layer_out {
  plan_place place;
  bool pinned;                /* fixed by the input plan or annotation */
  double compute_s;           /* the layer's kernels and the ops that follow it, slowest group */
  double comm_s;              /* its reductions (and moves within its own placement) */
  double redist_s;            /* moving the previous layer's outputs to this layer */
  double param_bytes;         /* parameters this layer holds on its most-loaded rank */
  double act_bytes;           /* activation working set on its most-loaded rank */
  double reduce_bytes;        /* bytes each rank of its largest group sends in its reductions */
  double redist_bytes;        /* bytes received by the most-loaded rank in the redistribution */
  double sync_s;              /* training: its parameters' gradient sync over the groups (in comm_s) */
  double train_bytes;         /* training: gradients, fp32 masters and moments, saved activations */
  /* training, split: what the most-loaded rank keeps (gradients, optimizer state: with ZeRO its
     shards) and its saved activations; the bytes it sends in the gradient sync (all-reduce, or
     ZeRO's reduce-scatter with the redundant copies) and receives in the parameter all-gather */
  double grad_bytes, opt_bytes, saved_bytes, sync_bytes, gather_bytes;
  int32_t replicas;           /* groups holding its parameters (with rows) */
  int32_t domains;            /* the fewest failure domains the holders of one of its elements lie in */
} plan_layer_out;

/* A plan for one set of ranks. */
typedef struct plan_solution {
  bool feasible;
  int32_t world;              /* ranks used */
  int32_t *phys;              /* [world]: physical rank of each new rank */
  int32_t nlayers;
  plan_layer_out *layers;     /* [nlayers] (chain order) */
  double step_s, compute_s, comm_s;
  bool train;                 /* a training step's costs (plan_request.train) */
  double sync_s, train_bytes; /* training: the gradient sync in comm_s; the state in mem_peak (busiest
                                 rank of each layer, summed) */
  double const_s;             /* model-level work outside every layer */
  double *rank_params;        /* [world]: parameter + input bytes per rank */
  double *rank_act;           /* [world]: predicted activation peak per rank */
  double *rank_state;         /* [world]: training state kept per rank (gradients, optimizer, saved
                                 activations; in mem_peak, not in rank_act), or NULL */
  int32_t phys_world;         /* survivors: the healthy world phys[] numbers GPUs of (0: world) */
  double act_reserve;         /* activation bytes reserved: the plan's peak working set */
  double mem_cap, mem_peak;   /* per GPU */
  double quantum;             /* bytes per memory unit of the DP (0: memory never bound) */
  bool exact;                 /* optimal for the byte-exact memory constraint (certified) */
  double lower_bound_s;       /* no plan within the memory cap is faster than this */
  int32_t states;             /* placements searched per layer */
  double search_ms;           /* search time (every DP, the bound) */
  int32_t full_dps;           /* DPs over memory run (one per activation peak not pruned) */
  bool peaks_exact;           /* every candidate activation peak was searched (else: the first ones
                                 and the plan's own; the search then is exact for that reserve) */
  double tables_ms;           /* cost tables */
  double need_min;            /* when infeasible: the smallest plan's memory per GPU (in why) */
  char why[256];              /* when infeasible */
  /* training, the distributed optimizer: the stage and redundancy priced (chosen, or forced) */
  int32_t zero, redundancy, domain_size;
  double grad_bytes, opt_bytes, saved_bytes; /* per layer's busiest rank, summed (in train_bytes) */
  double grad_full, opt_full; /* the same without ZeRO: every replica keeping all */
  double sync_bytes, gather_bytes; /* per step, busiest rank of each layer, summed */
  int32_t lone_layers;        /* layers whose optimizer state a single GPU's failure loses (one copy) */
  int32_t domain_layers;      /* layers whose state a failure domain's loss takes (all copies in it) */
  int32_t nalts;              /* the candidates searched (zero auto), in order */
  struct plan_zero_alt {
    int32_t zero, redundancy;
    bool feasible, pruned;    /* pruned: its lower bound was slower than the chosen margin */
    double step_s, mem_peak, search_ms;
  } alts[PLAN_ZERO_MAX_ALTS];
  /* the 3D search: pp_stages > 0 is a pipelined plan, `pp_replicas` copies of one pipeline of
     pp_stages stages of pp_stage_world GPUs each (world = their product); layers[] are then placed
     over a stage's GPUs and timed per micro-batch of micro_rows rows; pm_stage is the model at
     those rows (the request's model_at_rows) */
  int32_t pp_stages, pp_replicas, pp_stage_world, micro_batches;
  int32_t schedule;           /* ir_schedule_code's: 2 1F1B, 4 ZB-H1 (written 'schedule zb-h1;') */
  int64_t micro_rows;
  const plan_model *pm_stage;
  int32_t *stage_first;       /* [pp_stages + 1]: the chain layer each stage starts at */
  double *stage_time;         /* [pp_stages]: a micro-batch's forward and backward, its input received */
  double *stage_sync, *stage_mem; /* [pp_stages]: the gradient sync; memory per GPU (busiest) */
  int32_t *stage_inflight;    /* [pp_stages]: micro-batches whose activations it keeps (its schedule's) */
  double bubble_s, p2p_s;     /* the step's idle time in the schedule; stage inputs received, summed */
  double flat_step_s;         /* the flat search's step, when it ran and fitted (else 0) */
  int32_t structures;         /* pipeline structures priced (stage GPUs x stages x replicas x micro-batches) */
} plan_solution;

/* Healthy planning (request->nfailed == 0). `m` is the module pm was built from; a plan active
 * in it (ntpc --plan) pins its non-auto rules. false on errors of the request (in diags). */
bool plan_solve(const plan_model *pm, const ir_module *m, const plan_request *rq, plan_solution *out,
                struct diag_sink *diags);
void plan_solution_free(plan_solution *s);
/* The solution as the compiler's placements, for every layer of pm's module (out: [n_layers]): the
 * chain layers' as chosen, every other layer (a norm: it follows its input) one group of them all. */
void plan_solution_placements(const plan_model *pm, const plan_solution *s, struct sh_placement *out);

/* Healthy planning in three dimensions: the flat search above (worlds up to PLAN_FLAT_MAX) beside
 * pipelines of stages of GPUs inside a node, replicated, with micro-batches (rq->model_at_rows),
 * the faster taken (docs/planner.md, "Pipelines"). */
#define PLAN_FLAT_MAX 16
bool plan_solve_3d(const plan_model *pm, const ir_module *m, const plan_request *rq, plan_solution *out,
                   struct diag_sink *diags);
/* The model FLOPs of a step (6 x parameters x tokens, training; 2x forward) and the MFU at a step
 * time: those FLOPs over the GPUs' dense peak (0 when the profile has none for the dtype). */
double plan_model_flops(const plan_model *pm, bool train);
/* Tests: the step of one pipeline structure (g GPUs a stage, p stages, d replicas, m micro-batches;
 * ZB-H1 where rq->schedule is 4 and it trains in stages, else 1F1B) as the 3D search finds it, or
 * by enumerating every placement of every layer and every cut into stages (tiny models only);
 * INFINITY when nothing fits. */
double plan_pipeline_shape(const plan_model *pm, const plan_request *rq, int32_t g, int32_t p, int32_t d, int32_t m,
                           bool exhaustive, struct diag_sink *diags);
double plan_mfu(const plan_model *pm, const plan_solution *s, const plan_profile *prof);

/* Failure re-planning: the healthy plan, the survivors' plan (degraded groups, batch by
 * throughput) and the alternatives that drop degraded replicas. */
typedef struct plan_failover {
  plan_solution healthy, survivors;
  int32_t replica_size;       /* ranks per replica of the healthy structure */
  int32_t nreplicas;
  int32_t replica_start[NTP_MAX_GROUPS + 1]; /* physical ranks of replica i */
  int32_t ndegraded;
  int32_t degraded[NTP_MAX_GROUPS];          /* replicas that lost a GPU */
  plan_solution drop[NTP_MAX_GROUPS + 1];    /* [i]: replica degraded[i] dropped; [ndegraded]: all of them */
} plan_failover;
bool plan_failover_solve(const plan_model *pm, const ir_module *m, const plan_request *rq, plan_failover *out,
                         struct diag_sink *diags);
void plan_failover_free(plan_failover *f);

/* Re-planning a pipelined plan (hp: the healthy program, compiled under it) for the survivors of
 * rq->failed (physical ranks): each replica keeps its stages' surviving GPUs, a degraded one runs
 * each stage as one group of them with its layers cut again to even out the stages' times, a
 * replica that lost a whole stage is dropped. With rq->slow, a replica holding a straggler is re-cut
 * the same way, each stage's time times its slowest GPU's factor (a group waits for its slowest),
 * and every replica's share of the rows follows its pace. Writes the survivors' plan (`plan
 * survivors`) to out; phys[new rank] = physical rank, *world the survivors kept. false with why. */
bool plan_failover_stages(const plan_model *pm, const ir_module *m, const struct sh_program *hp, const plan_request *rq,
                          FILE *out, int32_t **phys, int32_t *world, char *why, size_t cap);

/* ================================ output ================================ */

/* Bytes as the planner's reports write them (2.00 GiB, 3.5 MiB, 1.0 KiB, 12 B) into buf; buf. */
const char *plan_fmt_bytes(double b, char *buf, size_t cap);

/* The plan file: `plan NAME for MODEL { world W; rules }` (rules compressed into patterns
 * where a family of layers agrees). `header` is written as comment lines first. */
void plan_write_plan(FILE *out, const plan_model *pm, const ir_module *m, const plan_solution *s, const char *name,
                     const char *header);
/* The per-layer table and totals. */
void plan_write_report(FILE *out, const plan_model *pm, const plan_solution *s, const plan_profile *prof);
/* A self-contained SVG: degree per layer, compute vs communication per layer, memory per rank. */
void plan_write_svg(FILE *out, const plan_model *pm, const plan_solution *s, const plan_profile *prof,
                    const char *title);

/* Failure re-planning: per layer (families merged) the new groups as physical GPUs, their
 * batch rows and the slice of the layer's units (heads, hidden columns, vocabulary rows,
 * output columns) each GPU holds, beside the healthy placement. */
void plan_write_reshard(FILE *out, const plan_model *pm, const plan_solution *s, const plan_solution *healthy);
/* tokens per step (rows x positions entering the first layer) */
double plan_model_tokens(const plan_model *pm);

/* ================================ tests ================================ */

/* The tables of one world for tests: states = every balanced placement with and without
 * sequence parallelism (what plan_solve searches without pins or failures). */
typedef struct plan_tables plan_tables;
plan_tables *plan_tables_new(const plan_model *pm, const plan_request *rq, struct diag_sink *diags);
void plan_tables_free(plan_tables *t);
/* The problem at a memory cap (bytes); ceil: conservative rounding (else the relaxation). */
plan_problem plan_tables_problem(plan_tables *t, double mem_cap, int32_t quanta, bool ceil);
const plan_place *plan_tables_state(const plan_tables *t, int32_t s);
int32_t plan_tables_nstates(const plan_tables *t);
/* the DP's memory model in bytes: a layer's parameters on its most-loaded rank in a state, and
 * what every plan adds (activation reserve, slices no layer places) */
double plan_tables_param_bytes(const plan_tables *t, int32_t layer, int32_t s);
double plan_tables_fixed_bytes(const plan_tables *t);
/* a layer's activation working set in a state (a plan's peak is the largest of its layers'),
 * and the slices no layer places */
double plan_tables_act_bytes(const plan_tables *t, int32_t layer, int32_t s);
double plan_tables_const_bytes(const plan_tables *t);
/* Predicted bytes received per rank over a whole forward pass for an assignment of states
 * (compared with the compiler's sharded program in the tests). */
void plan_tables_bytes_in(plan_tables *t, const int32_t *choice, double *per_rank);

#endif
