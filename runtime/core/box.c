/* box.c — boxes (hyper-rectangles of global indices): volume, intersection, shapes. */
#include <stdio.h>

#include "ntp_types.h"

int64_t box_volume(const ntp_box *b) {
  int64_t v = 1;
  for (int i = 0; i < b->ndim; i++) v *= b->hi[i] > b->lo[i] ? b->hi[i] - b->lo[i] : 0;
  return v;
}

bool box_eq(const ntp_box *a, const ntp_box *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->lo[i] != b->lo[i] || a->hi[i] != b->hi[i]) return false;
  return true;
}

bool box_contains(const ntp_box *o, const ntp_box *in) {
  if (o->ndim != in->ndim) return false;
  for (int i = 0; i < o->ndim; i++)
    if (in->lo[i] < o->lo[i] || in->hi[i] > o->hi[i]) return false;
  return true;
}

bool box_intersect(const ntp_box *a, const ntp_box *b, ntp_box *out) {
  if (a->ndim != b->ndim) return false;
  out->ndim = a->ndim;
  for (int i = 0; i < a->ndim; i++) {
    out->lo[i] = a->lo[i] > b->lo[i] ? a->lo[i] : b->lo[i];
    out->hi[i] = a->hi[i] < b->hi[i] ? a->hi[i] : b->hi[i];
    if (out->lo[i] >= out->hi[i]) return false;
  }
  return true;
}

ntp_box box_full(const ntp_shape *s) {
  ntp_box b = {.ndim = s->ndim};
  for (int i = 0; i < s->ndim; i++) b.hi[i] = s->dim[i];
  return b;
}

ntp_shape box_shape(const ntp_box *b) {
  ntp_shape s = {.ndim = b->ndim};
  for (int i = 0; i < b->ndim; i++) s.dim[i] = b->hi[i] - b->lo[i];
  return s;
}

const char *box_str(const ntp_box *b, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < b->ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld:%lld", i ? ", " : "", (long long)b->lo[i], (long long)b->hi[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}
