/* dtype.h — the dtype table, defined once. */
#ifndef NTP_DTYPE_H
#define NTP_DTYPE_H

#include <stdbool.h>
#include <stddef.h>

/* X(enum suffix, spelling, bytes, is_float) */
#define NTP_DTYPES(X)       \
  X(BF16, "bf16", 2, true)  \
  X(FP16, "fp16", 2, true)  \
  X(FP32, "fp32", 4, true)  \
  X(I32, "i32", 4, false)

typedef enum {
#define X(e, s, b, f) NTP_##e,
  NTP_DTYPES(X)
#undef X
  NTP_DTYPE_COUNT
} ntp_dtype;

const char *dtype_name(ntp_dtype t);
size_t dtype_bytes(ntp_dtype t);
bool dtype_is_float(ntp_dtype t);
/* -1 when `s` names no dtype */
int dtype_lookup(const char *s);

#endif
