/* cuda_gen.h — CUDA C for one rank of a sharded program.
 *
 * Every compute step that is not a GEMM becomes (part of) a kernel with its shapes,
 * offsets and launch geometry baked in as constants; chains of elementwise steps are
 * fused into one kernel, and the elementwise tail of a norm (gain, bias) into the norm.
 * GEMMs are left to cuBLASLt and communication to NCCL: the runtime reads their
 * descriptors from the step list. Storage is bf16 / fp16 / fp32, math is fp32, rounding
 * to storage is round-to-nearest-even exactly as in the CPU reference. The source needs
 * no headers (NVRTC compiles it as it is) and carries #line directives, so a compile error
 * points at the .ntp line the op came from.
 *
 * Contract with the runtime: the kernels of parameter and input initialisation steps run
 * before all other steps (fusion may move a consumer of a parameter ahead of the step
 * that initialises it in the list).
 */
#ifndef NTP_CUDA_GEN_H
#define NTP_CUDA_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ntp_program.h"
#include "shard.h"


/* cg_step, cg_kernel and CG_MAX_ARGS are the runtime's (runtime/ntp_program.h): what codegen
 * writes is what the runtime runs. */
typedef struct cg_module {
  char *source;
  size_t len, cap;
  cg_kernel *kernels;
  size_t nkernels, cap_kernels;
  cg_step *steps; /* per step of the program (all ranks; only this rank's are set) */
  int64_t *args;  /* the argument blocks of the kernel steps */
  size_t nargs, cap_args;
  int32_t rank;
  int64_t scratch_bytes; /* the most any step of the rank uses (ntp_rank_code's) */
  bool failed; /* out of memory while writing: cg_generate fails */
} cg_module;


/* What the compile knows of the GPU it is for: from the session's device profile (`--gpu NAME|FILE`).
 * All zero: nothing known, each choice by its default rule. */
typedef struct cg_options {
  /* the profile's attention_gemm_from (0: not given; INT64_MAX: never): from this sequence length
   * on, auto's attention rule takes the GEMMs (cg_attention_pick; the environment overrides it) */
  int64_t attn_gemm_from;
} cg_options;

/* Generates rank `rank`'s CUDA source for a GPU described by opts (NULL: nothing known). Returns
 * 0, or -1 with a message; -2 with a message where a setting of the environment is invalid
 * (NTP_CUDA_ATTENTION, NTP_CUDA_ATTENTION_GEMM_FROM). */
int cg_generate_with(const sh_program *p, int32_t rank, const cg_options *opts, cg_module *out, char *err, size_t cap);
/* cg_generate_with, nothing known of the GPU */
int cg_generate(const sh_program *p, int32_t rank, cg_module *out, char *err, size_t cap);
void cg_module_free(cg_module *m);

#endif
