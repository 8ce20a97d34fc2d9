/* geometry.c — the placement geometry (geometry.h), shared by the sharder and the planner. */
#include <stdlib.h>

#include "geometry.h"

ntp_box geom_group_piece(ntp_shape s, int64_t b0, int64_t b1, bool whole, int t, int i, bool seq, bool cols) {
  ntp_box b = box_full(&s);
  if (s.ndim < 2 || whole) return b; /* no batch dim (dim 0 of a vector is its features): whole */
  b.lo[0] = b0 < s.dim[0] ? b0 : s.dim[0];
  b.hi[0] = b1 < s.dim[0] ? b1 : s.dim[0];
  if (seq && t > 1) split_range(s.dim[1], t, i, &b.lo[1], &b.hi[1]);
  if (cols && t > 1) split_range(s.dim[s.ndim - 1], t, i, &b.lo[s.ndim - 1], &b.hi[s.ndim - 1]);
  return b;
}

int32_t geom_followed_operand(const ir_module *m, const ir_op *op) {
  if (op->code == IR_MATMUL) return op->args[0];
  const ntp_shape rs = m->values[op->result].shape;
  int32_t a = -1;
  for (int i = 0; i < op->nargs; i++) {
    int32_t v = op->args[i];
    if (m->ops[m->values[v].def].code != IR_CONST && shape_eq(&m->values[v].shape, &rs) && v > a) a = v;
  }
  return a;
}

bool geom_whole_rows(ir_opcode code) {
  return code == IR_MATMUL || code == IR_LAYERNORM || code == IR_RMSNORM || code == IR_SOFTMAX;
}

ntp_box geom_result_piece(ir_opcode code, ntp_box followed, ntp_shape result) {
  ntp_box res = followed;
  if (geom_whole_rows(code) && result.ndim > 0) {
    res.lo[result.ndim - 1] = 0;
    res.hi[result.ndim - 1] = result.dim[result.ndim - 1];
  }
  return res;
}

ntp_box geom_operand_need(ir_opcode code, int j, ntp_box res, ntp_shape os) {
  if (code != IR_MATMUL) return box_project(res, os);
  if (j == 0) { /* the left operand: the piece's rows, every contracted column */
    ntp_box b = res;
    b.lo[os.ndim - 1] = 0;
    b.hi[os.ndim - 1] = os.dim[os.ndim - 1];
    return b;
  }
  ntp_box b = box_full(&os); /* the right operand whole, but for the batch dims of a batched one */
  for (int d = 0; d + 2 < os.ndim && d < res.ndim; d++) {
    b.lo[d] = res.lo[d];
    b.hi[d] = res.hi[d];
  }
  return b;
}

bool geom_serve(const rank_box *srcs, int nsrc, int32_t rank, const ntp_box *need, geom_serve_fn serve, void *ctx) {
  if (box_volume(need) == 0) return true;
  int *hit = malloc((size_t)(nsrc + 1) * sizeof *hit);
  ntp_box *hb = malloc((size_t)(nsrc + 1) * sizeof *hb);
  bool ok = hit && hb;
  int nh = 0;
  for (int k = 0; ok && k < nsrc; k++) {
    ntp_box x;
    if (!box_intersect(&srcs[k].box, need, &x)) continue;
    hb[nh] = srcs[k].box;
    hit[nh++] = k;
  }
  box_grid grid;
  if (ok && !box_grid_init(&grid, need, hb, (size_t)nh)) ok = false;
  ntp_box cell;
  while (ok && box_grid_next(&grid, &cell)) {
    int best = -1, bestd = 0;
    for (int h = 0; h < nh; h++) {
      const rank_box *sp = &srcs[hit[h]];
      if (!box_contains(&sp->box, &cell)) continue;
      int d = abs(sp->rank - rank);
      if (best < 0 || d < bestd) {
        best = hit[h];
        bestd = d;
      }
    }
    serve(ctx, best, &cell);
  }
  if (ok) box_grid_free(&grid);
  free(hit);
  free(hb);
  return ok;
}
