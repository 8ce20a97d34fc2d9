/* cg_attention.c — attention's forward: the one rule that picks its kernel (attention_pick), and
 * the three kernels it picks among:
 *  - tiled (flash-attention style) for head dims up to ATT_TILED_MAX_HD;
 *  - a warp per query above that, the head dim spread over the lanes;
 *  - the GEMM baseline's middle kernel (the softmax of the fp32 scores between cuBLASLt's two
 *    batched GEMMs), where the rank holds whole groups of query heads and the rule asks for it.
 * Every kernel keeps an online softmax or a fixed reduction tree: no atomics, the same bits on
 * every run. */
#include "cg_attention.h"
#include "cg_families.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- what the forward and the backward share --------------------------------------------------- */

attn_dims cg_attn_dims(gen *g, int32_t s) {
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

/* A warp per row: the block's warps take consecutive rows, lane the thread's place in its warp. */
void cg_attn_warp_head(gen *g, int32_t s, long long rows) {
  cg_kernel_head(g, s, (rows + ATT_WARPS - 1) / ATT_WARPS, ATT_WARPS * 32, 0);
  cg_out(g->m, "  i64 w = (i64)blockIdx.x * %d + (threadIdx.x >> 5);\n  int lane = threadIdx.x & 31;\n  if (w >= %lldll) return;\n",
      ATT_WARPS, rows);
}

/* ---- which kernel ---------------------------------------------------------------------------- */

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
 * unequal counts; the scores within ATT_GEMM_MAX_SCRATCH) and is asked for, or under auto from
 * the crossover on; else the tiled kernel, or the warp kernel above the tiled kernel's head dims. */
static cg_att_kernel attention_pick(gen *g, int32_t s) {
  attn_dims d = cg_attn_dims(g, s);
  int64_t es = (int64_t)dtype_bytes(g->p->tensors[d.y].dtype);
  int64_t first = d.qoff / d.group - d.kvoff; /* the kv head of the rank's first query head */
  bool gemm_ok = d.qoff % d.group == 0 && d.H % d.group == 0 && first >= 0 && first + d.H / d.group <= d.KV &&
                 ntp_attention_gemm_scratch(d.B, d.H, d.S, es, NULL) <= ATT_GEMM_MAX_SCRATCH;
  bool gemm = gemm_ok && (g->attn_mode == CG_ATT_GEMM || (g->attn_mode == CG_ATT_AUTO && d.S >= g->attn_gemm_from));
  if (gemm) return CG_ATT_GEMM;
  return d.HD <= ATT_TILED_MAX_HD ? CG_ATT_TILED : CG_ATT_WARP;
}

/* ---- the kernels ----------------------------------------------------------------------------- */

/* Flash-attention style: a block takes ATT_BQ queries of one (batch, head); key and value
 * tiles of ATT_BK rows stream through shared memory and an online softmax keeps, per query,
 * the running maximum, the sum of exponentials and the weighted sum of values; no S x S
 * matrix exists anywhere. Tiles wholly above the causal diagonal are skipped. Eight threads
 * share a query: each scores 4 of the tile's keys and owns every 8th dim of the output.
 * For head dims up to ATT_TILED_MAX_HD (shared memory: Q, K, V tiles and the probabilities). */
enum { ATT_BQ = 16, ATT_BK = 32 };
static void tiled_forward(gen *g, int32_t s) {
  attn_dims d = cg_attn_dims(g, s);
  long long S = d.S, H = d.H, HD = d.HD, nqt = (S + ATT_BQ - 1) / ATT_BQ, per = (HD + 7) / 8;
  cg_kernel_head(g, s, d.B * H * nqt, ATT_BQ * 8, 0);
  cg_decl(g, d.q);
  cg_decl(g, d.k);
  cg_decl(g, d.v);
  cg_decl(g, d.y);
  cg_out(g->m, "  __shared__ float sq[%d][%lld], sk[%d][%lld], sv[%d][%lld], sp[%d][%d];\n", ATT_BQ, HD, ATT_BK, HD + 1,
      ATT_BK, HD, ATT_BQ, ATT_BK);
  cg_out(g->m, "  const i64 S = %lldll, H = %lldll, KV = %lldll, HD = %lldll;\n", S, H, d.KV, HD);
  cg_out(g->m, "  i64 qt = blockIdx.x %% %lldll, h = (blockIdx.x / %lldll) %% H, b = blockIdx.x / (%lldll * H);\n", nqt, nqt,
      nqt);
  cg_out(g->m, "  int r = threadIdx.x >> 3, t = threadIdx.x & 7;\n  i64 q0 = qt * %d, qi = q0 + r;\n", ATT_BQ);
  cg_out(g->m, "  i64 kvh = (%lldll + h) / %lldll - %lldll;\n", d.qoff, d.group, d.kvoff);
  /* the query tile */
  cg_out(g->m, "  for (int e = threadIdx.x; e < %lld; e += %d) {\n    int rr = e / %lld, d = e %% %lld; i64 qq = q0 + rr;\n",
      ATT_BQ * HD, ATT_BQ * 8, HD, HD);
  cg_out(g->m, "    sq[rr][d] = qq < S ? ");
  cg_load(g, d.q, "((b * S + qq) * H + h) * HD + d");
  cg_out(g->m, " : 0.0f;\n  }\n");
  cg_out(g->m, "  float m = -__int_as_float(0x7f800000), l = 0.0f, o[%lld];\n", per);
  cg_out(g->m, "  for (int j = 0; j < %lld; j++) o[j] = 0.0f;\n", per);
  if (d.causal) cg_out(g->m, "  i64 kend = q0 + %d < S ? q0 + %d : S; /* no key tile past the diagonal */\n", ATT_BQ, ATT_BQ);
  else cg_out(g->m, "  i64 kend = S;\n");
  /* key and value tiles */
  cg_out(g->m, "  for (i64 k0 = 0; k0 < kend; k0 += %d) {\n    __syncthreads();\n", ATT_BK);
  cg_out(g->m, "    for (int e = threadIdx.x; e < %lld; e += %d) {\n      int j = e / %lld, d = e %% %lld; i64 kk = k0 + j;\n",
      ATT_BK * HD, ATT_BQ * 8, HD, HD);
  cg_out(g->m, "      i64 at = ((b * S + kk) * KV + kvh) * HD + d;\n      sk[j][d] = kk < S ? ");
  cg_load(g, d.k, "at");
  cg_out(g->m, " : 0.0f;\n      sv[j][d] = kk < S ? ");
  cg_load(g, d.v, "at");
  cg_out(g->m, " : 0.0f;\n    }\n    __syncthreads();\n");
  /* scores of this thread's 4 keys; the row's maximum and sum over its 8 threads */
  cg_out(g->m, "    float sc[4], tmax = -__int_as_float(0x7f800000);\n");
  cg_out(g->m, "    for (int jj = 0; jj < 4; jj++) {\n      int j = t + 8 * jj; i64 kk = k0 + j;\n");
  cg_out(g->m, "      bool ok = kk < S && qi < S%s;\n", d.causal ? " && kk <= qi" : "");
  cg_out(g->m, "      float dot = 0.0f;\n      for (int d = 0; d < HD; d++) dot += sq[r][d] * sk[j][d];\n");
  cg_out(g->m, "      sc[jj] = ok ? dot * %s : -__int_as_float(0x7f800000);\n      tmax = fmaxf(tmax, sc[jj]);\n    }\n",
      d.scale);
  cg_out(g->m, "    for (int w = 1; w < 8; w <<= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, w));\n");
  cg_out(g->m, "    float mn = fmaxf(m, tmax), ps = 0.0f;\n"
            "    float corr = m == -__int_as_float(0x7f800000) ? 0.0f : expf(m - mn);\n");
  cg_out(g->m, "    for (int jj = 0; jj < 4; jj++) {\n"
            "      float p = sc[jj] == -__int_as_float(0x7f800000) ? 0.0f : expf(sc[jj] - mn);\n"
            "      sp[r][t + 8 * jj] = p;\n      ps += p;\n    }\n");
  cg_out(g->m, "    for (int w = 1; w < 8; w <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, w);\n");
  cg_out(g->m, "    l = l * corr + ps;\n    __syncwarp(); /* the row's probabilities, written by its 8 lanes */\n");
  cg_out(g->m, "    for (int jj = 0; jj < %lld; jj++) {\n      int d = t + 8 * jj;\n      if (d >= HD) break;\n"
            "      float acc = o[jj] * corr;\n      for (int j = 0; j < %d; j++) acc += sp[r][j] * sv[j][d];\n"
            "      o[jj] = acc;\n    }\n    m = mn;\n  }\n",
      per, ATT_BK);
  cg_out(g->m, "  if (qi < S) for (int jj = 0; jj < %lld; jj++) {\n    int d = t + 8 * jj;\n    if (d >= HD) break;\n", per);
  cg_out(g->m, "  ");
  cg_store(g, d.y, "((b * S + qi) * H + h) * HD + d", "o[jj] / l");
  cg_out(g->m, "  }\n}\n");
}

/* One warp per query (b, s, head): online softmax over the keys, the head dim spread over lanes. */
static void warp_forward(gen *g, int32_t s) {
  attn_dims d = cg_attn_dims(g, s);
  long long S = d.S, H = d.H, HD = d.HD, per_lane = (HD + 31) / 32;
  cg_attn_warp_head(g, s, d.B * S * H);
  cg_decl(g, d.q);
  cg_decl(g, d.k);
  cg_decl(g, d.v);
  cg_decl(g, d.y);
  cg_out(g->m, "  i64 h = w %% %lldll, t = (w / %lldll) %% %lldll, b = w / %lldll;\n", H, H, S, H * S);
  cg_out(g->m, "  i64 kvh = (%lldll + h) / %lldll - %lldll;\n", d.qoff, d.group, d.kvoff);
  cg_out(g->m, "  float qr[%lld], acc[%lld];\n", per_lane, per_lane);
  cg_out(g->m, "  i64 qb = ((b * %lldll + t) * %lldll + h) * %lldll;\n", S, H, HD);
  cg_out(g->m, "  for (int r = 0; r < %lld; r++) { int d = lane + 32 * r; qr[r] = d < %lld ? ", per_lane, HD);
  cg_load(g, d.q, "qb + d");
  cg_out(g->m, " : 0.0f; acc[r] = 0.0f; }\n");
  cg_out(g->m, "  float m = -__int_as_float(0x7f800000), l = 0.0f;\n");
  cg_out(g->m, "  i64 nk = %s;\n", d.causal ? "t + 1" : "0");
  if (!d.causal) cg_out(g->m, "  nk = %lldll;\n", S);
  cg_out(g->m, "  for (i64 u = 0; u < nk; u++) {\n    i64 kb = ((b * %lldll + u) * %lldll + kvh) * %lldll;\n", S, d.KV, HD);
  cg_out(g->m, "    float dot = 0.0f;\n    for (int r = 0; r < %lld; r++) { int d = lane + 32 * r; if (d < %lld) dot += qr[r] * ",
      per_lane, HD);
  cg_load(g, d.k, "kb + d");
  cg_out(g->m, "; }\n    float sc = warp_sum(dot) * %s;\n", d.scale);
  cg_out(g->m, "    float mn = fmaxf(m, sc), corr = expf(m - mn), p = expf(sc - mn);\n    l = l * corr + p;\n");
  cg_out(g->m, "    for (int r = 0; r < %lld; r++) { int d = lane + 32 * r; acc[r] = acc[r] * corr + (d < %lld ? p * ",
      per_lane, HD);
  cg_load(g, d.v, "kb + d");
  cg_out(g->m, " : 0.0f); }\n    m = mn;\n  }\n");
  cg_out(g->m, "  for (int r = 0; r < %lld; r++) { int d = lane + 32 * r; if (d < %lld) {\n", per_lane, HD);
  cg_out(g->m, "  ");
  cg_store(g, d.y, "qb + d", "acc[r] / l");
  cg_out(g->m, "  } }\n}\n");
}

/* The GEMM baseline's middle kernel: a block per (batch, head, query) row of the fp32 scores:
 * scale, causal mask, max and sum of exponentials over the block (a fixed tree), the
 * probabilities rounded to the storage dtype for the second GEMM. The GEMMs are the runtime's. */
static void gemm_softmax(gen *g, int32_t s) {
  attn_dims d = cg_attn_dims(g, s);
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
               "  m = block_max(m, sh);\n", CG_NEG_INF, ok, d.scale);
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

/* The step's kernel by the rule; the GEMM baseline's softmax is finished here (the step is not a
 * plain kernel: cuBLASLt's GEMMs run around it). */
void cg_write_attention(gen *g, int32_t s) {
  switch (attention_pick(g, s)) {
  case CG_ATT_GEMM: gemm_softmax(g, s); break;
  case CG_ATT_TILED: tiled_forward(g, s); break;
  case CG_ATT_WARP:
  case CG_ATT_AUTO: warp_forward(g, s); break;
  }
}
