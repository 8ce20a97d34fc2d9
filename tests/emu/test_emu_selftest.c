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
static cudaError_t as_cuda(int ok) { return ok ? cudaSuccess : cudaErrorUnknown; }
/* two ranks on GPUs 0 and 1, a buffer of 64 floats each */
static bool two_ranks(ncclComm_t comm[2], float *buf[2]) {
  for (int r = 0; r < 2; r++) cudaSetDevice(r), cudaMalloc((void **)&buf[r], 64 * sizeof(float));
  return ncclCommInitAll(comm, 2, NULL) == ncclSuccess;
}
static cudaError_t c_nccl_missing_rank(void) {
  ncclComm_t comm[2];
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(0);
  ncclGroupStart();
  ncclAllReduce(buf[0], buf[0], 64, ncclFloat32, ncclSum, comm[0], NULL); /* rank 1 never joins */
  return as_cuda(ncclGroupEnd() == ncclSuccess && cudaStreamSynchronize(NULL) == cudaSuccess); /* stream work */
}
static cudaError_t c_nccl_mismatch(void) {
  ncclComm_t comm[2];
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  ncclGroupStart();
  for (int r = 0; r < 2; r++) {
    cudaSetDevice(r);
    ncclAllReduce(buf[r], buf[r], r ? 32 : 64, ncclFloat32, ncclSum, comm[r], NULL);
  }
  return as_cuda(ncclGroupEnd() == ncclSuccess && cudaStreamSynchronize(NULL) == cudaSuccess);
}
static cudaError_t c_nccl_unmatched_send(void) {
  ncclComm_t comm[2];
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(0);
  ncclGroupStart();
  ncclSend(buf[0], 64, ncclFloat32, 1, comm[0], NULL);
  return as_cuda(ncclGroupEnd() == ncclSuccess && cudaStreamSynchronize(NULL) == cudaSuccess);
}
static cudaError_t c_nccl_reduces_in_rank_order(void) {
  ncclComm_t comm[3];
  float *buf[3], h[3][4] = {{1e8f, 1, 0, 0}, {-1e8f, 2, 0, 0}, {1, 3, 0, 0}}, r[4];
  for (int k = 0; k < 3; k++) {
    cudaSetDevice(k);
    cudaMalloc((void **)&buf[k], sizeof h[k]);
    cudaMemcpy(buf[k], h[k], sizeof h[k], cudaMemcpyHostToDevice);
  }
  if (ncclCommInitAll(comm, 3, NULL) != ncclSuccess) return cudaErrorUnknown;
  ncclGroupStart();
  for (int k = 0; k < 3; k++) cudaSetDevice(k), ncclAllReduce(buf[k], buf[k], 4, ncclFloat32, ncclSum, comm[k], NULL);
  if (ncclGroupEnd() != ncclSuccess) return cudaErrorUnknown;
  cudaSetDevice(2);
  cudaMemcpy(r, buf[2], sizeof r, cudaMemcpyDeviceToHost);
  /* fp32 in rank order: (1e8 + -1e8) + 1 = 1, not 1e8 + (-1e8 + 1) = 0 */
  return as_cuda(r[0] == 1.0f && r[1] == 6.0f);
}
/* after a failure: rank 1 of 3 excluded, ranks 0 and 2 shrink (NCCL_SHRINK_ABORT) in a group */
static bool shrink_three(ncclComm_t comm[3], ncclComm_t sub[2], float *buf[3], int flags) {
  for (int r = 0; r < 3; r++) cudaSetDevice(r), cudaMalloc((void **)&buf[r], 4 * sizeof(float));
  if (ncclCommInitAll(comm, 3, NULL) != ncclSuccess) return false;
  int gone = 1;
  bool ok = true;
  ncclGroupStart();
  for (int r = 0; r < 3; r += 2)
    cudaSetDevice(r), ok &= ncclCommShrink(comm[r], &gone, 1, &sub[r / 2], NULL, flags) == ncclSuccess;
  return ncclGroupEnd() == ncclSuccess && ok;
}
static cudaError_t c_nccl_shrink(void) {
  ncclComm_t comm[3], sub[2];
  float *buf[3], h[2][4] = {{1, 2, 3, 4}, {10, 20, 30, 40}}, r[4];
  if (!shrink_three(comm, sub, buf, NCCL_SHRINK_ABORT)) return cudaErrorUnknown;
  int n0, n1, r0, r1;
  ncclCommCount(sub[0], &n0), ncclCommCount(sub[1], &n1), ncclCommUserRank(sub[0], &r0), ncclCommUserRank(sub[1], &r1);
  if (n0 != 2 || n1 != 2 || r0 != 0 || r1 != 1) return cudaErrorUnknown; /* renumbered in order */
  ncclGroupStart();
  for (int k = 0; k < 2; k++) {
    cudaSetDevice(2 * k);
    cudaMemcpy(buf[2 * k], h[k], sizeof h[k], cudaMemcpyHostToDevice);
    ncclAllReduce(buf[2 * k], buf[2 * k], 4, ncclFloat32, ncclSum, sub[k], NULL);
  }
  if (ncclGroupEnd() != ncclSuccess) return cudaErrorUnknown;
  cudaMemcpy(r, buf[2], sizeof r, cudaMemcpyDeviceToHost);
  for (int r_ = 0; r_ < 3; r_ += 2) cudaSetDevice(r_), ncclCommAbort(comm[r_]); /* the parents: only to be freed */
  return as_cuda(r[0] == 11.0f && r[3] == 44.0f && ncclCommDestroy(sub[0]) == ncclSuccess);
}
static cudaError_t c_nccl_shrink_excluded(void) {
  ncclComm_t comm[2], sub;
  float *buf[2];
  int gone = 1;
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(1);
  return as_cuda(ncclCommShrink(comm[1], &gone, 1, &sub, NULL, NCCL_SHRINK_ABORT) == ncclSuccess);
}
static cudaError_t c_nccl_shrunk_parent(void) {
  ncclComm_t comm[3], sub[2];
  float *buf[3];
  if (!shrink_three(comm, sub, buf, NCCL_SHRINK_ABORT)) return cudaErrorUnknown;
  cudaSetDevice(0);
  return as_cuda(ncclAllReduce(buf[0], buf[0], 4, ncclFloat32, ncclSum, comm[0], NULL) == ncclSuccess);
}
static cudaError_t c_nccl_peer_aborted(void) {
  ncclComm_t comm[2];
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(1);
  ncclCommAbort(comm[1]);
  cudaSetDevice(0);
  return as_cuda(ncclAllReduce(buf[0], buf[0], 64, ncclFloat32, ncclSum, comm[0], NULL) == ncclSuccess);
}
/* a peer process that dies (here: exits without its all-reduce, a zombie until reaped): the
 * survivor's operation fails with ncclRemoteError instead of waiting out the timeout, and
 * ncclCommGetAsyncError says so; any other outcome passes as "success", which this case fails */
static cudaError_t c_nccl_dead_process(void) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return cudaErrorUnknown;
  setenv("NTP_EMU_NCCL_TIMEOUT", "60", 1);
  pid_t child = fork();
  if (child == 0) {
    ncclComm_t peer;
    cudaSetDevice(1);
    _exit(ncclCommInitRank(&peer, 2, id, 1) == ncclSuccess ? 0 : 3);
  }
  ncclComm_t comm;
  float *buf;
  cudaSetDevice(0);
  cudaMalloc((void **)&buf, 64 * sizeof(float));
  if (ncclCommInitRank(&comm, 2, id, 0) != ncclSuccess) return cudaErrorUnknown;
  ncclResult_t r = ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, comm, NULL), a = ncclSuccess;
  if (r == ncclSuccess && cudaStreamSynchronize(NULL) != cudaSuccess) r = ncclRemoteError; /* seen at the sync */
  ncclCommGetAsyncError(comm, &a);
  int st;
  waitpid(child, &st, 0);
  unlink(id.internal + strlen("ntp-emu:")); /* the dead peer never lets go of the fabric */
  bool seen = r == ncclRemoteError && a == ncclRemoteError && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  return seen ? cudaErrorUnknown : cudaSuccess;
}
/* NTP_EMU_FAIL_GPUS: GPU 1 fails at the first abort or shrink; then nothing may touch it */
static cudaError_t c_failed_gpu_touched(void) {
  ncclComm_t comm[2];
  float *buf[2], h[64];
  setenv("NTP_EMU_FAIL_GPUS", "1", 1);
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(0);
  ncclCommAbort(comm[0]);
  cudaMemcpy(h, buf[0], sizeof h, cudaMemcpyDeviceToHost); /* GPU 0's memory: fine */
  return cudaMemcpy(h, buf[1], sizeof h, cudaMemcpyDeviceToHost); /* GPU 1's: stops the process */
}
static cudaError_t c_failed_peer_destroy(void) {
  ncclComm_t comm[3], sub[2];
  float *buf[3];
  setenv("NTP_EMU_FAIL_GPUS", "1", 1);
  if (!shrink_three(comm, sub, buf, NCCL_SHRINK_ABORT)) return cudaErrorUnknown;
  cudaSetDevice(0);
  return as_cuda(ncclCommDestroy(comm[0]) == ncclSuccess); /* waits for rank 1, on the failed GPU */
}
static cudaError_t c_failed_peer_shrink_default(void) {
  ncclComm_t comm[3], sub[2];
  float *buf[3];
  setenv("NTP_EMU_FAIL_GPUS", "1", 1);
  return as_cuda(shrink_three(comm, sub, buf, NCCL_SHRINK_DEFAULT));
}
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

/* a graph per rank, each capturing its rank's part of one group of all-reduces; the launches
 * meet at the replay, as NCCL's kernels do */
static cudaError_t c_nccl_graph_per_rank(void) {
  setenv("NTP_EMU_STREAMS", "lazy", 1);
  ncclComm_t comm[2];
  float *buf[2], h[64], r[64];
  cudaStream_t s[2];
  cudaGraphExec_t e[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  for (int k = 0; k < 2; k++) cudaSetDevice(k), cudaStreamCreate(&s[k]);
  for (int k = 0; k < 2; k++) cudaSetDevice(k), cudaStreamBeginCapture(s[k], cudaStreamCaptureModeThreadLocal);
  ncclGroupStart();
  for (int k = 0; k < 2; k++) cudaSetDevice(k), ncclAllReduce(buf[k], buf[k], 64, ncclFloat32, ncclSum, comm[k], s[k]);
  if (ncclGroupEnd() != ncclSuccess) return cudaErrorUnknown;
  for (int k = 0; k < 2; k++) {
    cudaGraph_t g;
    cudaSetDevice(k);
    if (cudaStreamEndCapture(s[k], &g) != cudaSuccess || cudaGraphInstantiate(&e[k], g, 0) != cudaSuccess)
      return cudaErrorUnknown;
    cudaGraphDestroy(g);
  }
  for (int rep = 1; rep <= 2; rep++) {
    for (int k = 0; k < 2; k++) {
      for (int i = 0; i < 64; i++) h[i] = (float)(rep * (k + 1) + i);
      cudaSetDevice(k), cudaMemcpy(buf[k], h, sizeof h, cudaMemcpyHostToDevice);
    }
    for (int k = 0; k < 2; k++) cudaSetDevice(k), cudaGraphLaunch(e[k], s[k]);
    for (int k = 0; k < 2; k++)
      if (cudaSetDevice(k), cudaStreamSynchronize(s[k]) != cudaSuccess) return cudaErrorUnknown;
    cudaSetDevice(1), cudaMemcpy(r, buf[1], sizeof r, cudaMemcpyDeviceToHost);
    if (r[0] != (float)(3 * rep) || r[63] != (float)(3 * rep + 126)) return cudaErrorUnknown;
  }
  return cudaSuccess;
}
/* NCCL refuses a group that straddles the start of a capture */
static cudaError_t c_nccl_group_capture_boundary(void) {
  ncclComm_t comm[2];
  float *buf[2];
  cudaStream_t s;
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(0);
  cudaStreamCreate(&s);
  ncclGroupStart();
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  ncclAllReduce(buf[0], buf[0], 64, ncclFloat32, ncclSum, comm[0], s);
  return as_cuda(ncclGroupEnd() == ncclSuccess);
}
/* a graph that captured a collective, launched after its communicator was aborted */
static cudaError_t c_nccl_graph_dead_comm(void) {
  ncclComm_t comm;
  float *buf;
  cudaStream_t s;
  cudaGraph_t g;
  cudaGraphExec_t e;
  cudaSetDevice(0);
  cudaMalloc((void **)&buf, 64 * sizeof(float));
  cudaStreamCreate(&s);
  if (ncclCommInitAll(&comm, 1, NULL) != ncclSuccess) return cudaErrorUnknown;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, comm, s);
  if (cudaStreamEndCapture(s, &g) != cudaSuccess || cudaGraphInstantiate(&e, g, 0) != cudaSuccess) return cudaErrorUnknown;
  if (cudaGraphLaunch(e, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) return cudaErrorUnknown;
  ncclCommAbort(comm);
  return cudaGraphLaunch(e, s);
}

static const struct {
  const char *name;
  cudaError_t (*run)(void);
  const char *expect; /* in the error text; NULL: must succeed */
} cases[] = {
    {"correct block reduction passes the race check", c_block_sum_ok, NULL},
    {"missing __syncthreads", c_missing_barrier, "kernel missing_barrier: race"},
    {"out-of-bounds write", c_oob_write, "kernel oob_write: out-of-bounds access"},
    {"warp reduction over returned lanes", c_wrong_warp_reduction, "kernel wrong_warp_reduction: lane 0 of warp 0 waits"},
    {"two blocks racing", c_blocks_race, "kernel blocks_race: race"},
    {"barrier reached by part of a block", c_partial_barrier, "kernel partial_barrier: __syncthreads reached by 32 of the 64"},
    {"launch beyond __launch_bounds__", c_launch_bounds, "kernel bounded: launch of grid"},
    {"stray pointer", c_stray_pointer, "kernel stray_pointer: invalid memory access"},
    {"host memory as an argument", c_host_pointer, "kernel missing_barrier: argument 0"},
    {"NCCL: a rank that never joins", c_nccl_missing_rank, "ncclAllReduce on rank 0 of a communicator of 2 ranks would hang"},
    {"NCCL: all-reduce counts that differ", c_nccl_mismatch, "ncclAllReduce mismatch"},
    {"NCCL: a send nobody receives", c_nccl_unmatched_send, "ncclSend on rank 0 of a communicator of 2 ranks would hang"},
    {"NCCL: all-reduce in fp32 in rank order", c_nccl_reduces_in_rank_order, NULL},
    {"NCCL: shrink renumbers the ranks left", c_nccl_shrink, NULL},
    {"NCCL: an excluded rank calls ncclCommShrink", c_nccl_shrink_excluded, "an excluded rank does not call"},
    {"NCCL: the parent after NCCL_SHRINK_ABORT", c_nccl_shrunk_parent, "terminated this communicator"},
    {"NCCL: an operation after a peer's abort", c_nccl_peer_aborted, "a peer aborted the communicator"},
    {"NCCL: a peer process that died", c_nccl_dead_process, "the process of rank 1 (pid"},
    {"a failed GPU's memory read", c_failed_gpu_touched, "cudaMemcpy (source) touches GPU 1, which has failed"},
    {"NCCL: a destroy that waits for a failed GPU", c_failed_peer_destroy, "ncclCommDestroy on rank 0 would hang"},
    {"NCCL: NCCL_SHRINK_DEFAULT after a failure", c_failed_peer_shrink_default, "after a failure: NCCL_SHRINK_ABORT"},
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
    {"NCCL: a graph per rank, its part of a group of all-reduces", c_nccl_graph_per_rank, NULL},
    {"NCCL: a group across a capture boundary", c_nccl_group_capture_boundary, "spans a capture boundary"},
    {"NCCL: a graph replayed after its communicator was aborted", c_nccl_graph_dead_comm, "destroyed or aborted"},
};

int main(void) {
  setenv("NTP_EMU_RACECHECK", "reverse", 1);
  kern("block_sum_ok"); /* compiled and loaded once; every child inherits the module */
  int failed = 0, n = (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n; i++) {
    int pipefd[2];
    if (pipe(pipefd) != 0) return 2;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      close(pipefd[0]);
      dup2(pipefd[1], 2);
      cudaError_t e = cases[i].run();
      fprintf(stderr, "\nresult: %s\n", e == cudaSuccess ? "success" : cudaGetErrorString(e));
      _exit(e == cudaSuccess ? 0 : 1);
    }
    close(pipefd[1]);
    char buf[16384];
    size_t len = 0;
    ssize_t r;
    while ((r = read(pipefd[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)r;
    buf[len] = 0;
    close(pipefd[0]);
    int status;
    waitpid(pid, &status, 0);
    bool exited = WIFEXITED(status);
    int code = exited ? WEXITSTATUS(status) : -1;
    /* 134: the emulator stopped the process (emu_fatal) */
    bool ok = cases[i].expect ? exited && (code == 1 || code == 134) && strstr(buf, cases[i].expect) : exited && code == 0;
    printf("%-48s %s\n", cases[i].name, !ok ? "FAILED" : cases[i].expect ? "caught" : "ok");
    if (cases[i].expect && ok) {
      const char *line = strstr(buf, "ntp-emu: error: ");
      if (line) printf("    %.*s\n", (int)strcspn(line, "\n"), line);
    }
    if (!ok) {
      printf("    expected %s; exit %d, output:\n%s\n", cases[i].expect ? cases[i].expect : "success", code, buf);
      failed++;
    }
  }
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed ? 1 : 0;
}
