/* adamw_options.c — the trainer's options (ntp_adamw) by name, with their bounds, in one table:
 * `ntpc train` (--lr, --weight-decay, ...), the model ABI's train step and the Python package set
 * and check them here, so a value one accepts the others accept, and the messages are the same. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntp_train.h"

typedef struct adamw_field {
  const char *name;
  size_t off;
  bool whole;      /* an int64_t step count; else a double */
  double lo, hi;   /* bounds, both included but with below_hi */
  bool below_hi;
  const char *help;
} adamw_field;

#define REAL(f, lo, hi, below, help) {#f, offsetof(ntp_adamw, f), false, lo, hi, below, help}
#define WHOLE(f, help) {#f, offsetof(ntp_adamw, f), true, 0, 1e9, false, help}

static const adamw_field fields[] = {
    REAL(lr, 0, HUGE_VAL, false, "peak learning rate (default 1e-3)"),
    WHOLE(warmup, "steps of linear warmup (default 0); then a cosine to lr * min_lr_frac"),
    REAL(min_lr_frac, 0, HUGE_VAL, false, "the cosine's end, as a fraction of lr (default 0.1)"),
    WHOLE(steps, "the schedule's length in steps"),
    REAL(beta1, 0, 1, true, "AdamW's first moment decay (default 0.9)"),
    REAL(beta2, 0, 1, true, "AdamW's second moment decay (default 0.95)"),
    REAL(eps, 0, HUGE_VAL, false, "AdamW's epsilon (default 1e-8)"),
    REAL(weight_decay, 0, HUGE_VAL, false, "decoupled, on matrices and embeddings (default 0.1)"),
    REAL(clip, 0, HUGE_VAL, false, "clip the gradients' global norm to this (default 1; 0: off)"),
};
enum { N_FIELDS = sizeof fields / sizeof fields[0] };

static const adamw_field *field(const char *name) {
  for (int i = 0; name && i < N_FIELDS; i++)
    if (strcmp(fields[i].name, name) == 0) return &fields[i];
  return NULL;
}

/* what the field takes, as the messages say it */
static void expects(const adamw_field *f, char *err, size_t cap) {
  if (f->whole) snprintf(err, cap, "expected a whole number from 0 to 10^9");
  else if (f->below_hi) snprintf(err, cap, "expected a number of %g or more and below %g", f->lo, f->hi);
  else snprintf(err, cap, "expected a number of %g or more", f->lo);
}

static bool in_bounds(const adamw_field *f, double v) {
  return isfinite(v) && v >= f->lo && (f->below_hi ? v < f->hi : v <= f->hi) && (!f->whole || v == floor(v));
}

int ntp_adamw_set_number(ntp_adamw *o, const char *name, double v, char *err, size_t cap) {
  const adamw_field *f = field(name);
  if (!f) {
    snprintf(err, cap, "no such option '%s'", name ? name : "(null)");
    return -1;
  }
  if (!in_bounds(f, v)) {
    expects(f, err, cap);
    return -1;
  }
  if (f->whole) *(int64_t *)((char *)o + f->off) = (int64_t)v;
  else *(double *)((char *)o + f->off) = v;
  return 0;
}

int ntp_adamw_set(ntp_adamw *o, const char *name, const char *text, char *err, size_t cap) {
  const adamw_field *f = field(name);
  /* decimal only: strtod would also take hex (0x10), "inf", "nan" and leading spaces */
  char *end = NULL;
  errno = 0;
  double v = f && *text && strspn(text, "0123456789.eE+-") == strlen(text) ? strtod(text, &end) : NAN;
  if (f && (errno || !end || *end)) v = NAN;
  return ntp_adamw_set_number(o, name, v, err, cap);
}

int ntp_adamw_check(const ntp_adamw *o, char *err, size_t cap) {
  for (int i = 0; i < N_FIELDS; i++) {
    const adamw_field *f = &fields[i];
    double v = f->whole ? (double)*(const int64_t *)((const char *)o + f->off) : *(const double *)((const char *)o + f->off);
    if (in_bounds(f, v)) continue;
    char why[128];
    expects(f, why, sizeof why);
    snprintf(err, cap, "%s: %s, got %g", f->name, why, v);
    return -1;
  }
  return 0;
}

const char *ntp_adamw_option(size_t i, const char **help) {
  if (i >= N_FIELDS) return NULL;
  if (help) *help = fields[i].help;
  return fields[i].name;
}
