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

#endif
