/* cg_loss.c — the kernels of the loss and its gradient (the same arithmetic as the CPU
 * reference's runtime/cpu/cpu_grad.c, in fp32, the result rounded to its storage dtype once):
 *  - cross_entropy: one block over all rows (a warp per row), the mean made by thread 0;
 *  - cross_entropy_grad: a block per row;
 *  - the vocabulary-parallel loss (compiler/shard/shard_loss.c), where the logits' vocabulary is
 *    split over ranks: per row the rank's slice's statistics (ce_stats), per row block the
 *    combined loss (ce_rows), their mean (ce_mean), and the three gradients in reverse.
 * Deterministic everywhere: no atomics, every sum with one owner and a fixed order. */
#include "cg_families.h"

#include <stdio.h>

/* ---- the loss ---------------------------------------------------------------------------- */

/* mean over the rows whose target is not `ignore` of log(sum exp(l)) - l[target]; a target
 * outside [0, V) makes the loss NaN (the CPU reference stops with the element's index). */
void cg_write_cross_entropy(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t lg = st->op.args[0], tg = st->op.args[1], y = st->op.result;
  ntp_shape ls = cg_tshape(g, lg);
  long long V = ls.dim[ls.ndim - 1], rows = cg_rows_of(ls), ign = st->op.attr.ce.ignore;
  cg_kernel_head(g, s, 1, ROW_BLOCK, 0);
  cg_decl(g, lg);
  cg_decl(g, tg);
  cg_decl(g, y);
  cg_out(g->m, "  __shared__ float ssum[%d];\n  __shared__ int scnt[%d], sbad[%d];\n", ROW_BLOCK / 32, ROW_BLOCK / 32,
         ROW_BLOCK / 32);
  cg_out(g->m, "  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, cnt = 0, bad = 0;\n  float sum = 0.0f;\n");
  cg_out(g->m, "  for (i64 r = w; r < %lldll; r += %d) {\n    i64 t = T%d[r];\n    if (t == %lldll) continue;\n", rows,
         ROW_BLOCK / 32, tg, ign);
  cg_out(g->m, "    if (t < 0 || t >= %lldll) { bad = 1; continue; }\n    const i64 base = r * %lldll;\n", V, V);
  cg_out(g->m, "    float mx = %s;\n    for (i64 j = lane; j < %lldll; j += 32) mx = fmaxf(mx, ", CG_NEG_INF, V);
  cg_load(g, lg, "base + j");
  cg_out(g->m, ");\n    mx = warp_max(mx);\n    float se = 0.0f;\n    for (i64 j = lane; j < %lldll; j += 32) se += expf(", V);
  cg_load(g, lg, "base + j");
  cg_out(g->m, " - mx);\n    se = warp_sum(se);\n    if (lane == 0) { sum += logf(se) + mx - ");
  cg_load(g, lg, "base + t");
  cg_out(g->m, "; cnt++; }\n  }\n");
  cg_out(g->m, "  if (lane == 0) { ssum[w] = sum; scnt[w] = cnt; sbad[w] = bad; }\n  __syncthreads();\n");
  cg_out(g->m, "  if (threadIdx.x == 0) {\n    float tot = 0.0f; int n = 0, b = 0;\n");
  cg_out(g->m, "    for (int k = 0; k < %d; k++) { tot += ssum[k]; n += scnt[k]; b |= sbad[k]; }\n", ROW_BLOCK / 32);
  cg_out(g->m, "    float loss = b ? __int_as_float(0x7fc00000) : n ? tot / (float)n : 0.0f;\n  ");
  cg_store(g, y, "0", "loss");
  cg_out(g->m, "  }\n}\n");
}

/* A block's row of V logits at base: "mx", its maximum, and with sumexp "se", the sum of
 * exp(l - mx) (a kernel with `sh`, `V` and `base` declared). */
static void row_max_sumexp(gen *g, int32_t lg, bool sumexp) {
  cg_out(g->m, "  float mx = %s;\n  for (i64 j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, ", CG_NEG_INF);
  cg_load(g, lg, "base + j");
  cg_out(g->m, ");\n  mx = block_max(mx, sh);\n");
  if (!sumexp) return;
  cg_out(g->m, "  float se = 0.0f;\n  for (i64 j = threadIdx.x; j < V; j += blockDim.x) se += expf(");
  cg_load(g, lg, "base + j");
  cg_out(g->m, " - mx);\n  se = block_sum(se, sh);\n");
}

/* (softmax(l) - onehot(target)) * dloss / n for each row, n the rows counted by the loss */
void cg_write_cross_entropy_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t lg = st->op.args[0], tg = st->op.args[1], dl = st->op.args[2], y = st->op.result;
  ntp_shape ls = cg_tshape(g, lg);
  long long V = ls.dim[ls.ndim - 1], rows = cg_rows_of(ls), ign = st->op.attr.ce.ignore;
  cg_kernel_head(g, s, rows, ROW_BLOCK, 0);
  cg_decl(g, lg);
  cg_decl(g, tg);
  cg_decl(g, dl);
  cg_decl(g, y);
  cg_out(g->m, "  __shared__ float sh[32];\n  i64 row = blockIdx.x;\n  const i64 V = %lldll, base = row * V;\n", V);
  cg_out(g->m, "  float cnt = 0.0f;\n  for (i64 r = threadIdx.x; r < %lldll; r += blockDim.x) { i64 u = T%d[r]; "
               "cnt += u != %lldll && u >= 0 && u < V ? 1.0f : 0.0f; }\n  cnt = block_sum(cnt, sh);\n",
         rows, tg, ign);
  cg_out(g->m, "  i64 t = T%d[row];\n  if (t == %lldll || t < 0 || t >= V) {\n", tg, ign);
  cg_out(g->m, "    for (i64 j = threadIdx.x; j < V; j += blockDim.x) T%d[base + j] = 0;\n    return;\n  }\n", y);
  cg_out(g->m, "  float scale = ");
  cg_load(g, dl, "0");
  cg_out(g->m, " / cnt;\n");
  row_max_sumexp(g, lg, true);
  cg_out(g->m, "  for (i64 j = threadIdx.x; j < V; j += blockDim.x) {\n    float p = expf(");
  cg_load(g, lg, "base + j");
  cg_out(g->m, " - mx) / se;\n  ");
  cg_store(g, y, "base + j", "(p - (j == t ? 1.0f : 0.0f)) * scale");
  cg_out(g->m, "  }\n}\n");
}

/* ---- the vocabulary-parallel loss (compiler/shard/shard_loss.c) ---------------------------- */

/* A block per row of the rank's slice of the vocabulary: max, sum of exponentials, the target's
 * logit where this slice holds it. */
void cg_write_ce_stats(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t lg = st->op.args[0], tg = st->op.args[1], y = st->op.result;
  ntp_shape ls = cg_tshape(g, lg);
  long long V = ls.dim[ls.ndim - 1], rows = cg_rows_of(ls), lo = st->op.attr.ce.lo, ign = st->op.attr.ce.ignore;
  cg_kernel_head(g, s, rows, ROW_BLOCK, 0);
  cg_decl(g, lg);
  cg_decl(g, tg);
  cg_decl(g, y);
  cg_out(g->m, "  __shared__ float sh[32];\n  i64 row = blockIdx.x;\n  const i64 V = %lldll, base = row * V;\n", V);
  row_max_sumexp(g, lg, true);
  cg_out(g->m, "  if (threadIdx.x == 0) {\n");
  cg_out(g->m, "    i64 t = T%d[row];\n    bool h = t != %lldll && t >= %lldll && t < %lldll + V;\n", tg, ign, lo, lo);
  cg_out(g->m, "    T%d[4 * row] = mx;\n    T%d[4 * row + 1] = se;\n    T%d[4 * row + 2] = h ? ", y, y, y);
  char at[64];
  snprintf(at, sizeof at, "base + t - %lldll", lo);
  cg_load(g, lg, at);
  cg_out(g->m, " : 0.0f;\n    T%d[4 * row + 3] = h ? 1.0f : 0.0f;\n  }\n}\n", y);
}

/* "mx, s: the row's max and sum of exponentials over its t ranks' stats at G" */
static void ce_row_lse(gen *g, int32_t G, long long t) {
  cg_out(g->m, "    float mx = %s, s = 0.0f;\n    for (int k = 0; k < %lld; k++) mx = fmaxf(mx, T%d[gb + 4 * k]);\n", CG_NEG_INF,
         t, G);
  cg_out(g->m, "    for (int k = 0; k < %lld; k++) s += T%d[gb + 4 * k + 1] * expf(T%d[gb + 4 * k] - mx);\n", t, G, G);
}

/* One block over the row block's rows: the sum of logsumexp - target logit and the count. */
void cg_write_ce_rows(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t G = st->op.args[0], tg = st->op.args[1], y = st->op.result;
  ntp_shape gs = cg_tshape(g, G);
  long long rows = gs.dim[0], t = gs.dim[1] / 4, ign = st->op.attr.ce.ignore;
  cg_kernel_head(g, s, 1, ROW_BLOCK, 0);
  cg_decl(g, G);
  cg_decl(g, tg);
  cg_decl(g, y);
  cg_out(g->m, "  __shared__ float sh[32];\n  float sum = 0.0f, cnt = 0.0f, bad = 0.0f;\n");
  cg_out(g->m, "  for (i64 r = threadIdx.x; r < %lldll; r += blockDim.x) {\n    if (T%d[r] == %lldll) continue;\n"
               "    i64 gb = r * %lld;\n",
         rows, tg, ign, 4 * t);
  ce_row_lse(g, G, t);
  cg_out(g->m, "    float tl = 0.0f, h = 0.0f;\n    for (int k = 0; k < %lld; k++) { tl += T%d[gb + 4 * k + 2]; h += T%d[gb + 4 * k + 3]; }\n",
         t, G, G);
  cg_out(g->m, "    if (h != 1.0f) bad = 1.0f;\n    sum += mx + logf(s) - tl;\n    cnt += 1.0f;\n  }\n");
  cg_out(g->m, "  sum = block_sum(sum, sh);\n  cnt = block_sum(cnt, sh);\n  bad = block_max(bad, sh);\n");
  cg_out(g->m, "  if (threadIdx.x == 0) { T%d[0] = bad > 0.0f ? __int_as_float(0x7fc00000) : sum; T%d[1] = cnt; }\n}\n", y, y);
}

void cg_write_ce_mean(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t P = st->op.args[0], y = st->op.result;
  long long nb = cg_tshape(g, P).dim[0];
  cg_kernel_head(g, s, 1, 32, 0);
  cg_decl(g, P);
  cg_decl(g, y);
  cg_out(g->m, "  if (threadIdx.x != 0) return;\n  float sum = 0.0f, n = 0.0f;\n");
  cg_out(g->m, "  for (int j = 0; j < %lld; j++) { sum += T%d[2 * j]; n += T%d[2 * j + 1]; }\n", nb, P, P);
  cg_out(g->m, "  T%d[0] = n > 0.0f ? sum / n : 0.0f;\n}\n", y);
}

/* A block per row: the gradient of the row's sum of exponentials and of its target logit. */
void cg_write_ce_stats_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t lg = st->op.args[0], tg = st->op.args[1], ds = st->op.args[2], y = st->op.result;
  ntp_shape ls = cg_tshape(g, lg);
  long long V = ls.dim[ls.ndim - 1], rows = cg_rows_of(ls), lo = st->op.attr.ce.lo, ign = st->op.attr.ce.ignore;
  cg_kernel_head(g, s, rows, ROW_BLOCK, 0);
  cg_decl(g, lg);
  cg_decl(g, tg);
  cg_decl(g, ds);
  cg_decl(g, y);
  cg_out(g->m, "  __shared__ float sh[32];\n  i64 row = blockIdx.x;\n  const i64 V = %lldll, base = row * V;\n", V);
  row_max_sumexp(g, lg, false);
  cg_out(g->m, "  float dsum = T%d[4 * row + 1], dtl = T%d[4 * row + 2];\n", ds, ds);
  cg_out(g->m, "  i64 t = T%d[row];\n  i64 at = t != %lldll && t >= %lldll && t < %lldll + V ? t - %lldll : -1;\n", tg,
         ign, lo, lo, lo);
  cg_out(g->m, "  for (i64 j = threadIdx.x; j < V; j += blockDim.x) {\n    float d = dsum * expf(");
  cg_load(g, lg, "base + j");
  cg_out(g->m, " - mx) + (j == at ? dtl : 0.0f);\n  ");
  cg_store(g, y, "base + j", "d");
  cg_out(g->m, "  }\n}\n");
}

void cg_write_ce_rows_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t G = st->op.args[0], tg = st->op.args[1], dp = st->op.args[2], y = st->op.result;
  ntp_shape gs = cg_tshape(g, G);
  long long rows = gs.dim[0], t = gs.dim[1] / 4, ign = st->op.attr.ce.ignore;
  cg_kernel_flat(g, s, rows, "r");
  cg_decl(g, G);
  cg_decl(g, tg);
  cg_decl(g, dp);
  cg_decl(g, y);
  cg_out(g->m, "  i64 gb = r * %lld;\n  for (int k = 0; k < %lld; k++) T%d[gb + k] = 0.0f;\n  if (T%d[r] == %lldll) return;\n",
         4 * t, 4 * t, y, tg, ign);
  cg_out(g->m, "  {\n");
  ce_row_lse(g, G, t);
  cg_out(g->m, "    float g0 = T%d[0];\n    for (int k = 0; k < %lld; k++) {\n", dp, t);
  cg_out(g->m, "      T%d[gb + 4 * k + 1] = g0 * expf(T%d[gb + 4 * k] - mx) / s;\n      T%d[gb + 4 * k + 2] = -g0;\n    }\n  }\n}\n",
         y, G, y);
}

void cg_write_ce_count(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t tg = st->op.args[0], y = st->op.result;
  ntp_shape ts = cg_tshape(g, tg);
  long long rows = 1, ign = st->op.attr.ce.ignore;
  for (int d = 0; d < ts.ndim; d++) rows *= ts.dim[d];
  cg_kernel_head(g, s, 1, 32, 0);
  cg_decl(g, tg);
  cg_decl(g, y);
  cg_out(g->m, "  if (threadIdx.x != 0) return;\n  float n = 0.0f;\n");
  cg_out(g->m, "  for (i64 r = 0; r < %lldll; r++) n += T%d[r] != %lldll ? 1.0f : 0.0f;\n", rows, tg, ign);
  cg_out(g->m, "  T%d[0] = 0.0f;\n  T%d[1] = n;\n}\n", y, y);
}

/* As ce_mean_grad's kernel with a gradient of 1 (the same float). */
void cg_write_ce_seed(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t C = st->op.args[0], y = st->op.result;
  long long nc = cg_tshape(g, C).dim[0];
  cg_kernel_head(g, s, 1, 32, 0);
  cg_decl(g, C);
  cg_decl(g, y);
  cg_out(g->m, "  if (threadIdx.x != 0) return;\n  float n = 0.0f;\n");
  cg_out(g->m, "  for (int i = 0; i < %lld; i++) n += T%d[2 * i + 1];\n", nc, C);
  cg_out(g->m, "  T%d[0] = n > 0.0f ? 1.0f / n : 0.0f;\n  T%d[1] = 0.0f;\n}\n", y, y);
}

void cg_write_ce_mean_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t P = st->op.args[0], dl = st->op.args[1], y = st->op.result;
  long long nb = cg_tshape(g, P).dim[0];
  cg_kernel_flat(g, s, nb, "j");
  cg_decl(g, P);
  cg_decl(g, dl);
  cg_decl(g, y);
  cg_out(g->m, "  float n = 0.0f;\n  for (int i = 0; i < %lld; i++) n += T%d[2 * i + 1];\n", nb, P);
  cg_out(g->m, "  T%d[2 * j] = n > 0.0f ? T%d[0] / n : 0.0f;\n  T%d[2 * j + 1] = 0.0f;\n}\n", y, dl, y);
}
