/* cg_emit.h — the emitter kit of the CUDA generator: the state of one rank's generation and the
 * helpers every kernel family writes its text with (tensor declarations, storage loads and
 * rounding stores, float literals, kernel heads, the deduplication of finished kernels).
 *
 * The generator is layered so that no file calls back into one that calls it:
 *   cg_emit.c (this kit) <- cg_fuse.c (elementwise chains) <- the kernel families
 *   (cg_pointwise.c, cg_rows.c, cg_attention.c, cg_attention_grad.c, cg_loss.c, cg_grad.c,
 *   cg_gemm.c) <- cg_generate.c (the driver: its table maps an op to the family that writes it).
 * The kit knows nothing of ops, and a family calls no other family (attention's backward uses the
 * dims and warp head its forward defines, cg_attention.h). */
#ifndef NTP_CG_EMIT_H
#define NTP_CG_EMIT_H

#include "cuda_gen.h"

/* threads per block of the elementwise (a thread per element) and the row (a block per row) kernels */
enum { EW_BLOCK = 256, ROW_BLOCK = 256 };

/* -infinity as CUDA C, with no header to name it */
#define CG_NEG_INF "(-__int_as_float(0x7f800000))"

typedef struct gen {
  const sh_program *p;
  cg_module *m;
  int32_t rank;
  int32_t *uses; /* per tensor: how many steps read it */
  int line;      /* the last known source line, for #line */
  /* the kernel being written: its step, where its text starts; the distinct kernels so far */
  int32_t kstep;
  size_t kstart;
  bool too_many_args;
  char **bodies; /* per kernel: its text, identifiers numbered canonically */
  uint64_t *hashes;
  int attn_mode;           /* cg_att_kernel (cg_attention.h): NTP_CUDA_ATTENTION's choice, CG_ATT_AUTO by default */
  int64_t attn_gemm_from;  /* auto: the GEMM baseline from this sequence length on (INT64_MAX: never) */
} gen;

/* appends formatted text to the module's source */
void cg_out(cg_module *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* a float constant as CUDA C ("1.0f", "1e-05f", infinities spelled out), into buf */
const char *cg_flit(double x, char *buf, size_t cap);
/* a value of the launch's argument block: the kernel reads it as args.v[index] */
int cg_arg(gen *g, int64_t v);
const char *cg_ctype(ntp_dtype dt);   /* the storage type: float, int, u16 */
const char *cg_dsuffix(ntp_dtype dt); /* bf16, f16, f32: of ld_, rn_, rt_ */
/* "  T<t> = pointer to tensor t" */
void cg_decl(gen *g, int32_t t);
/* the expression of element idx of tensor t, as float */
void cg_load(gen *g, int32_t t, const char *idx);
/* "  T<t>[idx] = val" rounded to t's storage dtype */
void cg_store(gen *g, int32_t t, const char *idx, const char *val);
ntp_shape cg_tshape(gen *g, int32_t t);
/* the rows of shape s: the product of all dims but the last (1 for a scalar) */
int64_t cg_rows_of(ntp_shape s);
/* do tensors a and b share bytes? */
bool cg_overlap(gen *g, int32_t a, int32_t b);

/* starts the kernel of a step (its name is written when it is finished) */
void cg_kernel_head(gen *g, int32_t step, int64_t grid, int32_t block, int32_t smem);
/* starts the kernel of a step with a thread per element: i64 `var` in [0, n) */
void cg_kernel_flat(gen *g, int32_t step, int64_t n, const char *var);
/* step's work is done in another step's kernel or GEMM: it launches nothing */
void cg_mark_fused(gen *g, int32_t step);
/* names the kernel being written (or finds its text written already); -1: out of memory */
int cg_finish_kernel(gen *g);

#endif
