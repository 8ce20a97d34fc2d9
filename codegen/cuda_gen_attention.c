/* cuda_gen_attention.c — attention's tiled backward (flash-attention-2 style) and the kernel
 * between the two GEMMs of the GEMM baseline, and the one rule that picks among attention's
 * kernels (cg_attention_pick).
 *
 * The backward of one attention op is three IR ops (attention_grad with which = q, k, v), each a
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
 * one ATB x ATB tile, 34 KB of the 48 KB a block may have statically. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_gen_internal.h"

enum { ATB = 16, ATB_THREADS = ATB * 8 }; /* rows per tile; 8 threads per row */

static const char *NEG_INF = "(-__int_as_float(0x7f800000))";

/* The attributes and shapes every attention kernel bakes in. */
typedef struct attn_dims {
  int32_t q, k, v, dy, y;
  long long B, S, H, KV, HD, group, qoff, kvoff;
  bool causal;
  char scale[48];
} attn_dims;

static attn_dims dims_of(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  attn_dims d = {.q = st->op.args[0], .k = st->op.args[1], .v = st->op.args[2], .y = st->op.result, .dy = -1};
  if (st->op.nargs > 3) d.dy = st->op.args[3];
  ntp_shape qs = cg_tshape(g, d.q), ks = cg_tshape(g, d.k);
  d.B = qs.dim[0], d.S = qs.dim[1], d.H = qs.dim[2], d.HD = qs.dim[3], d.KV = ks.dim[2];
  d.group = st->op.attr.attn.group ? st->op.attr.attn.group : d.H / d.KV;
  d.qoff = st->op.attr.attn.q_off, d.kvoff = st->op.attr.attn.kv_off;
  d.causal = st->op.attr.attn.causal;
  cg_flit(st->op.attr.attn.scale, d.scale, sizeof d.scale);
  return d;
}

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
  cg_out(g->m, "  }\n  float m = %s, l = 0.0f, a = 0.0f;\n", NEG_INF);
  cg_out(g->m, "  i64 kend = %s;\n", d->causal ? "q0 + ATB < S ? q0 + ATB : S /* no key tile past the diagonal */" : "S");
  cg_out(g->m, "  for (i64 k0 = 0; k0 < kend; k0 += %d) {\n    __syncthreads();\n", ATB);
  load_tile(g, "sk", d->k, "k0", "kvh", "KV");
  if (with_d) load_tile(g, "sv", d->v, "k0", "kvh", "KV");
  cg_out(g->m, "    __syncthreads();\n    float sc[2], dp[2], tmax = %s;\n", NEG_INF);
  cg_out(g->m, "    for (int jj = 0; jj < 2; jj++) {\n      int j = t + 8 * jj; i64 kk = k0 + j;\n");
  cg_out(g->m, "      bool ok = kk < S && qi < S%s;\n", d->causal ? " && kk <= qi" : "");
  tile_dot(g, "dot", "sq", "r", "sk", "j");
  if (with_d) tile_dot(g, "dpj", "sg", "r", "sv", "j");
  cg_out(g->m, "      sc[jj] = ok ? dot * %s : %s;\n      dp[jj] = %s;\n      tmax = fmaxf(tmax, sc[jj]);\n    }\n",
         d->scale, NEG_INF, with_d ? "dpj" : "0.0f");
  row_reduce(g, "tmax", true);
  cg_out(g->m, "    float mn = fmaxf(m, tmax), ps = 0.0f, pa = 0.0f;\n"
               "    float corr = m == %s ? 0.0f : expf(m - mn);\n", NEG_INF);
  cg_out(g->m, "    for (int jj = 0; jj < 2; jj++) {\n      float p = sc[jj] == %s ? 0.0f : expf(sc[jj] - mn);\n"
               "      ps += p;\n      pa += p * dp[jj];\n    }\n", NEG_INF);
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

bool cg_attention_grad_tiled(gen *g, int32_t s) {
  attn_dims d = dims_of(g, s);
  if (d.HD > ATT_TILED_MAX_HD) return false;
  int which = g->p->steps[s].op.attr.attn.which;
  gen_stats(g, s, &d, which != 2);
  if (cg_finish_kernel(g) != 0) {
    g->m->failed = true;
    return true;
  }
  cg_step pre = g->m->steps[s];
  g->m->nargs = (size_t)pre.arg0; /* the step's kernel writes the same argument block again */
  if (which == 0) gen_dq(g, s, &d);
  else gen_dkv(g, s, &d, which);
  g->m->steps[s].pre = pre.kernel;
  g->m->steps[s].pre_grid = pre.grid;
  int64_t need = d.B * d.H * d.S * 2 * (int64_t)sizeof(float);
  if (need > g->m->scratch_bytes) g->m->scratch_bytes = need;
  return true;
}

/* ---- which forward kernel ---------------------------------------------------------------------- */

/* The GEMM baseline's scores may take at most this much scratch; above it, the tiled kernel. */
#define ATT_GEMM_MAX_SCRATCH ((int64_t)1 << 30)
/* auto's crossover when none is measured: the GEMMs from this many positions on. An assumption
 * (tensor-core GEMMs against the tiled kernel's fp32 loops, less the scores' round trip through
 * memory and three launches), for a compile given no calibrated device profile. */
#define ATT_GEMM_FROM_DEFAULT 128

/* The selection's inputs, in one order of precedence (docs/runtime.md, "Generated kernels"):
 * NTP_CUDA_ATTENTION forces a kernel; under auto the crossover is NTP_CUDA_ATTENTION_GEMM_FROM
 * (an experiment's override), else the device profile's attention_gemm_from (measured by `ntpc
 * calibrate`, given with --gpu FILE), else ATT_GEMM_FROM_DEFAULT. */
int cg_attention_config(gen *g, const cg_options *opts, char *err, size_t cap) {
  const char *mode = getenv("NTP_CUDA_ATTENTION"), *from = getenv("NTP_CUDA_ATTENTION_GEMM_FROM");
  g->attn_mode = CG_ATT_AUTO;
  if (mode && *mode && strcmp(mode, "auto")) {
    if (!strcmp(mode, "tiled")) g->attn_mode = CG_ATT_TILED;
    else if (!strcmp(mode, "gemm")) g->attn_mode = CG_ATT_GEMM;
    else {
      snprintf(err, cap, "NTP_CUDA_ATTENTION=%s: expected tiled, gemm or auto", mode);
      return -1;
    }
  }
  g->attn_gemm_from = opts && opts->attn_gemm_from > 0 ? opts->attn_gemm_from : ATT_GEMM_FROM_DEFAULT;
  if (from && *from) {
    char *end;
    long long v = strtoll(from, &end, 10);
    if (*end || v < 1) {
      snprintf(err, cap, "NTP_CUDA_ATTENTION_GEMM_FROM=%s: expected a sequence length (a positive integer)", from);
      return -1;
    }
    g->attn_gemm_from = v;
  }
  return 0;
}

/* The one rule (docs/runtime.md, "Generated kernels"): the GEMM baseline where it applies (the
 * rank holds whole groups of query heads: a group cut by a rank boundary leaves batches of
 * unequal counts; the scores within ATT_GEMM_MAX_SCRATCH) and is asked for, or under auto from the crossover on; else the tiled
 * kernel, or the warp kernel above the tiled kernel's head dims. */
cg_att_kernel cg_attention_pick(gen *g, int32_t s) {
  attn_dims d = dims_of(g, s);
  int64_t es = (int64_t)dtype_bytes(g->p->tensors[d.y].dtype);
  int64_t first = d.qoff / d.group - d.kvoff; /* the kv head of the rank's first query head */
  bool gemm_ok = d.qoff % d.group == 0 && d.H % d.group == 0 && first >= 0 && first + d.H / d.group <= d.KV &&
                 ntp_attention_gemm_scratch(d.B, d.H, d.S, es, NULL) <= ATT_GEMM_MAX_SCRATCH;
  bool gemm = gemm_ok && (g->attn_mode == CG_ATT_GEMM || (g->attn_mode == CG_ATT_AUTO && d.S >= g->attn_gemm_from));
  if (gemm) return CG_ATT_GEMM;
  return d.HD <= ATT_TILED_MAX_HD ? CG_ATT_TILED : CG_ATT_WARP;
}

/* The GEMM baseline's middle kernel: a block per (batch, head, query) row of the fp32 scores:
 * scale, causal mask, max and sum of exponentials over the block (a fixed tree), the
 * probabilities rounded to the storage dtype for the second GEMM. The GEMMs are the runtime's. */
void cg_attention_gemm(gen *g, int32_t s) {
  attn_dims d = dims_of(g, s);
  ntp_dtype dt = g->p->tensors[d.y].dtype;
  int64_t probs, scratch = ntp_attention_gemm_scratch(d.B, d.H, d.S, (int64_t)dtype_bytes(dt), &probs);
  int64_t at = ntp_scratch_offset(g->p->mem[g->rank].arena_bytes);
  cg_kernel_head(g, s, d.B * d.H * d.S, ROW_BLOCK, 0);
  cg_out(g->m, "  const float *SCO = (const float *)(A + args.v[%d]);\n", cg_arg(g, at));
  cg_out(g->m, "  %s *PR = (%s *)(A + args.v[%d]);\n", cg_ctype(dt), cg_ctype(dt), cg_arg(g, at + probs));
  cg_out(g->m, "  __shared__ float sh[32];\n  const i64 S = %lldll;\n  i64 row = blockIdx.x, qi = row %% S;\n"
               "  const float *x = SCO + row * S;\n", d.S);
  const char *ok = d.causal ? "j <= qi" : "true";
  cg_out(g->m, "  float m = %s;\n  for (i64 j = threadIdx.x; j < S; j += blockDim.x) if (%s) m = fmaxf(m, x[j] * %s);\n"
               "  m = block_max(m, sh);\n", NEG_INF, ok, d.scale);
  cg_out(g->m, "  float l = 0.0f;\n  for (i64 j = threadIdx.x; j < S; j += blockDim.x) if (%s) l += expf(x[j] * %s - m);\n"
               "  l = block_sum(l, sh);\n", ok, d.scale);
  cg_out(g->m, "  for (i64 j = threadIdx.x; j < S; j += blockDim.x) {\n    float p = %s ? expf(x[j] * %s - m) / l : 0.0f;\n",
         ok, d.scale);
  if (dt == NTP_FP32) cg_out(g->m, "    PR[row * S + j] = p;\n  }\n}\n");
  else cg_out(g->m, "    PR[row * S + j] = rn_%s(p);\n  }\n}\n", cg_dsuffix(dt));
  if (cg_finish_kernel(g) != 0) g->m->failed = true;
  g->m->steps[s].kind = CG_ATTENTION_GEMM;
  if (scratch > g->m->scratch_bytes) g->m->scratch_bytes = scratch;
}
