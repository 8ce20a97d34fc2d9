/* shard_box.c — the compiler's box rules: balanced uneven splits, broadcast projection, default
 * placements, slice-intersection grids (the box basics are runtime/core/box.c). */
#include <stdio.h>
#include <stdlib.h>

#include "shard.h"

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
