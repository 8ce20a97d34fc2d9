/* emu_numbers.c — storage formats of the emulated libraries (cuBLASLt, NCCL): binary16 and
 * bfloat16 to and from binary32, rounding to nearest even, NaN kept quiet; element i of a
 * buffer in one of them, as a float. */
#include <math.h>
#include <string.h>

#include "emu.h"

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

float emu_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t emu_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float emu_f16_to_f32(uint16_t h) {
  uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31u, m = h & 1023u;
  if (e == 31u) return bits_f32(s | 0x7f800000u | (m << 13));
  if (e) return bits_f32(s | ((e + 112u) << 23) | (m << 13));
  return bits_f32(f32_bits(ldexpf((float)m, -24)) | s); /* zero or subnormal: exact */
}

uint16_t emu_f32_to_f16(float f) {
  uint32_t u = f32_bits(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u); /* rounds to infinity */
  if (a < 0x38800000u) return (uint16_t)(s | (uint32_t)nearbyintf(bits_f32(a) * 16777216.0f)); /* subnormal */
  uint32_t r = a - 0x38000000u;
  return (uint16_t)(s | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}

float emu_load(const void *p, emu_format f, size_t i) {
  const unsigned char *b = p;
  if (f == EMU_F32) {
    float v;
    memcpy(&v, b + 4 * i, 4);
    return v;
  }
  uint16_t h;
  memcpy(&h, b + 2 * i, 2);
  return f == EMU_BF16 ? emu_bf16_to_f32(h) : emu_f16_to_f32(h);
}

void emu_store(void *p, emu_format f, size_t i, float v) {
  unsigned char *b = p;
  if (f == EMU_F32) {
    memcpy(b + 4 * i, &v, 4);
    return;
  }
  uint16_t h = f == EMU_BF16 ? emu_f32_to_bf16(v) : emu_f32_to_f16(v);
  memcpy(b + 2 * i, &h, 2);
}
