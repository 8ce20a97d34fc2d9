/* cuda_gen_internal.h — what the files of the CUDA code generator share: the state of one
 * rank's generation and the helpers that write kernel text (tensor declarations, storage loads
 * and rounding stores, float literals, kernel heads). cuda_gen.c writes the forward kernels and
 * drives the generation; cuda_gen_grad.c writes the kernels of the loss and the backward ops. */
#ifndef NTP_CUDA_GEN_INTERNAL_H
#define NTP_CUDA_GEN_INTERNAL_H

#include "cuda_gen.h"

enum { EW_BLOCK = 256, ROW_BLOCK = 256, ATT_WARPS = 4 };
/* the largest head dim of the tiled attention kernels (their tiles in static shared memory) */
enum { ATT_TILED_MAX_HD = 128 };

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
  int attn_mode;           /* cg_att_kernel: NTP_CUDA_ATTENTION's choice, CG_ATT_AUTO by default */
  int64_t attn_gemm_from;  /* auto: the GEMM baseline from this sequence length on (INT64_MAX: never) */
} gen;

typedef enum { CG_ATT_AUTO, CG_ATT_TILED, CG_ATT_GEMM, CG_ATT_WARP } cg_att_kernel;

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
/* starts the kernel of a step (its name is written when it is finished) */
void cg_kernel_head(gen *g, int32_t step, int64_t grid, int32_t block, int32_t smem);

/* cuda_gen.c: do tensors a and b share bytes? */
bool cg_overlap(gen *g, int32_t a, int32_t b);
/* cuda_gen_bwd_gemm.c: marks the backward steps that GEMM epilogues take (DGELU, DGELU_BGRAD,
 * BGRADA/B) in the module's step list, before any kernel is written */
void cg_fold_backward_gemms(gen *g);

/* names the kernel being written (or finds its text written already); -1: out of memory */
int cg_finish_kernel(gen *g);

/* cuda_gen_attention.c: attention_grad as the tiled statistics pass + dq or dk/dv kernel; false
 * where the head dim is above ATT_TILED_MAX_HD (cuda_gen_grad.c's warp kernel then) */
bool cg_attention_grad_tiled(gen *g, int32_t step);
/* attention's selection into g: NTP_CUDA_ATTENTION (tiled | gemm | auto), and auto's crossover from
 * NTP_CUDA_ATTENTION_GEMM_FROM, else the device profile's (opts), else the default; -1: a bad value */
int cg_attention_config(gen *g, const cg_options *opts, char *err, size_t cap);
/* the forward kernel of attention step `step`: CG_ATT_TILED, CG_ATT_GEMM or CG_ATT_WARP */
cg_att_kernel cg_attention_pick(gen *g, int32_t step);
/* the GEMM baseline's step: its softmax kernel, written and finished; the runtime adds the GEMMs */
void cg_attention_gemm(gen *g, int32_t step);

/* cuda_gen_grad.c: the loss and the backward ops; false when `code` is none of them */
bool cg_gen_grad_step(gen *g, int32_t step);
/* the device functions those kernels call, appended to the prelude */
extern const char cg_grad_prelude[];

#endif
