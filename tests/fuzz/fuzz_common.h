/* fuzz_common.h — helpers shared by the libFuzzer harnesses (tests/fuzz/README.md). */
#ifndef NTP_FUZZ_COMMON_H
#define NTP_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Where emitted text goes: written, never kept. */
static inline FILE *fuzz_sink(void) {
  static FILE *f;
  if (!f) f = fopen("/dev/null", "w");
  return f;
}

/* The input as a NUL-terminated string (a NUL inside ends it early, as a C string would). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) abort();
  memcpy(s, data, size);
  s[size] = 0;
  return s;
}

/* The input written to a per-process file, for readers that take a path. */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *ext) {
  static char path[256];
  snprintf(path, sizeof path, "/tmp/ntp_fuzz_%ld%s", (long)getpid(), ext);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
  return path;
}

/* Inputs that ask the planner ('tp auto') for a world above 16 ranks: skipped. Planning them is
 * correct but slow under the fuzzer's instrumentation (a toy GPT-2 at 82 ranks: 0.8 s natively,
 * over 20 s instrumented, libFuzzer's timeout); the planner's own tests cover large worlds. */
static inline int fuzz_autoplan_too_big(const uint8_t *data, size_t size) {
  const char *d = (const char *)data;
  int has_auto = 0;
  long world = 0;
  for (size_t i = 0; i + 4 <= size; i++) {
    if (memcmp(d + i, "auto", 4) == 0) has_auto = 1;
    if (i + 5 <= size && memcmp(d + i, "world", 5) == 0) {
      size_t j = i + 5;
      while (j < size && (d[j] == ' ' || d[j] == '\t' || d[j] == '\n')) j++;
      long v = 0;
      while (j < size && d[j] >= '0' && d[j] <= '9' && v < 100000) v = v * 10 + (d[j++] - '0');
      if (v > world) world = v;
    }
  }
  return has_auto && world > 16;
}

#endif
