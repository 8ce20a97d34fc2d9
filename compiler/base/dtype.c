/* dtype.c — lookups over the dtype table. */
#include "dtype.h"

#include <string.h>

static const struct {
  const char *name;
  size_t bytes;
  bool is_float;
} dtypes[] = {
#define X(e, s, b, f) {s, b, f},
    NTP_DTYPES(X)
#undef X
};

const char *dtype_name(ntp_dtype t) { return (unsigned)t < NTP_DTYPE_COUNT ? dtypes[t].name : "?"; }
size_t dtype_bytes(ntp_dtype t) { return (unsigned)t < NTP_DTYPE_COUNT ? dtypes[t].bytes : 0; }
bool dtype_is_float(ntp_dtype t) { return (unsigned)t < NTP_DTYPE_COUNT && dtypes[t].is_float; }

int dtype_lookup(const char *s) {
  for (int i = 0; i < NTP_DTYPE_COUNT; i++)
    if (strcmp(s, dtypes[i].name) == 0) return i;
  return -1;
}
