/* shard_internal.h — shared between the sharding files and the planner. */
#ifndef NTP_SHARD_INTERNAL_H
#define NTP_SHARD_INTERNAL_H

#include "shard.h"

/* Rows per group in proportion to the shares, largest remainders first; sums to rows. */
void shard_split_rows(int64_t rows, const int64_t *shares, int32_t ngroups, int64_t *row_start);

/* ---- the sharded backward (shard_grad.c) and what it uses of the lowering (shard.c) ---- */
typedef struct shard_lowering shard_lowering;
/* After the forward steps of a module with a gradient pass: every rank's backward steps and
 * the parameter gradients' sync, as pieces of the module's grad.NAME outputs. false if
 * reported (out of memory, an op without a rule). */
bool shard_backward(shard_lowering *L, diag_sink *diags);
sh_program *shard_lowering_program(shard_lowering *L);
/* A temporary with the given box (global -1): op `code` on `rank`'s tensors. */
int32_t shard_backward_compute(shard_lowering *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs,
                               const ntp_op_attr *attr, ntp_box box, ntp_dtype dt, int32_t layer, ntp_loc loc);
/* One comm step over the transfers (sums into each destination), with its bytes counted. */
void shard_backward_comm(shard_lowering *L, sh_comm_kind kind, sh_xfer *xf, size_t n, const char *why);
/* Tensor t holds a piece of global value v (an output the runtime assembles). */
void shard_backward_piece(shard_lowering *L, int32_t v, int32_t t);

/* ---- the distributed optimizer (shard_zero.c) ---- */
typedef struct sh_zero_shard {
  int32_t v, rank;
  ntp_box box;  /* a part of a cell of the parameter's holders' slices */
  int32_t copy; /* 0..redundancy-1: a part's copies follow each other */
  bool partial; /* NTP_FAILPOINT=zero-two-owners: a deliberately wrong part (tests) */
} sh_zero_shard;
typedef struct sh_zero {
  sh_zero_shard *s;
  size_t n, cap;
  int32_t *tensor; /* [n]: each shard's persistent slice (shard_zero_rewrite) */
} sh_zero;
/* Parameter v's parts, owned by p->redundancy of the holders of each cell of the holders' slices
 * (ranks hr, boxes hb; nh of them, each (rank, box) once), appended to z: the gradient sync's
 * destinations. ring[rank] += the bytes the sync moves for it as a collective library runs it. */
size_t shard_zero_parts(const sh_program *p, int32_t v, const int32_t *hr, const ntp_box *hb, size_t nh, ntp_box whole,
                        ntp_dtype dt, int64_t *ring, sh_zero *z);
/* After the backward and its syncs (steps syncs[0..nsync): moved to just after their last
 * contribution, for ZeRO-2): the shards made persistent slices at the start, every holder's slice
 * gathered from them where its parameter step was. */
void shard_zero_rewrite(shard_lowering *L, sh_zero *z, const int32_t *syncs, size_t nsync);
void shard_zero_free(sh_zero *z);

/* ---- pipelined programs: micro-batches (shard.c) ---- */
/* The number of micro-batches of a pipelined program, else 0; the one being lowered (-1: none). */
int32_t shard_micro_batches(const shard_lowering *L);
int32_t shard_current_mb(const shard_lowering *L);
void shard_set_mb(shard_lowering *L, int32_t mb);
void shard_set_phase(shard_lowering *L, sh_phase ph);
void shard_set_at_layer(shard_lowering *L, int32_t l);
/* The micro-batch of value v's i-th home piece (as shard_homes lists them). */
int32_t shard_home_mb(const shard_lowering *L, int32_t v, size_t i);
/* The loss's gradient on tensor `part` is tensor `grad` (a micro-batched loss: shard_loss.c);
 * the backward seeds there instead of at the loss. */
typedef struct shard_seed {
  int32_t part, grad;
} shard_seed;
void shard_add_seed(shard_lowering *L, int32_t part, int32_t grad);
size_t shard_seeds(const shard_lowering *L, const shard_seed **seeds);

/* ---- the vocabulary-parallel loss (shard_loss.c) and what it uses of the lowering ---- */
/* cross_entropy `op` without gathering its logits, when they are spread over ranks; false
 * (nothing emitted) when their pieces do not tile the vocabulary, or one rank holds them all. */
bool shard_lower_loss(shard_lowering *L, const ir_op *op);
/* Where value v's pieces are (rank, box): out has room for shard_home_count + 4 W + 4. */
size_t shard_homes(shard_lowering *L, int32_t v, rank_box *out);
size_t shard_home_count(const shard_lowering *L, int32_t v);
/* An empty temporary with box `box` (a transfer's destination), and op `code` into one. */
int32_t shard_new_temp(shard_lowering *L, int32_t rank, ntp_box box, ntp_dtype dt);
int32_t shard_temp_box(shard_lowering *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs,
                       const ir_op *attrs, ntp_box box, ntp_dtype dt);

#endif
