/* shard_lowering.h — the lowering's state and the primitives its files share, hidden from
 * everything else (layer kinds see shard_lower.h, the backward and the loss shard_internal.h):
 *   shard.c         the entry: op by op, outputs, ops that follow their operand; the verifier
 *   shard_steps.c   tensors and pieces, compute steps, transfers batched into collectives
 *   shard_layer.c   one layer in its groups, and the kit its kind shards with
 *   shard_layout.c  explicit layouts on a mesh and the sharded-matmul rules */
#ifndef NTP_SHARD_LOWERING_H
#define NTP_SHARD_LOWERING_H

#include "shard.h"
#include "shard_internal.h"
#include "shard_lower.h"

struct shard_lowering {
  sh_program *p;
  const ir_module *m;
  diag_sink *diags;
  int32_t W;
  int32_t **home; /* per global value: the pieces it was computed as (what followers follow) */
  size_t *nhome, *chome;
  sh_xfer *pend; /* transfers waiting for the next flush */
  size_t npend, cpend;
  int32_t layer;
  ntp_loc loc;
  const char *why;
  ntp_layout *lay; /* explicit layout of each value, where layouts apply */
  bool use_layouts;
  int32_t mesh; /* the mesh layouts live on */
  bool failed;
  /* pipelined programs (stages or micro-batches): M micro-batches (else 0), the one being
   * lowered (-1: none), the phase of the steps being made */
  int32_t M, mb;
  sh_phase phase;
  int32_t at_layer;
  shard_seed *seeds; /* the loss's gradient per row block's part (micro-batched) */
  size_t nseeds, cseeds;
};
typedef struct shard_lowering lower;

static inline ntp_shape vshape(lower *L, int32_t v) { return L->m->values[v].shape; }
static inline ntp_dtype vdtype(lower *L, int32_t v) { return L->m->values[v].dtype; }
static inline const ir_op *vdef(lower *L, int32_t v) { return &L->m->ops[L->m->values[v].def]; }

/* ---- shard_steps.c ---- */
/* Reports an internal error once (msg has one %s for arg) and marks the lowering failed. */
void lw_error(lower *L, const char *msg, const char *arg);
/* Op `code` on `rank`'s tensors args into a new tensor: a piece of `global` with box `box`
 * (global -1: a temporary). Flushes the queued transfers first when an operand waits on them. */
int32_t lw_compute(lower *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs, const ir_op *attrs,
                   int32_t global, ntp_box box, ntp_dtype dt, const char *name);
/* Inputs, params (and their slices) and constants: read where needed, never moved. */
bool lw_is_source(lower *L, int32_t v);
/* A tensor on `rank` that reads box `box` of source v from the model's inputs or parameters. */
int32_t lw_materialize(lower *L, int32_t v, int32_t rank, ntp_box box);
/* The queued transfers as communication steps, one per connected set of ranks. */
void lw_flush(lower *L);
/* Partial sums parts[0..n) reduced: outs[i] = the sum over out_boxes[i] on parts[i]'s rank, as
 * pieces of `global` (or temporaries when -1); an all-reduce, or a reduce-scatter. */
void lw_reduce(lower *L, const int32_t *parts, int n, const ntp_box *out_boxes, int32_t global, int32_t *outs,
               const char *why);

/* ---- shard_layout.c ---- */
/* Picks the mesh the values' layouts live on and applies the layouts when it is the world
 * (reporting a mesh of another size, and dims split over more ranks than they have elements). */
void lw_init_layouts(lower *L);
/* The box of a value of `shape` with layout `lay` that `rank` holds (the whole value: no layout). */
ntp_box lw_layout_box(lower *L, const ntp_layout *lay, ntp_shape shape, int32_t rank);
/* A matmul with an operand in an explicit layout, by the sharded-matmul rules (noted). */
void lw_layout_matmul(lower *L, const ir_op *op);

/* ---- shard_layer.c ---- */
/* Layer l, lowered by its kind in each of its groups; the rest of its ops follow the core. */
void lw_lower_layer(lower *L, int32_t l);

/* ---- shard.c ---- */
/* Op computed beside the pieces of the operand it follows (geom_followed_operand). */
void lw_follow(lower *L, const ir_op *op);

#endif
