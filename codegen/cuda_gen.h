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

#include <stddef.h>
#include <stdint.h>

#include "shard.h"

typedef enum { CG_NONE, CG_KERNEL, CG_GEMM, CG_FUSED } cg_step_kind;

/* How the runtime runs one compute step of the rank. */
typedef struct cg_step {
  cg_step_kind kind; /* CG_FUSED: done by the kernel of an earlier step */
  int32_t kernel;    /* index into kernels, for CG_KERNEL */
} cg_step;

typedef struct cg_kernel {
  char name[32];
  int32_t step;   /* the step that launches it */
  int64_t grid;   /* blocks (1-D) */
  int32_t block;  /* threads per block */
  int32_t smem;   /* dynamic shared memory bytes */
} cg_kernel;

typedef struct cg_module {
  char *source;
  size_t len, cap;
  cg_kernel *kernels;
  size_t nkernels, cap_kernels;
  cg_step *steps; /* per step of the program (all ranks; only this rank's are set) */
  int32_t rank;
} cg_module;

/* Generates rank `rank`'s CUDA source. Returns 0, or -1 with a message. */
int cg_generate(const sh_program *p, int32_t rank, cg_module *out, char *err, size_t cap);
void cg_module_free(cg_module *m);

#endif
