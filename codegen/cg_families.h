/* cg_families.h — what the kernel families offer the driver (cg_generate.c): a writer per op,
 * which its table (writers[], indexed by op code) holds, and the two things done once before
 * any step is written. A writer writes the step's kernel (cg_kernel_head ... its text; the driver
 * finishes it) or marks the step as something else (a GEMM, fused into another step's kernel). */
#ifndef NTP_CG_FAMILIES_H
#define NTP_CG_FAMILIES_H

#include "cg_emit.h"

typedef void (*cg_writer)(gen *g, int32_t step);

/* cg_pointwise.c: a thread per element */
void cg_write_init(gen *g, int32_t step);   /* input, param: the CPU reference's values from the seed */
void cg_write_const(gen *g, int32_t step);  /* const */
void cg_write_copy(gen *g, int32_t step);   /* reshape, slice */
void cg_write_gather(gen *g, int32_t step); /* gather: an embedding's rows */
void cg_write_rope(gen *g, int32_t step);   /* rope */
void cg_write_ew(gen *g, int32_t step);     /* elementwise and act_grad, with the chain fused after it */

/* cg_rows.c: a block per row */
void cg_write_row(gen *g, int32_t step);      /* layernorm, rmsnorm, softmax, with a fused tail */
void cg_write_row_grad(gen *g, int32_t step); /* their gradients */

/* cg_gemm.c: no kernel; cuBLASLt's, with what its epilogue takes */
void cg_write_gemm(gen *g, int32_t step);
/* marks the backward steps that GEMM epilogues take (DGELU, DGELU_BGRAD, BGRADA/B), before any
 * kernel is written */
void cg_fold_backward_gemms(gen *g);

/* cg_attention.c: the forward kernel its one rule picks (tiled, warp, or the GEMM baseline) */
void cg_write_attention(gen *g, int32_t step);
/* the rule's inputs into g: NTP_CUDA_ATTENTION (tiled | gemm | auto), and auto's crossover from
 * NTP_CUDA_ATTENTION_GEMM_FROM, else the device profile's (opts), else the default; -1: a bad value */
int cg_attention_config(gen *g, const cg_options *opts, char *err, size_t cap);
/* cg_attention_grad.c: attention_grad (dq, dk or dv) */
void cg_write_attention_grad(gen *g, int32_t step);

/* cg_loss.c: cross_entropy and its gradient, and the vocabulary-parallel loss's six steps */
void cg_write_cross_entropy(gen *g, int32_t step);
void cg_write_cross_entropy_grad(gen *g, int32_t step);
void cg_write_ce_stats(gen *g, int32_t step);
void cg_write_ce_rows(gen *g, int32_t step);
void cg_write_ce_mean(gen *g, int32_t step);
void cg_write_ce_stats_grad(gen *g, int32_t step);
void cg_write_ce_rows_grad(gen *g, int32_t step);
void cg_write_ce_mean_grad(gen *g, int32_t step);
void cg_write_ce_count(gen *g, int32_t step);
void cg_write_ce_seed(gen *g, int32_t step);

/* cg_grad.c: the transposes of the forward's data movement */
void cg_write_sum_to(gen *g, int32_t step);      /* of a broadcast */
void cg_write_pad(gen *g, int32_t step);         /* of a slice */
void cg_write_scatter_add(gen *g, int32_t step); /* of a gather */

#endif
