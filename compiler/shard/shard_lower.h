/* shard_lower.h — the sharder's kit for layer kinds: what a kind's `shard` (compiler/layers/)
 * builds one TP group's ranks with. Boxes are in the global value's coordinates; `ensure`
 * brings a box of a value to a rank (scheduling the transfers), `temp` computes a layer-internal
 * tensor, `group_reduce` ends a row-parallel layer with its group's reduction. */
#ifndef NTP_SHARD_LOWER_H
#define NTP_SHARD_LOWER_H

#include "layer_kind.h"
#include "shard.h"

struct shard_group {
  const ir_layer *ly;
  const sh_placement *pl;
  int g;          /* group index */
  int32_t r0;     /* first rank */
  int t;          /* group size */
  int64_t b0, b1; /* batch rows */
  bool whole;     /* the layer's input has no batch dim: the owning group takes every value whole */
  int32_t x;      /* the layer's input */
  int32_t core;   /* the value the group's pieces are of */
  const layer_dims *d;
};

const ir_module *shard_module(const shard_lowering *L);
/* The group's batch rows of value v (v whole when it has no batch dim). */
ntp_box shard_rows_box(const shard_lowering *L, int32_t v, const shard_group *g);
/* A box of weight w: rows (dim 0) or columns (dim 1) [lo, hi). */
ntp_box shard_weight_box(const shard_lowering *L, int32_t w, int dim, int64_t lo, int64_t hi);
ntp_box shard_tensor_box(const shard_lowering *L, int32_t t);
/* A tensor on `rank` holding box `need` of value v (found, materialised or transferred). */
int32_t shard_ensure(shard_lowering *L, int32_t v, int32_t rank, ntp_box need);
/* A layer-internal tensor: op `code` on local tensors, its box its own shape. */
int32_t shard_temp(shard_lowering *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs, const ir_op *attrs,
                   ntp_shape shape, ntp_dtype dt);
/* A piece of global value `global` (box gbox) computed on `rank`. */
int32_t shard_compute(shard_lowering *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs,
                      const ir_op *attrs, int32_t global, ntp_box gbox, ntp_dtype dt);
/* x @ w[lo:hi]^T (+ b[lo:hi]): the column-parallel half of a Megatron pair; a piece of `global`
 * (box gbox) when global >= 0 and there is no bias, else a temporary. */
int32_t shard_col_linear(shard_lowering *L, int32_t rank, int32_t xt, int32_t w, int32_t b, int64_t lo, int64_t hi,
                         int32_t global, ntp_box gbox);
/* Records tensor t as a piece of value v that later ops follow. */
void shard_add_home(shard_lowering *L, int32_t v, int32_t t);
/* The row-parallel end: parts[i] (rank r0 + i) are partial sums of the group's rows of g->core. */
void shard_group_reduce(shard_lowering *L, const shard_group *g, const int32_t *parts, const char *why);

#endif
