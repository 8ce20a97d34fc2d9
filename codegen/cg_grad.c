/* cg_grad.c — the backward ops that undo a forward op's data movement: sum_to (a broadcast's
 * transpose: the elements that broadcast from one, summed), pad (a slice's) and scatter_add (a
 * gather's: an embedding table's gradient). Each output element has one owning thread that sums
 * in a fixed order (no atomics): the same bits on every run. The other backward ops are written
 * by the families of their forward (cg_rows.c, cg_attention_grad.c, cg_loss.c; act_grad fuses
 * into elementwise chains, cg_pointwise.c). */
#include "cg_families.h"

#include <stdio.h>

void cg_write_sum_to(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t x = st->op.args[0], y = st->op.result;
  ntp_shape xs = cg_tshape(g, x), ys = cg_tshape(g, y);
  int64_t ny = shape_numel(&ys), nx = shape_numel(&xs), R = ny ? nx / ny : 0;
  int64_t xstride[NTP_MAX_RANK], st1 = 1;
  bool kept[NTP_MAX_RANK];
  for (int d = xs.ndim - 1; d >= 0; d--) {
    int yd = d - (xs.ndim - ys.ndim);
    kept[d] = yd >= 0 && ys.dim[yd] == xs.dim[d] && xs.dim[d] != 1;
    xstride[d] = st1;
    st1 *= xs.dim[d];
  }
  cg_kernel_flat(g, s, ny, "i");
  cg_decl(g, x);
  cg_decl(g, y);
  /* the output element's coordinates, on the dims it keeps: the base of its sum in x */
  cg_out(g->m, "  i64 base = 0, rest = i;\n");
  for (int d = xs.ndim - 1; d >= 0; d--)
    if (kept[d])
      cg_out(g->m, "  base += (rest %% %lldll) * %lldll; rest /= %lldll;\n", (long long)xs.dim[d], (long long)xstride[d],
             (long long)xs.dim[d]);
  cg_out(g->m, "  float acc = 0.0f;\n  for (i64 r = 0; r < %lldll; r++) {\n    i64 off = base, rr = r;\n", (long long)R);
  for (int d = xs.ndim - 1; d >= 0; d--)
    if (!kept[d] && xs.dim[d] != 1)
      cg_out(g->m, "    off += (rr %% %lldll) * %lldll; rr /= %lldll;\n", (long long)xs.dim[d], (long long)xstride[d],
             (long long)xs.dim[d]);
  cg_out(g->m, "    acc += ");
  cg_load(g, x, "off");
  cg_out(g->m, ";\n  }\n");
  cg_store(g, y, "i", "acc");
  cg_out(g->m, "}\n");
}

void cg_write_pad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t x = st->op.args[0], y = st->op.result;
  ntp_shape ys = cg_tshape(g, y);
  int ax = st->op.attr.slice.axis;
  int64_t N = shape_numel(&ys), inner = 1, len = st->op.attr.slice.len, start = st->op.attr.slice.start;
  for (int d = ax + 1; d < ys.ndim; d++) inner *= ys.dim[d];
  cg_kernel_flat(g, s, N, "i");
  cg_decl(g, x);
  cg_decl(g, y);
  cg_out(g->m, "  i64 o = i / %lldll, a = (i / %lldll) %% %lldll - %lldll, in = i %% %lldll;\n",
         (long long)(inner * ys.dim[ax]), (long long)inner, (long long)ys.dim[ax], (long long)start, (long long)inner);
  cg_out(g->m, "  T%d[i] = a >= 0 && a < %lldll ? T%d[(o * %lldll + a) * %lldll + in] : 0;\n}\n", y, (long long)len, x,
         (long long)len, (long long)inner);
}

void cg_write_scatter_add(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t idx = st->op.args[0], dy = st->op.args[1], y = st->op.result;
  ntp_shape ys = cg_tshape(g, y), is = cg_tshape(g, idx);
  int64_t rows = ys.dim[0], D = ys.dim[1], n_idx = shape_numel(&is);
  int64_t lo = st->op.attr.gather.hi ? st->op.attr.gather.lo : 0;
  cg_kernel_head(g, s, rows, ROW_BLOCK, 0);
  cg_decl(g, idx);
  cg_decl(g, dy);
  cg_decl(g, y);
  cg_out(g->m, "  i64 row = blockIdx.x, tok = row + %lldll; /* the table row this block owns */\n", (long long)lo);
  cg_out(g->m, "  for (i64 e = threadIdx.x; e < %lldll; e += blockDim.x) {\n    float acc = 0.0f;\n", (long long)D);
  cg_out(g->m, "    for (i64 n = 0; n < %lldll; n++)\n      if ((i64)T%d[n] == tok) acc += ", (long long)n_idx, idx);
  char at[64];
  snprintf(at, sizeof at, "n * %lldll + e", (long long)D);
  cg_load(g, dy, at);
  cg_out(g->m, ";\n  ");
  snprintf(at, sizeof at, "row * %lldll + e", (long long)D);
  cg_store(g, y, at, "acc");
  cg_out(g->m, "  }\n}\n");
}
