/* gemm.c — the GEMM steps on cuBLASLt: operands as column-major layouts, the fused epilogues
 * (bias, GELU and their gradients), one heuristic query per distinct shape. */
#include "cuda_internal.h"

static bool same_shape(const gemm_shape *x, const gemm_shape *y) {
  return x->n == y->n && x->cols == y->cols && x->k == y->k && x->batch == y->batch && x->trans == y->trans &&
         x->dtype == y->dtype && x->epilogue == y->epilogue && x->bias_dtype == y->bias_dtype && x->device == y->device;
}

cudaDataType_t cu_data_type(ntp_dtype dt) {
  return dt == NTP_BF16 ? CUDA_R_16BF : dt == NTP_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Row-major C[M,N] = A[M,K] B (B: [K,N], or [N,K] with trans_b) as column-major
 * C^T (N x M) = op(B^T) (N x K) * A^T (K x M); a batched right operand is a strided batch.
 * With trans_a (a weight's gradient: A stored [K, M]) the stored A is A^T's column-major
 * transpose, so cuBLASLt's B operand is transposed; a batch of such A cannot fold into M, and
 * a shared right operand is then a batch of stride 0. */
static cublasLtEpilogue_t lt_epilogue(cg_epilogue e) {
  switch (e) {
  case CG_EPI_NONE: return CUBLASLT_EPILOGUE_DEFAULT;
  case CG_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
  case CG_EPI_GELU: return CUBLASLT_EPILOGUE_GELU;
  case CG_EPI_GELU_BIAS: return CUBLASLT_EPILOGUE_GELU_BIAS;
  case CG_EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
  case CG_EPI_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
  case CG_EPI_BGRADA: return CUBLASLT_EPILOGUE_BGRADA;
  case CG_EPI_BGRADB: return CUBLASLT_EPILOGUE_BGRADB;
  case CG_EPI_COUNT: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT; /* not reached: the image reader refuses other values */
}

/* The epilogue's attributes: the bias (read), or the bias gradient (written: cuBLASLt's type is
 * D's, no data type set); DGELU's aux matrix, the GELU input, laid out as D (ld = D's rows). */
static int gemm_epilogue(ntp_cuda *c, const cg_step *cs, gemm *g, int64_t N, char *err, size_t cap) {
  if (cs->epilogue == CG_EPI_NONE) return 0;
  cublasLtEpilogue_t epi = lt_epilogue(cs->epilogue);
  LT(cu_api.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (cs->bias >= 0) {
    const void *bias = dev_ptr(c, cs->bias);
    LT(cu_api.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  if (cs->bias >= 0 && (cs->epilogue == CG_EPI_BIAS || cs->epilogue == CG_EPI_GELU_BIAS)) {
    cudaDataType_t bt = cu_data_type(c->p->tensors[cs->bias].dtype);
    LT(cu_api.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  if (cs->aux >= 0) {
    const void *aux = dev_ptr(c, cs->aux);
    int64_t ld = N;
    LT(cu_api.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    LT(cu_api.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  return 0;
fail:
  return -1;
}

/* Row-major C[M,N] = A[M,K] B (B: [K,N], or [N,K] with trans_b) as column-major
 * C^T (N x M) = op(B^T) (N x K) * A^T (K x M); a batched right operand is a strided batch.
 * With trans_a (a weight's gradient: A stored [K, M]) the stored A is A^T's column-major
 * transpose, so cuBLASLt's B operand is transposed; a batch of such A cannot fold into M, and
 * a shared right operand is then a batch of stride 0. st is the matmul step (cs->mm), which
 * may be earlier than the step cs stands at (a GEMM run at its act_grad's step). */
int cu_gemm_setup(ntp_cuda *c, const ntp_step *st, const cg_step *cs, gemm *g, char *err, size_t cap) {
  const ntp_tensor *ta = &c->p->tensors[st->op.args[0]], *tb = &c->p->tensors[st->op.args[1]];
  ntp_shape as = box_shape(&ta->box), bs = box_shape(&tb->box);
  bool tr = st->op.attr.mm.trans_b, ta_ = st->op.attr.mm.trans_a;
  int64_t K = as.dim[as.ndim - (ta_ ? 2 : 1)];
  int64_t M = ta_ ? as.dim[as.ndim - 1] : as.ndim >= 2 ? as.dim[as.ndim - 2] : 1;
  int64_t N = bs.dim[bs.ndim - (tr ? 2 : 1)], batch = shape_numel(&as) / (M * K);
  bool bbatch = bs.ndim > 2 || (ta_ && batch > 1);
  int64_t cols = bbatch ? M : M * batch; /* a shared right operand: the batch folds into M */
  cudaDataType_t t = cu_data_type(ta->dtype);
  cublasOperation_t opa = tr ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta_ ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT(cu_api.cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT(cu_api.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  LT(cu_api.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  if (gemm_epilogue(c, cs, g, N, err, cap) != 0) goto fail;
  LT(cu_api.cublasLtMatrixLayoutCreate(&g->a, t, (uint64_t)(tr ? K : N), (uint64_t)(tr ? N : K), tr ? K : N));
  if (ta_) LT(cu_api.cublasLtMatrixLayoutCreate(&g->b, t, (uint64_t)M, (uint64_t)K, M));
  else LT(cu_api.cublasLtMatrixLayoutCreate(&g->b, t, (uint64_t)K, (uint64_t)cols, K));
  LT(cu_api.cublasLtMatrixLayoutCreate(&g->c, t, (uint64_t)N, (uint64_t)cols, N));
  if (bbatch) {
    int32_t count = (int32_t)batch;
    int64_t sa = bs.ndim > 2 ? K * N : 0, sb = M * K, sc = M * N;
    LT(cu_api.cublasLtMatrixLayoutSetAttribute(g->a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    LT(cu_api.cublasLtMatrixLayoutSetAttribute(g->a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof sa));
    LT(cu_api.cublasLtMatrixLayoutSetAttribute(g->b, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    LT(cu_api.cublasLtMatrixLayoutSetAttribute(g->b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb));
    LT(cu_api.cublasLtMatrixLayoutSetAttribute(g->c, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    LT(cu_api.cublasLtMatrixLayoutSetAttribute(g->c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc));
  }
  g->shape = (gemm_shape){.n = N, .cols = cols, .k = K, .batch = bbatch ? batch : 1, .trans = tr | ta_ << 1,
                          .dtype = (int32_t)t,
                          .epilogue = cs->epilogue, .bias_dtype = cs->bias >= 0 ? (int32_t)c->p->tensors[cs->bias].dtype : -1,
                          .device = c->dev[st->rank]};
  /* one heuristic query per distinct shape and GPU. The answer also depends on the bias and aux
   * pointers' alignment: every tensor starts on a 256-byte boundary of its block, so all alike */
  for (size_t s = 0; s < c->p->n_steps; s++)
    if (c->gemms[s].ready && same_shape(&c->gemms[s].shape, &g->shape)) {
      g->algo = c->gemms[s].algo;
      g->ready = true;
      return 0;
    }
  cublasLtMatmulPreference_t pref;
  LT(cu_api.cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = c->workspace_cap;
  LT(cu_api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  int found = 0;
  cublasStatus_t hs =
      cu_api.cublasLtMatmulAlgoGetHeuristic(c->lt[st->rank], g->op, g->a, g->b, g->c, g->c, pref, 1, &g->algo, &found);
  cu_api.cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    snprintf(err, cap, "cuBLASLt has no algorithm for a %lldx%lldx%lld %s GEMM (epilogue %s)", (long long)cols,
             (long long)N, (long long)K, dtype_name(ta->dtype), cg_epilogue_name(cs->epilogue));
    return -1;
  }
  g->ready = g->queried = true;
  return 0;
fail:
  return -1;
}
