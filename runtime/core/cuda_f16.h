/* cuda_f16.h — binary16 conversions as CUDA source text, shared by the generated kernels
 * (codegen/cg_generate.c) and the runtime's own (runtime/cuda/collectives.c, optimizer.c). */
#ifndef NTP_CUDA_F16_H
#define NTP_CUDA_F16_H

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

#endif
