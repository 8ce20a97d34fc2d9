/* test_emu_selftest.c — the emulated GPU can fail: deliberately broken kernels, each of which
 * must be reported as a launch error naming the kernel and the defect, and correct kernels
 * that must pass with the race check on. Each case runs in a child process, since a launch
 * failure is sticky for the rest of a process (as on a GPU). */
#define _GNU_SOURCE
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <nccl.h>
#include <nvrtc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "selftest_runner.h"

static const char common[] =
    "extern \"C\" __global__ void __launch_bounds__(64) block_sum_ok(const float *x, float *out) {\n"
    "  __shared__ float sh[2];\n"
    "  float v = x[blockIdx.x * 64 + threadIdx.x];\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  float t = (threadIdx.x & 31) < 2 ? sh[threadIdx.x & 31] : 0.0f;\n"
    "  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);\n"
    "  out[blockIdx.x * 64 + threadIdx.x] = t;\n"
    "}\n"
    /* the neighbour's slot is read before anyone waits for it to be written */
    "extern \"C\" __global__ void missing_barrier(float *out) {\n"
    "  __shared__ float sh[64];\n"
    "  sh[threadIdx.x] = (float)threadIdx.x;\n"
    "  out[threadIdx.x] = sh[(threadIdx.x + 1) % 64];\n"
    "}\n"
    "extern \"C\" __global__ void oob_write(float *out, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i <= n) out[i] = 1.0f; /* one past the end */\n"
    "}\n"
    /* half the warp returns, the other half reduces across all 32 lanes */
    "extern \"C\" __global__ void wrong_warp_reduction(const float *x, float *out) {\n"
    "  if (threadIdx.x >= 16) return;\n"
    "  float v = x[threadIdx.x];\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  out[threadIdx.x] = v;\n"
    "}\n"
    "extern \"C\" __global__ void blocks_race(int *out) { if (threadIdx.x == 0) out[0] = (int)blockIdx.x; }\n"
    "extern \"C\" __global__ void partial_barrier(float *out) {\n"
    "  if (threadIdx.x < 32) __syncthreads();\n"
    "  out[threadIdx.x] = 1.0f;\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(128) bounded(float *out) { out[threadIdx.x] = 0.0f; }\n"
    "extern \"C\" __global__ void stray_pointer(float *out) { out[(long long)1 << 40] = 1.0f; }\n";

static cudaKernel_t kern(const char *name) {
  static cudaLibrary_t lib;
  if (!lib) {
    nvrtcProgram p;
    const char *opts[] = {"--gpu-architecture=sm_90", "--std=c++17"};
    if (nvrtcCreateProgram(&p, common, "selftest.cu", 0, NULL, NULL) != NVRTC_SUCCESS) exit(3);
    if (nvrtcCompileProgram(p, 2, opts) != NVRTC_SUCCESS) {
      size_t n;
      nvrtcGetProgramLogSize(p, &n);
      char *log = malloc(n);
      nvrtcGetProgramLog(p, log);
      fprintf(stderr, "compile failed:\n%s\n", log);
      exit(3);
    }
    size_t n;
    nvrtcGetCUBINSize(p, &n);
    char *img = malloc(n);
    nvrtcGetCUBIN(p, img);
    if (cudaLibraryLoadData(&lib, img, NULL, NULL, 0, NULL, NULL, 0) != cudaSuccess) exit(3);
    free(img);
    nvrtcDestroyProgram(&p);
  }
  cudaKernel_t k;
  if (cudaLibraryGetKernel(&k, lib, name) != cudaSuccess) exit(3);
  return k;
}

static cudaError_t launch(const char *name, unsigned grid, unsigned block, void **args) {
  cudaError_t e = cudaLaunchKernel((const void *)kern(name), (dim3){grid, 1, 1}, (dim3){block, 1, 1}, args, 0, NULL);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

/* a kernel whose one argument is a fresh buffer of `bytes` */
static cudaError_t launch_on_buffer(const char *name, unsigned grid, unsigned block, size_t bytes) {
  void *out;
  cudaMalloc(&out, bytes);
  void *a[] = {&out};
  return launch(name, grid, block, a);
}

/* the cases: each returns the launch's error (cudaSuccess for the correct kernels) */
static cudaError_t c_block_sum_ok(void) {
  float h[256], *x, *out, r[256];
  for (int i = 0; i < 256; i++) h[i] = (float)(i % 7) - 2.5f;
  cudaMalloc((void **)&x, sizeof h);
  cudaMalloc((void **)&out, sizeof h);
  cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice);
  void *a[] = {&x, &out};
  cudaError_t e = launch("block_sum_ok", 4, 64, a);
  if (e != cudaSuccess) return e;
  cudaMemcpy(r, out, sizeof r, cudaMemcpyDeviceToHost);
  for (int b = 0; b < 4; b++) {
    float s = 0;
    for (int i = 0; i < 64; i++) s += h[b * 64 + i];
    for (int i = 0; i < 64; i++)
      if (r[b * 64 + i] != s) {
        fprintf(stderr, "block %d thread %d: %g, expected %g\n", b, i, r[b * 64 + i], s);
        return cudaErrorUnknown;
      }
  }
  return cudaSuccess;
}
static cudaError_t c_missing_barrier(void) { return launch_on_buffer("missing_barrier", 1, 64, 64 * sizeof(float)); }
static cudaError_t c_oob_write(void) {
  float *out;
  int n = 1000;
  cudaMalloc((void **)&out, (size_t)n * sizeof(float));
  void *a[] = {&out, &n};
  return launch("oob_write", 4, 256, a);
}
static cudaError_t c_wrong_warp_reduction(void) {
  float *x, *out;
  cudaMalloc((void **)&x, 32 * sizeof(float));
  cudaMalloc((void **)&out, 32 * sizeof(float));
  cudaMemset(x, 0, 32 * sizeof(float));
  void *a[] = {&x, &out};
  return launch("wrong_warp_reduction", 1, 32, a);
}
static cudaError_t c_blocks_race(void) { return launch_on_buffer("blocks_race", 8, 32, sizeof(int)); }
static cudaError_t c_partial_barrier(void) { return launch_on_buffer("partial_barrier", 1, 64, 64 * sizeof(float)); }
static cudaError_t c_launch_bounds(void) { return launch_on_buffer("bounded", 1, 256, 256 * sizeof(float)); }
static cudaError_t c_stray_pointer(void) { return launch_on_buffer("stray_pointer", 1, 1, 64 * sizeof(float)); }
static cudaError_t c_host_pointer(void) {
  static float host[64];
  float *p = host;
  void *a[] = {&p};
  return launch("missing_barrier", 1, 64, a);
}

/* the libraries: what would hang or be ignored on a GPU is an error */
static cudaError_t c_cublaslt_epilogue(void) {
  cublasLtMatmulDesc_t d;
  if (cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_RELU; /* not one the backend uses */
  return as_cuda(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e) == CUBLAS_STATUS_SUCCESS);
}
static cudaError_t c_cublaslt_gemm(void) { /* column-major, op(A) = A^T, a strided batch of 2 */
  enum { M = 3, N = 2, K = 4 };
  float a[2][K * M], b[2][K * N], d[2][M * N], *da, *db, *dd;
  for (int i = 0; i < 2 * K * M; i++) (&a[0][0])[i] = (float)(i % 5) - 2;
  for (int i = 0; i < 2 * K * N; i++) (&b[0][0])[i] = (float)(i % 3) + 0.5f;
  cudaMalloc((void **)&da, sizeof a), cudaMalloc((void **)&db, sizeof b), cudaMalloc((void **)&dd, sizeof d);
  cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice), cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasOperation_t t = CUBLAS_OP_T;
  int32_t batch = 2;
  int64_t sa = K * M, sb = K * N, sd = M * N;
  cublasLtCreate(&h);
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
  cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, K, M, K); /* A stored K x M: op(A) is M x K */
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, K, N, K);
  cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, M, N, M);
  cublasLtMatrixLayout_t ls[] = {la, lb, ld};
  int64_t strides[] = {sa, sb, sd};
  for (int i = 0; i < 3; i++) {
    cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch);
    cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof strides[i]);
  }
  float one = 1, zero = 0;
  if (cublasLtMatmul(h, op, &one, da, la, db, lb, &zero, dd, ld, dd, ld, NULL, NULL, 0, NULL) != CUBLAS_STATUS_SUCCESS)
    return cudaErrorUnknown;
  cudaMemcpy(d, dd, sizeof d, cudaMemcpyDeviceToHost);
  for (int q = 0; q < 2; q++)
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        float s = 0;
        for (int k = 0; k < K; k++) s += a[q][k + i * K] * b[q][k + j * K];
        if (d[q][i + j * M] != s) return cudaErrorUnknown;
      }
  return cudaSuccess;
}

/* The backward's epilogues against plain loops: D (m x n) = op(A) op(B) with op(A) = A (m x k,
 * ld m) and op(B) = B^T (B stored n x k, ld n), as the backend's weight-gradient GEMMs are. */
enum { EM = 16, EN = 5, EK = 6 };
typedef struct lt_case {
  float a[EM * EK], b[EN * EK], aux[EM * EN], d[EM * EN], bias[EM];
  float *da, *db, *daux, *dd, *dbias;
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
} lt_case;
static float lt_rand(unsigned *x) { *x = *x * 1664525u + 1013904223u; return (float)(*x >> 8) / 16777216.0f * 4.0f - 2.0f; }
static void lt_setup(lt_case *c, cublasLtEpilogue_t e, int64_t aux_ld) {
  unsigned seed = 7;
  for (int i = 0; i < EM * EK; i++) c->a[i] = lt_rand(&seed);
  for (int i = 0; i < EN * EK; i++) c->b[i] = lt_rand(&seed);
  for (int i = 0; i < EM * EN; i++) c->aux[i] = lt_rand(&seed);
  cudaMalloc((void **)&c->da, sizeof c->a), cudaMalloc((void **)&c->db, sizeof c->b);
  cudaMalloc((void **)&c->daux, sizeof c->aux), cudaMalloc((void **)&c->dd, sizeof c->d);
  cudaMalloc((void **)&c->dbias, sizeof c->bias);
  cudaMemcpy(c->da, c->a, sizeof c->a, cudaMemcpyHostToDevice), cudaMemcpy(c->db, c->b, sizeof c->b, cudaMemcpyHostToDevice);
  cudaMemcpy(c->daux, c->aux, sizeof c->aux, cudaMemcpyHostToDevice);
  cublasOperation_t t = CUBLAS_OP_T;
  cublasLtCreate(&c->h);
  cublasLtMatmulDescCreate(&c->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_TRANSB, &t, sizeof t);
  cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
  cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c->dbias, sizeof c->dbias);
  if (e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
    cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c->daux, sizeof c->daux);
    cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
  }
  cublasLtMatrixLayoutCreate(&c->la, CUDA_R_32F, EM, EK, EM);
  cublasLtMatrixLayoutCreate(&c->lb, CUDA_R_32F, EN, EK, EN);
  cublasLtMatrixLayoutCreate(&c->ld, CUDA_R_32F, EM, EN, EM);
}
static bool lt_run(lt_case *c, const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsbytes) {
  float one = 1, zero = 0;
  if (cublasLtMatmul(c->h, c->op, &one, c->da, c->la, c->db, c->lb, &zero, c->dd, c->ld, c->dd, c->ld, algo, ws, wsbytes,
                     NULL) != CUBLAS_STATUS_SUCCESS)
    return false;
  cudaMemcpy(c->d, c->dd, sizeof c->d, cudaMemcpyDeviceToHost);
  cudaMemcpy(c->bias, c->dbias, sizeof c->bias, cudaMemcpyDeviceToHost);
  return true;
}
static bool close_to(float x, double want) { return fabs(x - want) <= 1e-5 * (1.0 + fabs(want)); }
static double dgelu_ref(double x) { /* the tanh form's derivative, in double */
  double c = 0.7978845608028654, k = 0.044715, t = tanh(c * (x + k * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * k * x * x);
}
static double prod_ref(const lt_case *c, int i, int j) {
  double s = 0;
  for (int k = 0; k < EK; k++) s += (double)c->a[i + k * EM] * c->b[j + k * EN];
  return s;
}
static cudaError_t c_cublaslt_dgelu_bgrad(void) {
  lt_case c;
  lt_setup(&c, CUBLASLT_EPILOGUE_DGELU_BGRAD, EM);
  if (!lt_run(&c, NULL, NULL, 0)) return cudaErrorUnknown;
  for (int i = 0; i < EM; i++) {
    double sum = 0;
    for (int j = 0; j < EN; j++) {
      double want = prod_ref(&c, i, j) * dgelu_ref(c.aux[i + j * EM]);
      if (!close_to(c.d[i + j * EM], want)) return cudaErrorUnknown;
      sum += c.d[i + j * EM];
    }
    if (!close_to(c.bias[i], sum)) return cudaErrorUnknown; /* over D's columns */
  }
  return cudaSuccess;
}
static cudaError_t c_cublaslt_bgrad(void) {
  for (int which = 0; which < 2; which++) {
    lt_case c;
    lt_setup(&c, which == 0 ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_BGRADB, 0);
    if (!lt_run(&c, NULL, NULL, 0)) return cudaErrorUnknown;
    for (int i = 0; i < EM; i++)
      for (int j = 0; j < EN; j++)
        if (!close_to(c.d[i + j * EM], prod_ref(&c, i, j))) return cudaErrorUnknown;
    for (int i = 0; i < (which == 0 ? EM : EN); i++) { /* op(A)'s rows, or op(B)'s columns, summed over k */
      double sum = 0;
      for (int k = 0; k < EK; k++) sum += which == 0 ? c.a[i + k * EM] : c.b[i + k * EN];
      if (!close_to(c.bias[i], sum)) return cudaErrorUnknown;
    }
  }
  return cudaSuccess;
}
static cudaError_t c_cublaslt_aux_ld(void) { /* cuBLASLt: the aux ld a multiple of 8 */
  lt_case c;
  lt_setup(&c, CUBLASLT_EPILOGUE_DGELU, EM + 4);
  return lt_run(&c, NULL, NULL, 0) ? cudaSuccess : cudaErrorUnknown;
}
static cudaError_t c_cublaslt_bgrad_type(void) { /* the bias gradient is D's type: no bias data type */
  lt_case c;
  lt_setup(&c, CUBLASLT_EPILOGUE_BGRADB, 0);
  int32_t bt = CUDA_R_16BF;
  cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
  return lt_run(&c, NULL, NULL, 0) ? cudaSuccess : cudaErrorUnknown;
}
static cudaError_t c_cublaslt_bgrad_overlap(void) { /* an output over an input: a race on a GPU */
  lt_case c;
  lt_setup(&c, CUBLASLT_EPILOGUE_DGELU_BGRAD, EM);
  cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.daux, sizeof c.daux);
  return lt_run(&c, NULL, NULL, 0) ? cudaSuccess : cudaErrorUnknown;
}
static cudaError_t c_cublaslt_workspace(void) { /* the heuristic's algorithm, given less workspace than it needs */
  lt_case c;
  lt_setup(&c, CUBLASLT_EPILOGUE_DEFAULT, 0);
  cublasLtMatmulPreference_t pref;
  uint64_t most = 1 << 20;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &most, sizeof most);
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(c.h, c.op, c.la, c.lb, c.ld, c.ld, pref, 1, &res, &found);
  if (found != 1 || res.workspaceSize == 0) return cudaErrorUnknown;
  void *ws;
  cudaMalloc(&ws, res.workspaceSize);
  if (!lt_run(&c, &res.algo, ws, res.workspaceSize)) return cudaErrorUnknown; /* enough */
  return lt_run(&c, &res.algo, ws, res.workspaceSize - 4) ? cudaSuccess : cudaErrorUnknown;
}

/* a captured graph replays the launches with the argument values of the capture; a synchronous
 * copy during a capture is refused */
static cudaError_t c_graph_replay(void) {
  float h[128], *x, *out, r[128];
  for (int i = 0; i < 128; i++) h[i] = (float)i;
  cudaMalloc((void **)&x, sizeof h);
  cudaMalloc((void **)&out, sizeof h);
  cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice);
  cudaStream_t s;
  cudaStreamCreate(&s);
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return cudaErrorUnknown;
  cudaMemsetAsync(out, 0, sizeof h, s);
  float *arg = x;
  void *a[] = {&arg, &out};
  cudaLaunchKernel((const void *)kern("block_sum_ok"), (dim3){2, 1, 1}, (dim3){64, 1, 1}, a, 0, s);
  arg = NULL; /* the graph keeps the value of the capture */
  if (cudaMemcpy(r, out, sizeof r, cudaMemcpyDeviceToHost) != cudaErrorStreamCaptureUnsupported) return cudaErrorUnknown;
  cudaGraph_t g;
  cudaGraphExec_t e;
  if (cudaStreamEndCapture(s, &g) != cudaSuccess || cudaGraphInstantiate(&e, g, 0) != cudaSuccess) return cudaErrorUnknown;
  cudaGraphDestroy(g);
  for (int rep = 0; rep < 2; rep++) {
    cudaMemset(out, 0xff, sizeof h);
    if (cudaGraphLaunch(e, s) != cudaSuccess) return cudaErrorUnknown;
    cudaMemcpy(r, out, sizeof r, cudaMemcpyDeviceToHost);
    if (r[0] != 2016.0f || r[127] != 6112.0f) return cudaErrorUnknown; /* 0+..+63, 64+..+127 */
  }
  cudaGraphExecDestroy(e);
  return cudaSuccess;
}


/* ---- streams, events, graphs ------------------------------------------------------------------ */

/* one byte of the buffer after stream a sets it to 0x11 and stream b to 0x22, b after a when `wait` */
static unsigned char two_streams(bool wait) {
  unsigned char *buf, h = 0;
  cudaStream_t a, b;
  cudaEvent_t e;
  cudaMalloc((void **)&buf, 64);
  cudaStreamCreate(&a), cudaStreamCreate(&b), cudaEventCreate(&e);
  cudaMemsetAsync(buf, 0x11, 64, a);
  cudaEventRecord(e, a);
  if (wait) cudaStreamWaitEvent(b, e, 0);
  cudaMemsetAsync(buf, 0x22, 64, b);
  cudaStreamSynchronize(b);
  cudaStreamSynchronize(a);
  cudaMemcpy(&h, buf, 1, cudaMemcpyDeviceToHost);
  return h;
}
static cudaError_t c_streams_event_order(void) {
  setenv("NTP_EMU_STREAMS", "lazy", 1);
  return as_cuda(two_streams(true) == 0x22);
}
/* the adversarial order: with the wait forgotten, the later stream's work runs first */
static cudaError_t c_streams_missing_wait(void) {
  setenv("NTP_EMU_STREAMS", "lazy", 1);
  if (two_streams(false) == 0x11) fprintf(stderr, "the second stream's memset ran first\n");
  return cudaErrorUnknown;
}
/* eager: program order, whatever the events say */
static cudaError_t c_streams_eager(void) {
  setenv("NTP_EMU_STREAMS", "eager", 1);
  return as_cuda(two_streams(false) == 0x22);
}

/* a capture forked onto a second stream and joined back; replayed twice */
static cudaError_t c_graph_fork_join(void) {
  setenv("NTP_EMU_STREAMS", "lazy", 1);
  unsigned char *x, hx[64], hy[64];
  cudaStream_t s, t;
  cudaEvent_t fork, join;
  cudaMalloc((void **)&x, 128);
  cudaStreamCreate(&s), cudaStreamCreate(&t), cudaEventCreate(&fork), cudaEventCreate(&join);
  cudaGraph_t g;
  cudaGraphExec_t e;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return cudaErrorUnknown;
  cudaMemsetAsync(x, 0x11, 128, s);
  cudaEventRecord(fork, s);
  cudaStreamWaitEvent(t, fork, 0); /* t joins the capture */
  cudaMemsetAsync(x + 64, 0x22, 64, t);
  cudaEventRecord(join, t);
  cudaStreamWaitEvent(s, join, 0);
  if (cudaStreamEndCapture(s, &g) != cudaSuccess || cudaGraphInstantiate(&e, g, 0) != cudaSuccess) return cudaErrorUnknown;
  cudaGraphDestroy(g);
  for (int rep = 0; rep < 2; rep++) {
    cudaMemset(x, 0, 128);
    if (cudaGraphLaunch(e, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) return cudaErrorUnknown;
    cudaMemcpy(hx, x, 64, cudaMemcpyDeviceToHost);
    cudaMemcpy(hy, x + 64, 64, cudaMemcpyDeviceToHost);
    if (hx[0] != 0x11 || hy[0] != 0x22) return cudaErrorUnknown;
  }
  return cudaGraphExecDestroy(e);
}
static cudaError_t c_graph_unjoined(void) {
  cudaStream_t s, t;
  cudaEvent_t fork;
  unsigned char *x;
  cudaMalloc((void **)&x, 64);
  cudaStreamCreate(&s), cudaStreamCreate(&t), cudaEventCreate(&fork);
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  cudaEventRecord(fork, s);
  cudaStreamWaitEvent(t, fork, 0);
  cudaMemsetAsync(x, 1, 64, t); /* t never rejoins s */
  cudaGraph_t g;
  return cudaStreamEndCapture(s, &g);
}


static const selftest_case cases[] = {
    {"correct block reduction passes the race check", c_block_sum_ok, NULL},
    {"missing __syncthreads", c_missing_barrier, "kernel missing_barrier: race"},
    {"out-of-bounds write", c_oob_write, "kernel oob_write: out-of-bounds access"},
    {"warp reduction over returned lanes", c_wrong_warp_reduction, "kernel wrong_warp_reduction: lane 0 of warp 0 waits"},
    {"two blocks racing", c_blocks_race, "kernel blocks_race: race"},
    {"barrier reached by part of a block", c_partial_barrier, "kernel partial_barrier: __syncthreads reached by 32 of the 64"},
    {"launch beyond __launch_bounds__", c_launch_bounds, "kernel bounded: launch of grid"},
    {"stray pointer", c_stray_pointer, "kernel stray_pointer: invalid memory access"},
    {"host memory as an argument", c_host_pointer, "kernel missing_barrier: argument 0"},
    {"cuBLASLt: an epilogue it does not emulate", c_cublaslt_epilogue, "epilogue 2 is not emulated"},
    {"cuBLASLt: transposed, strided-batch GEMM", c_cublaslt_gemm, NULL},
    {"cuBLASLt: DGELU_BGRAD against loops", c_cublaslt_dgelu_bgrad, NULL},
    {"cuBLASLt: BGRADA and BGRADB against loops", c_cublaslt_bgrad, NULL},
    {"cuBLASLt: DGELU with an aux ld not a multiple of 8", c_cublaslt_aux_ld, "an EPILOGUE_AUX_LD divisible by 8"},
    {"cuBLASLt: a bias gradient with a bias data type", c_cublaslt_bgrad_type, "(and no BIAS_DATA_TYPE)"},
    {"cuBLASLt: a bias gradient over the aux matrix", c_cublaslt_bgrad_overlap, "the bias gradient overlaps the aux matrix"},
    {"cuBLASLt: less workspace than the algorithm needs", c_cublaslt_workspace, "needs 320 bytes of workspace, given 316"},
    {"graphs: capture, refuse a synchronous copy, replay", c_graph_replay, NULL},
    {"streams: work ordered by an event wait", c_streams_event_order, NULL},
    {"streams: a forgotten event wait runs out of order (lazy)", c_streams_missing_wait, "the second stream's memset ran first"},
    {"streams: eager runs in program order", c_streams_eager, NULL},
    {"graphs: a fork onto a second stream and the join, replayed", c_graph_fork_join, NULL},
    {"graphs: a forked stream that never rejoins", c_graph_unjoined, "never rejoined the origin stream"},
};

int main(void) {
  setenv("NTP_EMU_RACECHECK", "reverse", 1);
  kern("block_sum_ok"); /* compiled and loaded once; every child inherits the module */
  return run_cases(cases, (int)(sizeof cases / sizeof cases[0]));
}
