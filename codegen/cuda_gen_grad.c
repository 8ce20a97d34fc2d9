/* cuda_gen_grad.c — the kernels of the loss and of the backward ops (compiler/grad/): the
 * same vector-Jacobian products as the CPU reference's runtime/cpu/cpu_grad.c, in fp32 with the
 * result rounded to its storage dtype once, as every kernel of this generator stores.
 *
 * Written for correctness first, deterministic everywhere (no atomics: every sum has one
 * owner and a fixed order, so two runs give the same bits):
 *  - cross_entropy: one block over all rows (a warp per row), the mean made by thread 0;
 *  - cross_entropy_grad, the norms' and softmax's gradients: a block per row;
 *  - sum_to: a thread per output element summing what broadcast it;
 *  - scatter_add (the embedding's gradient): a block per table row, scanning the indices;
 *  - attention_grad: tiled (cuda_gen_attention.c) up to head dim 128; above it here, a warp per
 *    output row recomputing the softmax statistics it needs (the forward's probabilities are not
 *    kept). dq costs two passes over the keys; dk and dv one pass per query row that sees the
 *    key, O(S^2) per warp.
 */
#include <stdio.h>

#include "cuda_gen_internal.h"

const char cg_grad_prelude[] =
    "/* derivatives of the activations, as the CPU reference's act_grad */\n"
    "__device__ __forceinline__ float ntp_d_gelu(float x) {\n"
    "  const float c = 0.7978845608028654f, a = 0.044715f;\n"
    "  float t = tanhf(c * (x + a * x * x * x));\n"
    "  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * a * x * x);\n"
    "}\n"
    "__device__ __forceinline__ float ntp_d_relu(float x) { return x > 0.0f ? 1.0f : 0.0f; }\n"
    "__device__ __forceinline__ float ntp_d_silu(float x) { float s = ntp_sigmoid(x); return s * (1.0f + x * (1.0f - s)); }\n"
    "__device__ __forceinline__ float ntp_d_sigmoid_y(float y) { return y * (1.0f - y); }\n"
    "__device__ __forceinline__ float ntp_d_tanh_y(float y) { return 1.0f - y * y; }\n"
    "__device__ __forceinline__ float ntp_d_exp_y(float y) { return y; }\n"
    "__device__ __forceinline__ float ntp_d_neg(float x) { (void)x; return -1.0f; }\n";

static const char *NEG_INF = "(-__int_as_float(0x7f800000))";

/* ---- sum_to: broadcasting undone ------------------------------------------------------- */

static void gen_sum_to(gen *g, int32_t s) {
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
  cg_kernel_head(g, s, (ny + EW_BLOCK - 1) / EW_BLOCK, EW_BLOCK, 0);
  cg_out(g->m, "  i64 i = (i64)blockIdx.x * %d + threadIdx.x;\n  if (i >= %lldll) return;\n", EW_BLOCK, (long long)ny);
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

/* ---- pad: slice's transpose --------------------------------------------------------------- */

static void gen_pad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t x = st->op.args[0], y = st->op.result;
  ntp_shape ys = cg_tshape(g, y);
  int ax = st->op.attr.slice.axis;
  int64_t N = shape_numel(&ys), inner = 1, len = st->op.attr.slice.len, start = st->op.attr.slice.start;
  for (int d = ax + 1; d < ys.ndim; d++) inner *= ys.dim[d];
  cg_kernel_head(g, s, (N + EW_BLOCK - 1) / EW_BLOCK, EW_BLOCK, 0);
  cg_out(g->m, "  i64 i = (i64)blockIdx.x * %d + threadIdx.x;\n  if (i >= %lldll) return;\n", EW_BLOCK, (long long)N);
  cg_decl(g, x);
  cg_decl(g, y);
  cg_out(g->m, "  i64 o = i / %lldll, a = (i / %lldll) %% %lldll - %lldll, in = i %% %lldll;\n",
         (long long)(inner * ys.dim[ax]), (long long)inner, (long long)ys.dim[ax], (long long)start, (long long)inner);
  cg_out(g->m, "  T%d[i] = a >= 0 && a < %lldll ? T%d[(o * %lldll + a) * %lldll + in] : 0;\n}\n", y, (long long)len, x,
         (long long)len, (long long)inner);
}

/* ---- scatter_add: the gather's transpose (an embedding table's gradient) --------------------- */

static void gen_scatter_add(gen *g, int32_t s) {
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

/* ---- the loss ---------------------------------------------------------------------------- */

static int64_t rows_of(ntp_shape s) { return s.ndim ? shape_numel(&s) / s.dim[s.ndim - 1] : 1; }

/* mean over the rows whose target is not `ignore` of log(sum exp(l)) - l[target]; a target
 * outside [0, V) makes the loss NaN (the CPU reference stops with the element's index). */
static void gen_cross_entropy(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t lg = st->op.args[0], tg = st->op.args[1], y = st->op.result;
  ntp_shape ls = cg_tshape(g, lg);
  long long V = ls.dim[ls.ndim - 1], rows = rows_of(ls), ign = st->op.attr.ce.ignore;
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
  cg_out(g->m, "    float mx = %s;\n    for (i64 j = lane; j < %lldll; j += 32) mx = fmaxf(mx, ", NEG_INF, V);
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
  cg_out(g->m, "  float mx = %s;\n  for (i64 j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, ", NEG_INF);
  cg_load(g, lg, "base + j");
  cg_out(g->m, ");\n  mx = block_max(mx, sh);\n");
  if (!sumexp) return;
  cg_out(g->m, "  float se = 0.0f;\n  for (i64 j = threadIdx.x; j < V; j += blockDim.x) se += expf(");
  cg_load(g, lg, "base + j");
  cg_out(g->m, " - mx);\n  se = block_sum(se, sh);\n");
}

/* (softmax(l) - onehot(target)) * dloss / n for each row, n the rows counted by the loss */
static void gen_cross_entropy_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t lg = st->op.args[0], tg = st->op.args[1], dl = st->op.args[2], y = st->op.result;
  ntp_shape ls = cg_tshape(g, lg);
  long long V = ls.dim[ls.ndim - 1], rows = rows_of(ls), ign = st->op.attr.ce.ignore;
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

/* ---- row gradients: softmax, layernorm, rmsnorm ------------------------------------------------ */

/* "float xv = x[base + j], gv = dy[base + j];" */
static void row_loads(gen *g, int32_t x, int32_t dy) {
  cg_out(g->m, "float xv = ");
  cg_load(g, x, "base + j");
  cg_out(g->m, ", gv = ");
  cg_load(g, dy, "base + j");
  cg_out(g->m, ";");
}

static void gen_row_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t x = st->op.args[0], dy = st->op.args[1], y = st->op.result; /* x: the forward's result for softmax */
  ntp_shape ys = cg_tshape(g, y);
  long long D = ys.dim[ys.ndim - 1], rows = rows_of(ys);
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

/* ---- attention's gradients ------------------------------------------------------------------ */

/* Lane-strided head-dim registers: "float NAME[per]" loaded from tensor t at row base `at`. */
static void lane_load(gen *g, const char *name, int32_t t, const char *at, long long per, long long HD) {
  char idx[96];
  snprintf(idx, sizeof idx, "%s + d", at);
  cg_out(g->m, "    for (int r = 0; r < %lld; r++) { int d = lane + 32 * r; %s[r] = d < %lld ? ", per, name, HD);
  cg_load(g, t, idx);
  cg_out(g->m, " : 0.0f; }\n");
}

/* "warp_sum(sum over the lane's dims of REG[r] * t[at + d])" into the float `dst` */
static void lane_dot(gen *g, const char *dst, const char *reg, int32_t t, const char *at, long long per, long long HD) {
  char idx[96];
  snprintf(idx, sizeof idx, "%s + d", at);
  cg_out(g->m, "    float %s = 0.0f;\n    for (int r = 0; r < %lld; r++) { int d = lane + 32 * r; if (d < %lld) %s += %s[r] * ",
         dst, per, HD, dst, reg);
  cg_load(g, t, idx);
  cg_out(g->m, "; }\n    %s = warp_sum(%s);\n", dst, dst);
}

/* dq: a warp per (batch, query, head); pass 1 finds the row's max, sum of exponentials and
 * sum(P * dP) online; pass 2 accumulates dS k. dk, dv: a warp per (batch, key, kv head), over
 * every query row of the group's heads that sees the key, each row's statistics recomputed. */
static void gen_attention_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t q = st->op.args[0], k = st->op.args[1], v = st->op.args[2], dy = st->op.args[3], y = st->op.result;
  ntp_shape qs = cg_tshape(g, q), ks = cg_tshape(g, k);
  long long B = qs.dim[0], S = qs.dim[1], H = qs.dim[2], HD = qs.dim[3], KV = ks.dim[2];
  long long group = st->op.attr.attn.group ? st->op.attr.attn.group : H / KV, per = (HD + 31) / 32;
  long long qoff = st->op.attr.attn.q_off, kvoff = st->op.attr.attn.kv_off;
  int which = st->op.attr.attn.which;
  bool causal = st->op.attr.attn.causal;
  char fb[48];
  const char *scale = cg_flit(st->op.attr.attn.scale, fb, sizeof fb);
  long long heads = which == 0 ? H : KV, warps = B * S * heads;
  cg_kernel_head(g, s, (warps + ATT_WARPS - 1) / ATT_WARPS, ATT_WARPS * 32, 0);
  cg_out(g->m, "  i64 w = (i64)blockIdx.x * %d + (threadIdx.x >> 5);\n  int lane = threadIdx.x & 31;\n  if (w >= %lldll) return;\n",
         ATT_WARPS, warps);
  cg_decl(g, q);
  cg_decl(g, k);
  cg_decl(g, v);
  cg_decl(g, dy);
  cg_decl(g, y);
  cg_out(g->m, "  const i64 S = %lldll, H = %lldll, KV = %lldll, HD = %lldll;\n", S, H, KV, HD);
  cg_out(g->m, "  i64 hh = w %% %lldll, pos = (w / %lldll) %% S, b = w / (%lldll * S);\n", heads, heads, heads);
  cg_out(g->m, "  float qr[%lld], gr[%lld], acc[%lld];\n  for (int r = 0; r < %lld; r++) acc[r] = 0.0f;\n", per, per, per, per);
  if (which == 0) {
    cg_out(g->m, "  i64 kvh = (%lldll + hh) / %lldll - %lldll, qb = ((b * S + pos) * H + hh) * HD;\n", qoff, group, kvoff);
    lane_load(g, "qr", q, "qb", per, HD);
    lane_load(g, "gr", dy, "qb", per, HD);
    cg_out(g->m, "  i64 nk = %s;\n", causal ? "pos + 1" : "S");
    cg_out(g->m, "  float m = %s, l = 0.0f, a = 0.0f;\n  for (i64 u = 0; u < nk; u++) {\n"
                 "    i64 kb = ((b * S + u) * KV + kvh) * HD;\n",
           NEG_INF);
    lane_dot(g, "sc", "qr", k, "kb", per, HD);
    lane_dot(g, "dp", "gr", v, "kb", per, HD);
    cg_out(g->m, "    sc *= %s;\n    float mn = fmaxf(m, sc), corr = expf(m - mn), p = expf(sc - mn);\n"
                 "    l = l * corr + p;\n    a = a * corr + p * dp;\n    m = mn;\n  }\n  float dpo = a / l;\n",
           scale);
    cg_out(g->m, "  for (i64 u = 0; u < nk; u++) {\n    i64 kb = ((b * S + u) * KV + kvh) * HD;\n");
    lane_dot(g, "sc", "qr", k, "kb", per, HD);
    lane_dot(g, "dp", "gr", v, "kb", per, HD);
    cg_out(g->m, "    float ds = expf(sc * %s - m) / l * (dp - dpo) * %s;\n", scale, scale);
    cg_out(g->m, "    for (int r = 0; r < %lld; r++) { int d = lane + 32 * r; if (d < %lld) acc[r] += ds * ", per, HD);
    cg_load(g, k, "kb + d");
    cg_out(g->m, "; }\n  }\n  i64 ob = qb;\n");
  } else {
    /* this warp's key `pos` of kv head hh; every query head n of its group, every row t that sees it */
    cg_out(g->m, "  i64 kb = ((b * S + pos) * KV + hh) * HD;\n");
    cg_out(g->m, "  for (i64 n = 0; n < H; n++) {\n    if ((%lldll + n) / %lldll - %lldll != hh) continue;\n", qoff, group,
           kvoff);
    cg_out(g->m, "  for (i64 t = %s; t < S; t++) {\n    i64 qb = ((b * S + t) * H + n) * HD, nk = %s;\n",
           causal ? "pos" : "0", causal ? "t + 1" : "S");
    lane_load(g, "qr", q, "qb", per, HD);
    lane_load(g, "gr", dy, "qb", per, HD);
    cg_out(g->m, "    float m = %s, l = 0.0f, a = 0.0f, mine = 0.0f, mydp = 0.0f;\n"
                 "    for (i64 u = 0; u < nk; u++) {\n      i64 ub = ((b * S + u) * KV + hh) * HD;\n",
           NEG_INF);
    lane_dot(g, "sc", "qr", k, "ub", per, HD);
    lane_dot(g, "dp", "gr", v, "ub", per, HD);
    cg_out(g->m, "      sc *= %s;\n      if (u == pos) { mine = sc; mydp = dp; }\n"
                 "      float mn = fmaxf(m, sc), corr = expf(m - mn), p = expf(sc - mn);\n"
                 "      l = l * corr + p;\n      a = a * corr + p * dp;\n      m = mn;\n    }\n"
                 "    float p = expf(mine - m) / l;\n",
           scale);
    if (which == 2)
      cg_out(g->m, "    for (int r = 0; r < %lld; r++) acc[r] += p * gr[r];\n", per);
    else
      cg_out(g->m, "    float ds = p * (mydp - a / l) * %s;\n    for (int r = 0; r < %lld; r++) acc[r] += ds * qr[r];\n",
             scale, per);
    cg_out(g->m, "  }\n  }\n  i64 ob = kb;\n");
  }
  cg_out(g->m, "  for (int r = 0; r < %lld; r++) { int d = lane + 32 * r; if (d < %lld) {\n  ", per, HD);
  cg_store(g, y, "ob + d", "acc[r]");
  cg_out(g->m, "  } }\n}\n");
}

/* ---- the vocabulary-parallel loss (compiler/shard/shard_loss.c) ---------------------------- */

/* A block per row of the rank's slice of the vocabulary: max, sum of exponentials, the target's
 * logit where this slice holds it. */
static void gen_ce_stats(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t lg = st->op.args[0], tg = st->op.args[1], y = st->op.result;
  ntp_shape ls = cg_tshape(g, lg);
  long long V = ls.dim[ls.ndim - 1], rows = rows_of(ls), lo = st->op.attr.ce.lo, ign = st->op.attr.ce.ignore;
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
  cg_out(g->m, "    float mx = %s, s = 0.0f;\n    for (int k = 0; k < %lld; k++) mx = fmaxf(mx, T%d[gb + 4 * k]);\n", NEG_INF,
         t, G);
  cg_out(g->m, "    for (int k = 0; k < %lld; k++) s += T%d[gb + 4 * k + 1] * expf(T%d[gb + 4 * k] - mx);\n", t, G, G);
}

/* One block over the row block's rows: the sum of logsumexp - target logit and the count. */
static void gen_ce_rows(gen *g, int32_t s) {
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

static void gen_ce_mean(gen *g, int32_t s) {
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
static void gen_ce_stats_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t lg = st->op.args[0], tg = st->op.args[1], ds = st->op.args[2], y = st->op.result;
  ntp_shape ls = cg_tshape(g, lg);
  long long V = ls.dim[ls.ndim - 1], rows = rows_of(ls), lo = st->op.attr.ce.lo, ign = st->op.attr.ce.ignore;
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

static void gen_ce_rows_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t G = st->op.args[0], tg = st->op.args[1], dp = st->op.args[2], y = st->op.result;
  ntp_shape gs = cg_tshape(g, G);
  long long rows = gs.dim[0], t = gs.dim[1] / 4, ign = st->op.attr.ce.ignore;
  cg_kernel_head(g, s, (rows + EW_BLOCK - 1) / EW_BLOCK, EW_BLOCK, 0);
  cg_out(g->m, "  i64 r = (i64)blockIdx.x * %d + threadIdx.x;\n  if (r >= %lldll) return;\n", EW_BLOCK, rows);
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

static void gen_ce_mean_grad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t P = st->op.args[0], dl = st->op.args[1], y = st->op.result;
  long long nb = cg_tshape(g, P).dim[0];
  cg_kernel_head(g, s, (nb + EW_BLOCK - 1) / EW_BLOCK, EW_BLOCK, 0);
  cg_out(g->m, "  i64 j = (i64)blockIdx.x * %d + threadIdx.x;\n  if (j >= %lldll) return;\n", EW_BLOCK, nb);
  cg_decl(g, P);
  cg_decl(g, dl);
  cg_decl(g, y);
  cg_out(g->m, "  float n = 0.0f;\n  for (int i = 0; i < %lld; i++) n += T%d[2 * i + 1];\n", nb, P);
  cg_out(g->m, "  T%d[2 * j] = n > 0.0f ? T%d[0] / n : 0.0f;\n  T%d[2 * j + 1] = 0.0f;\n}\n", y, dl, y);
}

bool cg_gen_grad_step(gen *g, int32_t s) {
  switch (g->p->steps[s].op.code) {
  case IR_SUM_TO: gen_sum_to(g, s); return true;
  case IR_PAD: gen_pad(g, s); return true;
  case IR_SCATTER_ADD: gen_scatter_add(g, s); return true;
  case IR_CROSS_ENTROPY: gen_cross_entropy(g, s); return true;
  case IR_CROSS_ENTROPY_GRAD: gen_cross_entropy_grad(g, s); return true;
  case IR_SOFTMAX_GRAD:
  case IR_LAYERNORM_GRAD:
  case IR_RMSNORM_GRAD: gen_row_grad(g, s); return true;
  case IR_ATTENTION_GRAD: /* tiled where the tiles fit in shared memory */
    if (!cg_attention_grad_tiled(g, s)) gen_attention_grad(g, s);
    return true;
  case IR_CE_STATS: gen_ce_stats(g, s); return true;
  case IR_CE_ROWS: gen_ce_rows(g, s); return true;
  case IR_CE_MEAN: gen_ce_mean(g, s); return true;
  case IR_CE_STATS_GRAD: gen_ce_stats_grad(g, s); return true;
  case IR_CE_ROWS_GRAD: gen_ce_rows_grad(g, s); return true;
  case IR_CE_MEAN_GRAD: gen_ce_mean_grad(g, s); return true;
  default: return false;
  }
}
