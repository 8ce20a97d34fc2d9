/* hash.c — FNV-1a: the program image's checksum. */
#include "ntp_types.h"

uint64_t ntp_fnv1a64(const void *data, size_t len, uint64_t h) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}
