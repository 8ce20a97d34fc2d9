/* attention.c — attention as two strided-batch GEMMs on cuBLASLt and a softmax kernel (the
 * baseline the tiled attention kernel must beat; NTP attention selection "gemm"). */
#include "cuda_internal.h"

/* ---- attention as two GEMMs (the baseline the tiled kernel must beat) ------------------------ */

/* A column-major operand: rows x cols at leading dimension ld, batch `count` at `stride` elements. */
typedef struct lt_mat {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld, stride;
} lt_mat;

static int lt_layout(cublasLtMatrixLayout_t *l, lt_mat m, int32_t count, char *err, size_t cap) {
  LT(cu_api.cublasLtMatrixLayoutCreate(l, m.type, m.rows, m.cols, m.ld));
  LT(cu_api.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
  LT(cu_api.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.stride, sizeof m.stride));
  return 0;
fail:
  return -1;
}

/* The alignment cuBLASLt may assume of an operand whose pointers, batch stride and leading
 * dimension are all multiples of `bytes` (its heuristic assumes 256 unless told less). */
static uint32_t lt_align(int64_t bytes) {
  uint32_t a = 1;
  while (a < 256 && bytes % (2 * (int64_t)a) == 0) a *= 2;
  return a;
}

/* D = op(A) B over `count` strided batches, fp32 accumulation; no epilogue. align: what the
 * pointers of A, B and D (= C) are multiples of. */
static int batched_gemm(ntp_cuda *c, int r, cublasOperation_t opa, lt_mat A, lt_mat B, lt_mat D, int32_t count,
                        const uint32_t align[3], gemm *g, char *err, size_t cap) {
  cublasOperation_t opb = CUBLAS_OP_N;
  LT(cu_api.cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT(cu_api.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  LT(cu_api.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  if (lt_layout(&g->a, A, count, err, cap) || lt_layout(&g->b, B, count, err, cap) || lt_layout(&g->c, D, count, err, cap))
    return -1;
  cublasLtMatmulPreference_t pref;
  LT(cu_api.cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = c->workspace_cap;
  LT(cu_api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  LT(cu_api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0], sizeof align[0]));
  LT(cu_api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1], sizeof align[1]));
  LT(cu_api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2], sizeof align[2]));
  LT(cu_api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2], sizeof align[2]));
  int found = 0;
  cublasStatus_t hs = cu_api.cublasLtMatmulAlgoGetHeuristic(c->lt[r], g->op, g->a, g->b, g->c, g->c, pref, 1, &g->algo, &found);
  cu_api.cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    snprintf(err, cap, "cuBLASLt has no algorithm for attention's %llux%llux%llu GEMM in %d batches",
             (unsigned long long)D.rows, (unsigned long long)D.cols, (unsigned long long)(opa == CUBLAS_OP_T ? A.rows : A.cols),
             count);
    return -1;
  }
  g->ready = g->queried = true;
  return 0;
fail:
  return -1;
}

/* The GEMM attention of q [B, S, H, HD] over k, v [B, S, KV, HD]: the rank holds whole groups of
 * G query heads, query head h reading kv head first + h / G. Per batch b and place j in the
 * group, the heads j, j + G, ... are the strided batches (q and y at stride G HD, k and v at HD,
 * the scores at G S S):
 *   scores (fp32, column-major keys x queries = row-major [h][query][key]) = K^T Q
 *   y (column-major HD x queries at ld H HD)                                = V P
 * qk is c->gemms[s], pv c->gemms[n_steps + s]. */
typedef struct attn_geom {
  int64_t B, S, H, HD, KV, G, first, es;
} attn_geom;

static attn_geom attention_geometry(const ntp_cuda *c, const ntp_step *st) {
  const ntp_tensor *tq = &c->p->tensors[st->op.args[0]], *tk = &c->p->tensors[st->op.args[1]];
  ntp_shape qs = box_shape(&tq->box), ks = box_shape(&tk->box);
  int64_t G = st->op.attr.attn.group;
  return (attn_geom){.B = qs.dim[0], .S = qs.dim[1], .H = qs.dim[2], .HD = qs.dim[3], .KV = ks.dim[2], .G = G,
                     .first = st->op.attr.attn.q_off / G - st->op.attr.attn.kv_off, .es = (int64_t)dtype_bytes(tq->dtype)};
}

int cu_attention_gemm_setup(ntp_cuda *c, size_t s, char *err, size_t cap) {
  const ntp_step *st = &c->p->steps[s];
  attn_geom a = attention_geometry(c, st);
  if (st->op.attr.attn.q_off % a.G || a.H % a.G || a.first < 0 || a.first + a.H / a.G > a.KV) {
    snprintf(err, cap, "step %zu: GEMM attention needs whole groups of query heads on the rank", s);
    return -1;
  }
  if (ntp_attention_gemm_scratch(a.B, a.H, a.S, a.es, NULL) > c->cuda[st->rank].scratch_bytes) {
    snprintf(err, cap, "step %zu: GEMM attention's scores do not fit the rank's scratch", s);
    return -1;
  }
  cudaDataType_t t = cu_data_type(c->p->tensors[st->op.args[0]].dtype);
  lt_mat q = {t, (uint64_t)a.HD, (uint64_t)a.S, a.H * a.HD, a.G * a.HD}, k = {t, (uint64_t)a.HD, (uint64_t)a.S, a.KV * a.HD, a.HD};
  lt_mat scores = {CUDA_R_32F, (uint64_t)a.S, (uint64_t)a.S, a.S, a.G * a.S * a.S};
  lt_mat probs = {t, (uint64_t)a.S, (uint64_t)a.S, a.S, a.G * a.S * a.S};
  int32_t count = (int32_t)(a.H / a.G);
  /* the pointers run_attention_gemm passes step by HD elements through q, k, v and y and by S * S
   * through the scores and probabilities (both after 256-byte aligned starts) */
  uint32_t head = lt_align(a.HD * a.es), qk_align[3] = {head, head, lt_align(a.S * 4)};
  uint32_t pv_align[3] = {head, lt_align(a.S * a.es), head};
  if (batched_gemm(c, st->rank, CUBLAS_OP_T, k, q, scores, count, qk_align, &c->gemms[s], err, cap) != 0) return -1;
  return batched_gemm(c, st->rank, CUBLAS_OP_N, k, probs, q, count, pv_align, &c->gemms[c->p->n_steps + s], err, cap);
}

/* Scores for every batch, the softmax kernel over all of them, then the products with V. */
int cu_run_attention_gemm(ntp_cuda *c, size_t s, const cg_step *cs, uint64_t seed, char *err, size_t cap) {
  static const float one = 1.0f, zero = 0.0f;
  const ntp_step *st = &c->p->steps[s];
  int r = st->rank;
  attn_geom a = attention_geometry(c, st);
  int64_t probs_at, qrow = a.S * a.H * a.HD * a.es, kvrow = a.S * a.KV * a.HD * a.es, first = a.first * a.HD * a.es;
  ntp_attention_gemm_scratch(a.B, a.H, a.S, a.es, &probs_at);
  unsigned char *scratch = c->arena[r] + ntp_scratch_offset(c->p->mem[r].arena_bytes);
  const gemm *qk = &c->gemms[s], *pv = &c->gemms[c->p->n_steps + s];
  for (int64_t b = 0; b < a.B; b++)
    for (int64_t j = 0; j < a.G; j++) { /* heads j, j + G, ... of batch b */
      unsigned char *q = dev_ptr(c, st->op.args[0]) + b * qrow + j * a.HD * a.es, *k = dev_ptr(c, st->op.args[1]) + b * kvrow + first;
      unsigned char *sc = scratch + (b * a.H + j) * a.S * a.S * 4;
      LT(cu_api.cublasLtMatmul(c->lt[r], qk->op, &one, k, qk->a, q, qk->b, &zero, sc, qk->c, sc, qk->c, &qk->algo.algo,
                           c->workspace[r], qk->algo.workspaceSize, c->stream[r]));
    }
  if (cu_launch_step_kernel(c, r, cs, cs->kernel, cs->grid, seed, err, cap) != 0) return -1;
  for (int64_t b = 0; b < a.B; b++)
    for (int64_t j = 0; j < a.G; j++) {
      unsigned char *v = dev_ptr(c, st->op.args[2]) + b * kvrow + first, *y = dev_ptr(c, st->op.result) + b * qrow + j * a.HD * a.es;
      unsigned char *pr = scratch + probs_at + (b * a.H + j) * a.S * a.S * a.es;
      LT(cu_api.cublasLtMatmul(c->lt[r], pv->op, &one, v, pv->a, pr, pv->b, &zero, y, pv->c, y, pv->c, &pv->algo.algo,
                           c->workspace[r], pv->algo.workspaceSize, c->stream[r]));
    }
  return 0;
fail:
  return -1;
}
