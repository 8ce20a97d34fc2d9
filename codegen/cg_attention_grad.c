/* cg_attention_grad.c — attention's backward: tiled (flash-attention-2 style) for head dims up
 * to ATT_TILED_MAX_HD, and a warp per output row above them.
 *
 * Tiled: the backward of one attention op is three IR ops (attention_grad with which = q, k, v), each a
 * step of its own; each step runs two kernels:
 *  1. the statistics pass (cg_step.pre): a block per (batch, head, ATB query rows) streams the
 *     key/value tiles once and writes, per query row, lse = max + log(sum of exponentials) and
 *     D = sum_j P_ij dP_ij (= rowsum(dO * O)) into the rank's scratch (ntp_scratch_offset);
 *  2. dq: a block per (batch, head, ATB query rows), the key/value tiles streamed again, each
 *     score's probability recomputed as exp(s - lse), dS = P (dP - D) scale, dq += dS k;
 *     dk, dv: a block per (batch, kv head, ATB key rows), the query tiles of every query head of
 *     the group streamed (heads ascending, then query tiles ascending), dv += P^T dO and
 *     dk += dS^T q.
 * No atomics: every output element has one owning thread and a fixed order of summation, so the
 * race check's reversed and shuffled orders give the same bits. Tiles wholly above the causal
 * diagonal are skipped (dq: key tiles past the query tile; dk/dv: query tiles before the key
 * tile). Shared memory at the limit ATT_TILED_MAX_HD = 128: four ATB x (HD + 1) float tiles and
 * one ATB x ATB tile, 34 KB of the 48 KB a block may have statically.
 *
 * Warp (head dims above ATT_TILED_MAX_HD, where the tiles would not fit): a warp per output row,
 * recomputing the softmax statistics it needs (the forward's probabilities are not kept). dq costs
 * two passes over the keys; dk and dv one pass per query row that sees the key, O(S^2) per warp. */
#include "cg_attention.h"
#include "cg_families.h"

#include <stdio.h>

enum { ATB = 16, ATB_THREADS = ATB * 8 }; /* rows per tile; 8 threads per row */

/* ---- tiled ----------------------------------------------------------------------------------- */

/* The declarations both kernels of a step open with, in one order: their argument blocks are
 * then the same, as cg_step.pre requires. SC: the rank's scratch, as floats. */
static void attn_decls(gen *g, const attn_dims *d) {
  cg_decl(g, d->q);
  cg_decl(g, d->k);
  cg_decl(g, d->v);
  if (d->dy >= 0) cg_decl(g, d->dy);
  cg_decl(g, d->y);
  cg_out(g->m, "  float *SC = (float *)(A + args.v[%d]);\n",
         cg_arg(g, ntp_scratch_offset(g->p->mem[g->rank].arena_bytes)));
  cg_out(g->m, "  const i64 S = %lldll, H = %lldll, KV = %lldll, HD = %lldll;\n  const int ATB = %d;\n", d->S, d->H, d->KV,
         d->HD, ATB);
}

/* "TILE[rr][dd] = tensor t's row (row0 + rr) of head `head` (heads per row: nh), 0 past S" for the
 * block's threads, ATB rows */
static void load_tile(gen *g, const char *tile, int32_t t, const char *row0, const char *head, const char *nh) {
  char idx[160];
  snprintf(idx, sizeof idx, "((b * S + (%s + rr)) * %s + %s) * HD + dd", row0, nh, head);
  cg_out(g->m, "    for (int e = threadIdx.x; e < %d * HD; e += %d) {\n      int rr = e / HD, dd = e %% HD;\n"
               "      %s[rr][dd] = %s + rr < S ? ", ATB, ATB_THREADS, tile, row0);
  cg_load(g, t, idx);
  cg_out(g->m, " : 0.0f;\n    }\n");
}

/* "float NAME = sum over d of X[xr][d] * Y[yr][d]" */
static void tile_dot(gen *g, const char *name, const char *x, const char *xr, const char *y, const char *yr) {
  cg_out(g->m, "      float %s = 0.0f;\n      for (int d = 0; d < HD; d++) %s += %s[%s][d] * %s[%s][d];\n", name, name, x, xr,
         y, yr);
}

/* The 8 lanes of a row combine OP over their values (the row's threads are one warp's 8 lanes). */
static void row_reduce(gen *g, const char *var, bool max) {
  if (max) cg_out(g->m, "    for (int w = 1; w < 8; w <<= 1) %s = fmaxf(%s, __shfl_xor_sync(0xffffffffu, %s, w));\n", var, var, var);
  else cg_out(g->m, "    for (int w = 1; w < 8; w <<= 1) %s += __shfl_xor_sync(0xffffffffu, %s, w);\n", var, var);
}

/* The statistics pass: per query row, online over the key tiles, the max m, the sum of
 * exponentials l and a = sum_j exp(s_j - m) dP_j (rescaled as m grows); lse = m + log(l), D = a / l.
 * dv needs no D: its pass skips dP. */
static void gen_stats(gen *g, int32_t s, const attn_dims *d, bool with_d) {
  long long nqt = (d->S + ATB - 1) / ATB;
  cg_kernel_head(g, s, d->B * d->H * nqt, ATB_THREADS, 0);
  attn_decls(g, d);
  cg_out(g->m, "  __shared__ float sq[%d][%lld], sg[%d][%lld], sk[%d][%lld], sv[%d][%lld];\n", ATB, d->HD + 1, ATB,
         d->HD + 1, ATB, d->HD + 1, ATB, d->HD + 1);
  cg_out(g->m, "  i64 qt = blockIdx.x %% %lldll, h = (blockIdx.x / %lldll) %% H, b = blockIdx.x / (%lldll * H);\n", nqt, nqt, nqt);
  cg_out(g->m, "  int r = threadIdx.x >> 3, t = threadIdx.x & 7;\n  i64 q0 = qt * %d, qi = q0 + r;\n", ATB);
  cg_out(g->m, "  i64 kvh = (%lldll + h) / %lldll - %lldll;\n  {\n", d->qoff, d->group, d->kvoff);
  load_tile(g, "sq", d->q, "q0", "h", "H");
  if (with_d) load_tile(g, "sg", d->dy, "q0", "h", "H");
  cg_out(g->m, "  }\n  float m = %s, l = 0.0f, a = 0.0f;\n", CG_NEG_INF);
  cg_out(g->m, "  i64 kend = %s;\n", d->causal ? "q0 + ATB < S ? q0 + ATB : S /* no key tile past the diagonal */" : "S");
  cg_out(g->m, "  for (i64 k0 = 0; k0 < kend; k0 += %d) {\n    __syncthreads();\n", ATB);
  load_tile(g, "sk", d->k, "k0", "kvh", "KV");
  if (with_d) load_tile(g, "sv", d->v, "k0", "kvh", "KV");
  cg_out(g->m, "    __syncthreads();\n    float sc[2], dp[2], tmax = %s;\n", CG_NEG_INF);
  cg_out(g->m, "    for (int jj = 0; jj < 2; jj++) {\n      int j = t + 8 * jj; i64 kk = k0 + j;\n");
  cg_out(g->m, "      bool ok = kk < S && qi < S%s;\n", d->causal ? " && kk <= qi" : "");
  tile_dot(g, "dot", "sq", "r", "sk", "j");
  if (with_d) tile_dot(g, "dpj", "sg", "r", "sv", "j");
  cg_out(g->m, "      sc[jj] = ok ? dot * %s : %s;\n      dp[jj] = %s;\n      tmax = fmaxf(tmax, sc[jj]);\n    }\n",
         d->scale, CG_NEG_INF, with_d ? "dpj" : "0.0f");
  row_reduce(g, "tmax", true);
  cg_out(g->m, "    float mn = fmaxf(m, tmax), ps = 0.0f, pa = 0.0f;\n"
               "    float corr = m == %s ? 0.0f : expf(m - mn);\n", CG_NEG_INF);
  cg_out(g->m, "    for (int jj = 0; jj < 2; jj++) {\n      float p = sc[jj] == %s ? 0.0f : expf(sc[jj] - mn);\n"
               "      ps += p;\n      pa += p * dp[jj];\n    }\n", CG_NEG_INF);
  row_reduce(g, "ps", false);
  row_reduce(g, "pa", false);
  cg_out(g->m, "    l = l * corr + ps;\n    a = a * corr + pa;\n    m = mn;\n  }\n");
  cg_out(g->m, "  if (qi < S && t == 0) {\n    i64 at = ((b * H + h) * S + qi) * 2;\n"
               "    SC[at] = m + logf(l);\n    SC[at + 1] = a / l;\n  }\n}\n");
}

/* dq for the block's query tile: the key/value tiles streamed, dS recomputed from the statistics. */
static void gen_dq(gen *g, int32_t s, const attn_dims *d) {
  long long nqt = (d->S + ATB - 1) / ATB, per = (d->HD + 7) / 8;
  cg_kernel_head(g, s, d->B * d->H * nqt, ATB_THREADS, 0);
  attn_decls(g, d);
  cg_out(g->m, "  __shared__ float sq[%d][%lld], sg[%d][%lld], sk[%d][%lld], sv[%d][%lld], sds[%d][%d];\n", ATB,
         d->HD + 1, ATB, d->HD + 1, ATB, d->HD + 1, ATB, d->HD + 1, ATB, ATB);
  cg_out(g->m, "  i64 qt = blockIdx.x %% %lldll, h = (blockIdx.x / %lldll) %% H, b = blockIdx.x / (%lldll * H);\n", nqt, nqt, nqt);
  cg_out(g->m, "  int r = threadIdx.x >> 3, t = threadIdx.x & 7;\n  i64 q0 = qt * %d, qi = q0 + r;\n", ATB);
  cg_out(g->m, "  i64 kvh = (%lldll + h) / %lldll - %lldll;\n  {\n", d->qoff, d->group, d->kvoff);
  load_tile(g, "sq", d->q, "q0", "h", "H");
  load_tile(g, "sg", d->dy, "q0", "h", "H");
  cg_out(g->m, "  }\n  i64 st = ((b * H + h) * S + (qi < S ? qi : 0)) * 2;\n  float lse = SC[st], D = SC[st + 1];\n");
  cg_out(g->m, "  float acc[%lld];\n  for (int jj = 0; jj < %lld; jj++) acc[jj] = 0.0f;\n", per, per);
  cg_out(g->m, "  i64 kend = %s;\n", d->causal ? "q0 + ATB < S ? q0 + ATB : S /* no key tile past the diagonal */" : "S");
  cg_out(g->m, "  for (i64 k0 = 0; k0 < kend; k0 += %d) {\n    __syncthreads();\n", ATB);
  load_tile(g, "sk", d->k, "k0", "kvh", "KV");
  load_tile(g, "sv", d->v, "k0", "kvh", "KV");
  cg_out(g->m, "    __syncthreads();\n    for (int jj = 0; jj < 2; jj++) {\n      int j = t + 8 * jj; i64 kk = k0 + j;\n");
  cg_out(g->m, "      bool ok = kk < S && qi < S%s;\n", d->causal ? " && kk <= qi" : "");
  tile_dot(g, "dot", "sq", "r", "sk", "j");
  tile_dot(g, "dp", "sg", "r", "sv", "j");
  cg_out(g->m, "      sds[r][j] = ok ? expf(dot * %s - lse) * (dp - D) * %s : 0.0f;\n    }\n", d->scale, d->scale);
  cg_out(g->m, "    __syncwarp(); /* the row's dS, written by its 8 lanes */\n");
  cg_out(g->m, "    for (int jj = 0; jj < %lld; jj++) {\n      int dd = t + 8 * jj;\n      if (dd >= HD) break;\n"
               "      float x = acc[jj];\n      for (int j = 0; j < %d; j++) x += sds[r][j] * sk[j][dd];\n"
               "      acc[jj] = x;\n    }\n  }\n", per, ATB);
  cg_out(g->m, "  if (qi < S) for (int jj = 0; jj < %lld; jj++) {\n    int dd = t + 8 * jj;\n    if (dd >= HD) break;\n", per);
  cg_out(g->m, "  ");
  cg_store(g, d->y, "((b * S + qi) * H + h) * HD + dd", "acc[jj]");
  cg_out(g->m, "  }\n}\n");
}

/* dk (which 1) or dv (which 2) for the block's key tile of one kv head: every query head of its
 * group in ascending order, every query tile that sees the key tile in ascending order. Thread
 * (j, t) owns key j's dims t, t + 8, ...; it computes P (or dS) for queries t and t + 8 of the
 * tile and key j into sp[query][key]. */
static void gen_dkv(gen *g, int32_t s, const attn_dims *d, int which) {
  long long nkt = (d->S + ATB - 1) / ATB, per = (d->HD + 7) / 8;
  bool dk = which == 1;
  cg_kernel_head(g, s, d->B * d->KV * nkt, ATB_THREADS, 0);
  attn_decls(g, d);
  cg_out(g->m, "  __shared__ float sq[%d][%lld], sg[%d][%lld], sk[%d][%lld], sv[%d][%lld], sp[%d][%d], sl[%d], sd[%d];\n",
         ATB, d->HD + 1, ATB, d->HD + 1, ATB, d->HD + 1, ATB, dk ? d->HD + 1 : 1, ATB, ATB, ATB, ATB);
  cg_out(g->m, "  i64 kt = blockIdx.x %% %lldll, kvh = (blockIdx.x / %lldll) %% KV, b = blockIdx.x / (%lldll * KV);\n", nkt,
         nkt, nkt);
  cg_out(g->m, "  int j = threadIdx.x >> 3, t = threadIdx.x & 7;\n  i64 k0 = kt * %d, kk = k0 + j;\n  {\n", ATB);
  load_tile(g, "sk", d->k, "k0", "kvh", "KV");
  if (dk) load_tile(g, "sv", d->v, "k0", "kvh", "KV");
  cg_out(g->m, "  }\n  float acc[%lld];\n  for (int jj = 0; jj < %lld; jj++) acc[jj] = 0.0f;\n", per, per);
  cg_out(g->m, "  for (i64 h = 0; h < H; h++) {\n    if ((%lldll + h) / %lldll - %lldll != kvh) continue; /* not of this group */\n",
         d->qoff, d->group, d->kvoff);
  /* causal: the first query tile that sees key k0 is the one holding query k0 (tiles of equal size) */
  cg_out(g->m, "  for (i64 q0 = %s; q0 < S; q0 += %d) {\n    __syncthreads();\n", d->causal ? "k0" : "0", ATB);
  load_tile(g, "sq", d->q, "q0", "h", "H");
  load_tile(g, "sg", d->dy, "q0", "h", "H");
  cg_out(g->m, "    if (threadIdx.x < %d) {\n      i64 qq = q0 + threadIdx.x, at = ((b * H + h) * S + (qq < S ? qq : 0)) * 2;\n"
               "      sl[threadIdx.x] = SC[at];\n      sd[threadIdx.x] = SC[at + 1];\n    }\n    __syncthreads();\n", ATB);
  cg_out(g->m, "    for (int ii = 0; ii < 2; ii++) {\n      int i = t + 8 * ii; i64 qi = q0 + i;\n");
  cg_out(g->m, "      bool ok = kk < S && qi < S%s;\n", d->causal ? " && kk <= qi" : "");
  tile_dot(g, "dot", "sq", "i", "sk", "j");
  cg_out(g->m, "      float p = ok ? expf(dot * %s - sl[i]) : 0.0f;\n", d->scale);
  if (dk) {
    tile_dot(g, "dp", "sg", "i", "sv", "j");
    cg_out(g->m, "      sp[i][j] = p * (dp - sd[i]) * %s;\n    }\n", d->scale);
  } else
    cg_out(g->m, "      sp[i][j] = p;\n    }\n");
  cg_out(g->m, "    __syncthreads();\n");
  cg_out(g->m, "    for (int jj = 0; jj < %lld; jj++) {\n      int dd = t + 8 * jj;\n      if (dd >= HD) break;\n"
               "      float x = acc[jj];\n      for (int i = 0; i < %d; i++) x += sp[i][j] * %s[i][dd];\n"
               "      acc[jj] = x;\n    }\n  }\n  }\n",
         per, ATB, dk ? "sq" : "sg");
  cg_out(g->m, "  if (kk < S) for (int jj = 0; jj < %lld; jj++) {\n    int dd = t + 8 * jj;\n    if (dd >= HD) break;\n", per);
  cg_out(g->m, "  ");
  cg_store(g, d->y, "((b * S + kk) * KV + kvh) * HD + dd", "acc[jj]");
  cg_out(g->m, "  }\n}\n");
}

/* The statistics pass (finished here: its kernel is the step's cg_step.pre), then dq, dk or dv. */
static void tiled_grad(gen *g, int32_t s, const attn_dims *d, int which) {
  gen_stats(g, s, d, which != 2);
  if (cg_finish_kernel(g) != 0) {
    g->m->failed = true;
    return;
  }
  cg_step pre = g->m->steps[s];
  g->m->nargs = (size_t)pre.arg0; /* the step's kernel writes the same argument block again */
  if (which == 0) gen_dq(g, s, d);
  else gen_dkv(g, s, d, which);
  g->m->steps[s].pre = pre.kernel;
  g->m->steps[s].pre_grid = pre.grid;
  int64_t need = d->B * d->H * d->S * 2 * (int64_t)sizeof(float);
  if (need > g->m->scratch_bytes) g->m->scratch_bytes = need;
}

/* ---- a warp per output row --------------------------------------------------------------------- */

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
 * sum(P * dP) online; pass 2 accumulates dS k. */
static void warp_dq(gen *g, const attn_dims *d, long long per) {
  long long HD = d->HD;
  cg_out(g->m, "  i64 kvh = (%lldll + hh) / %lldll - %lldll, qb = ((b * S + pos) * H + hh) * HD;\n", d->qoff, d->group,
         d->kvoff);
  lane_load(g, "qr", d->q, "qb", per, HD);
  lane_load(g, "gr", d->dy, "qb", per, HD);
  cg_out(g->m, "  i64 nk = %s;\n", d->causal ? "pos + 1" : "S");
  cg_out(g->m, "  float m = %s, l = 0.0f, a = 0.0f;\n  for (i64 u = 0; u < nk; u++) {\n"
               "    i64 kb = ((b * S + u) * KV + kvh) * HD;\n",
         CG_NEG_INF);
  lane_dot(g, "sc", "qr", d->k, "kb", per, HD);
  lane_dot(g, "dp", "gr", d->v, "kb", per, HD);
  cg_out(g->m, "    sc *= %s;\n    float mn = fmaxf(m, sc), corr = expf(m - mn), p = expf(sc - mn);\n"
               "    l = l * corr + p;\n    a = a * corr + p * dp;\n    m = mn;\n  }\n  float dpo = a / l;\n",
         d->scale);
  cg_out(g->m, "  for (i64 u = 0; u < nk; u++) {\n    i64 kb = ((b * S + u) * KV + kvh) * HD;\n");
  lane_dot(g, "sc", "qr", d->k, "kb", per, HD);
  lane_dot(g, "dp", "gr", d->v, "kb", per, HD);
  cg_out(g->m, "    float ds = expf(sc * %s - m) / l * (dp - dpo) * %s;\n", d->scale, d->scale);
  cg_out(g->m, "    for (int r = 0; r < %lld; r++) { int d = lane + 32 * r; if (d < %lld) acc[r] += ds * ", per, HD);
  cg_load(g, d->k, "kb + d");
  cg_out(g->m, "; }\n  }\n  i64 ob = qb;\n");
}

/* dk (which 1), dv (which 2): a warp per (batch, key, kv head), over every query row of the
 * group's heads that sees the key, each row's statistics recomputed. */
static void warp_dkv(gen *g, const attn_dims *d, long long per, int which) {
  long long HD = d->HD;
  /* this warp's key `pos` of kv head hh; every query head n of its group, every row t that sees it */
  cg_out(g->m, "  i64 kb = ((b * S + pos) * KV + hh) * HD;\n");
  cg_out(g->m, "  for (i64 n = 0; n < H; n++) {\n    if ((%lldll + n) / %lldll - %lldll != hh) continue;\n", d->qoff,
         d->group, d->kvoff);
  cg_out(g->m, "  for (i64 t = %s; t < S; t++) {\n    i64 qb = ((b * S + t) * H + n) * HD, nk = %s;\n",
         d->causal ? "pos" : "0", d->causal ? "t + 1" : "S");
  lane_load(g, "qr", d->q, "qb", per, HD);
  lane_load(g, "gr", d->dy, "qb", per, HD);
  cg_out(g->m, "    float m = %s, l = 0.0f, a = 0.0f, mine = 0.0f, mydp = 0.0f;\n"
               "    for (i64 u = 0; u < nk; u++) {\n      i64 ub = ((b * S + u) * KV + hh) * HD;\n",
         CG_NEG_INF);
  lane_dot(g, "sc", "qr", d->k, "ub", per, HD);
  lane_dot(g, "dp", "gr", d->v, "ub", per, HD);
  cg_out(g->m, "      sc *= %s;\n      if (u == pos) { mine = sc; mydp = dp; }\n"
               "      float mn = fmaxf(m, sc), corr = expf(m - mn), p = expf(sc - mn);\n"
               "      l = l * corr + p;\n      a = a * corr + p * dp;\n      m = mn;\n    }\n"
               "    float p = expf(mine - m) / l;\n",
         d->scale);
  if (which == 2)
    cg_out(g->m, "    for (int r = 0; r < %lld; r++) acc[r] += p * gr[r];\n", per);
  else
    cg_out(g->m, "    float ds = p * (mydp - a / l) * %s;\n    for (int r = 0; r < %lld; r++) acc[r] += ds * qr[r];\n",
           d->scale, per);
  cg_out(g->m, "  }\n  }\n  i64 ob = kb;\n");
}

/* The warp kernel: the head dim spread over the lanes, registers qr (the query row), gr (its dy)
 * and acc (the output row), which warp_dq or warp_dkv fill; ob the output row's base. */
static void warp_grad(gen *g, int32_t s, const attn_dims *d, int which) {
  long long S = d->S, H = d->H, HD = d->HD, KV = d->KV, per = (HD + 31) / 32;
  long long heads = which == 0 ? H : KV;
  cg_attn_warp_head(g, s, d->B * S * heads);
  cg_decl(g, d->q);
  cg_decl(g, d->k);
  cg_decl(g, d->v);
  cg_decl(g, d->dy);
  cg_decl(g, d->y);
  cg_out(g->m, "  const i64 S = %lldll, H = %lldll, KV = %lldll, HD = %lldll;\n", S, H, KV, HD);
  cg_out(g->m, "  i64 hh = w %% %lldll, pos = (w / %lldll) %% S, b = w / (%lldll * S);\n", heads, heads, heads);
  cg_out(g->m, "  float qr[%lld], gr[%lld], acc[%lld];\n  for (int r = 0; r < %lld; r++) acc[r] = 0.0f;\n", per, per, per, per);
  if (which == 0) warp_dq(g, d, per);
  else warp_dkv(g, d, per, which);
  cg_out(g->m, "  for (int r = 0; r < %lld; r++) { int d = lane + 32 * r; if (d < %lld) {\n  ", per, HD);
  cg_store(g, d->y, "ob + d", "acc[r]");
  cg_out(g->m, "  } }\n}\n");
}

/* Tiled where the tiles fit in shared memory. */
void cg_write_attention_grad(gen *g, int32_t s) {
  attn_dims d = cg_attn_dims(g, s);
  int which = g->p->steps[s].op.attr.attn.which;
  if (d.HD <= ATT_TILED_MAX_HD) tiled_grad(g, s, &d, which);
  else warp_grad(g, s, &d, which);
}
