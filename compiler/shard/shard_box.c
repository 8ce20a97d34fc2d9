/* shard_box.c — boxes (hyper-rectangles of global indices) and balanced uneven splits. */
#include <stdio.h>
#include <stdlib.h>

#include "shard.h"

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

void split_range(int64_t n, int64_t parts, int64_t i, int64_t *lo, int64_t *hi) {
  /* the first n % parts parts get one more */
  int64_t q = n / parts, r = n % parts;
  *lo = i * q + (i < r ? i : r);
  *hi = *lo + q + (i < r ? 1 : 0);
}

void split_units(int64_t n, int64_t unit, int64_t parts, int64_t i, int64_t *lo, int64_t *hi) {
  int64_t units = (n + unit - 1) / unit, ulo, uhi;
  split_range(units, parts, i, &ulo, &uhi);
  *lo = ulo * unit < n ? ulo * unit : n;
  *hi = uhi * unit < n ? uhi * unit : n;
}

ntp_box box_project(ntp_box rb, ntp_shape os) {
  ntp_box b = {.ndim = os.ndim};
  for (int i = 0; i < os.ndim; i++) {
    int r = rb.ndim - os.ndim + i;
    if (os.dim[i] == 1 || r < 0) { /* broadcast along this dim: the operand's whole (size-1) dim */
      b.lo[i] = 0;
      b.hi[i] = os.dim[i];
    } else {
      b.lo[i] = rb.lo[r];
      b.hi[i] = rb.hi[r];
    }
  }
  return b;
}

int box_default_split(ntp_shape s, int32_t W, rank_box *out) {
  int n = 0;
  if (s.ndim == 0) {
    out[n++] = (rank_box){0, box_full(&s)};
    return n;
  }
  for (int32_t r = 0; r < W; r++) {
    ntp_box b = box_full(&s);
    split_range(s.dim[0], W, r, &b.lo[0], &b.hi[0]);
    if (b.hi[0] > b.lo[0]) out[n++] = (rank_box){r, b};
  }
  return n;
}

bool box_grid_init(box_grid *g, const ntp_box *need, const ntp_box *srcs, size_t n) {
  *g = (box_grid){.nd = need->ndim};
  size_t per = 2 * n + 2;
  g->mem = malloc((size_t)(need->ndim ? need->ndim : 1) * per * sizeof *g->mem);
  if (!g->mem) return false;
  for (int d = 0; d < g->nd; d++) {
    int64_t *cut = g->cut[d] = g->mem + (size_t)d * per;
    int c = 0;
    cut[c++] = need->lo[d];
    cut[c++] = need->hi[d];
    for (size_t i = 0; i < n; i++) {
      if (srcs[i].lo[d] > need->lo[d] && srcs[i].lo[d] < need->hi[d]) cut[c++] = srcs[i].lo[d];
      if (srcs[i].hi[d] > need->lo[d] && srcs[i].hi[d] < need->hi[d]) cut[c++] = srcs[i].hi[d];
    }
    for (int i = 1; i < c; i++) /* insertion sort: a few entries */
      for (int j = i; j > 0 && cut[j - 1] > cut[j]; j--) {
        int64_t x = cut[j];
        cut[j] = cut[j - 1];
        cut[j - 1] = x;
      }
    int u = 0;
    for (int i = 0; i < c; i++)
      if (u == 0 || cut[i] != cut[u - 1]) cut[u++] = cut[i];
    g->ncut[d] = u;
    if (u < 2) g->done = true; /* an empty need has no cells */
  }
  return true;
}

bool box_grid_next(box_grid *g, ntp_box *cell) {
  if (g->done) return false;
  if (g->started) {
    int d = g->nd - 1;
    while (d >= 0 && ++g->idx[d] >= g->ncut[d] - 1) g->idx[d--] = 0;
    if (d < 0) {
      g->done = true;
      return false;
    }
  }
  g->started = true;
  cell->ndim = g->nd;
  for (int d = 0; d < g->nd; d++) {
    cell->lo[d] = g->cut[d][g->idx[d]];
    cell->hi[d] = g->cut[d][g->idx[d] + 1];
  }
  return true;
}

void box_grid_free(box_grid *g) {
  free(g->mem);
  g->mem = NULL;
}
