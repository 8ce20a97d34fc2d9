/* geometry.h — the placement geometry, once: which box of a value each rank holds at a layer's
 * placement, which operand an op computed outside a layer follows and what box of each operand a
 * piece of its result needs, and which rank serves each cell of a needed box. The sharder lowers
 * with these (shard.c) and the planner costs with them (compiler/planner/), so the planner's
 * bytes and the compiler's are the same computation. */
#ifndef NTP_GEOMETRY_H
#define NTP_GEOMETRY_H

#include "shard.h"

/* The box of a value of shape s that rank i (of t) of a group holds when the value lives at
 * the group's placement: the group's batch rows [b0, b1) (the whole value when it has no batch
 * dim or `whole`: the layer's input has none); with `seq`, the i-th of t slices of the sequence
 * (dim 1); with `cols`, the i-th slice of the last dim (a column-parallel output). */
ntp_box geom_group_piece(ntp_shape s, int64_t b0, int64_t b1, bool whole, int t, int i, bool seq, bool cols);

/* The operand an op outside a layer's core is computed beside: a matmul's left operand, else
 * its latest operand of the result's shape that is not a constant (-1: none). */
int32_t geom_followed_operand(const ir_module *m, const ir_op *op);
/* Ops whose every result piece spans the whole last dim (a matmul's N, a norm's or softmax's rows). */
bool geom_whole_rows(ir_opcode code);
/* The result piece computed beside a piece `followed` of the followed operand (or of the result
 * itself when there is none). */
ntp_box geom_result_piece(ir_opcode code, ntp_box followed, ntp_shape result);
/* The box of operand j (of shape os) that result piece `res` of an op `code` needs. */
ntp_box geom_operand_need(ir_opcode code, int j, ntp_box res, ntp_shape os);

/* Which rank serves each cell of box `need` wanted on `rank`: `need` cut along every boundary of
 * the sources that meet it (slice intersection), each cell from the rank itself when it holds
 * it, else from the nearest rank that does. serve(ctx, k, cell) is called per cell with the
 * index k of its source (-1: no source holds it). false when out of memory. */
typedef void (*geom_serve_fn)(void *ctx, int k, const ntp_box *cell);
bool geom_serve(const rank_box *srcs, int nsrc, int32_t rank, const ntp_box *need, geom_serve_fn serve, void *ctx);

#endif
