/* rng.h — the random generator of the randomised tests: splitmix64, so a seed names a case. */
#ifndef NTP_TEST_RNG_H
#define NTP_TEST_RNG_H

#include <stdbool.h>
#include <stdint.h>

typedef struct rng {
  uint64_t s;
} rng;

static inline uint64_t next(rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* in [lo, hi] */
static inline int uni(rng *r, int lo, int hi) { return lo + (int)(next(r) % (uint64_t)(hi - lo + 1)); }
static inline bool chance(rng *r, int percent) { return uni(r, 1, 100) <= percent; }

#endif
