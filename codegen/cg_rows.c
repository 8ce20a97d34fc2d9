/* cg_rows.c — the kernels of a block per row of the last dim: layernorm, rmsnorm and softmax
 * (with the elementwise tail fused after them: a norm's gain and bias), and their gradients.
 * A row's sums are block reductions (block_sum, block_max of the prelude) in a fixed tree, so a
 * row gives the same bits on every run. */
#include "cg_families.h"
#include "cg_fuse.h"

#include <stdio.h>

/* ---- forward --------------------------------------------------------------------------------- */

/* The row's statistics first, then each element normalised (or exponentiated) and the tail
 * applied in registers: only the chain's last result is stored. */
void cg_write_row(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t x = st->op.args[0], y = st->op.result;
  ntp_shape ys = cg_tshape(g, y);
  int64_t D = ys.dim[ys.ndim - 1], rows = shape_numel(&ys) / D;
  int32_t chain[16];
  int n = cg_collect_chain(g, s, chain, 16); /* the norm and its tail: norm * g + b */
  int32_t last = g->p->steps[chain[n - 1]].op.result;
  char fb[48];
  cg_kernel_head(g, s, rows, ROW_BLOCK, 0);
  cg_out(g->m, "  __shared__ float sh[32];\n  i64 row = blockIdx.x;\n");
  cg_decl(g, x);
  if (n > 1) cg_declare_chain(g, chain + 1, n - 1, y);
  else cg_decl(g, y);
  cg_out(g->m, "  const i64 D = %lldll, base = row * D;\n", (long long)D);
  char xi[64];
  snprintf(xi, sizeof xi, "base + j");
  if (st->op.code == IR_SOFTMAX) {
    cg_out(g->m, "  float mx = -__int_as_float(0x7f800000);\n  for (i64 j = threadIdx.x; j < D; j += blockDim.x) mx = fmaxf(mx, ");
    cg_load(g, x, xi);
    cg_out(g->m, ");\n  mx = block_max(mx, sh);\n  float sum = 0.0f;\n  for (i64 j = threadIdx.x; j < D; j += blockDim.x) sum += expf(");
    cg_load(g, x, xi);
    cg_out(g->m, " - mx);\n  sum = block_sum(sum, sh);\n  float inv = mx == -__int_as_float(0x7f800000) ? 0.0f : 1.0f / sum;\n");
  } else if (st->op.code == IR_LAYERNORM) {
    cg_out(g->m, "  float sum = 0.0f;\n  for (i64 j = threadIdx.x; j < D; j += blockDim.x) sum += ");
    cg_load(g, x, xi);
    cg_out(g->m, ";\n  float mean = block_sum(sum, sh) / (float)D;\n  float var = 0.0f;\n"
              "  for (i64 j = threadIdx.x; j < D; j += blockDim.x) { float d_ = ");
    cg_load(g, x, xi);
    cg_out(g->m, " - mean; var += d_ * d_; }\n  var = block_sum(var, sh) / (float)D;\n"
              "  float inv = 1.0f / sqrtf(var + %s);\n",
        cg_flit(st->op.attr.norm.eps, fb, sizeof fb));
  } else {
    cg_out(g->m, "  float ss = 0.0f;\n  for (i64 j = threadIdx.x; j < D; j += blockDim.x) { float v_ = ");
    cg_load(g, x, xi);
    cg_out(g->m, "; ss += v_ * v_; }\n  float inv = 1.0f / sqrtf(block_sum(ss, sh) / (float)D + %s);\n",
        cg_flit(st->op.attr.norm.eps, fb, sizeof fb));
  }
  cg_out(g->m, "  for (i64 j = threadIdx.x; j < D; j += blockDim.x) {\n    i64 i = base + j;\n");
  if (n > 1) cg_coords(g, ys, cg_coord_mask(g, chain + 1, n - 1, ys, y));
  cg_out(g->m, "    float v%d = rt_%s(", y, cg_dsuffix(g->p->tensors[y].dtype));
  if (st->op.code == IR_SOFTMAX) {
    cg_out(g->m, "expf(");
    cg_load(g, x, "i");
    cg_out(g->m, " - mx) * inv");
  } else if (st->op.code == IR_LAYERNORM) {
    cg_out(g->m, "(");
    cg_load(g, x, "i");
    cg_out(g->m, " - mean) * inv");
  } else {
    cg_load(g, x, "i");
    cg_out(g->m, " * inv");
  }
  cg_out(g->m, ");\n");
  if (n > 1) cg_ew_body(g, chain + 1, n - 1, ys, y);
  char v[32];
  snprintf(v, sizeof v, "v%d", last);
  cg_store(g, last, "i", v);
  cg_out(g->m, "  }\n}\n");
}

/* ---- backward -------------------------------------------------------------------------------- */

/* "float xv = x[base + j], gv = dy[base + j];" */
static void row_loads(gen *g, int32_t x, int32_t dy) {
  cg_out(g->m, "float xv = ");
  cg_load(g, x, "base + j");
  cg_out(g->m, ", gv = ");
  cg_load(g, dy, "base + j");
  cg_out(g->m, ";");
}

void cg_write_row_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t x = st->op.args[0], dy = st->op.args[1], y = st->op.result; /* x: the forward's result for softmax */
  ntp_shape ys = cg_tshape(g, y);
  long long D = ys.dim[ys.ndim - 1], rows = cg_rows_of(ys);
  char fb[48];
  cg_kernel_head(g, s, rows, ROW_BLOCK, 0);
  cg_decl(g, x);
  cg_decl(g, dy);
  cg_decl(g, y);
  cg_out(g->m, "  __shared__ float sh[32];\n  i64 row = blockIdx.x;\n  const i64 D = %lldll, base = row * D;\n", D);
  const char *xj = "base + j";
  if (st->op.code == IR_SOFTMAX_GRAD) {
    cg_out(g->m, "  float s = 0.0f;\n  for (i64 j = threadIdx.x; j < D; j += blockDim.x) { ");
    row_loads(g, x, dy);
    cg_out(g->m, " s += xv * gv; }\n  s = block_sum(s, sh);\n  for (i64 j = threadIdx.x; j < D; j += blockDim.x) {\n    ");
    row_loads(g, x, dy);
    cg_out(g->m, "\n  ");
    cg_store(g, y, "base + j", "xv * (gv - s)");
  } else if (st->op.code == IR_LAYERNORM_GRAD) {
    cg_out(g->m, "  float sum = 0.0f;\n  for (i64 j = threadIdx.x; j < D; j += blockDim.x) sum += ");
    cg_load(g, x, xj);
    cg_out(g->m, ";\n  float mean = block_sum(sum, sh) / (float)D, var = 0.0f;\n"
                 "  for (i64 j = threadIdx.x; j < D; j += blockDim.x) { float d_ = ");
    cg_load(g, x, xj);
    cg_out(g->m, " - mean; var += d_ * d_; }\n  var = block_sum(var, sh) / (float)D;\n"
                 "  float inv = 1.0f / sqrtf(var + %s), mg = 0.0f, mgx = 0.0f;\n",
           cg_flit(st->op.attr.norm.eps, fb, sizeof fb));
    cg_out(g->m, "  for (i64 j = threadIdx.x; j < D; j += blockDim.x) { ");
    row_loads(g, x, dy);
    cg_out(g->m, " mg += gv; mgx += gv * (xv - mean) * inv; }\n"
                 "  mg = block_sum(mg, sh) / (float)D;\n  mgx = block_sum(mgx, sh) / (float)D;\n"
                 "  for (i64 j = threadIdx.x; j < D; j += blockDim.x) {\n    ");
    row_loads(g, x, dy);
    cg_out(g->m, "\n  ");
    cg_store(g, y, "base + j", "inv * (gv - mg - (xv - mean) * inv * mgx)");
  } else {
    cg_out(g->m, "  float ms = 0.0f, gx = 0.0f;\n  for (i64 j = threadIdx.x; j < D; j += blockDim.x) { ");
    row_loads(g, x, dy);
    cg_out(g->m, " ms += xv * xv; gx += gv * xv; }\n  ms = block_sum(ms, sh);\n  gx = block_sum(gx, sh);\n"
                 "  float inv = 1.0f / sqrtf(ms / (float)D + %s);\n"
                 "  for (i64 j = threadIdx.x; j < D; j += blockDim.x) {\n    ",
           cg_flit(st->op.attr.norm.eps, fb, sizeof fb));
    row_loads(g, x, dy);
    cg_out(g->m, "\n  ");
    cg_store(g, y, "base + j", "inv * gv - inv * inv * inv * xv * gx / (float)D");
  }
  cg_out(g->m, "  }\n}\n");
}
