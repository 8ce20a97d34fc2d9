/* cg_fuse.h — elementwise fusion (cg_fuse.c): which steps join an earlier step's kernel, and the
 * text of such a chain, for the families that fuse (cg_pointwise.c, cg_rows.c, cg_gemm.c).
 *
 * A chain is chain[0..n): chain[0] the step the kernel is written for, each later step reading
 * the previous one's result from a register "v<tensor>". `reg` is a tensor whose value the kernel
 * computed before the chain (a norm's result, for its tail), or -1. */
#ifndef NTP_CG_FUSE_H
#define NTP_CG_FUSE_H

#include "cg_emit.h"

/* the next step of this rank after s, looking past initialisation steps; -1 at a collective or the end */
int32_t cg_next_step(gen *g, int32_t s);
/* may step nx (-1: none) join the kernel that computes tensor prev_result? */
bool cg_fusable(gen *g, int32_t prev_result, int32_t nx);
/* first and the steps fused after it into chain (at most max), those marked CG_FUSED; their count */
int cg_collect_chain(gen *g, int32_t first, int32_t *chain, int max);

/* "  T<t> = ..." for every tensor the chain reads from memory, and its last result */
void cg_declare_chain(gen *g, const int32_t *chain, int n, int32_t reg);
/* the output dims (a bit each) that broadcast operands of the chain index by */
unsigned cg_coord_mask(gen *g, const int32_t *chain, int n, ntp_shape os, int32_t reg);
/* "  i64 c<d> = ..." from the flat index i, for each dim d in mask */
void cg_coords(gen *g, ntp_shape s, unsigned mask);
/* "  float v<r> = ..." for each step of the chain, output shape os */
void cg_ew_body(gen *g, const int32_t *chain, int n, ntp_shape os, int32_t reg);

#endif
