/* emu_cublaslt.c — the subset of libcublasLt the backend calls: a reference GEMM with
 * cuBLASLt's descriptor semantics. Matrices are column-major (element (i, j) of a layout
 * with leading dimension ld at i + j * ld), op() applies TRANSA / TRANSB, a strided batch
 * steps each operand by its own offset, products accumulate in fp32 in order of k, and D is
 * rounded once to its storage type. An attribute or a type it does not implement is an
 * error, never ignored, and every operand's extent must lie inside one device allocation. */
#define _GNU_SOURCE
#include <cublasLt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"

typedef struct emu_desc {
  int magic;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t ta, tb;
  cublasLtEpilogue_t epilogue; /* DEFAULT, BIAS, GELU, GELU_BIAS, DGELU, DGELU_BGRAD, BGRADA, BGRADB */
  const void *bias;            /* BIAS: one value per row of D, read; BGRAD: the gradient, written */
  cudaDataType_t bias_type;
  bool bias_type_set;
  const void *aux; /* DGELU: the GELU input, laid out as D with leading dimension aux_ld */
  int64_t aux_ld;
} emu_desc;
typedef struct emu_layout {
  int magic;
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld, stride;
  int32_t batch;
} emu_layout;
/* align: the MIN_ALIGNMENT_{A,B,C,D}_BYTES promised, 0 where left at the default (256: not checked) */
typedef struct emu_pref { int magic; uint64_t workspace; uint32_t align[4]; } emu_pref;
enum { DESC_MAGIC = 0x4c544453, LAYOUT_MAGIC = 0x4c544c59, PREF_MAGIC = 0x4c545046, HANDLE_MAGIC = 0x4c54484e };
typedef struct emu_handle { int magic, device, gen; } emu_handle;

const char *cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (emulated cuBLASLt: see the message above)";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (emulated cuBLASLt: see the message above)";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  default: return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}
const char *cublasLtGetStatusName(cublasStatus_t s) { return cublasLtGetStatusString(s); }

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  if (!emu_device_ok(emu_current_device(), "cublasLtCreate")) return CUBLAS_STATUS_EXECUTION_FAILED;
  emu_handle *x = calloc(1, sizeof *x);
  if (!x) return CUBLAS_STATUS_ALLOC_FAILED;
  x->magic = HANDLE_MAGIC;
  x->device = emu_current_device();
  x->gen = emu_device_gen(x->device);
  *h = (cublasLtHandle_t)x;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h || ((emu_handle *)h)->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!emu_object_ok(((emu_handle *)h)->device, ((emu_handle *)h)->gen, "cublasLtDestroy")) return CUBLAS_STATUS_EXECUTION_FAILED;
  ((emu_handle *)h)->magic = 0;
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}

static bool storage_type(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) {
    emu_fail("cublasLtMatmulDescCreate: compute type %d with scale type %d is not emulated (only fp32 with fp32 scale)",
             (int)compute, (int)scale);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  emu_desc *x = calloc(1, sizeof *x);
  if (!x) return CUBLAS_STATUS_ALLOC_FAILED;
  *x = (emu_desc){.magic = DESC_MAGIC, .compute = compute, .scale = scale, .ta = CUBLAS_OP_N, .tb = CUBLAS_OP_N,
                  .epilogue = CUBLASLT_EPILOGUE_DEFAULT};
  *d = (cublasLtMatmulDesc_t)x;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  if (!d || ((emu_desc *)d)->magic != DESC_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
  ((emu_desc *)d)->magic = 0;
  free(d);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t n) {
  emu_desc *x = (emu_desc *)d;
  if (!x || x->magic != DESC_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
  if ((a == CUBLASLT_MATMUL_DESC_TRANSA || a == CUBLASLT_MATMUL_DESC_TRANSB) && n == sizeof(int32_t)) {
    int32_t op;
    memcpy(&op, buf, sizeof op);
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) {
      emu_fail("cublasLtMatmulDescSetAttribute: operation %d is not emulated (only N and T)", op);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (a == CUBLASLT_MATMUL_DESC_TRANSA) x->ta = (cublasOperation_t)op;
    else x->tb = (cublasOperation_t)op;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a == CUBLASLT_MATMUL_DESC_EPILOGUE && n == sizeof(uint32_t)) {
    uint32_t e;
    memcpy(&e, buf, sizeof e);
    if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS && e != CUBLASLT_EPILOGUE_GELU &&
        e != CUBLASLT_EPILOGUE_GELU_BIAS && e != CUBLASLT_EPILOGUE_DGELU && e != CUBLASLT_EPILOGUE_DGELU_BGRAD &&
        e != CUBLASLT_EPILOGUE_BGRADA && e != CUBLASLT_EPILOGUE_BGRADB) {
      emu_fail("cublasLtMatmulDescSetAttribute: epilogue %u is not emulated (DEFAULT, BIAS, GELU, GELU_BIAS, DGELU, "
               "DGELU_BGRAD, BGRADA, BGRADB)", e);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    x->epilogue = (cublasLtEpilogue_t)e;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a == CUBLASLT_MATMUL_DESC_BIAS_POINTER && n == sizeof(void *)) {
    memcpy(&x->bias, buf, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER && n == sizeof(void *)) {
    memcpy(&x->aux, buf, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD && n == sizeof(int64_t)) {
    memcpy(&x->aux_ld, buf, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE && n == sizeof(int32_t)) {
    int32_t t;
    memcpy(&t, buf, n);
    if (!storage_type((cudaDataType_t)t)) {
      emu_fail("cublasLtMatmulDescSetAttribute: bias data type %d is not emulated", t);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    x->bias_type = (cudaDataType_t)t;
    x->bias_type_set = true;
    return CUBLAS_STATUS_SUCCESS;
  }
  emu_fail("cublasLtMatmulDescSetAttribute: attribute %d (%zu bytes) is not emulated", (int)a, n);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (!storage_type(t)) {
    emu_fail("cublasLtMatrixLayoutCreate: data type %d is not emulated (fp32, fp16, bf16)", (int)t);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (ld < (int64_t)rows || ld < 1) {
    emu_fail("cublasLtMatrixLayoutCreate: leading dimension %lld is smaller than the %llu rows", (long long)ld,
             (unsigned long long)rows);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  emu_layout *x = calloc(1, sizeof *x);
  if (!x) return CUBLAS_STATUS_ALLOC_FAILED;
  *x = (emu_layout){LAYOUT_MAGIC, t, rows, cols, ld, 0, 1};
  *l = (cublasLtMatrixLayout_t)x;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  if (!l || ((emu_layout *)l)->magic != LAYOUT_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
  ((emu_layout *)l)->magic = 0;
  free(l);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,
                                                const void *buf, size_t n) {
  emu_layout *x = (emu_layout *)l;
  if (!x || x->magic != LAYOUT_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
  if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && n == sizeof(int32_t)) {
    memcpy(&x->batch, buf, n);
    if (x->batch < 1) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && n == sizeof(int64_t)) {
    memcpy(&x->stride, buf, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  emu_fail("cublasLtMatrixLayoutSetAttribute: attribute %d (%zu bytes) is not emulated (column order only)", (int)a, n);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  emu_pref *x = calloc(1, sizeof *x);
  if (!x) return CUBLAS_STATUS_ALLOC_FAILED;
  x->magic = PREF_MAGIC;
  *p = (cublasLtMatmulPreference_t)x;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  if (!p || ((emu_pref *)p)->magic != PREF_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
  ((emu_pref *)p)->magic = 0;
  free(p);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t n) {
  emu_pref *x = (emu_pref *)p;
  if (!x || x->magic != PREF_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && n == sizeof(uint64_t)) {
    memcpy(&x->workspace, buf, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES && n == sizeof(uint32_t)) {
    uint32_t v;
    memcpy(&v, buf, n);
    if (v == 0 || (v & (v - 1))) return CUBLAS_STATUS_INVALID_VALUE;
    x->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = v;
    return CUBLAS_STATUS_SUCCESS;
  }
  emu_fail("cublasLtMatmulPreferenceSetAttribute: attribute %d is not emulated", (int)a);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

/* the shapes must chain: op(A) m x k, op(B) k x n, C and D m x n, batches alike */
static bool shapes(const emu_desc *d, const emu_layout *A, const emu_layout *B, const emu_layout *C,
                   const emu_layout *D, uint64_t *m, uint64_t *n, uint64_t *k) {
  uint64_t am = d->ta == CUBLAS_OP_N ? A->rows : A->cols, ak = d->ta == CUBLAS_OP_N ? A->cols : A->rows;
  uint64_t bk = d->tb == CUBLAS_OP_N ? B->rows : B->cols, bn = d->tb == CUBLAS_OP_N ? B->cols : B->rows;
  if (ak != bk || C->rows != am || C->cols != bn || D->rows != am || D->cols != bn) {
    emu_fail("cublasLtMatmul: shapes do not chain: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu",
             (unsigned long long)am, (unsigned long long)ak, (unsigned long long)bk, (unsigned long long)bn,
             (unsigned long long)C->rows, (unsigned long long)C->cols, (unsigned long long)D->rows,
             (unsigned long long)D->cols);
    return false;
  }
  if (B->batch != A->batch || C->batch != A->batch || D->batch != A->batch) {
    emu_fail("cublasLtMatmul: batch counts differ (A %d, B %d, C %d, D %d)", A->batch, B->batch, C->batch, D->batch);
    return false;
  }
  *m = am, *n = bn, *k = ak;
  return true;
}

/* The emulated algorithm, in the opaque cublasLtMatmulAlgo_t: a mark and the workspace it was
 * chosen with. Like a split-k algorithm it wants workspace, 4 bytes per element of D when the
 * preference allows as much (none otherwise), so that a caller that passes less than
 * workspaceSize to cublasLtMatmul, or workspace that is not device memory, is caught. */
enum { ALGO_MAGIC = 0x4c54414c };
static uint64_t algo_workspace(const cublasLtMatmulAlgo_t *algo, bool *ok) {
  *ok = algo && algo->data[0] == ALGO_MAGIC;
  return *ok ? algo->data[1] : 0;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int want,
                                              cublasLtMatmulHeuristicResult_t *res, int *found) {
  *found = 0;
  if (!pref || ((emu_pref *)pref)->magic != PREF_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
  if (!h || ((emu_handle *)h)->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
  uint64_t m, n, k;
  if (want < 1 || !shapes((emu_desc *)desc, (emu_layout *)a, (emu_layout *)b, (emu_layout *)c, (emu_layout *)d, &m, &n, &k))
    return CUBLAS_STATUS_INVALID_VALUE;
  memset(&res[0], 0, sizeof res[0]);
  uint64_t need = 4 * m * n * (uint64_t)((emu_layout *)d)->batch;
  res[0].workspaceSize = need <= ((emu_pref *)pref)->workspace ? need : 0;
  res[0].algo.data[0] = ALGO_MAGIC;
  res[0].algo.data[1] = res[0].workspaceSize;
  /* the algorithm remembers the alignments it was chosen for (data[2..5]: A, B, C, D);
   * cublasLtMatmul holds the pointers to them */
  const emu_pref *p = (const emu_pref *)pref;
  if (p && p->magic == PREF_MAGIC)
    for (int i = 0; i < 4; i++) res[0].algo.data[2 + i] = p->align[i];
  res[0].state = CUBLAS_STATUS_SUCCESS;
  res[0].wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

static emu_format format(cudaDataType_t t) { return t == CUDA_R_32F ? EMU_F32 : t == CUDA_R_16BF ? EMU_BF16 : EMU_F16; }
static float load(const void *p, cudaDataType_t t, int64_t i) { return emu_load(p, format(t), (size_t)i); }
static void store(void *p, cudaDataType_t t, int64_t i, float f) { emu_store(p, format(t), (size_t)i, f); }

static size_t tbytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

/* GELU's derivative (the tanh form's), in fp32 as the generated act_grad kernel computes it */
static float dgelu_at(float x) {
  const float c = 0.7978845608028654f, a = 0.044715f;
  float t = tanhf(c * (x + a * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * a * x * x);
}

/* the bytes a layout's batches span from its base pointer */
static bool extent(const void *p, const emu_layout *l, const char *what) {
  if (!p) {
    emu_fail("cublasLtMatmul: %s is NULL", what);
    return false;
  }
  uint64_t last = (l->rows - 1) + (l->cols - 1) * (uint64_t)l->ld + (uint64_t)(l->batch - 1) * (uint64_t)l->stride;
  size_t bytes = (size_t)(last + 1) * tbytes(l->type);
  if (emu_find(p, bytes)) {
    if (emu_find(p, 0)->device == emu_current_device()) return true;
    emu_fail("cublasLtMatmul on GPU %d: %s is memory of GPU %d", emu_current_device(), what, emu_find(p, 0)->device);
    return false;
  }
  emu_fail("cublasLtMatmul: %s (%llux%llu, ld %lld, %d batches) spans %zu bytes, beyond its allocation", what,
           (unsigned long long)l->rows, (unsigned long long)l->cols, (long long)l->ld, l->batch, bytes);
  return false;
}

static cublasStatus_t matmul_now(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, float al, const void *A,
                                 cublasLtMatrixLayout_t Al, const void *B, cublasLtMatrixLayout_t Bl, float be,
                                 const void *C, cublasLtMatrixLayout_t Cl, void *D, cublasLtMatrixLayout_t Dl,
                                 cublasLtMatmulAlgo_t algo, void *ws, size_t wsbytes, bool check_only);

/* a GEMM in a stream or a graph: every argument (the scalars by value, as cuBLASLt reads
 * host scalars at the call); the descriptors must outlive the graph, as with cuBLASLt */
typedef struct gemm_node {
  size_t bytes;
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t desc;
  float alpha, beta;
  const void *A, *B, *C;
  void *D, *ws;
  cublasLtMatrixLayout_t Al, Bl, Cl, Dl;
  size_t wsbytes;
  cublasLtMatmulAlgo_t algo;
} gemm_node;
static int run_gemm(void *ctx) {
  gemm_node *g = ctx;
  return matmul_now(g->h, g->desc, g->alpha, g->A, g->Al, g->B, g->Bl, g->beta, g->C, g->Cl, g->D, g->Dl, g->algo,
                    g->ws, g->wsbytes, false) == CUBLAS_STATUS_SUCCESS
             ? 0
             : -1;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Al, const void *B, cublasLtMatrixLayout_t Bl, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cl, void *D, cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsbytes, cudaStream_t stream) {
  if (!emu_device_ok(emu_current_device(), "cublasLtMatmul") || (h && ((emu_handle *)h)->magic == HANDLE_MAGIC &&
      !emu_object_ok(((emu_handle *)h)->device, ((emu_handle *)h)->gen, "cublasLtMatmul")))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  /* no algorithm: cuBLASLt queries its heuristic itself; the emulator's answer then needs no workspace */
  const cublasLtMatmulAlgo_t implicit = {.data = {ALGO_MAGIC, 0}};
  /* an algorithm chosen for operands aligned to N bytes may not be given a pointer aligned to less;
   * checked up to 16 bytes, what the emulator's allocations guarantee (a GPU's, 256) */
  const void *ptr[4] = {A, B, C, D};
  for (int i = 0; algo && i < 4; i++) {
    uint64_t need = algo->data[2 + i] < 16 ? algo->data[2 + i] : 16;
    if (need && (uintptr_t)ptr[i] % need) {
      emu_fail("cublasLtMatmul: %c at %p is not aligned to the %llu bytes its algorithm was chosen for", "ABCD"[i], ptr[i],
               (unsigned long long)algo->data[2 + i]);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  float al, be;
  memcpy(&al, alpha, 4);
  memcpy(&be, beta, 4);
  if (!emu_stream_ok(stream, "cublasLtMatmul")) return CUBLAS_STATUS_INVALID_VALUE;
  /* the arguments are checked at the call, as cuBLASLt does: a refusal is this call's status,
   * not a failure of the stream later */
  cublasStatus_t st = matmul_now(h, desc, al, A, Al, B, Bl, be, C, Cl, D, Dl, algo ? *algo : implicit, ws, wsbytes, true);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  gemm_node *g = malloc(sizeof *g); /* run in stream order (emu_streams.c), or recorded by a capture */
  if (!g) return CUBLAS_STATUS_ALLOC_FAILED;
  *g = (gemm_node){sizeof *g, h, desc, al, be, A, B, C, D, ws, Al, Bl, Cl, Dl, wsbytes, algo ? *algo : implicit};
  return emu_enqueue(stream, run_gemm, g) == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* the bytes an operand covers, for the overlap check */
typedef struct span {
  const void *lo, *hi;
  const char *what;
} span;
static span span_of(const void *p, const emu_layout *l, const char *what) {
  uint64_t last = (l->rows - 1) + (l->cols - 1) * (uint64_t)l->ld + (uint64_t)(l->batch - 1) * (uint64_t)l->stride;
  return (span){p, (const char *)p + (last + 1) * tbytes(l->type), what};
}

static cublasStatus_t matmul_now(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, float al, const void *A,
                                 cublasLtMatrixLayout_t Al, const void *B, cublasLtMatrixLayout_t Bl, float be,
                                 const void *C, cublasLtMatrixLayout_t Cl, void *D, cublasLtMatrixLayout_t Dl,
                                 cublasLtMatmulAlgo_t algo, void *ws, size_t wsbytes, bool check_only) {
  const emu_desc *d = (const emu_desc *)desc;
  const emu_layout *a = (const emu_layout *)Al, *b = (const emu_layout *)Bl, *c = (const emu_layout *)Cl,
                   *o = (const emu_layout *)Dl;
  if (!h || ((emu_handle *)h)->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!d || d->magic != DESC_MAGIC || !a || a->magic != LAYOUT_MAGIC || !b || b->magic != LAYOUT_MAGIC || !c ||
      c->magic != LAYOUT_MAGIC || !o || o->magic != LAYOUT_MAGIC) {
    emu_fail("cublasLtMatmul: a descriptor is invalid (destroyed, or never created)");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  uint64_t m, n, k;
  if (!shapes(d, a, b, c, o, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
  bool ours;
  uint64_t need = algo_workspace(&algo, &ours);
  if (!ours) {
    emu_fail("cublasLtMatmul: the algorithm is not one cublasLtMatmulAlgoGetHeuristic returned");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (wsbytes < need || (need && !ws)) {
    emu_fail("cublasLtMatmul: the algorithm needs %llu bytes of workspace, given %zu", (unsigned long long)need, wsbytes);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (ws && wsbytes && !emu_find(ws, wsbytes)) {
    emu_fail("cublasLtMatmul: the workspace (%zu bytes) is not device memory", wsbytes);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!extent(A, a, "A") || !extent(B, b, "B") || !extent(D, o, "D") || (be != 0.0f && !extent(C, c, "C")))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (C != D && be != 0.0f) {
    emu_fail("cublasLtMatmul: C and D differ (out-of-place accumulation is not emulated)");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  bool with_bias = d->epilogue == CUBLASLT_EPILOGUE_BIAS || d->epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  bool with_gelu = d->epilogue == CUBLASLT_EPILOGUE_GELU || d->epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  bool dgelu = d->epilogue == CUBLASLT_EPILOGUE_DGELU || d->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  int bgrad = d->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD ? 'D'
              : d->epilogue == CUBLASLT_EPILOGUE_BGRADA    ? 'A'
              : d->epilogue == CUBLASLT_EPILOGUE_BGRADB    ? 'B'
                                                           : 0;
  /* the bias: one value per row of D, of D's type unless set; the same for every batch */
  cudaDataType_t bias_t = d->bias_type_set ? d->bias_type : o->type;
  if (with_bias && (!d->bias || !emu_find(d->bias, m * tbytes(bias_t)))) {
    emu_fail("cublasLtMatmul: the bias epilogue needs a bias of %llu values in device memory",
             (unsigned long long)m);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if ((dgelu || bgrad) && (a->batch > 1 || be != 0.0f)) {
    emu_fail("cublasLtMatmul: the %s epilogue is emulated for one unbatched GEMM with beta 0",
             dgelu ? "DGELU" : "bias-gradient");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  /* DGELU's aux: the GELU input as D is laid out, ld a multiple of 8 and no less than D's rows
   * (cuBLASLt's rule), of D's type (the default aux type, the only one emulated) */
  if (dgelu && (!d->aux || d->aux_ld % 8 != 0 || d->aux_ld < (int64_t)m)) {
    emu_fail("cublasLtMatmul: DGELU needs EPILOGUE_AUX_POINTER and an EPILOGUE_AUX_LD divisible by 8 and at least "
             "the %llu rows of D (given %p, ld %lld)", (unsigned long long)m, d->aux, (long long)d->aux_ld);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (dgelu && !extent(d->aux, &(emu_layout){LAYOUT_MAGIC, o->type, m, n, d->aux_ld, 0, 1}, "the aux matrix"))
    return CUBLAS_STATUS_INVALID_VALUE;
  /* the bias gradient: written, D's type (no bias data type may be set: cuBLASLt's is Ctype), one
   * value per row of D (DGELU_BGRAD, BGRADA) or per column (BGRADB) */
  uint64_t nbg = bgrad == 'B' ? n : m;
  if (bgrad && (d->bias_type_set || !d->bias || !emu_find(d->bias, nbg * tbytes(o->type)))) {
    emu_fail("cublasLtMatmul: the bias gradient needs BIAS_POINTER to %llu values of D's type in device memory%s",
             (unsigned long long)nbg, d->bias_type_set ? " (and no BIAS_DATA_TYPE)" : "");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  /* what it writes may share no byte with what it reads, nor with each other: on a GPU the
   * tiles of one would race with the reads of another (in place, C = D, is allowed) */
  span spans[] = {span_of(D, o, "D"), {0}, span_of(A, a, "A"), span_of(B, b, "B"), {0}, {0}};
  if (bgrad) spans[1] = (span){d->bias, (const char *)d->bias + nbg * tbytes(o->type), "the bias gradient"};
  if (dgelu) spans[4] = span_of(d->aux, &(emu_layout){LAYOUT_MAGIC, o->type, m, n, d->aux_ld, 0, 1}, "the aux matrix");
  if (with_bias) spans[5] = (span){d->bias, (const char *)d->bias + m * tbytes(bias_t), "the bias"};
  for (int w = 0; w < 2; w++)
    for (int x = w + 1; x < 6; x++)
      if (spans[w].lo && spans[x].lo && spans[w].lo < spans[x].hi && spans[x].lo < spans[w].hi) {
        emu_fail("cublasLtMatmul: %s overlaps %s", spans[w].what, spans[x].what);
        return CUBLAS_STATUS_INVALID_VALUE;
      }
  if (check_only) return CUBLAS_STATUS_SUCCESS;
  /* op(A) as m x k rows and op(B) as n x k rows in fp32: contiguous dot products */
  float *pa = malloc(sizeof(float) * (m * k + 1)), *pb = malloc(sizeof(float) * (n * k + 1));
  float *acc = malloc(sizeof(float) * (m * n + 1));
  if (!pa || !pb || !acc) {
    free(pa), free(pb), free(acc);
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  for (int32_t bt = 0; bt < a->batch; bt++) {
    const unsigned char *ab = (const unsigned char *)A + (size_t)(bt * a->stride) * tbytes(a->type);
    const unsigned char *bb = (const unsigned char *)B + (size_t)(bt * b->stride) * tbytes(b->type);
    unsigned char *db = (unsigned char *)D + (size_t)(bt * o->stride) * tbytes(o->type);
    for (uint64_t i = 0; i < m; i++)
      for (uint64_t kk = 0; kk < k; kk++)
        pa[i * k + kk] = load(ab, a->type, d->ta == CUBLAS_OP_N ? (int64_t)(i + kk * a->ld) : (int64_t)(kk + i * a->ld));
    for (uint64_t j = 0; j < n; j++)
      for (uint64_t kk = 0; kk < k; kk++)
        pb[j * k + kk] = load(bb, b->type, d->tb == CUBLAS_OP_N ? (int64_t)(kk + j * b->ld) : (int64_t)(j + kk * b->ld));
    for (uint64_t j = 0; j < n; j++)
      for (uint64_t i = 0; i < m; i++) {
        float s = 0.0f;
        const float *x = &pa[i * k], *y = &pb[j * k];
        for (uint64_t kk = 0; kk < k; kk++) s += x[kk] * y[kk];
        acc[j * m + i] = s;
      }
    for (uint64_t j = 0; j < n; j++)
      for (uint64_t i = 0; i < m; i++) {
        int64_t at = (int64_t)(i + j * (uint64_t)o->ld);
        float v = al * acc[j * m + i];
        if (be != 0.0f) v += be * load(db, o->type, at);
        if (with_bias) v += load(d->bias, bias_t, (int64_t)i);
        if (with_gelu) /* cuBLASLt's GELU: the tanh form */
          v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        if (dgelu) /* the tanh form's derivative at the GELU input */
          v = v * dgelu_at(load(d->aux, o->type, (int64_t)(i + j * (uint64_t)d->aux_ld)));
        store(db, o->type, at, v);
      }
    /* bias gradients, summed in fp32 in order: DGELU_BGRAD over D's columns (of the values as
     * stored), BGRADA over op(A)'s k, BGRADB over op(B)'s k; rounded once to D's type */
    for (uint64_t i = 0; bgrad && i < nbg; i++) {
      float sum = 0.0f;
      for (uint64_t kk = 0; kk < (bgrad == 'D' ? n : k); kk++)
        sum += bgrad == 'D' ? load(db, o->type, (int64_t)(i + kk * (uint64_t)o->ld)) : bgrad == 'A' ? pa[i * k + kk] : pb[i * k + kk];
      store((void *)d->bias, o->type, (int64_t)i, sum);
    }
  }
  free(pa), free(pb), free(acc);
  return CUBLAS_STATUS_SUCCESS;
}
