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

#include "shard.h"

typedef enum { CG_NONE, CG_KERNEL, CG_GEMM, CG_FUSED } cg_step_kind;
/* What a GEMM's epilogue adds to the product before its one rounding (cuBLASLt epilogues). */
typedef enum { CG_EPI_NONE, CG_EPI_BIAS, CG_EPI_GELU, CG_EPI_GELU_BIAS } cg_epilogue;

/* Values a launch passes in its argument block (`struct ntp_args { i64 v[CG_MAX_ARGS]; }`, the
 * kernel's last parameter): its tensors' byte offsets and an init kernel's name hash. Nothing
 * else differs between the kernels of repeated layers, so those are one kernel, launched by
 * every step that needs it, and NVRTC compiles it once. */
#define CG_MAX_ARGS 48

/* How the runtime runs one compute step of the rank. */
typedef struct cg_step {
  cg_step_kind kind;    /* CG_FUSED: done by the kernel (or GEMM epilogue) of an earlier step */
  int32_t kernel;       /* index into kernels, for CG_KERNEL */
  cg_epilogue epilogue; /* CG_GEMM: a bias over the output columns and/or GELU, fused */
  int32_t bias;         /* CG_GEMM with a bias: its tensor ([N], the product's dtype) */
  int32_t out;          /* CG_GEMM: the tensor written (the last fused step's result) */
  int64_t grid;         /* CG_KERNEL: blocks (1-D) */
  int32_t block, smem;  /* CG_KERNEL: threads per block, dynamic shared memory bytes */
  int32_t arg0, nargs;  /* CG_KERNEL: its argument block, args[arg0 .. arg0 + nargs) of the module */
} cg_step;

typedef struct cg_kernel {
  char name[32];
  int32_t step;   /* the first step that launches it */
  int64_t grid;   /* that step's launch (others may launch it with another grid) */
  int32_t block;  /* threads per block */
  int32_t smem;   /* dynamic shared memory bytes */
} cg_kernel;

typedef struct cg_module {
  char *source;
  size_t len, cap;
  cg_kernel *kernels;
  size_t nkernels, cap_kernels;
  cg_step *steps; /* per step of the program (all ranks; only this rank's are set) */
  int64_t *args;  /* the argument blocks of the kernel steps */
  size_t nargs, cap_args;
  int32_t rank;
  bool failed; /* out of memory while writing: cg_generate fails */
} cg_module;

/* binary16 <-> binary32 for generated sources (which define u16 and u32): PTX on the device,
 * the same rounding in C where a host compiles the source as device code (tests/emu). */
#define NTP_CUDA_F16_CONVERSIONS                                                                        \
  "__device__ __forceinline__ float f16_to_f32(u16 h) {\n"                                               \
  "#ifdef __CUDA_ARCH__\n"                                                                               \
  "  float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f;\n"                          \
  "#else\n"                                                                                              \
  "  u32 s = (u32)(h >> 15) << 31, e = (h >> 10) & 31u, m = h & 1023u, u;\n"                             \
  "  if (e == 31u) u = s | 0x7f800000u | (m << 13);\n"                                                   \
  "  else if (e) u = s | ((e + 112u) << 23) | (m << 13);\n"                                              \
  "  else u = __float_as_uint((float)m * 5.9604644775390625e-08f) | s;\n"                                \
  "  return __uint_as_float(u);\n"                                                                       \
  "#endif\n"                                                                                             \
  "}\n"                                                                                                  \
  "__device__ __forceinline__ u16 f32_to_f16(float f) {\n"                                               \
  "#ifdef __CUDA_ARCH__\n"                                                                               \
  "  u16 h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;\n"                          \
  "#else\n"                                                                                              \
  "  u32 u = __float_as_uint(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;\n"                        \
  "  if (a > 0x7f800000u) return (u16)(s | 0x7e00u);\n"                                                  \
  "  if (a >= 0x477ff000u) return (u16)(s | 0x7c00u); /* rounds to infinity */\n"                        \
  "  if (a < 0x38800000u) return (u16)(s | (u32)rintf(__uint_as_float(a) * 16777216.0f));\n"             \
  "  u32 r = a - 0x38000000u;\n"                                                                         \
  "  return (u16)(s | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));\n"                                       \
  "#endif\n"                                                                                             \
  "}\n"

/* Generates rank `rank`'s CUDA source. Returns 0, or -1 with a message. */
int cg_generate(const sh_program *p, int32_t rank, cg_module *out, char *err, size_t cap);
void cg_module_free(cg_module *m);

#endif
