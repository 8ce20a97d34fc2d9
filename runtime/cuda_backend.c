/* cuda_backend.c — runs a sharded program on GPUs (see cuda_backend.h).
 *
 * Loopback mode: every rank's arena lives on one GPU and the compute steps run in their launch
 * order (launch_order.h) on one stream, the collectives on a second (comm_deps.h: the events
 * between them); collectives
 * are device copies and fp32 reductions done by three small kernels
 * (the same arithmetic as the CPU simulation: sum in participant order, round once), so
 * sharded GPU execution is checked on a single GPU. GEMMs go to cuBLASLt (fp32
 * accumulation, the storage dtype in and out); the rest runs the NVRTC-compiled kernels of
 * codegen/cuda_gen.c. The CUDA libraries are fetched with dlopen; the headers give the
 * exact prototypes and enum values, so nothing is re-declared by hand.
 */
#define _GNU_SOURCE
#include "cuda_backend.h"
#include "comm_deps.h"
#include "launch_order.h"
#include "cuda_f16.h"
#include "nvrtc_dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ntp_launcher_rank(int *rank, int *device) {
  static const char *ranks[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"};
  static const char *locals[] = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"};
  for (int i = 0; i < 3; i++) {
    const char *r = getenv(ranks[i]);
    if (!r) continue;
    *rank = atoi(r);
    const char *l = getenv(locals[i]);
    *device = l ? atoi(l) : 0;
    return 0;
  }
  return -1;
}

#if NTP_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#define FN(name) __typeof__(&name) name
static struct {
  void *rt, *lt;
  FN(cudaGetDeviceCount);
  FN(cudaSetDevice);
  FN(cudaDeviceGetAttribute);
  FN(cudaMalloc);
  FN(cudaFree);
  FN(cudaMemcpy);
  FN(cudaMemsetAsync);
  FN(cudaStreamCreate);
  FN(cudaStreamDestroy);
  FN(cudaStreamSynchronize);
  FN(cudaStreamQuery);
  FN(cudaGetErrorString);
  FN(cudaLibraryLoadData);
  FN(cudaLibraryUnload);
  FN(cudaLibraryGetKernel);
  FN(cudaLaunchKernel);
  FN(cudaEventCreate);
  FN(cudaEventCreateWithFlags);
  FN(cudaEventRecord);
  FN(cudaStreamWaitEvent);
  FN(cudaEventSynchronize);
  FN(cudaEventElapsedTime);
  FN(cudaEventDestroy);
  FN(cudaPointerGetAttributes);
  FN(cudaStreamBeginCapture);
  FN(cudaStreamEndCapture);
  FN(cudaGraphInstantiate);
  FN(cudaGraphLaunch);
  FN(cudaGraphExecDestroy);
  FN(cudaGraphDestroy);
  FN(cublasLtCreate);
  FN(cublasLtDestroy);
  FN(cublasLtMatmulDescCreate);
  FN(cublasLtMatmulDescDestroy);
  FN(cublasLtMatmulDescSetAttribute);
  FN(cublasLtMatrixLayoutCreate);
  FN(cublasLtMatrixLayoutDestroy);
  FN(cublasLtMatrixLayoutSetAttribute);
  FN(cublasLtMatmulPreferenceCreate);
  FN(cublasLtMatmulPreferenceDestroy);
  FN(cublasLtMatmulPreferenceSetAttribute);
  FN(cublasLtMatmulAlgoGetHeuristic);
  FN(cublasLtMatmul);
  FN(cublasLtGetStatusString);
  void *nccl;
  FN(ncclGetUniqueId);
  FN(ncclCommInitAll);
  FN(ncclCommInitRank);
  FN(ncclCommSplit);
  FN(ncclCommDestroy);
  FN(ncclCommAbort);
  /* NCCL 2.27 and later; NULL where the library lacks it (the survivors of a failure then get a
   * new ncclCommInitAll). Typed here, not from nccl.h: older headers do not declare it. */
  ncclResult_t (*ncclCommShrink)(ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int);
  FN(ncclAllReduce);
  FN(ncclSend);
  FN(ncclRecv);
  FN(ncclGroupStart);
  FN(ncclGroupEnd);
  FN(ncclGetErrorString);
  FN(ncclCommGetAsyncError); /* optional: NULL where the library lacks it */
  FN(ncclCommInitRankConfig); /* optional (NCCL 2.14): non-blocking communicators need it */
} cu;

/* The last NCCL call that failed, by the NC macro (ntp_cuda_peer_lost reads it). */
static ncclResult_t nccl_last = ncclSuccess;
#undef FN

/* NCCL only when ranks sit on separate GPUs. */
static int load_nccl(char *err, size_t cap) {
  if (cu.nccl) return 0;
  const char *names[] = {getenv("NTP_NCCL_LIB"), "libnccl.so.2", "libnccl.so"};
  for (size_t i = 0; i < 3 && !cu.nccl; i++)
    if (names[i] && *names[i]) cu.nccl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!cu.nccl) {
    snprintf(err, cap, "NCCL is not installed (libnccl.so.2 not found; set NTP_NCCL_LIB)");
    return -1;
  }
#define GETN(name)                                                   \
  if (!(*(void **)&cu.name = dlsym(cu.nccl, #name))) {              \
    snprintf(err, cap, "libnccl lacks %s (NCCL 2.18 or later is needed)", #name); \
    cu.nccl = NULL;                                                  \
    return -1;                                                       \
  }
  GETN(ncclGetUniqueId) GETN(ncclCommInitAll) GETN(ncclCommInitRank) GETN(ncclCommSplit) GETN(ncclCommDestroy)
  GETN(ncclCommAbort) GETN(ncclAllReduce) GETN(ncclSend) GETN(ncclRecv) GETN(ncclGroupStart) GETN(ncclGroupEnd) GETN(ncclGetErrorString)
#undef GETN
  *(void **)&cu.ncclCommShrink = dlsym(cu.nccl, "ncclCommShrink"); /* optional */
  *(void **)&cu.ncclCommGetAsyncError = dlsym(cu.nccl, "ncclCommGetAsyncError");
  *(void **)&cu.ncclCommInitRankConfig = dlsym(cu.nccl, "ncclCommInitRankConfig");
  return 0;
}

static int load_libs(char *err, size_t cap) {
  if (cu.rt) return 0;
  /* NTP_CUDART_LIB / NTP_CUBLASLT_LIB name other libraries (the emulated GPU of tests/emu) */
  const char *rts[] = {getenv("NTP_CUDART_LIB"), "libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  const char *lts[] = {getenv("NTP_CUBLASLT_LIB"), "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  for (size_t i = 0; i < 4 && !cu.rt; i++)
    if (rts[i] && *rts[i]) cu.rt = dlopen(rts[i], RTLD_NOW | RTLD_LOCAL);
  for (size_t i = 0; i < 4 && !cu.lt; i++)
    if (lts[i] && *lts[i]) cu.lt = dlopen(lts[i], RTLD_NOW | RTLD_LOCAL);
  if (!cu.rt || !cu.lt) {
    snprintf(err, cap, "the CUDA runtime libraries are not installed (libcudart / libcublasLt not found; "
                       "NTP_CUDART_LIB and NTP_CUBLASLT_LIB name them)");
    return -1;
  }
#define GET(lib, name)                                                            \
  if (!(*(void **)&cu.name = dlsym(cu.lib, #name))) {                             \
    snprintf(err, cap, "%s lacks %s (CUDA 12 or later is needed)", #lib, #name);  \
    cu.rt = NULL;                                                                 \
    return -1;                                                                    \
  }
  GET(rt, cudaGetDeviceCount) GET(rt, cudaSetDevice) GET(rt, cudaDeviceGetAttribute) GET(rt, cudaMalloc)
  GET(rt, cudaFree) GET(rt, cudaMemcpy) GET(rt, cudaMemsetAsync) GET(rt, cudaStreamCreate)
  GET(rt, cudaStreamDestroy) GET(rt, cudaStreamSynchronize) GET(rt, cudaStreamQuery) GET(rt, cudaGetErrorString)
  GET(rt, cudaLibraryLoadData) GET(rt, cudaLibraryUnload) GET(rt, cudaLibraryGetKernel) GET(rt, cudaLaunchKernel)
  GET(rt, cudaEventCreate) GET(rt, cudaEventCreateWithFlags) GET(rt, cudaEventRecord) GET(rt, cudaStreamWaitEvent) GET(rt, cudaEventSynchronize) GET(rt, cudaEventElapsedTime)
  GET(rt, cudaEventDestroy) GET(rt, cudaPointerGetAttributes)
  GET(rt, cudaStreamBeginCapture) GET(rt, cudaStreamEndCapture) GET(rt, cudaGraphInstantiate) GET(rt, cudaGraphLaunch)
  GET(rt, cudaGraphExecDestroy) GET(rt, cudaGraphDestroy)
  GET(lt, cublasLtCreate) GET(lt, cublasLtDestroy) GET(lt, cublasLtMatmulDescCreate) GET(lt, cublasLtMatmulDescDestroy)
  GET(lt, cublasLtMatmulDescSetAttribute) GET(lt, cublasLtMatrixLayoutCreate) GET(lt, cublasLtMatrixLayoutDestroy)
  GET(lt, cublasLtMatrixLayoutSetAttribute) GET(lt, cublasLtMatmulPreferenceCreate)
  GET(lt, cublasLtMatmulPreferenceDestroy) GET(lt, cublasLtMatmulPreferenceSetAttribute)
  GET(lt, cublasLtMatmulAlgoGetHeuristic) GET(lt, cublasLtMatmul) GET(lt, cublasLtGetStatusString)
#undef GET
  return 0;
}

/* CUDA and cuBLAS failures become messages with the call and its place. */
#define CU(call)                                                                                          \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    if (e_ != cudaSuccess) {                                                                              \
      snprintf(err, cap, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cu.cudaGetErrorString(e_));          \
      goto fail;                                                                                          \
    }                                                                                                     \
  } while (0)
/* A non-blocking communicator's call may return ncclInProgress: NCCL then wants
 * ncclCommGetAsyncError to say ncclSuccess before the next call (settle, below). */
#define NC(call)                                                                                          \
  do {                                                                                                    \
    ncclResult_t n_ = (call);                                                                             \
    if (n_ == ncclInProgress) n_ = settle(c, err, cap) == 0 ? ncclSuccess : nccl_last;                     \
    if (n_ != ncclSuccess) {                                                                              \
      nccl_last = n_;                                                                                     \
      snprintf(err, cap, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cu.ncclGetErrorString(n_));          \
      goto fail;                                                                                          \
    }                                                                                                     \
  } while (0)
#define LT(call)                                                                                          \
  do {                                                                                                    \
    cublasStatus_t s_ = (call);                                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                    \
      snprintf(err, cap, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cu.cublasLtGetStatusString(s_));     \
      goto fail;                                                                                          \
    }                                                                                                     \
  } while (0)

int ntp_cuda_available(char *err, size_t cap) {
  if (load_libs(err, cap) != 0) return -1;
  int n = 0;
  cudaError_t e = cu.cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    snprintf(err, cap, "no CUDA GPU is available (%s)", e != cudaSuccess ? cu.cudaGetErrorString(e) : "0 devices");
    return -1;
  }
  return 0;
}

void *ntp_cuda_dl(const char *which, char *err, size_t cap) {
  if (!strcmp(which, "nccl")) return load_nccl(err, cap) == 0 ? cu.nccl : NULL;
  if (load_libs(err, cap) != 0) return NULL;
  return !strcmp(which, "cudart") ? cu.rt : !strcmp(which, "cublasLt") ? cu.lt : NULL;
}

/* ---- collectives on one GPU: three kernels over boxes ----------------------------------- */

typedef struct box_geom {
  int64_t n;
  int32_t nd, esize;
  int64_t len[NTP_MAX_RANK], sstr[NTP_MAX_RANK], dstr[NTP_MAX_RANK], soff, doff;
} box_geom;

/* What the runtime's own kernels share: storage loads as float and round-to-nearest-even
 * stores, by dtype (0 bf16, 1 fp16, 2 fp32: ntp_dtype's numbers). */
#define RUNTIME_KERNEL_PRELUDE                                                      \
  "typedef long long i64; typedef unsigned short u16; typedef unsigned int u32;\n"  \
  NTP_CUDA_F16_CONVERSIONS                                                          \
  "__device__ float ldv(const unsigned char *p, int dt, i64 i) {\n"                \
  "  if (dt == 0) return __uint_as_float(((u32)((const u16 *)p)[i]) << 16);\n"     \
  "  if (dt == 1) return f16_to_f32(((const u16 *)p)[i]);\n"                       \
  "  return ((const float *)p)[i];\n"                                               \
  "}\n"                                                                            \
  "__device__ void stv(unsigned char *p, int dt, i64 i, float f) {\n"              \
  "  if (dt == 2) { ((float *)p)[i] = f; return; }\n"                               \
  "  if (dt == 1) { ((u16 *)p)[i] = f32_to_f16(f); return; }\n"                     \
  "  u32 u = __float_as_uint(f);\n"                                                 \
  "  if ((u & 0x7fffffffu) > 0x7f800000u) { ((u16 *)p)[i] = (u16)((u >> 16) | 0x40u); return; }\n" \
  "  u += 0x7fffu + ((u >> 16) & 1u); ((u16 *)p)[i] = (u16)(u >> 16);\n"            \
  "}\n"

static const char comm_src[] =
    RUNTIME_KERNEL_PRELUDE
    "struct box_geom { i64 n; int nd, esize; i64 len[6], sstr[6], dstr[6], soff, doff; };\n"
    "__device__ void offsets(const box_geom &g, i64 i, i64 *so, i64 *dd) {\n"
    "  i64 s = g.soff, d = g.doff;\n"
    "  for (int k = g.nd - 1; k >= 0; k--) { i64 c = i % g.len[k]; i /= g.len[k]; s += c * g.sstr[k]; d += c * g.dstr[k]; }\n"
    "  *so = s; *dd = d;\n"
    "}\n"
    "extern \"C\" __global__ void ntp_copy_box(const unsigned char *src, unsigned char *dst, box_geom g) {\n"
    "  i64 i = (i64)blockIdx.x * 256 + threadIdx.x; if (i >= g.n) return;\n"
    "  i64 s, d; offsets(g, i, &s, &d);\n"
    "  if (g.esize == 2) ((u16 *)dst)[d] = ((const u16 *)src)[s]; else ((u32 *)dst)[d] = ((const u32 *)src)[s];\n"
    "}\n"
    "extern \"C\" __global__ void ntp_acc_box(const unsigned char *src, float *acc, int dt, box_geom g) {\n"
    "  i64 i = (i64)blockIdx.x * 256 + threadIdx.x; if (i >= g.n) return;\n"
    "  i64 s, d; offsets(g, i, &s, &d);\n"
    "  acc[d] += ldv(src, dt, s);\n"
    "}\n"
    "extern \"C\" __global__ void ntp_store_acc(const float *acc, unsigned char *dst, int dt, i64 n) {\n"
    "  i64 i = (i64)blockIdx.x * 256 + threadIdx.x; if (i >= n) return;\n"
    "  stv(dst, dt, i, acc[i]);\n"
    "}\n";

/* ---- the optimizer's kernels (ntp_cuda_sumsq, ntp_cuda_adamw): AdamW on a parameter slice in
 * place, as train.c does on the host, and the sum of squares of a gradient over the elements a
 * mask marks (the global norm counts each element once, on its first holder) ---- */
static const char opt_src[] =
    RUNTIME_KERNEL_PRELUDE
    "extern \"C\" __global__ void __launch_bounds__(256) ntp_sumsq(const unsigned char *g, int dt, const unsigned char *mask, i64 n, float *partial) {\n"
    "  __shared__ float sh[256];\n"
    "  float s = 0.0f;\n"
    "  for (i64 i = (i64)blockIdx.x * 256 + threadIdx.x; i < n; i += (i64)gridDim.x * 256)\n"
    "    if (mask[i]) { float x = ldv(g, dt, i); s += x * x; }\n"
    "  sh[threadIdx.x] = s;\n"
    "  __syncthreads();\n"
    "  for (int w = 128; w > 0; w >>= 1) { if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w]; __syncthreads(); }\n"
    "  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];\n"
    "}\n"
    "struct adamw_h { float lr, b1, b2, c1, c2, eps, wd, scale; };\n"
    "extern \"C\" __global__ void __launch_bounds__(256) ntp_adamw(unsigned char *p, int dt, const unsigned char *g, int gdt, float *w, float *m, float *v, i64 n, adamw_h h) {\n"
    "  i64 i = (i64)blockIdx.x * 256 + threadIdx.x; if (i >= n) return;\n"
    "  float ge = g ? ldv(g, gdt, i) * h.scale : 0.0f;\n"
    "  float mm = h.b1 * m[i] + (1.0f - h.b1) * ge, vv = h.b2 * v[i] + (1.0f - h.b2) * ge * ge;\n"
    "  m[i] = mm; v[i] = vv;\n"
    "  float x = w[i];\n"
    "  x -= h.lr * ((mm / h.c1) / (sqrtf(vv / h.c2) + h.eps) + h.wd * x);\n"
    "  w[i] = x;\n"
    "  stv(p, dt, i, x);\n"
    "}\n";
enum { OPT_PARTIALS = 1024 }; /* blocks of ntp_sumsq */

/* What a heuristic's answer depends on: one query per distinct key (the model's GEMMs repeat a
 * few shapes layer after layer), shared by the ranks of one GPU. */
typedef struct gemm_shape {
  int64_t n, cols, k, batch; /* column-major D is n x cols, over k, in batch strided batches */
  int32_t trans, dtype, epilogue, bias_dtype;
  int device;
} gemm_shape;

static bool same_shape(const gemm_shape *x, const gemm_shape *y) {
  return x->n == y->n && x->cols == y->cols && x->k == y->k && x->batch == y->batch && x->trans == y->trans &&
         x->dtype == y->dtype && x->epilogue == y->epilogue && x->bias_dtype == y->bias_dtype && x->device == y->device;
}

typedef struct gemm {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulHeuristicResult_t algo;
  gemm_shape shape; /* the heuristic's answer is reused for every GEMM of the same shape */
  bool ready;
  bool queried;     /* this GEMM's shape was asked of the heuristic (the first of its shape) */
} gemm;

struct ntp_cuda {
  const ntp_program *p;
  const ntp_rank_code *cuda;
  bool nccl;              /* ranks on separate GPUs, collectives through NCCL; else loopback */
  int rank_lo, rank_hi;   /* the ranks this process runs */
  int *dev;               /* per rank: its GPU */
  cudaStream_t *stream;   /* per rank (loopback: all the same stream): compute, in the launch order */
  cudaStream_t *comm;     /* per rank (loopback: one): collectives, overlapping compute (comm_deps.h);
                           * the compute stream itself with NTP_CUDA_OVERLAP=0 */
  bool overlap;
  ntp_footprints fp;       /* every launch's and collective's bytes (comm_deps.h) */
  ntp_launch_order order;  /* the enqueue order after the initialisation steps (launch_order.h; step order without overlap) */
  ntp_comm_deps deps;      /* in that order */
  ntp_overlap_count overlap_now, overlap_before; /* for ntp_cuda_overlap_summary */
  cudaEvent_t *fork;      /* per rank: the compute stream's point a collective starts after */
  cudaEvent_t *done;      /* [step * world + rank], collectives only: the collective's end on that rank */
  cudaEvent_t *join;      /* per rank: the comm stream's end of the step list */
  cublasLtHandle_t *lt;   /* per rank (loopback: shared) */
  void **workspace;       /* per rank (loopback: shared): the most its GEMMs' algorithms need */
  size_t *workspace_size;
  size_t workspace_cap;   /* the most an algorithm may ask for (NTP_CUBLASLT_WORKSPACE) */
  unsigned char **arena, **persist, **staging; /* per rank, device memory */
  size_t *staging_bytes;
  cudaLibrary_t *lib;     /* per rank */
  cudaKernel_t **kern;    /* per rank, per kernel */
  cudaLibrary_t comm_lib;
  cudaKernel_t k_copy, k_acc, k_store;
  cudaLibrary_t opt_lib; /* the optimizer's kernels, loaded at the first use */
  cudaKernel_t k_sumsq, k_adamw;
  int arch;
  float **partials;      /* per rank: ntp_sumsq's block sums */
  void **bufs;           /* ntp_cuda_alloc's, freed with c */
  int *buf_dev;
  size_t nbufs, cap_bufs;
  float *scratch;         /* loopback reductions */
  gemm *gemms;            /* per step (GEMM steps only) */
  bool *filled;
  cudaEvent_t ev0, ev1;
  /* nccl */
  ncclComm_t *world;      /* per rank */
  int nsets;              /* distinct rank sets of reductions */
  int32_t **sets;
  int *set_len;
  ncclComm_t **group;     /* [rank][set], NULL where the rank is not a member */
  int *step_set;          /* per step: the set of its reduction */
  bool own_world;
  bool nonblocking;       /* its communicators' calls may return ncclInProgress (ncclConfig_t.blocking = 0) */
  bool wait_failed;       /* a wait saw a lost peer or timed out: its communicators are aborted, not destroyed */
  ncclComm_t *settling;   /* a communicator being made outside c->world and c->group (the survivors' world):
                           * while set, settle() polls it alone */
  double nccl_timeout;    /* NTP_NCCL_TIMEOUT: seconds a wait may see no progress and no NCCL error */
  bool *dead;             /* per rank, after ntp_cuda_lose: failed with its GPU, never touched again */
  /* the step list captured as CUDA graphs, one per rank of this process (loopback: one) on its
   * compute stream, the comm stream forked into it and joined back, NCCL calls captured, and
   * replayed; captured again when the seed changes (the init kernels take it) or a value was set
   * (its init kernel is skipped); dropped by ntp_cuda_lose (they hold the old communicators) */
  bool graphs;
  bool no_graphs;         /* never: NCCL joins several GPUs of this process (ntp_cuda_create) */
  cudaGraphExec_t *graph; /* per rank */
  uint64_t graph_seed;
  bool graph_stale;
  /* profiling (ntp_cuda_profile_layers): an event where the step list enters another layer */
  bool profile;
  cudaEvent_t *prof_ev;  /* [n_steps + 1] */
  int32_t *prof_layer;   /* [n_steps + 1]: the layer of the steps after event i */
  int nprof;             /* events recorded in the last run */
  double host_s, host_graph_s, host_direct_s; /* the last run's host time to enqueue its work; by mode */
};
/* the ranks that own a compute stream here (loopback: the first) */
static bool stream_owner(const ntp_cuda *c, int r) { return c->nccl || r == c->rank_lo; }
static int settle(ntp_cuda *c, char *err, size_t cap);

/* ---- waiting on NCCL: polled, never blocking ---------------------------------------------------
 * NCCL's guide ("Asynchronous errors", "Fault tolerance"): an operation whose peer died "will
 * usually not progress and never complete", so cudaStreamSynchronize on it never returns; the
 * error shows only through ncclCommGetAsyncError, per communicator. Every wait here polls
 * cudaStreamQuery together with the async error of every communicator of this process, and gives
 * up after NTP_NCCL_TIMEOUT seconds (default 600) with no progress and no error (a peer stopped,
 * or too slow). After a failed wait the communicators are aborted, never destroyed. */

static double host_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* the set of ranks of communicator k of rank r ("the world" for k < 0), for messages */
static void comm_name(const ntp_cuda *c, int r, int k, char *out, size_t cap) {
  if (k < 0) {
    snprintf(out, cap, "rank %d's world communicator", r);
    return;
  }
  size_t n = (size_t)snprintf(out, cap, "rank %d's communicator of ranks {", r);
  for (int i = 0; i < c->set_len[k] && n < cap; i++) n += (size_t)snprintf(out + n, cap - n, "%s%d", i ? "," : "", c->sets[k][i]);
  if (n < cap) snprintf(out + n, cap - n, "}");
}

/* One look at every communicator of this process: 1 while some call is still in progress, 0
 * when all are settled and well, -1 (err, nccl_last) when one reports an error. */
static int comms_state(ntp_cuda *c, char *err, size_t cap) {
  if (!c->nccl || !cu.ncclCommGetAsyncError) return 0;
  int busy = 0;
  if (c->settling) { /* a failover's new world: the old communicators are being aborted */
    ncclResult_t a = ncclSuccess;
    if (*c->settling && cu.ncclCommGetAsyncError(*c->settling, &a) != ncclSuccess) a = ncclInternalError;
    if (a == ncclInProgress || a == ncclSuccess) return a == ncclInProgress;
    nccl_last = a;
    snprintf(err, cap, "NCCL reports %s on rank %d's new world communicator (ncclCommGetAsyncError)",
             cu.ncclGetErrorString(a), c->rank_lo);
    return -1;
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++) {
    if (c->dead && c->dead[r]) continue;
    for (int k = -1; k < c->nsets; k++) {
      ncclComm_t m = k < 0 ? (c->world ? c->world[r] : NULL) : c->group && c->group[r] ? c->group[r][k] : NULL;
      if (!m) continue;
      ncclResult_t a = ncclSuccess;
      if (cu.ncclCommGetAsyncError(m, &a) != ncclSuccess) a = ncclInternalError;
      if (a == ncclInProgress) busy = 1;
      else if (a != ncclSuccess) {
        char name[256];
        comm_name(c, r, k, name, sizeof name);
        nccl_last = a;
        c->wait_failed = true;
        snprintf(err, cap, "NCCL reports %s on %s (ncclCommGetAsyncError)", cu.ncclGetErrorString(a), name);
        return -1;
      }
    }
  }
  return busy;
}

/* a moment's pause in a polled wait: a yield at first, then sleeps growing to 1 ms */
static void poll_pause(int spins) {
  if (spins < 64) {
    sched_yield();
    return;
  }
  long ns = spins < 128 ? 50000L : spins < 256 ? 200000L : 1000000L;
  nanosleep(&(struct timespec){0, ns}, NULL);
}

/* Until no communicator's call is in progress (a non-blocking one returned ncclInProgress). */
static int settle(ntp_cuda *c, char *err, size_t cap) {
  if (!c) {
    nccl_last = ncclInternalError;
    snprintf(err, cap, "internal: ncclInProgress from a call outside a communicator");
    return -1;
  }
  double t0 = host_now();
  for (int spins = 0;; spins++) {
    int st = comms_state(c, err, cap);
    if (st <= 0) return st;
    if (host_now() - t0 > c->nccl_timeout) {
      nccl_last = ncclInProgress;
      c->wait_failed = true;
      snprintf(err, cap, "a non-blocking NCCL call of rank %d was still in progress after %g s (NTP_NCCL_TIMEOUT): a "
               "peer never joined", c->rank_lo, c->nccl_timeout);
      return -1;
    }
    poll_pause(spins);
  }
}

/* Until the streams of ranks [lo, hi) of this process have done their work. */
static int wait_ranks(ntp_cuda *c, int lo, int hi, char *err, size_t cap) {
  if (!c->nccl) { /* loopback: no peer to lose */
    for (int r = lo; r < hi; r++) {
      if (!stream_owner(c, r)) continue;
      CU(cu.cudaSetDevice(c->dev[r]));
      CU(cu.cudaStreamSynchronize(c->stream[r]));
    }
    return 0;
  }
  double t0 = host_now();
  for (int spins = 0;; spins++) {
    bool busy = false;
    for (int r = lo; r < hi; r++) {
      if ((c->dead && c->dead[r]) || !c->stream[r]) continue;
      CU(cu.cudaSetDevice(c->dev[r]));
      cudaError_t e = cu.cudaStreamQuery(c->stream[r]);
      if (e == cudaErrorNotReady) busy = true;
      else CU(e);
    }
    if (!busy) return 0;
    if (comms_state(c, err, cap) < 0) return -1;
    if (host_now() - t0 > c->nccl_timeout) {
      c->wait_failed = true;
      snprintf(err, cap, "rank %d's work made no progress for %g s (NTP_NCCL_TIMEOUT) and NCCL reported no error: a "
               "peer is stopped or too slow", lo, c->nccl_timeout);
      return -1;
    }
    poll_pause(spins);
  }
fail:
  return -1;
}
static int wait_streams(ntp_cuda *c, char *err, size_t cap) { return wait_ranks(c, c->rank_lo, c->rank_hi, err, cap); }


static bool local_rank(const ntp_cuda *c, int r) { return r >= c->rank_lo && r < c->rank_hi; }
static void abandon(void *handle); /* a failed GPU's handle, never to be touched */

static unsigned char *dev_ptr(const ntp_cuda *c, int32_t t) {
  const ntp_tensor *s = &c->p->tensors[t];
  return (s->persistent ? c->persist[s->rank] : c->arena[s->rank]) + s->offset;
}

static cudaDataType_t cuda_type(ntp_dtype dt) {
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
  LT(cu.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (cs->bias >= 0) {
    const void *bias = dev_ptr(c, cs->bias);
    LT(cu.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  if (cs->bias >= 0 && (cs->epilogue == CG_EPI_BIAS || cs->epilogue == CG_EPI_GELU_BIAS)) {
    cudaDataType_t bt = cuda_type(c->p->tensors[cs->bias].dtype);
    LT(cu.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  if (cs->aux >= 0) {
    const void *aux = dev_ptr(c, cs->aux);
    int64_t ld = N;
    LT(cu.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    LT(cu.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
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
static int gemm_setup(ntp_cuda *c, const ntp_step *st, const cg_step *cs, gemm *g, char *err, size_t cap) {
  const ntp_tensor *ta = &c->p->tensors[st->op.args[0]], *tb = &c->p->tensors[st->op.args[1]];
  ntp_shape as = box_shape(&ta->box), bs = box_shape(&tb->box);
  bool tr = st->op.attr.mm.trans_b, ta_ = st->op.attr.mm.trans_a;
  int64_t K = as.dim[as.ndim - (ta_ ? 2 : 1)];
  int64_t M = ta_ ? as.dim[as.ndim - 1] : as.ndim >= 2 ? as.dim[as.ndim - 2] : 1;
  int64_t N = bs.dim[bs.ndim - (tr ? 2 : 1)], batch = shape_numel(&as) / (M * K);
  bool bbatch = bs.ndim > 2 || (ta_ && batch > 1);
  int64_t cols = bbatch ? M : M * batch; /* a shared right operand: the batch folds into M */
  cudaDataType_t t = cuda_type(ta->dtype);
  cublasOperation_t opa = tr ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta_ ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT(cu.cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT(cu.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  LT(cu.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  if (gemm_epilogue(c, cs, g, N, err, cap) != 0) goto fail;
  LT(cu.cublasLtMatrixLayoutCreate(&g->a, t, (uint64_t)(tr ? K : N), (uint64_t)(tr ? N : K), tr ? K : N));
  if (ta_) LT(cu.cublasLtMatrixLayoutCreate(&g->b, t, (uint64_t)M, (uint64_t)K, M));
  else LT(cu.cublasLtMatrixLayoutCreate(&g->b, t, (uint64_t)K, (uint64_t)cols, K));
  LT(cu.cublasLtMatrixLayoutCreate(&g->c, t, (uint64_t)N, (uint64_t)cols, N));
  if (bbatch) {
    int32_t count = (int32_t)batch;
    int64_t sa = bs.ndim > 2 ? K * N : 0, sb = M * K, sc = M * N;
    LT(cu.cublasLtMatrixLayoutSetAttribute(g->a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    LT(cu.cublasLtMatrixLayoutSetAttribute(g->a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof sa));
    LT(cu.cublasLtMatrixLayoutSetAttribute(g->b, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    LT(cu.cublasLtMatrixLayoutSetAttribute(g->b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb));
    LT(cu.cublasLtMatrixLayoutSetAttribute(g->c, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    LT(cu.cublasLtMatrixLayoutSetAttribute(g->c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc));
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
  LT(cu.cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = c->workspace_cap;
  LT(cu.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  int found = 0;
  cublasStatus_t hs =
      cu.cublasLtMatmulAlgoGetHeuristic(c->lt[st->rank], g->op, g->a, g->b, g->c, g->c, pref, 1, &g->algo, &found);
  cu.cublasLtMatmulPreferenceDestroy(pref);
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

/* ---- attention as two GEMMs (the baseline the tiled kernel must beat) ------------------------ */

/* A column-major operand: rows x cols at leading dimension ld, batch `count` at `stride` elements. */
typedef struct lt_mat {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld, stride;
} lt_mat;

static int lt_layout(cublasLtMatrixLayout_t *l, lt_mat m, int32_t count, char *err, size_t cap) {
  LT(cu.cublasLtMatrixLayoutCreate(l, m.type, m.rows, m.cols, m.ld));
  LT(cu.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
  LT(cu.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.stride, sizeof m.stride));
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
  LT(cu.cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT(cu.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  LT(cu.cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  if (lt_layout(&g->a, A, count, err, cap) || lt_layout(&g->b, B, count, err, cap) || lt_layout(&g->c, D, count, err, cap))
    return -1;
  cublasLtMatmulPreference_t pref;
  LT(cu.cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = c->workspace_cap;
  LT(cu.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  LT(cu.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0], sizeof align[0]));
  LT(cu.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1], sizeof align[1]));
  LT(cu.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2], sizeof align[2]));
  LT(cu.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2], sizeof align[2]));
  int found = 0;
  cublasStatus_t hs = cu.cublasLtMatmulAlgoGetHeuristic(c->lt[r], g->op, g->a, g->b, g->c, g->c, pref, 1, &g->algo, &found);
  cu.cublasLtMatmulPreferenceDestroy(pref);
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

static int attention_gemm_setup(ntp_cuda *c, size_t s, char *err, size_t cap) {
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
  cudaDataType_t t = cuda_type(c->p->tensors[st->op.args[0]].dtype);
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

/* The step's launch of kernel `kernel` (its own or its first pass) with its argument block. */
static int launch_step_kernel(ntp_cuda *c, int r, const cg_step *cs, int32_t kernel, int64_t grid, uint64_t seed, char *err,
                              size_t cap) {
  unsigned char *a = c->arena[r], *pp = c->persist[r];
  struct { long long v[CG_MAX_ARGS]; } block_args = {{0}}; /* the kernel's struct ntp_args */
  memcpy(block_args.v, c->cuda[r].args + cs->arg0, (size_t)cs->nargs * sizeof block_args.v[0]);
  void *args[] = {&a, &pp, &seed, &block_args};
  CU(cu.cudaLaunchKernel((const void *)c->kern[r][kernel], (dim3){(unsigned)grid, 1, 1}, (dim3){(unsigned)cs->block, 1, 1},
                         args, (size_t)cs->smem, c->stream[r]));
  return 0;
fail:
  return -1;
}

/* Scores for every batch, the softmax kernel over all of them, then the products with V. */
static int run_attention_gemm(ntp_cuda *c, size_t s, const cg_step *cs, uint64_t seed, char *err, size_t cap) {
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
      LT(cu.cublasLtMatmul(c->lt[r], qk->op, &one, k, qk->a, q, qk->b, &zero, sc, qk->c, sc, qk->c, &qk->algo.algo,
                           c->workspace[r], qk->algo.workspaceSize, c->stream[r]));
    }
  if (launch_step_kernel(c, r, cs, cs->kernel, cs->grid, seed, err, cap) != 0) return -1;
  for (int64_t b = 0; b < a.B; b++)
    for (int64_t j = 0; j < a.G; j++) {
      unsigned char *v = dev_ptr(c, st->op.args[2]) + b * kvrow + first, *y = dev_ptr(c, st->op.result) + b * qrow + j * a.HD * a.es;
      unsigned char *pr = scratch + probs_at + (b * a.H + j) * a.S * a.S * a.es;
      LT(cu.cublasLtMatmul(c->lt[r], pv->op, &one, v, pv->a, pr, pv->b, &zero, y, pv->c, y, pv->c, &pv->algo.algo,
                           c->workspace[r], pv->algo.workspaceSize, c->stream[r]));
    }
  return 0;
fail:
  return -1;
}

static box_geom geometry(const ntp_box *x, const ntp_box *src, const ntp_box *dst, int esize) {
  box_geom g = {.nd = x->ndim, .esize = esize, .n = box_volume(x)};
  int64_t ss = 1, ds = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    g.len[d] = x->hi[d] - x->lo[d];
    g.sstr[d] = ss;
    g.dstr[d] = ds;
    g.soff += (x->lo[d] - src->lo[d]) * ss;
    g.doff += (x->lo[d] - dst->lo[d]) * ds;
    ss *= src->hi[d] - src->lo[d];
    ds *= dst->hi[d] - dst->lo[d];
  }
  if (x->ndim == 0) {
    g.nd = 1;
    g.len[0] = 1;
  }
  return g;
}

static int launch(cudaKernel_t k, int64_t n, void **args, cudaStream_t stream, char *err, size_t cap) {
  if (n <= 0) return 0;
  CU(cu.cudaLaunchKernel((const void *)k, (dim3){(unsigned)((n + 255) / 256), 1, 1}, (dim3){256, 1, 1}, args, 0, stream));
  return 0;
fail:
  return -1;
}

/* copy box x of tensor src (at sp) into tensor dst (at dp), on the given stream */
static int copy_box(ntp_cuda *c, const ntp_box *x, const ntp_box *sbox, unsigned char *sp, const ntp_box *dbox,
                    unsigned char *dp, ntp_dtype dt, cudaStream_t stream, char *err, size_t cap) {
  box_geom g = geometry(x, sbox, dbox, (int)dtype_bytes(dt));
  void *args[] = {&sp, &dp, &g};
  return launch(c->k_copy, g.n, args, stream, err, cap);
}

/* Loopback: every rank on one GPU; copies and fp32 reductions as kernels. */
static int run_comm_loopback(ntp_cuda *c, const ntp_step *st, char *err, size_t cap) {
  const ntp_program *p = c->p;
  cudaStream_t stream = c->comm[0];
  if (st->comm != COMM_ALL_REDUCE && st->comm != COMM_REDUCE_SCATTER) {
    for (size_t i = 0; i < st->nxfers; i++) {
      const ntp_xfer *x = &st->xfers[i];
      const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
      if (copy_box(c, &x->box, &s->box, dev_ptr(c, x->src), &d->box, dev_ptr(c, x->dst), s->dtype, stream, err, cap))
        return -1;
    }
    return 0;
  }
  for (size_t i = 0; i < st->nxfers; i++) {
    int32_t dst = st->xfers[i].dst;
    bool first = true;
    for (size_t j = 0; j < i; j++) first &= st->xfers[j].dst != dst;
    if (!first) continue;
    const ntp_tensor *d = &p->tensors[dst];
    int64_t n = box_volume(&d->box);
    CU(cu.cudaMemsetAsync(c->scratch, 0, (size_t)n * sizeof(float), stream));
    int dt = (int)d->dtype;
    for (size_t j = i; j < st->nxfers; j++) {
      if (st->xfers[j].dst != dst) continue;
      const ntp_tensor *s = &p->tensors[st->xfers[j].src];
      box_geom g = geometry(&st->xfers[j].box, &s->box, &d->box, 4);
      unsigned char *sp = dev_ptr(c, st->xfers[j].src);
      void *args[] = {&sp, &c->scratch, &dt, &g};
      if (launch(c->k_acc, g.n, args, stream, err, cap)) return -1;
    }
    unsigned char *dp = dev_ptr(c, dst);
    void *args[] = {&c->scratch, &dp, &dt, &n};
    if (launch(c->k_store, n, args, stream, err, cap)) return -1;
  }
  return 0;
fail:
  return -1;
}

static ncclDataType_t nccl_type(ntp_dtype dt) {
  return dt == NTP_BF16 ? ncclBfloat16 : dt == NTP_FP16 ? ncclFloat16 : dt == NTP_FP32 ? ncclFloat32 : ncclInt32;
}

/* Is a reduction step what ncclAllReduce computes: every member adds its whole part (one source
 * per member, all of the same box), and each destination, inside that box, receives exactly one
 * box from every member? The forward's reductions are; the backward's adjoints (gradients of
 * gathered or redistributed pieces summed back at their sources, a parameter's gradient summed
 * over the cells of replicas that split it differently) in general are not. */
static bool symmetric_reduction(const ntp_program *p, const ntp_step *st) {
  if (st->nxfers == 0) return true;
  const ntp_box *whole = &p->tensors[st->xfers[0].src].box;
  int own = 0;
  for (size_t i = 0; i < st->nxfers; i++) {
    const ntp_xfer *x = &st->xfers[i];
    const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
    if (!box_eq(&s->box, whole) || !box_eq(&x->box, &d->box) || !box_contains(whole, &d->box)) return false;
    int from = 0;
    for (size_t j = 0; j < st->nxfers; j++) {
      if (st->xfers[j].dst != x->dst) continue;
      from++;
      for (size_t k = 0; k < j; k++) /* two boxes from one rank into one destination */
        if (st->xfers[k].dst == x->dst && p->tensors[st->xfers[k].src].rank == p->tensors[st->xfers[j].src].rank)
          return false;
    }
    if (from != st->nranks) return false;
    if (s->rank == d->rank) own++;
    for (size_t j = 0; j < i; j++) /* one source tensor per rank */
      if (p->tensors[st->xfers[j].src].rank == s->rank && st->xfers[j].src != x->src) return false;
  }
  return own == st->nranks;
}

/* Every transfer between two ranks of a step: its box packed into the sender's staging (from
 * used[sender] on: at[i]) and sent; received into the receiver's staging (from used[receiver]
 * on: recv_at[i]), in one group of NCCL calls. Transfers within a rank are the caller's. */
static int exchange_remote(ntp_cuda *c, const ntp_step *st, size_t *used, size_t *at, size_t *recv_at, char *err,
                           size_t cap) {
  const ntp_program *p = c->p;
  for (size_t i = 0; i < st->nxfers; i++) {
    const ntp_xfer *x = &st->xfers[i];
    const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
    if (s->rank == d->rank || !local_rank(c, s->rank)) continue;
    int r = s->rank;
    at[i] = used[r];
    used[r] += ((size_t)box_volume(&x->box) * dtype_bytes(s->dtype) + 255) / 256 * 256;
    CU(cu.cudaSetDevice(c->dev[r])); /* pack into the sender's staging */
    ntp_box packed = x->box;
    if (copy_box(c, &x->box, &s->box, dev_ptr(c, x->src), &packed, c->staging[r] + at[i], s->dtype, c->comm[r], err,
                 cap))
      return -1;
  }
  NC(cu.ncclGroupStart());
  for (size_t i = 0; i < st->nxfers; i++) {
    const ntp_xfer *x = &st->xfers[i];
    const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
    if (s->rank == d->rank) continue;
    size_t n = (size_t)box_volume(&x->box);
    if (local_rank(c, s->rank)) {
      CU(cu.cudaSetDevice(c->dev[s->rank]));
      NC(cu.ncclSend(c->staging[s->rank] + at[i], n, nccl_type(s->dtype), d->rank, c->world[s->rank], c->comm[s->rank]));
    }
    if (local_rank(c, d->rank)) {
      int r = d->rank;
      recv_at[i] = used[r];
      used[r] += (n * dtype_bytes(s->dtype) + 255) / 256 * 256;
      CU(cu.cudaSetDevice(c->dev[r]));
      NC(cu.ncclRecv(c->staging[r] + recv_at[i], n, nccl_type(s->dtype), s->rank, c->world[r], c->comm[r]));
    }
  }
  NC(cu.ncclGroupEnd());
  return 0;
fail:
  return -1;
}

/* A reduction that is not symmetric_reduction's, on separate GPUs: every remote box is sent
 * packed to its destination's rank; each destination is then the sum, in the step's order of
 * transfers, of its boxes, in an fp32 accumulator at the start of the rank's staging — the
 * loopback's arithmetic in the loopback's order, so both modes give the same bits. */
static int reduce_by_exchange(ntp_cuda *c, const ntp_step *st, char *err, size_t cap) {
  const ntp_program *p = c->p;
  size_t *used = calloc((size_t)p->world, sizeof *used), *at = calloc(st->nxfers + 1, sizeof *at);
  size_t *recv_at = calloc(st->nxfers + 1, sizeof *recv_at);
  if (!used || !at || !recv_at) goto fail;
  for (size_t i = 0; i < st->nxfers; i++) { /* the accumulators: the largest destination of each rank */
    const ntp_tensor *d = &p->tensors[st->xfers[i].dst];
    size_t b = ((size_t)box_volume(&d->box) * sizeof(float) + 255) / 256 * 256;
    if (b > used[d->rank]) used[d->rank] = b;
  }
  if (exchange_remote(c, st, used, at, recv_at, err, cap) != 0) goto fail;
  for (size_t i = 0; i < st->nxfers; i++) {
    int32_t dst = st->xfers[i].dst;
    const ntp_tensor *d = &p->tensors[dst];
    bool first = true;
    for (size_t j = 0; j < i; j++) first &= st->xfers[j].dst != dst;
    if (!first || !local_rank(c, d->rank)) continue;
    int r = d->rank, dt = (int)d->dtype;
    int64_t n = box_volume(&d->box);
    float *acc = (float *)c->staging[r];
    CU(cu.cudaSetDevice(c->dev[r]));
    CU(cu.cudaMemsetAsync(acc, 0, (size_t)n * sizeof(float), c->comm[r]));
    for (size_t j = i; j < st->nxfers; j++) {
      const ntp_xfer *x = &st->xfers[j];
      if (x->dst != dst) continue;
      const ntp_tensor *s = &p->tensors[x->src];
      bool remote = s->rank != r;
      box_geom g = geometry(&x->box, remote ? &x->box : &s->box, &d->box, 4);
      unsigned char *sp = remote ? c->staging[r] + recv_at[j] : dev_ptr(c, x->src);
      void *args[] = {&sp, &acc, &dt, &g};
      if (launch(c->k_acc, g.n, args, c->comm[r], err, cap)) goto fail;
    }
    unsigned char *dp = dev_ptr(c, dst);
    void *args[] = {&acc, &dp, &dt, &n};
    if (launch(c->k_store, n, args, c->comm[r], err, cap)) goto fail;
  }
  free(used);
  free(at);
  free(recv_at);
  return 0;
fail:
  free(used);
  free(at);
  free(recv_at);
  if (!err[0]) snprintf(err, cap, "out of memory");
  return -1;
}

/* Separate GPUs: reductions are NCCL all-reduces in the group's communicator (an uneven
 * reduce-scatter reduces into staging and keeps its slice), or reduce_by_exchange's sums;
 * moves are grouped send/recv of packed boxes on the world communicator. */
static int run_comm_nccl(ntp_cuda *c, int32_t si, const ntp_step *st, char *err, size_t cap) {
  const ntp_program *p = c->p;
  size_t *used = NULL, *at = NULL, *recv_at = NULL;
  if ((st->comm == COMM_ALL_REDUCE || st->comm == COMM_REDUCE_SCATTER) && c->step_set[si] < 0)
    return reduce_by_exchange(c, st, err, cap);
  if (st->comm == COMM_ALL_REDUCE || st->comm == COMM_REDUCE_SCATTER) {
    int set = c->step_set[si];
    NC(cu.ncclGroupStart());
    for (size_t i = 0; i < st->nxfers; i++) {
      const ntp_xfer *x = &st->xfers[i];
      const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
      if (s->rank != d->rank || !local_rank(c, s->rank)) continue; /* one call per member: its own part */
      int r = s->rank;
      bool whole = box_eq(&d->box, &s->box);
      CU(cu.cudaSetDevice(c->dev[r]));
      NC(cu.ncclAllReduce(dev_ptr(c, x->src), whole ? dev_ptr(c, x->dst) : c->staging[r], (size_t)box_volume(&s->box),
                          nccl_type(s->dtype), ncclSum, c->group[r][set], c->comm[r]));
    }
    NC(cu.ncclGroupEnd());
    for (size_t i = 0; i < st->nxfers; i++) { /* slices of an uneven reduce-scatter */
      const ntp_xfer *x = &st->xfers[i];
      const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
      if (s->rank != d->rank || !local_rank(c, s->rank) || box_eq(&d->box, &s->box)) continue;
      CU(cu.cudaSetDevice(c->dev[s->rank]));
      if (copy_box(c, &d->box, &s->box, c->staging[s->rank], &d->box, dev_ptr(c, x->dst), s->dtype, c->comm[s->rank],
                   err, cap))
        return -1;
    }
    return 0;
  }
  /* pack what leaves, exchange, unpack what arrived; local moves are plain copies */
  used = calloc((size_t)p->world, sizeof *used);
  at = calloc(st->nxfers + 1, sizeof *at);
  recv_at = calloc(st->nxfers + 1, sizeof *recv_at);
  if (!used || !at || !recv_at) goto fail;
  for (size_t i = 0; i < st->nxfers; i++) {
    const ntp_xfer *x = &st->xfers[i];
    const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
    if (s->rank != d->rank || !local_rank(c, s->rank)) continue;
    CU(cu.cudaSetDevice(c->dev[s->rank]));
    if (copy_box(c, &x->box, &s->box, dev_ptr(c, x->src), &d->box, dev_ptr(c, x->dst), s->dtype, c->comm[s->rank],
                 err, cap))
      goto fail;
  }
  if (exchange_remote(c, st, used, at, recv_at, err, cap) != 0) goto fail;
  for (size_t i = 0; i < st->nxfers; i++) {
    const ntp_xfer *x = &st->xfers[i];
    const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
    if (s->rank == d->rank || !local_rank(c, d->rank)) continue;
    CU(cu.cudaSetDevice(c->dev[d->rank]));
    ntp_box packed = x->box;
    if (copy_box(c, &x->box, &packed, c->staging[d->rank] + recv_at[i], &d->box, dev_ptr(c, x->dst), s->dtype,
                 c->comm[d->rank], err, cap))
      goto fail;
  }
  free(recv_at);
  free(used);
  free(at);
  return 0;
fail:
  free(recv_at);
  free(used);
  free(at);
  return -1;
}

static int compute_capability(int dev, char *err, size_t cap) {
  int major = 0, minor = 0;
  CU(cu.cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CU(cu.cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major * 10 + minor;
fail:
  return -1;
}

static int load_image(const void *cubin, const char *name, cudaLibrary_t *lib, char *err, size_t cap) {
  cudaError_t e = cu.cudaLibraryLoadData(lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
  if (e != cudaSuccess) {
    snprintf(err, cap, "loading %s: %s", name, cu.cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

static int load_library(const char *src, const char *name, int arch, cudaLibrary_t *lib, char *err, size_t cap) {
  void *cubin;
  size_t size;
  int hit;
  if (ntp_jit_cubin(src, name, arch, &cubin, &size, &hit, err, cap) != 0) return -1;
  int rc = load_image(cubin, name, lib, err, cap);
  free(cubin);
  return rc;
}

/* The images of this process's ranks: each distinct source compiled once (ranks of the same
 * shapes have the same text), the distinct ones by a few threads at once (NVRTC is thread-safe,
 * cache writes are atomic). first[r]: the rank whose image rank r uses. Plain threads rather than
 * OpenMP: a process forked from one that used OpenMP could not start a parallel region. */
typedef struct compile_job {
  ntp_cuda *c;
  int arch, next; /* the next rank to take, under mu */
  void **cubin;
  const int *first;
  char (*errs)[512];
  pthread_mutex_t mu;
} compile_job;

static void *compile_worker(void *arg) {
  compile_job *j = arg;
  for (;;) {
    pthread_mutex_lock(&j->mu);
    int r = j->next++;
    pthread_mutex_unlock(&j->mu);
    if (r >= j->c->rank_hi) return NULL;
    if (j->first[r] != r) continue;
    char name[64];
    size_t size;
    int hit;
    snprintf(name, sizeof name, "%s.rank%d.cu", j->c->p->global.name, r);
    if (ntp_jit_cubin(j->c->cuda[r].source, name, j->arch, &j->cubin[r], &size, &hit, j->errs[r - j->c->rank_lo],
                      sizeof j->errs[0]) != 0)
      j->cubin[r] = NULL;
  }
}

static int compile_ranks(ntp_cuda *c, int arch, void **cubin, int *first, char *err, size_t cap) {
  int lo = c->rank_lo, hi = c->rank_hi, failed = -1, distinct = 0;
  compile_job j = {.c = c, .arch = arch, .next = lo, .cubin = cubin, .first = first,
                   .errs = calloc((size_t)(hi - lo) + 1, sizeof *j.errs)};
  if (!j.errs || ntp_nvrtc_load(err, cap) != 0) {
    free(j.errs);
    return -1;
  }
  for (int r = lo; r < hi; r++) {
    first[r] = r;
    for (int q = lo; q < r && first[r] == r; q++)
      if (!strcmp(c->cuda[q].source, c->cuda[r].source)) first[r] = q;
    distinct += first[r] == r;
  }
  pthread_mutex_init(&j.mu, NULL);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int nthreads = (int)(cpus < 1 ? 1 : cpus > 16 ? 16 : cpus);
  if (nthreads > distinct) nthreads = distinct;
  pthread_t th[16];
  int started = 0;
  for (int t = 1; t < nthreads; t++) started += pthread_create(&th[started], NULL, compile_worker, &j) == 0;
  compile_worker(&j); /* this thread too */
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  pthread_mutex_destroy(&j.mu);
  for (int r = lo; r < hi && failed < 0; r++)
    if (first[r] == r && !cubin[r]) failed = r;
  if (failed >= 0) snprintf(err, cap, "%s", j.errs[failed - lo]);
  free(j.errs);
  return failed >= 0 ? -1 : 0;
}

/* A unique id through a file: the first rank creates it and writes it to `path` (a temporary file
 * renamed into place); the others wait for it, up to two minutes. */
static int share_id(const char *path, bool first, ncclUniqueId *id, char *err, size_t cap) {
  ntp_cuda *c = NULL; /* no communicator for NC to settle: ncclGetUniqueId is not a communicator's call */
  if (first) {
    NC(cu.ncclGetUniqueId(id));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      snprintf(err, cap, "cannot write the NCCL id to %s", path);
      return -1;
    }
    return 0;
  }
  bool got = false;
  for (int tries = 0; tries < 1200 && !got; tries++) { /* up to 2 minutes for the first rank */
    FILE *f = fopen(path, "rb");
    got = f && fread(id, sizeof *id, 1, f) == 1;
    if (f) fclose(f);
    if (!got) nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
  if (!got) {
    snprintf(err, cap, "no NCCL id appeared in %s", path);
    return -1;
  }
  return 0;
fail:
  return -1;
}

/* The world communicator: given, created for all ranks of this process, or (one rank per
 * process) joined through a unique id that rank 0 writes to $NTP_NCCL_ID_FILE. */
static int nccl_world(ntp_cuda *c, const ntp_cuda_options *o, char *err, size_t cap) {
  int W = c->p->world;
  if (o->nccl_comm) {
    c->world[c->rank_lo] = (ncclComm_t)o->nccl_comm;
    return 0;
  }
  c->own_world = true;
  if (o->nccl_world) return 0; /* taken in ntp_cuda_create */
  if (c->rank_lo == 0 && c->rank_hi == W) {
    NC(cu.ncclCommInitAll(c->world, W, c->dev));
    return 0;
  }
  const char *path = getenv("NTP_NCCL_ID_FILE");
  if (!path || c->rank_hi - c->rank_lo != 1) {
    snprintf(err, cap, "one rank per process needs NTP_NCCL_ID_FILE (a path every process can read) or a communicator");
    return -1;
  }
  ncclUniqueId id;
  int r = c->rank_lo;
  if (share_id(path, r == 0, &id, err, cap) != 0) return -1;
  CU(cu.cudaSetDevice(c->dev[r]));
  if (c->nonblocking) { /* its calls return at once; settle() polls them to their end */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NC(cu.ncclCommInitRankConfig(&c->world[r], W, id, r, &config));
  } else {
    NC(cu.ncclCommInitRank(&c->world[r], W, id, r));
  }
  return 0;
fail:
  return -1;
}

/* One communicator per distinct set of ranks that reduces together (ncclCommSplit). */
static int nccl_groups(ntp_cuda *c, char *err, size_t cap) {
  const ntp_program *p = c->p;
  c->step_set = calloc(p->n_steps + 1, sizeof *c->step_set);
  c->sets = calloc(p->n_steps + 1, sizeof *c->sets);
  c->set_len = calloc(p->n_steps + 1, sizeof *c->set_len);
  c->group = calloc((size_t)p->world, sizeof *c->group);
  if (!c->step_set || !c->sets || !c->set_len || !c->group) return -1;
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind != SH_COMM || (st->comm != COMM_ALL_REDUCE && st->comm != COMM_REDUCE_SCATTER)) continue;
    if (!symmetric_reduction(p, st)) { /* summed by send/recv: no communicator of its own */
      c->step_set[s] = -1;
      continue;
    }
    int k = 0;
    for (; k < c->nsets; k++)
      if (c->set_len[k] == st->nranks && !memcmp(c->sets[k], st->ranks, (size_t)st->nranks * sizeof(int32_t))) break;
    if (k == c->nsets) {
      c->sets[k] = st->ranks;
      c->set_len[k] = st->nranks;
      c->nsets++;
    }
    c->step_set[s] = k;
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++) c->group[r] = calloc((size_t)c->nsets + 1, sizeof(ncclComm_t));
  for (int k = 0; k < c->nsets; k++) {
    NC(cu.ncclGroupStart());
    for (int r = c->rank_lo; r < c->rank_hi; r++) {
      bool member = false;
      for (int i = 0; i < c->set_len[k]; i++) member |= c->sets[k][i] == r;
      CU(cu.cudaSetDevice(c->dev[r]));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = c->nonblocking ? 0 : 1;
      NC(cu.ncclCommSplit(c->world[r], member ? k : NCCL_SPLIT_NOCOLOR, r, &c->group[r][k], &config));
    }
    NC(cu.ncclGroupEnd());
  }
  return 0;
fail:
  return -1;
}

/* The most workspace a GEMM's algorithm may ask for: NTP_CUBLASLT_WORKSPACE bytes (a K, M or G
 * suffix multiplies), 32 MiB by default (cuBLAS's recommendation for Hopper). */
static int workspace_cap(size_t *bytes, char *err, size_t cap) {
  const char *e = getenv("NTP_CUBLASLT_WORKSPACE");
  *bytes = (size_t)32 << 20;
  if (!e || !*e) return 0;
  char *end;
  unsigned long long v = strtoull(e, &end, 10);
  int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
  if (end == e || *e == '-' || (shift && *++end) || *end || v > (1ull << 40) >> shift) {
    snprintf(err, cap, "NTP_CUBLASLT_WORKSPACE='%s' is not a size in bytes (e.g. 33554432, 32M)", e);
    return -1;
  }
  *bytes = (size_t)(v << shift);
  return 0;
}

/* Each GPU's workspace, sized once, after every algorithm is chosen: the most any GEMM that
 * uses it needs (loopback: one for all ranks; none at all when no algorithm needs any). */
static int alloc_workspaces(ntp_cuda *c, char *err, size_t cap) {
  for (size_t s = 0; s < 2 * c->p->n_steps; s++) { /* [n_steps + s]: a GEMM attention's second */
    const ntp_step *st = &c->p->steps[s % c->p->n_steps];
    if (!c->gemms[s].ready) continue;
    int owner = c->nccl ? st->rank : c->rank_lo;
    if (c->gemms[s].algo.workspaceSize > c->workspace_size[owner]) c->workspace_size[owner] = c->gemms[s].algo.workspaceSize;
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++) {
    int owner = c->nccl ? r : c->rank_lo;
    if (owner == r && c->workspace_size[r]) {
      CU(cu.cudaSetDevice(c->dev[r]));
      CU(cu.cudaMalloc(&c->workspace[r], c->workspace_size[r]));
    }
    c->workspace[r] = c->workspace[owner];
  }
  CU(cu.cudaSetDevice(c->dev[c->rank_lo]));
  return 0;
fail:
  return -1;
}

/* Does rank r run part of collective st (a source or destination of a box, or a member)? */
/* The rank whose comm stream runs rank r's part of the collectives (loopback: the one stream). */
static int comm_rank(const ntp_cuda *c, int r) { return c->nccl ? r : c->rank_lo; }

/* The launch order (launch_order.h: step order with NTP_CUDA_OVERLAP=0), the waits for the
 * collectives in it, and what it overlaps against step order (ntp_cuda_overlap_summary). */
static int plan_launches(ntp_cuda *c, char *err, size_t cap) {
  const ntp_program *p = c->p;
  ntp_launch_order steps = {0};
  ntp_comm_deps deps = {0};
  if (ntp_footprints_build(p, &c->fp) != 0 ||
      ntp_launch_order_build(p, &c->fp, c->rank_lo, c->rank_hi, c->overlap, &c->order) != 0)
    goto oom;
  if (!c->overlap) return 0;
  if (ntp_comm_deps_build(p, &c->fp, c->order.step, c->order.n, &c->deps) != 0) goto oom;
  ntp_overlap_measure(p, &c->order, &c->deps, &c->overlap_now);
  if (ntp_launch_order_build(p, &c->fp, c->rank_lo, c->rank_hi, false, &steps) != 0 ||
      ntp_comm_deps_build(p, &c->fp, steps.step, steps.n, &deps) != 0)
    goto oom;
  ntp_overlap_measure(p, &steps, &deps, &c->overlap_before);
  ntp_launch_order_free(&steps);
  ntp_comm_deps_free(&deps);
  return 0;
oom:
  ntp_launch_order_free(&steps);
  snprintf(err, cap, "out of host memory (the launch order)");
  return -1;
}

/* The events of the overlap: each collective's end on each rank of this process taking part
 * (comm_deps.h says which compute steps wait for it). */
static int comm_events(ntp_cuda *c, char *err, size_t cap) {
  const ntp_program *p = c->p;
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind != SH_COMM) continue;
    for (int r = c->rank_lo; r < c->rank_hi; r++) {
      if (c->nccl ? !ntp_comm_takes_part(p, s, r) : r != c->rank_lo) continue; /* loopback: all on the one comm stream */
      CU(cu.cudaSetDevice(c->dev[r]));
      CU(cu.cudaEventCreateWithFlags(&c->done[s * (size_t)p->world + (size_t)r], cudaEventDisableTiming));
    }
  }
  CU(cu.cudaSetDevice(c->dev[c->rank_lo]));
  return 0;
fail:
  return -1;
}

void ntp_cuda_overlap_summary(const ntp_cuda *c, ntp_cuda_overlap *out) {
  *out = (ntp_cuda_overlap){.on = c->overlap, .ranks = c->nccl ? c->rank_hi - c->rank_lo : c->p->world,
                            .consumed = c->overlap_now.consumed, .overlapped = c->overlap_now.overlapped,
                            .overlapped_before = c->overlap_before.overlapped, .launches = c->overlap_now.launches,
                            .launches_before = c->overlap_before.launches, .moved = c->order.moved};
}

void ntp_cuda_gemm_summary(const ntp_cuda *c, ntp_cuda_gemms *out) {
  *out = (ntp_cuda_gemms){0};
  for (size_t s = 0; s < 2 * c->p->n_steps; s++) { /* [n_steps + s]: a GEMM attention's second */
    const gemm *g = &c->gemms[s];
    if (!g->ready) continue;
    size_t at = s % c->p->n_steps;
    out->gemms++;
    out->shapes += g->queried;
    out->epilogues[c->cuda[c->p->steps[at].rank].steps[at].epilogue]++;
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++)
    if (c->nccl || r == c->rank_lo) {
      out->gpus++;
      if (c->workspace_size[r] > out->workspace) out->workspace = c->workspace_size[r];
    }
  out->workspace_cap = c->workspace_cap;
}

int ntp_cuda_create(const ntp_program *p, const ntp_cuda_options *o, ntp_cuda **out, char *err, size_t cap) {
  *out = NULL;
  if (!p->cuda) {
    snprintf(err, cap, "the program carries no CUDA (compiled without the codegen pass)");
    return -1;
  }
  if (ntp_cuda_available(err, cap) != 0) return -1;
  int W = p->world;
  ntp_cuda *c = calloc(1, sizeof *c);
  void **cubins = calloc((size_t)W + 1, sizeof *cubins);
  int *first = calloc((size_t)W + 1, sizeof *first);
  if (!c || !cubins || !first) {
    free(c), free(cubins), free(first);
    return -1;
  }
  c->p = p;
  c->cuda = p->cuda;
  c->nccl = !o->loopback && W > 1;
  const char *graphs = getenv("NTP_CUDA_GRAPHS"), *overlap = getenv("NTP_CUDA_OVERLAP"); /* 0: step by step; one stream */
  c->graphs = !(graphs && !strcmp(graphs, "0"));
  c->overlap = !(overlap && !strcmp(overlap, "0"));
  c->rank_lo = c->nccl ? o->rank_lo : 0;
  c->rank_hi = c->nccl && o->rank_hi > o->rank_lo ? o->rank_hi : W;
  const char *timeout = getenv("NTP_NCCL_TIMEOUT");
  c->nccl_timeout = timeout && atof(timeout) > 0 ? atof(timeout) : 600.0;
  if (c->nccl && c->rank_hi - c->rank_lo > 1) { /* several GPUs of one process joined by NCCL */
    /* NCCL's guide ("Using NCCL with CUDA graphs"): graphs of several GPUs launched from one thread
     * may deadlock (a launch may block until the other GPUs' graphs run); steps one by one */
    if (graphs && !strcmp(graphs, "1")) {
      snprintf(err, cap, "NTP_CUDA_GRAPHS=1: CUDA graphs holding the NCCL calls of several GPUs, launched from one "
               "thread, may deadlock (NCCL's guide); run one rank per process (--rank env) for graphs");
      goto fail;
    }
    c->graphs = false;
    c->no_graphs = true;
  }
  if (c->nccl && load_nccl(err, cap) != 0) goto fail;
  /* non-blocking communicators where NCCL can tell their state (NTP_NCCL_BLOCKING=1: blocking ones) */
  const char *blocking = getenv("NTP_NCCL_BLOCKING");
  c->nonblocking = c->nccl && cu.ncclCommGetAsyncError && cu.ncclCommInitRankConfig && !(blocking && !strcmp(blocking, "1"));
#define ALLOC(field) c->field = calloc((size_t)W + 1, sizeof *c->field)
  ALLOC(dev); ALLOC(stream); ALLOC(comm); ALLOC(fork); ALLOC(join); ALLOC(graph); ALLOC(lt); ALLOC(workspace); ALLOC(workspace_size);
  ALLOC(arena); ALLOC(persist); ALLOC(staging);
  ALLOC(staging_bytes); ALLOC(lib); ALLOC(kern); ALLOC(world);
#undef ALLOC
  c->gemms = calloc(2 * p->n_steps + 1, sizeof *c->gemms); /* [n_steps + s]: a GEMM attention's second */
  c->filled = calloc(p->n_tensors + 1, sizeof *c->filled);
  c->done = calloc(p->n_steps * (size_t)W + 1, sizeof *c->done);
  if (!c->dev || !c->stream || !c->comm || !c->fork || !c->join || !c->graph || !c->done || !c->lt || !c->workspace ||
      !c->workspace_size || !c->arena || !c->persist || !c->staging ||
      !c->staging_bytes || !c->lib || !c->kern || !c->world || !c->gemms || !c->filled)
    goto fail;
  for (int r = c->rank_lo; c->nccl && o->nccl_world && r < c->rank_hi; r++) { /* taken over at once */
    c->world[r] = (ncclComm_t)o->nccl_world[r];
    o->nccl_world[r] = NULL;
    c->own_world = true;
  }
  int ndev = 0;
  CU(cu.cudaGetDeviceCount(&ndev));
  for (int r = 0; r < W; r++)
    c->dev[r] = !c->nccl ? o->device : o->devices ? o->devices[r] : o->device + (r - c->rank_lo);
  for (int r = c->rank_lo; c->nccl && o->devices && r < c->rank_hi; r++)
    if (o->devices[r] < 0 || o->devices[r] >= ndev) {
      snprintf(err, cap, "rank %d is to run on GPU %d, but %d are visible", r, o->devices[r], ndev);
      goto fail;
    }
  if (c->nccl && !o->devices && o->device + (c->rank_hi - c->rank_lo) > ndev) {
    snprintf(err, cap, "%d ranks need %d GPUs from GPU %d, but %d are visible; use loopback to run them on one",
             c->rank_hi - c->rank_lo, c->rank_hi - c->rank_lo, o->device, ndev);
    goto fail;
  }
  if (workspace_cap(&c->workspace_cap, err, cap) != 0) goto fail;
  /* staging for packed transfers: the most one rank sends plus receives in one step */
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind != SH_COMM) continue;
    size_t *need = calloc((size_t)W, sizeof *need);
    for (size_t x = 0; need && x < st->nxfers; x++) {
      const ntp_tensor *src = &p->tensors[st->xfers[x].src], *dst = &p->tensors[st->xfers[x].dst];
      size_t b = ((size_t)box_volume(&st->xfers[x].box) * dtype_bytes(src->dtype) + 255) / 256 * 256;
      if (st->comm == COMM_ALL_REDUCE || st->comm == COMM_REDUCE_SCATTER) b = (size_t)box_volume(&src->box) * 4 + 256;
      need[src->rank] += b;
      need[dst->rank] += b;
      if (st->comm == COMM_ALL_REDUCE || st->comm == COMM_REDUCE_SCATTER) /* reduce_by_exchange's accumulator */
        need[dst->rank] += (size_t)box_volume(&dst->box) * 4 + 256;
    }
    for (int r = 0; need && r < W; r++)
      if (need[r] > c->staging_bytes[r]) c->staging_bytes[r] = need[r];
    free(need);
  }
  int arch = c->arch = compute_capability(c->dev[c->rank_lo], err, cap);
  if (arch < 0 || compile_ranks(c, arch, cubins, first, err, cap) != 0) goto fail;
  CU(cu.cudaSetDevice(c->dev[c->rank_lo]));
  CU(cu.cudaEventCreate(&c->ev0));
  CU(cu.cudaEventCreate(&c->ev1));
  for (int r = c->rank_lo; r < c->rank_hi; r++) {
    CU(cu.cudaSetDevice(c->dev[r]));
    if (c->nccl || r == c->rank_lo) {
      CU(cu.cudaStreamCreate(&c->stream[r]));
      if (c->overlap) {
        CU(cu.cudaStreamCreate(&c->comm[r]));
        CU(cu.cudaEventCreateWithFlags(&c->fork[r], cudaEventDisableTiming));
        CU(cu.cudaEventCreateWithFlags(&c->join[r], cudaEventDisableTiming));
      } else {
        c->comm[r] = c->stream[r];
      }
      LT(cu.cublasLtCreate(&c->lt[r]));
    } else { /* loopback: one stream, one handle */
      c->stream[r] = c->stream[c->rank_lo];
      c->comm[r] = c->comm[c->rank_lo];
      c->lt[r] = c->lt[c->rank_lo];
    }
    size_t arena = p->cuda[r].scratch_bytes ? (size_t)(ntp_scratch_offset(p->mem[r].arena_bytes) + p->cuda[r].scratch_bytes)
                                            : (size_t)p->mem[r].arena_bytes; /* the scratch after the arena */
    CU(cu.cudaMalloc((void **)&c->arena[r], arena + 256));
    CU(cu.cudaMalloc((void **)&c->persist[r], (size_t)(p->mem[r].param_bytes + p->mem[r].input_bytes) + 256));
    if (c->nccl) CU(cu.cudaMalloc((void **)&c->staging[r], c->staging_bytes[r] + 256));
    char name[64];
    snprintf(name, sizeof name, "%s.rank%d.cu", p->global.name, r);
    if (load_image(cubins[first[r]], name, &c->lib[r], err, cap) != 0) goto fail;
    c->kern[r] = calloc(p->cuda[r].nkernels + 1, sizeof *c->kern[r]);
    for (size_t k = 0; k < p->cuda[r].nkernels; k++)
      CU(cu.cudaLibraryGetKernel(&c->kern[r][k], c->lib[r], p->cuda[r].kernels[k].name));
  }
  CU(cu.cudaSetDevice(c->dev[c->rank_lo]));
  if (!c->nccl) {
    int64_t scratch = 1;
    for (size_t t = 0; t < p->n_tensors; t++)
      if (box_volume(&p->tensors[t].box) > scratch) scratch = box_volume(&p->tensors[t].box);
    CU(cu.cudaMalloc((void **)&c->scratch, (size_t)scratch * sizeof(float)));
  }
  if (load_library(comm_src, "ntp_collectives.cu", arch, &c->comm_lib, err, cap) != 0) goto fail;
  CU(cu.cudaLibraryGetKernel(&c->k_copy, c->comm_lib, "ntp_copy_box"));
  CU(cu.cudaLibraryGetKernel(&c->k_acc, c->comm_lib, "ntp_acc_box"));
  CU(cu.cudaLibraryGetKernel(&c->k_store, c->comm_lib, "ntp_store_acc"));
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind != SH_COMPUTE || !local_rank(c, st->rank)) continue;
    cg_step_kind kind = p->cuda[st->rank].steps[s].kind;
    if (kind != CG_GEMM && kind != CG_ATTENTION_GEMM) continue;
    CU(cu.cudaSetDevice(c->dev[st->rank]));
    const cg_step *cs = &p->cuda[st->rank].steps[s];
    if (kind == CG_GEMM ? gemm_setup(c, &p->steps[cs->mm], cs, &c->gemms[s], err, cap)
                        : attention_gemm_setup(c, s, err, cap))
      goto fail;
  }
  if (alloc_workspaces(c, err, cap) != 0) goto fail;
  if (c->nccl && (nccl_world(c, o, err, cap) != 0 || nccl_groups(c, err, cap) != 0)) goto fail;
  const char *prof = getenv("NTP_CUDA_PROFILE"); /* layers: per-layer device times */
  if (prof && !strcmp(prof, "layers") && ntp_cuda_profile_layers(c, true, err, cap) != 0) goto fail;
  if (plan_launches(c, err, cap) != 0 || (c->overlap && comm_events(c, err, cap) != 0)) goto fail;
  *out = c;
  for (int r = 0; r < W; r++) free(cubins[r]);
  free(cubins), free(first);
  return 0;
fail:
  for (int r = 0; r < W; r++) free(cubins[r]);
  free(cubins), free(first);
  ntp_cuda_free(c);
  return -1;
}

/* Host floats of a tensor's box -> its storage bits on its GPU. */
static int upload(ntp_cuda *c, int32_t t, const float *vals, char *err, size_t cap) {
  const ntp_tensor *s = &c->p->tensors[t];
  int64_t n = box_volume(&s->box);
  size_t es = dtype_bytes(s->dtype);
  unsigned char *buf = malloc((size_t)n * es + 1);
  if (!buf) return -1;
  for (int64_t i = 0; i < n; i++) {
    if (es == 4) memcpy(buf + 4 * i, &vals[i], 4);
    else {
      uint16_t b = s->dtype == NTP_BF16 ? ntp_float_to_bf16_bits(vals[i]) : ntp_float_to_f16_bits(vals[i]);
      memcpy(buf + 2 * i, &b, 2);
    }
  }
  CU(cu.cudaSetDevice(c->dev[s->rank]));
  CU(cu.cudaMemcpy(dev_ptr(c, t), buf, (size_t)n * es, cudaMemcpyHostToDevice));
  free(buf);
  c->graph_stale |= !c->filled[t]; /* its init kernel is not to run any more */
  c->filled[t] = true;
  return 0;
fail:
  free(buf);
  return -1;
}

int ntp_cuda_set(ntp_cuda *c, int32_t v, const ntp_host_tensor *g, char *err, size_t cap) {
  const ntp_program *p = c->p;
  for (size_t t = 0; t < p->n_tensors; t++) {
    const ntp_tensor *s = &p->tensors[t];
    if (!s->persistent || s->init_value != v || !local_rank(c, s->rank)) continue;
    int64_t n = box_volume(&s->init_box);
    float *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
    if (!vals) return -1;
    /* gather the box from the global tensor, row-major; int32 values keep their bits */
    int nd = s->init_box.ndim;
    int64_t idx[NTP_MAX_RANK] = {0};
    for (int64_t k = 0; k < n; k++) {
      int64_t gi = 0;
      for (int d = 0; d < nd; d++) gi = gi * g->shape.dim[d] + s->init_box.lo[d] + idx[d];
      if (g->f) vals[k] = g->f[gi];
      else memcpy(&vals[k], &g->i[gi], 4);
      for (int d = nd - 1; d >= 0; d--) {
        if (++idx[d] < s->init_box.hi[d] - s->init_box.lo[d]) break;
        idx[d] = 0;
      }
    }
    int rc = upload(c, (int32_t)t, vals, err, cap);
    free(vals);
    if (rc) return rc;
  }
  return 0;
}

int ntp_cuda_load(ntp_cuda *c, const ntp_safetensors *f, char *err, size_t cap) {
  const ntp_program *p = c->p;
  for (size_t t = 0; t < p->n_tensors; t++) {
    const ntp_tensor *s = &p->tensors[t];
    if (!s->persistent || !local_rank(c, s->rank) ||
        p->global.ops[p->global.values[s->init_value].def].code != IR_PARAM)
      continue;
    const ntp_value *gv = &p->global.values[s->init_value];
    int64_t n = box_volume(&s->init_box);
    float *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
    if (!vals || ntp_safetensors_read_box(f, gv->name, gv->dtype, &gv->shape, &s->init_box, vals, err, cap) != 0 ||
        upload(c, (int32_t)t, vals, err, cap) != 0) {
      free(vals);
      return -1;
    }
    free(vals);
  }
  return 0;
}

/* ---- per-layer device times (ntp_cuda_profile_layers) ---------------------------------------
 * An event on the first rank's stream wherever the step list enters another layer (and one at
 * its end): the time between two events is the device time of the steps of one layer, as the
 * first rank's stream sees it (with every rank on one GPU: all of them). */
static int profile_mark(ntp_cuda *c, int32_t layer, char *err, size_t cap) {
  if (c->nprof > 0 && c->prof_layer[c->nprof - 1] == layer) return 0;
  if (c->nprof > (int)c->p->n_steps) return 0;
  CU(cu.cudaSetDevice(c->dev[c->rank_lo]));
  CU(cu.cudaEventRecord(c->prof_ev[c->nprof], c->stream[c->rank_lo]));
  c->prof_layer[c->nprof++] = layer;
  return 0;
fail:
  return -1;
}

int ntp_cuda_profile_layers(ntp_cuda *c, bool on, char *err, size_t cap) {
  if (on && !c->prof_ev) {
    c->prof_ev = calloc(c->p->n_steps + 1, sizeof *c->prof_ev);
    c->prof_layer = calloc(c->p->n_steps + 1, sizeof *c->prof_layer);
    if (!c->prof_ev || !c->prof_layer) {
      snprintf(err, cap, "out of memory (profiling events)");
      return -1;
    }
    CU(cu.cudaSetDevice(c->dev[c->rank_lo]));
    for (size_t i = 0; i <= c->p->n_steps; i++) CU(cu.cudaEventCreate(&c->prof_ev[i]));
  }
  c->profile = on;
  c->nprof = 0;
  return 0;
fail:
  return -1;
}

int ntp_cuda_layer_times(const ntp_cuda *c, double *seconds, size_t n, char *err, size_t cap) {
  for (size_t l = 0; l < n; l++) seconds[l] = 0;
  if (!c->profile) {
    snprintf(err, cap, "layer profiling is off (ntp_cuda_profile_layers, NTP_CUDA_PROFILE=layers)");
    return -1;
  }
  for (int i = 0; i + 1 < c->nprof; i++) {
    float ms = 0;
    CU(cu.cudaEventElapsedTime(&ms, c->prof_ev[i], c->prof_ev[i + 1]));
    int32_t l = c->prof_layer[i];
    size_t at = l >= 0 && (size_t)l + 1 < n ? (size_t)l : n - 1; /* model level: the last entry */
    if (n) seconds[at] += ms / 1e3;
  }
  return 0;
fail:
  return -1;
}

/* The comm streams forked from the compute streams at the start of the step list (in a capture:
 * so they join it) and joined back at its end (so everything after, and a graph's end, follows
 * the collectives). */
static int fork_comm(ntp_cuda *c, bool join, char *err, size_t cap) {
  for (int r = c->rank_lo; c->overlap && r < c->rank_hi; r++) {
    if (comm_rank(c, r) != r) continue;
    CU(cu.cudaSetDevice(c->dev[r]));
    cudaStream_t from = join ? c->comm[r] : c->stream[r], to = join ? c->stream[r] : c->comm[r];
    cudaEvent_t e = join ? c->join[r] : c->fork[r];
    CU(cu.cudaEventRecord(e, from));
    CU(cu.cudaStreamWaitEvent(to, e, 0));
  }
  return 0;
fail:
  return -1;
}

/* A collective: on the comm streams of the ranks taking part, after the compute enqueued before
 * it on each (the producers of what it reads are there), its end recorded for the compute steps
 * that wait for it (comm_deps.h). */
static int enqueue_comm(ntp_cuda *c, int32_t s, const ntp_step *st, char *err, size_t cap) {
  const ntp_program *p = c->p;
  for (int r = c->rank_lo; c->overlap && r < c->rank_hi; r++) {
    if (!c->done[(size_t)s * (size_t)p->world + (size_t)r]) continue;
    CU(cu.cudaSetDevice(c->dev[r]));
    CU(cu.cudaEventRecord(c->fork[r], c->stream[r]));
    CU(cu.cudaStreamWaitEvent(c->comm[r], c->fork[r], 0));
  }
  if (c->nccl ? run_comm_nccl(c, s, st, err, cap) : run_comm_loopback(c, st, err, cap)) return -1;
  for (int r = c->rank_lo; c->overlap && r < c->rank_hi; r++) {
    cudaEvent_t e = c->done[(size_t)s * (size_t)p->world + (size_t)r];
    if (!e) continue;
    CU(cu.cudaSetDevice(c->dev[r]));
    CU(cu.cudaEventRecord(e, c->comm[r]));
  }
  return 0;
fail:
  return -1;
}

/* Compute step s of rank r waits for the collectives whose memory it touches. */
static int wait_comms(ntp_cuda *c, size_t s, int r, char *err, size_t cap) {
  for (int32_t i = c->overlap ? c->deps.start[s] : 0; c->overlap && i < c->deps.start[s + 1]; i++) {
    cudaEvent_t e = c->done[(size_t)c->deps.wait[i] * (size_t)c->p->world + (size_t)comm_rank(c, r)];
    if (e) CU(cu.cudaStreamWaitEvent(c->stream[r], e, 0));
  }
  return 0;
fail:
  return -1;
}

/* One step of the list: a collective on the comm streams, or a launch of a rank of this process
 * on its compute stream, after the waits for the collectives it touches. */
static int enqueue_step(ntp_cuda *c, size_t s, uint64_t seed, char *err, size_t cap) {
  const ntp_program *p = c->p;
  static const float one = 1.0f, zero = 0.0f; /* read by cuBLASLt at the call, or at the replay of a graph */
  const ntp_step *st = &p->steps[s];
  if (st->kind == SH_COMM) return enqueue_comm(c, (int32_t)s, st, err, cap);
  int r = st->rank;
  if (!local_rank(c, r)) return 0;
  const cg_step *cs = &c->cuda[r].steps[s];
  if (cs->kind != CG_GEMM && cs->kind != CG_KERNEL && cs->kind != CG_ATTENTION_GEMM) return 0;
  if (ntp_step_inits(st) && c->filled[st->op.result]) return 0;
  CU(cu.cudaSetDevice(c->dev[r]));
  if (wait_comms(c, s, r, err, cap) != 0) return -1;
  if (cs->kind == CG_GEMM) {
    gemm *g = &c->gemms[s];
    const ntp_op *mm = &p->steps[cs->mm].op; /* this step's, or the earlier matmul run here */
    unsigned char *a = dev_ptr(c, mm->args[0]), *b = dev_ptr(c, mm->args[1]), *d = dev_ptr(c, cs->out);
    LT(cu.cublasLtMatmul(c->lt[r], g->op, &one, b, g->a, a, g->b, &zero, d, g->c, d, g->c, &g->algo.algo,
                         c->workspace[r], g->algo.workspaceSize, c->stream[r]));
    return 0;
  }
  if (cs->kind == CG_ATTENTION_GEMM) return run_attention_gemm(c, s, cs, seed, err, cap);
  if (cs->pre >= 0 && launch_step_kernel(c, r, cs, cs->pre, cs->pre_grid, seed, err, cap) != 0) /* the first pass */
    return -1;
  return launch_step_kernel(c, r, cs, cs->kernel, cs->grid, seed, err, cap);
fail:
  return -1;
}

/* Enqueues the step list on the streams: initialisation first (fused kernels may read a
 * parameter earlier in the list than its initialisation step), then everything else in the
 * launch order (launch_order.h: collectives overlapping the compute that does not need them;
 * step order with NTP_CUDA_OVERLAP=0); compute on the compute streams, collectives on the comm
 * streams. */
static int enqueue_steps(ntp_cuda *c, uint64_t seed, char *err, size_t cap) {
  const ntp_program *p = c->p;
  if (fork_comm(c, false, err, cap) != 0) return -1;
  for (size_t s = 0; s < p->n_steps; s++)
    if (ntp_step_inits(&p->steps[s]) && enqueue_step(c, s, seed, err, cap) != 0) return -1;
  for (size_t k = 0; k < c->order.n; k++) {
    size_t s = (size_t)c->order.step[k];
    if (c->profile && profile_mark(c, p->steps[s].layer, err, cap) != 0) return -1;
    if (enqueue_step(c, s, seed, err, cap) != 0) return -1;
  }
  if (c->profile && profile_mark(c, INT32_MIN, err, cap) != 0) return -1; /* the end of the last layer */
  return fork_comm(c, true, err, cap);
}

static void drop_graphs(ntp_cuda *c) {
  for (int r = c->rank_lo; c->graph && r < c->rank_hi; r++) {
    if (c->graph[r] && !(c->dead && c->dead[r])) cu.cudaGraphExecDestroy(c->graph[r]);
    c->graph[r] = NULL; /* a failed GPU's is left there */
  }
}

/* The step list as a CUDA graph per rank of this process, each captured on the rank's compute
 * stream (no host work per step at the replay). With NCCL, every rank's capture is open while
 * the steps are enqueued, so a group's calls for several ranks go to their own graphs (NCCL
 * 2.9 and later capture them); the graphs meet at the replay, as their NCCL kernels do. */
static int capture_graph(ntp_cuda *c, uint64_t seed, char *err, size_t cap) {
  cudaGraph_t g = NULL;
  int begun = c->rank_lo, rc = -1;
  drop_graphs(c);
  for (; begun < c->rank_hi; begun++) {
    if (!stream_owner(c, begun)) continue;
    CU(cu.cudaSetDevice(c->dev[begun]));
    CU(cu.cudaStreamBeginCapture(c->stream[begun], cudaStreamCaptureModeThreadLocal));
  }
  rc = enqueue_steps(c, seed, err, cap);
fail:
  for (int r = c->rank_lo; r < begun; r++) { /* every capture begun is ended, also after a failure */
    if (!stream_owner(c, r)) continue;
    cu.cudaSetDevice(c->dev[r]);
    cudaError_t e = cu.cudaStreamEndCapture(c->stream[r], &g);
    if (e == cudaSuccess && rc == 0) e = cu.cudaGraphInstantiate(&c->graph[r], g, 0);
    if (g) cu.cudaGraphDestroy(g);
    g = NULL;
    if (e != cudaSuccess && rc == 0) {
      snprintf(err, cap, "%s:%d: capturing rank %d's steps: %s", __FILE__, __LINE__, r, cu.cudaGetErrorString(e));
      rc = -1;
    }
  }
  if (rc != 0) {
    drop_graphs(c);
    size_t len = strlen(err);
    snprintf(err + len, cap - len, " (capturing the step list as CUDA graphs; NTP_CUDA_GRAPHS=0 runs it step by step)");
    return -1;
  }
  c->graph_seed = seed;
  c->graph_stale = false;
  return 0;
}


int ntp_cuda_run(ntp_cuda *c, uint64_t seed, double *seconds, char *err, size_t cap) {
  nccl_last = ncclSuccess;
  c->nprof = 0;
  bool graphs = c->graphs && !c->profile; /* events between layers need the steps launched one by one */
  bool captured = c->graph[c->rank_lo] != NULL;
  if (graphs && (!captured || c->graph_seed != seed || c->graph_stale) && capture_graph(c, seed, err, cap) != 0)
    return -1;
  CU(cu.cudaSetDevice(c->dev[c->rank_lo]));
  CU(cu.cudaEventRecord(c->ev0, c->stream[c->rank_lo]));
  double t0 = host_now(); /* the host's part: the graph launches, or every step's calls */
  for (int r = c->rank_lo; graphs && r < c->rank_hi; r++) {
    if (!stream_owner(c, r)) continue;
    CU(cu.cudaSetDevice(c->dev[r]));
    CU(cu.cudaGraphLaunch(c->graph[r], c->stream[r]));
  }
  if (!graphs && enqueue_steps(c, seed, err, cap) != 0) return -1;
  c->host_s = host_now() - t0;
  *(graphs ? &c->host_graph_s : &c->host_direct_s) = c->host_s;
  CU(cu.cudaSetDevice(c->dev[c->rank_lo]));
  CU(cu.cudaEventRecord(c->ev1, c->stream[c->rank_lo]));
  if (wait_streams(c, err, cap) != 0) goto fail; /* polled: a lost peer's operation never completes */
  float ms = 0;
  CU(cu.cudaEventElapsedTime(&ms, c->ev0, c->ev1));
  if (seconds) *seconds = ms / 1e3;
  return 0;
fail:
  return -1;
}

int ntp_cuda_use_graphs(ntp_cuda *c, bool on) {
  if (!on) drop_graphs(c);
  if (on && c->no_graphs) return -1; /* several GPUs of this process joined by NCCL: step by step */
  c->graphs = on;
  return 0;
}

void ntp_cuda_host_time(const ntp_cuda *c, ntp_cuda_host *h) {
  int32_t layers = 0; /* distinct layer numbers of the steps */
  for (size_t s = 0; s < c->p->n_steps; s++)
    if (c->p->steps[s].layer + 1 > layers) layers = c->p->steps[s].layer + 1;
  *h = (ntp_cuda_host){.last_s = c->host_s, .graph_s = c->host_graph_s, .direct_s = c->host_direct_s,
                       .layers = layers > 0 ? layers : 1, .graphs = c->graphs};
}

/* Visits the runs of box x (contiguous along the last dim) inside a row-major tensor of
 * shape `outer`: fn(offset of the run in the tensor, offset in x packed, run length). */
static int box_runs(const ntp_box *x, const ntp_shape *outer, int (*fn)(void *, int64_t, int64_t, int64_t), void *ctx) {
  int nd = x->ndim;
  if (nd == 0) return fn(ctx, 0, 0, 1);
  int64_t len = x->hi[nd - 1] - x->lo[nd - 1], idx[NTP_MAX_RANK] = {0}, packed = 0;
  if (len <= 0) return 0;
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off = off * outer->dim[d] + x->lo[d] + (d == nd - 1 ? 0 : idx[d]);
    if (fn(ctx, off, packed, len) != 0) return -1;
    packed += len;
    int d = nd - 2;
    for (; d >= 0; d--) {
      if (++idx[d] < x->hi[d] - x->lo[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return 0;
  }
}

typedef struct run_copy {
  unsigned char *global, *packed;
  size_t es;
  enum cudaMemcpyKind kind; /* the direction of the global tensor's side */
  bool to_global;
} run_copy;

static int copy_run(void *ctx, int64_t goff, int64_t poff, int64_t len) {
  run_copy *rc = ctx;
  unsigned char *g = rc->global + (size_t)goff * rc->es, *p = rc->packed + (size_t)poff * rc->es;
  size_t n = (size_t)len * rc->es;
  return (rc->to_global ? cu.cudaMemcpy(g, p, n, cudaMemcpyHostToDevice) : cu.cudaMemcpy(p, g, n, cudaMemcpyDeviceToHost)) ==
                 cudaSuccess
             ? 0
             : -1;
}

static ntp_box whole(const ntp_shape *s) {
  ntp_box b = {.ndim = s->ndim};
  for (int d = 0; d < s->ndim; d++) b.hi[d] = s->dim[d];
  return b;
}

int ntp_cuda_copy_to_host(ntp_cuda *c, void *dst, const void *src, size_t bytes, char *err, size_t cap) {
  (void)c;
  CU(cu.cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return 0;
fail:
  return -1;
}

int ntp_cuda_device_of(ntp_cuda *c, const void *data, int *dev) {
  (void)c;
  struct cudaPointerAttributes at;
  if (cu.cudaPointerGetAttributes(&at, data) != cudaSuccess || at.type != cudaMemoryTypeDevice) return -1;
  *dev = at.device;
  return 0;
}

/* Value v from a global tensor in device memory on GPU dev (storage dtype): each rank's box
 * is copied by a kernel on its own GPU, or through the host from another GPU. */
int ntp_cuda_set_device(ntp_cuda *c, int32_t v, const void *data, int dev, char *err, size_t cap) {
  const ntp_program *p = c->p;
  const ntp_value *gv = &p->global.values[v];
  ntp_box all = whole(&gv->shape);
  unsigned char *buf = NULL;
  for (size_t t = 0; t < p->n_tensors; t++) {
    const ntp_tensor *s = &p->tensors[t];
    if (!s->persistent || s->init_value != v || !local_rank(c, s->rank)) continue;
    size_t es = dtype_bytes(s->dtype), n = (size_t)box_volume(&s->init_box) * es;
    CU(cu.cudaSetDevice(c->dev[s->rank]));
    if (c->dev[s->rank] == dev) {
      if (copy_box(c, &s->init_box, &all, (unsigned char *)data, &s->init_box, dev_ptr(c, (int32_t)t), s->dtype,
                   c->stream[s->rank], err, cap))
        goto fail;
      if (wait_ranks(c, s->rank, s->rank + 1, err, cap) != 0) goto fail;
    } else {
      free(buf);
      if (!(buf = malloc(n + 1))) goto fail;
      run_copy rc = {(unsigned char *)data, buf, es, cudaMemcpyDeviceToHost, false};
      CU(cu.cudaSetDevice(dev));
      if (box_runs(&s->init_box, &gv->shape, copy_run, &rc) != 0) {
        snprintf(err, cap, "copying '%s' from GPU %d failed", gv->name, dev);
        goto fail;
      }
      CU(cu.cudaSetDevice(c->dev[s->rank]));
      CU(cu.cudaMemcpy(dev_ptr(c, (int32_t)t), buf, n, cudaMemcpyHostToDevice));
    }
    c->graph_stale |= !c->filled[t];
    c->filled[t] = true;
  }
  free(buf);
  return 0;
fail:
  free(buf);
  return -1;
}

/* Output o into a global tensor in device memory on GPU dev: the pieces this process holds
 * (a kernel copy on the same GPU, through the host from another); the rest is left as it was. */
int ntp_cuda_output_device(ntp_cuda *c, size_t o, void *data, int dev, char *err, size_t cap) {
  const ntp_program *p = c->p;
  int32_t v = p->global.outputs[o].value;
  const ntp_value *gv = &p->global.values[v];
  ntp_box all = whole(&gv->shape);
  unsigned char *buf = NULL;
  for (size_t k = 0; k < p->npieces[v]; k++) {
    int32_t t = p->pieces[v][k];
    const ntp_tensor *s = &p->tensors[t];
    if (!local_rank(c, s->rank)) continue;
    size_t es = dtype_bytes(s->dtype), n = (size_t)box_volume(&s->box) * es;
    CU(cu.cudaSetDevice(c->dev[s->rank]));
    if (c->dev[s->rank] == dev) {
      if (copy_box(c, &s->box, &s->box, dev_ptr(c, t), &all, data, s->dtype, c->stream[s->rank], err, cap)) goto fail;
      if (wait_ranks(c, s->rank, s->rank + 1, err, cap) != 0) goto fail;
      continue;
    }
    free(buf);
    if (!(buf = malloc(n + 1))) goto fail;
    CU(cu.cudaMemcpy(buf, dev_ptr(c, t), n, cudaMemcpyDeviceToHost));
    CU(cu.cudaSetDevice(dev));
    run_copy rc = {data, buf, es, cudaMemcpyHostToDevice, true};
    if (box_runs(&s->box, &gv->shape, copy_run, &rc) != 0) {
      snprintf(err, cap, "copying output '%s' to GPU %d failed", gv->name, dev);
      goto fail;
    }
  }
  free(buf);
  return 0;
fail:
  free(buf);
  return -1;
}

/* Output o into a host tensor in the global layout (fp32 values, int32 bits), from the pieces
 * this process holds; with one rank per process, the elements held elsewhere are NaN. */
int ntp_cuda_output_host(ntp_cuda *c, size_t o, ntp_host_tensor *h, char *err, size_t cap) {
  const ntp_program *p = c->p;
  const ntp_module *m = &p->global;
  int32_t v = m->outputs[o].value;
  const ntp_value *gv = &m->values[v];
  *h = (ntp_host_tensor){.name = m->outputs[o].name, .dtype = gv->dtype, .shape = gv->shape};
  int64_t n = shape_numel(&gv->shape);
  float *f = malloc((size_t)(n ? n : 1) * sizeof(float)); /* int32 outputs share the 4-byte slots */
  if (!f) {
    snprintf(err, cap, "out of host memory for output '%s'", gv->name);
    return -1;
  }
  for (int64_t i = 0; i < n; i++) f[i] = gv->dtype == NTP_I32 ? 0.0f : NAN;
  if (gv->dtype == NTP_I32) h->i = (int32_t *)f;
  else h->f = f;
  unsigned char *buf = NULL;
  for (size_t k = 0; k < p->npieces[v]; k++) {
    int32_t t = p->pieces[v][k];
    const ntp_tensor *s = &p->tensors[t];
    if (!local_rank(c, s->rank)) continue;
    int64_t pn = box_volume(&s->box);
    size_t es = dtype_bytes(s->dtype);
    free(buf);
    if (!(buf = malloc((size_t)pn * es + 1))) goto fail;
    CU(cu.cudaSetDevice(c->dev[s->rank]));
    CU(cu.cudaMemcpy(buf, dev_ptr(c, t), (size_t)pn * es, cudaMemcpyDeviceToHost));
    int nd = s->box.ndim;
    int64_t idx[NTP_MAX_RANK] = {0};
    for (int64_t e = 0; e < pn; e++) {
      int64_t gi = 0;
      for (int d = 0; d < nd; d++) gi = gi * gv->shape.dim[d] + s->box.lo[d] + idx[d];
      if (es == 4) {
        memcpy(&f[gi], buf + 4 * e, 4);
      } else {
        uint16_t b16;
        memcpy(&b16, buf + 2 * e, 2);
        f[gi] = s->dtype == NTP_BF16 ? ntp_bf16_bits_to_float(b16) : ntp_f16_bits_to_float(b16);
      }
      for (int d = nd - 1; d >= 0; d--) {
        if (++idx[d] < s->box.hi[d] - s->box.lo[d]) break;
        idx[d] = 0;
      }
    }
  }
  free(buf);
  return 0;
fail:
  free(buf);
  free(f);
  h->f = NULL;
  h->i = NULL;
  if (!err[0]) snprintf(err, cap, "out of host memory for output '%s'", gv->name);
  return -1;
}

int ntp_cuda_forward(ntp_cuda *c, uint64_t seed, ntp_cpu_result *res, char *err, size_t cap) {
  const ntp_module *m = &c->p->global;
  *res = (ntp_cpu_result){0};
  if (ntp_cuda_run(c, seed, &res->seconds, err, cap) != 0) return -1;
  res->outputs = calloc(m->n_outputs + 1, sizeof *res->outputs);
  if (!res->outputs) {
    snprintf(err, cap, "out of host memory");
    return -1;
  }
  for (size_t o = 0; o < m->n_outputs; o++) {
    if (ntp_cuda_output_host(c, o, &res->outputs[o], err, cap) != 0) {
      ntp_cpu_result_free(res);
      return -1;
    }
    res->n_outputs++;
  }
  return 0;
}

/* ---- the optimizer on the GPUs ------------------------------------------------------------- */

int ntp_cuda_alloc(ntp_cuda *c, int rank, size_t bytes, void **dev, char *err, size_t cap) {
  *dev = NULL;
  if (!local_rank(c, rank)) {
    snprintf(err, cap, "rank %d does not run in this process", rank);
    return -1;
  }
  void **nb = realloc(c->bufs, (c->nbufs + 1) * sizeof *nb);
  int *nd = realloc(c->buf_dev, (c->nbufs + 1) * sizeof *nd);
  if (nb) c->bufs = nb;
  if (nd) c->buf_dev = nd;
  if (!nb || !nd) {
    snprintf(err, cap, "out of host memory");
    return -1;
  }
  CU(cu.cudaSetDevice(c->dev[rank]));
  CU(cu.cudaMalloc(dev, bytes ? bytes : 1));
  CU(cu.cudaMemsetAsync(*dev, 0, bytes ? bytes : 1, c->stream[rank]));
  c->bufs[c->nbufs] = *dev;
  c->buf_dev[c->nbufs++] = c->dev[rank];
  return 0;
fail:
  return -1;
}

int ntp_cuda_put(ntp_cuda *c, int rank, void *dev, const void *host, size_t bytes, char *err, size_t cap) {
  CU(cu.cudaSetDevice(c->dev[rank]));
  CU(cu.cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
  return 0;
fail:
  return -1;
}

int ntp_cuda_get(ntp_cuda *c, int rank, void *host, const void *dev, size_t bytes, char *err, size_t cap) {
  CU(cu.cudaSetDevice(c->dev[rank]));
  if (wait_ranks(c, rank, rank + 1, err, cap) != 0) goto fail;
  CU(cu.cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
  return 0;
fail:
  return -1;
}

static int opt_ready(ntp_cuda *c, char *err, size_t cap) {
  if (c->opt_lib) return 0;
  c->partials = calloc((size_t)c->p->world, sizeof *c->partials);
  if (!c->partials) {
    snprintf(err, cap, "out of host memory");
    return -1;
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++)
    if (ntp_cuda_alloc(c, r, OPT_PARTIALS * sizeof(float), (void **)&c->partials[r], err, cap) != 0) return -1;
  CU(cu.cudaSetDevice(c->dev[c->rank_lo]));
  if (load_library(opt_src, "ntp_optimizer.cu", c->arch, &c->opt_lib, err, cap) != 0) return -1;
  CU(cu.cudaLibraryGetKernel(&c->k_sumsq, c->opt_lib, "ntp_sumsq"));
  CU(cu.cudaLibraryGetKernel(&c->k_adamw, c->opt_lib, "ntp_adamw"));
  return 0;
fail:
  return -1;
}

int ntp_cuda_sumsq(ntp_cuda *c, int32_t t, const unsigned char *mask, double *out, char *err, size_t cap) {
  *out = 0;
  if (opt_ready(c, err, cap) != 0) return -1;
  const ntp_tensor *s = &c->p->tensors[t];
  int r = s->rank, dt = (int)s->dtype;
  long long n = (long long)box_volume(&s->box);
  if (n == 0) return 0;
  int blocks = (int)((n + 255) / 256 < OPT_PARTIALS ? (n + 255) / 256 : OPT_PARTIALS);
  const unsigned char *g = dev_ptr(c, t);
  float *part = c->partials[r], host[OPT_PARTIALS];
  void *args[] = {&g, &dt, &mask, &n, &part};
  CU(cu.cudaSetDevice(c->dev[r]));
  CU(cu.cudaLaunchKernel((const void *)c->k_sumsq, (dim3){(unsigned)blocks, 1, 1}, (dim3){256, 1, 1}, args, 0,
                         c->stream[r]));
  if (ntp_cuda_get(c, r, host, part, (size_t)blocks * sizeof(float), err, cap) != 0) return -1;
  for (int b = 0; b < blocks; b++) *out += host[b];
  return 0;
fail:
  return -1;
}

int ntp_cuda_adamw(ntp_cuda *c, int32_t param, int32_t grad, float *master, float *m, float *v,
                   const ntp_cuda_adamw_args *h, char *err, size_t cap) {
  if (opt_ready(c, err, cap) != 0) return -1;
  const ntp_tensor *s = &c->p->tensors[param];
  int r = s->rank, dt = (int)s->dtype, gdt = grad >= 0 ? (int)c->p->tensors[grad].dtype : 2;
  long long n = (long long)box_volume(&s->box);
  unsigned char *pp = dev_ptr(c, param);
  const unsigned char *gp = grad >= 0 ? dev_ptr(c, grad) : NULL;
  struct { float lr, b1, b2, c1, c2, eps, wd, scale; } hh = {h->lr, h->beta1, h->beta2, h->c1, h->c2, h->eps, h->wd, h->scale};
  void *args[] = {&pp, &dt, &gp, &gdt, &master, &m, &v, &n, &hh};
  CU(cu.cudaSetDevice(c->dev[r]));
  return launch(c->k_adamw, n, args, c->stream[r], err, cap);
fail:
  return -1;
}

int ntp_cuda_tensor_get(ntp_cuda *c, int32_t t, float *host, char *err, size_t cap) {
  const ntp_tensor *s = &c->p->tensors[t];
  int64_t n = box_volume(&s->box);
  size_t es = dtype_bytes(s->dtype);
  unsigned char *buf = malloc((size_t)n * es + 1);
  if (!buf) {
    snprintf(err, cap, "out of host memory");
    return -1;
  }
  if (ntp_cuda_get(c, s->rank, buf, dev_ptr(c, t), (size_t)n * es, err, cap) != 0) {
    free(buf);
    return -1;
  }
  for (int64_t i = 0; i < n; i++) {
    uint16_t b16;
    if (es == 4) memcpy(&host[i], buf + 4 * i, 4);
    else {
      memcpy(&b16, buf + 2 * i, 2);
      host[i] = s->dtype == NTP_BF16 ? ntp_bf16_bits_to_float(b16) : ntp_f16_bits_to_float(b16);
    }
  }
  free(buf);
  return 0;
}

int ntp_cuda_tensor_put(ntp_cuda *c, int32_t t, const float *host, char *err, size_t cap) {
  return upload(c, t, host, err, cap);
}

bool ntp_cuda_runs_rank(const ntp_cuda *c, int r) { return local_rank(c, r); }

bool ntp_cuda_all_here(const ntp_cuda *c) { return c->rank_lo == 0 && c->rank_hi == c->p->world; }

int ntp_cuda_merge(ntp_cuda *c, void *host, size_t bytes, char *err, size_t cap) {
  if (ntp_cuda_all_here(c) || bytes == 0) return 0;
  int r = c->rank_lo;
  void *d = NULL;
  CU(cu.cudaSetDevice(c->dev[r]));
  CU(cu.cudaMalloc(&d, bytes));
  CU(cu.cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  NC(cu.ncclAllReduce(d, d, bytes / 4, ncclInt32, ncclSum, c->world[r], c->stream[r]));
  if (wait_ranks(c, r, r + 1, err, cap) != 0) goto fail;
  CU(cu.cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost));
  cu.cudaFree(d);
  return 0;
fail:
  if (d) cu.cudaFree(d);
  return -1;
}

int ntp_cuda_exchange(ntp_cuda *c, float *const *send, const size_t *n_send, float *const *recv, const size_t *n_recv,
                      char *err, size_t cap) {
  int W = c->p->world, me = c->rank_lo;
  size_t total = 0;
  for (int q = 0; q < W; q++)
    if (q != me) total += n_send[q] + n_recv[q];
  if (total == 0) return 0;
  float *d = NULL;
  CU(cu.cudaSetDevice(c->dev[me]));
  CU(cu.cudaMalloc((void **)&d, total * sizeof(float)));
  size_t at = 0;
  for (int q = 0; q < W; q++) /* the sends first, then the receives, each in rank order */
    if (q != me && n_send[q]) {
      CU(cu.cudaMemcpy(d + at, send[q], n_send[q] * sizeof(float), cudaMemcpyHostToDevice));
      at += n_send[q];
    }
  NC(cu.ncclGroupStart());
  size_t sat = 0, rat = at;
  for (int q = 0; q < W; q++) {
    if (q == me) continue;
    if (n_send[q]) NC(cu.ncclSend(d + sat, n_send[q], ncclFloat32, q, c->world[me], c->stream[me]));
    if (n_recv[q]) NC(cu.ncclRecv(d + rat, n_recv[q], ncclFloat32, q, c->world[me], c->stream[me]));
    sat += n_send[q];
    rat += n_recv[q];
  }
  NC(cu.ncclGroupEnd());
  if (wait_ranks(c, me, me + 1, err, cap) != 0) goto fail;
  for (int q = 0; q < W; q++)
    if (q != me && n_recv[q]) {
      CU(cu.cudaMemcpy(recv[q], d + at, n_recv[q] * sizeof(float), cudaMemcpyDeviceToHost));
      at += n_recv[q];
    }
  cu.cudaFree(d);
  return 0;
fail:
  if (d) cu.cudaFree(d);
  return -1;
}

bool ntp_cuda_peer_lost(ntp_cuda *c) {
  if (nccl_last == ncclRemoteError || nccl_last == ncclSystemError) return true;
  char why[512]; /* every communicator of this process: the stalled operation may be on any of them */
  return comms_state(c, why, sizeof why) < 0 && (nccl_last == ncclRemoteError || nccl_last == ncclSystemError);
}

/* ---- after a failure: the survivors' communicators (ntp_cuda_lose) ---------------------------- */

#ifndef NCCL_SHRINK_ABORT
#define NCCL_SHRINK_ABORT 0x01
#endif

/* Is GPU d one of a failed rank's? (NCCL: a GPU per rank) */
static bool on_dead_gpu(const ntp_cuda *c, int d) {
  for (int r = c->rank_lo; c->dead && r < c->rank_hi; r++)
    if (c->dead[r] && c->dev[r] == d) return true;
  return false;
}

/* What both ways of losing ranks start with: the failed ranks marked (c->dead) and listed for
 * ncclCommShrink (*excl, *nexcl), the survivors' arrays allocated, and whether the world is to be
 * shrunk (the loaded NCCL has ncclCommShrink and NTP_NCCL_NO_SHRINK is not 1). */
static int lose_begin(ntp_cuda *c, const bool *dead, ntp_cuda_survivors *s, int **excl, int *nexcl, char *err,
                      size_t cap) {
  int W = c->p->world;
  *nexcl = 0;
  *excl = calloc((size_t)W, sizeof **excl);
  c->dead = calloc((size_t)W, sizeof *c->dead);
  s->devices = calloc((size_t)W, sizeof *s->devices);
  s->world = calloc((size_t)W, sizeof *s->world);
  if (!*excl || !c->dead || !s->devices || !s->world) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  for (int r = 0; r < W; r++) {
    c->dead[r] = dead[r];
    if (dead[r]) (*excl)[(*nexcl)++] = r;
  }
  const char *no = getenv("NTP_NCCL_NO_SHRINK");
  s->shrunk = cu.ncclCommShrink && !(no && !strcmp(no, "1"));
  return 0;
}

/* ntp_cuda_lose with one rank per process: this process's rank survives; every communicator of
 * it is aborted, and the world shrunk with the other survivors' processes (or made again from a
 * unique id through $NTP_NCCL_ID_FILE.wN). */
static int lose_one(ntp_cuda *c, const bool *dead, ntp_cuda_survivors *s, char *err, size_t cap) {
  int W = c->p->world, me = c->rank_lo, nexcl;
  int *excl = NULL;
  if (lose_begin(c, dead, s, &excl, &nexcl, err, cap) != 0) goto fail;
  if (dead[me]) {
    snprintf(err, cap, "internal: rank %d, run by this process, is among the failed", me);
    goto fail;
  }
  for (int r = 0; r < W; r++)
    if (!dead[r]) s->local += r < me, s->n++;
  for (int i = 0; i < s->n; i++) s->devices[i] = c->dev[me]; /* only this process's is known here */
  CU(cu.cudaSetDevice(c->dev[me]));
  NC(cu.ncclGroupStart()); /* every group, freed together: a peer may wait in any of them */
  for (int k = 0; k < c->nsets; k++)
    if (c->group[me][k]) {
      NC(cu.ncclCommAbort(c->group[me][k]));
      c->group[me][k] = NULL;
      s->aborted++;
    }
  NC(cu.ncclGroupEnd());
  s->how = s->shrunk ? "ncclCommShrink across the processes"
           : cu.ncclCommShrink ? "ncclCommInitRank from a new unique id: NTP_NCCL_NO_SHRINK=1"
                               : "ncclCommInitRank from a new unique id: libnccl has no ncclCommShrink";
  CU(cu.cudaSetDevice(c->dev[me]));
  c->settling = (ncclComm_t *)&s->world[s->local]; /* non-blocking as its parent: settled alone */
  if (s->shrunk) NC(cu.ncclCommShrink(c->world[me], excl, nexcl, (ncclComm_t *)&s->world[s->local], NULL, NCCL_SHRINK_ABORT));
  c->settling = NULL;
  NC(cu.ncclCommAbort(c->world[me]));
  c->world[me] = NULL;
  s->aborted++;
  if (!s->shrunk) {
    const char *path = getenv("NTP_NCCL_ID_FILE");
    if (!path) {
      snprintf(err, cap, "the survivors' world needs NTP_NCCL_ID_FILE (where the first survivor writes the new id)");
      goto fail;
    }
    char p2[4200];
    snprintf(p2, sizeof p2, "%s.w%d", path, s->n);
    ncclUniqueId id;
    if (share_id(p2, s->local == 0, &id, err, cap) != 0) goto fail;
    NC(cu.ncclCommInitRank((ncclComm_t *)&s->world[s->local], s->n, id, s->local));
  }
  free(excl);
  return 0;
fail:
  c->settling = NULL;
  free(excl);
  ntp_cuda_survivors_free(s);
  return -1;
}

int ntp_cuda_lose(ntp_cuda *c, const bool *dead, ntp_cuda_survivors *s, char *err, size_t cap) {
  memset(s, 0, sizeof *s);
  s->local = -1;
  /* the graphs hold the communicators about to be aborted: dropped first (a failed rank's are left
   * on its GPU), and not captured again; what this backend still does is hand the state over */
  for (int r = c->rank_lo; r < c->rank_hi; r++)
    if (dead[r] && c->graph[r]) abandon(c->graph[r]), c->graph[r] = NULL;
  drop_graphs(c);
  c->graphs = false;
  int W = c->p->world, nexcl;
  if (c->nccl && c->own_world && c->rank_hi - c->rank_lo == 1 && W > 1) {
    s->local = 0;
    return lose_one(c, dead, s, err, cap);
  }
  if (!c->nccl || c->rank_lo != 0 || c->rank_hi != W || !c->own_world) {
    snprintf(err, cap, "losing ranks needs every rank in this process, on a GPU each, or one rank per process, with "
             "its own communicators");
    return -1;
  }
  int *excl = NULL;
  if (lose_begin(c, dead, s, &excl, &nexcl, err, cap) != 0) goto fail;
  for (int r = 0; r < W; r++)
    if (!dead[r]) s->devices[s->n++] = c->dev[r];
  if (!s->n) {
    snprintf(err, cap, "no rank survives");
    goto fail;
  }
  /* the groups with a dead member: aborted on their survivors (the dead ranks' own handles are
   * the failed GPU's: left alone) */
  NC(cu.ncclGroupStart()); /* one thread frees several GPUs' communicators: in one group (NCCL's guide) */
  for (int k = 0; k < c->nsets; k++) {
    bool hit = false;
    for (int i = 0; i < c->set_len[k]; i++) hit |= dead[c->sets[k][i]];
    for (int r = 0; hit && r < W; r++) {
      if (!c->group[r][k]) continue;
      if (!dead[r]) {
        CU(cu.cudaSetDevice(c->dev[r]));
        NC(cu.ncclCommAbort(c->group[r][k]));
        s->aborted++;
      }
      c->group[r][k] = NULL;
    }
  }
  NC(cu.ncclGroupEnd());
  /* the world over the survivors: shrunk from the old one (its operations terminated first:
   * NCCL_SHRINK_ABORT), which is then aborted; or aborted and created again */
  s->how = s->shrunk ? "ncclCommShrink" : cu.ncclCommShrink ? "ncclCommInitAll: NTP_NCCL_NO_SHRINK=1"
                                                             : "ncclCommInitAll: libnccl has no ncclCommShrink";
  if (s->shrunk) {
    NC(cu.ncclGroupStart());
    for (int r = 0, i = 0; r < W; r++) {
      if (dead[r]) continue;
      CU(cu.cudaSetDevice(c->dev[r]));
      NC(cu.ncclCommShrink(c->world[r], excl, nexcl, (ncclComm_t *)&s->world[i++], NULL, NCCL_SHRINK_ABORT));
    }
    NC(cu.ncclGroupEnd());
  }
  NC(cu.ncclGroupStart());
  for (int r = 0; r < W; r++) {
    if (!dead[r] && c->world[r]) {
      CU(cu.cudaSetDevice(c->dev[r]));
      NC(cu.ncclCommAbort(c->world[r]));
      s->aborted++;
    }
    c->world[r] = NULL;
  }
  NC(cu.ncclGroupEnd());
  if (!s->shrunk) NC(cu.ncclCommInitAll((ncclComm_t *)s->world, s->n, s->devices));
  free(excl);
  return 0;
fail:
  free(excl);
  ntp_cuda_survivors_free(s);
  return -1;
}

void ntp_cuda_survivors_free(ntp_cuda_survivors *s) {
  if (s->world && cu.nccl) cu.ncclGroupStart(); /* several GPUs' communicators from one thread: one group */
  for (int i = 0; s->world && i < s->n; i++)
    if (s->world[i]) cu.ncclCommDestroy((ncclComm_t)s->world[i]);
  if (s->world && cu.nccl) cu.ncclGroupEnd();
  free(s->devices);
  free(s->world);
  memset(s, 0, sizeof *s);
}

/* A failed GPU's streams, handles, modules and communicators are never released: any call would
 * touch the dead device (on real hardware it may hang). They stay here, reachable for the
 * process's life, abandoned on purpose (a leak checker sees them as such, not as lost). */
static pthread_mutex_t abandoned_lock = PTHREAD_MUTEX_INITIALIZER;
static void **abandoned;
static size_t n_abandoned, abandoned_cap;

static void abandon(void *handle) {
  if (!handle) return;
  pthread_mutex_lock(&abandoned_lock);
  if (n_abandoned == abandoned_cap) {
    size_t cap = abandoned_cap ? 2 * abandoned_cap : 64;
    void **a = realloc(abandoned, cap * sizeof *a);
    if (a) abandoned = a, abandoned_cap = cap;
  }
  if (n_abandoned < abandoned_cap) abandoned[n_abandoned++] = handle;
  pthread_mutex_unlock(&abandoned_lock);
}

/* Every communicator of this process's live ranks, freed in one NCCL group (one thread may hold
 * several GPUs' ranks: NCCL's guide frees them together): destroyed, or, after a wait that saw a
 * lost peer or timed out, aborted (a destroy would wait for the peer for ever). */
static void free_comms(ntp_cuda *c) {
  if (!c->nccl || !c->world || !cu.nccl) return;
  cu.ncclGroupStart();
  for (int r = c->rank_lo; r < c->rank_hi; r++) {
    if (c->dead && c->dead[r]) continue; /* a failed GPU's: abandoned with it (ntp_cuda_free) */
    cu.cudaSetDevice(c->dev[r]);
    for (int k = 0; c->group && c->group[r] && k < c->nsets; k++)
      if (c->group[r][k]) {
        (c->wait_failed ? cu.ncclCommAbort : cu.ncclCommDestroy)(c->group[r][k]);
        c->group[r][k] = NULL;
      }
    if (c->world[r] && c->own_world) (c->wait_failed ? cu.ncclCommAbort : cu.ncclCommDestroy)(c->world[r]);
    c->world[r] = NULL;
  }
  cu.ncclGroupEnd();
}

void ntp_cuda_free(ntp_cuda *c) {
  if (!c) return;
  /* what is still queued (the last AdamW, with nothing read back after it) finishes before
   * anything it uses is freed: polled, as every wait on NCCL is */
  char why[512];
  if (c->stream && !c->wait_failed && wait_streams(c, why, sizeof why) != 0) c->wait_failed = true;
  drop_graphs(c); /* before the modules its kernels live in */
  free_comms(c);
  /* after an abort, what was queued behind the aborted operations runs: it ends before its memory,
   * descriptors and modules go (if it never does, they are left, as a failed GPU's are) */
  if (c->wait_failed && c->stream && wait_streams(c, why, sizeof why) != 0) return;
  for (size_t e = 0; c->done && e < c->p->n_steps * (size_t)c->p->world; e++) {
    if (!c->done[e]) continue;
    int r = (int)(e % (size_t)c->p->world);
    if (c->dead && c->dead[r]) abandon(c->done[e]);
    else cu.cudaSetDevice(c->dev[r]), cu.cudaEventDestroy(c->done[e]);
  }
  ntp_comm_deps_free(&c->deps);
  ntp_launch_order_free(&c->order);
  ntp_footprints_free(&c->fp);
  for (size_t s = 0; c->gemms && s < 2 * c->p->n_steps; s++) {
    gemm *g = &c->gemms[s];
    if (g->op) cu.cublasLtMatmulDescDestroy(g->op);
    if (g->a) cu.cublasLtMatrixLayoutDestroy(g->a);
    if (g->b) cu.cublasLtMatrixLayoutDestroy(g->b);
    if (g->c) cu.cublasLtMatrixLayoutDestroy(g->c);
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++) {
    if (c->dead && c->dead[r]) { /* failed with its GPU: its memory, streams and handles are left there */
      for (int k = 0; c->group && c->group[r] && k < c->nsets; k++) abandon(c->group[r][k]);
      if (c->group) free(c->group[r]);
      if (c->kern) free(c->kern[r]);
      if (c->world && c->own_world) abandon(c->world[r]);
      if (c->lib) abandon(c->lib[r]);
      bool owner = c->nccl || r == c->rank_lo;
      if (owner && c->lt) abandon(c->lt[r]);
      if (owner && c->stream) abandon(c->stream[r]);
      if (owner && c->overlap && c->comm) abandon(c->comm[r]), abandon(c->fork[r]), abandon(c->join[r]);
      continue;
    }
    if (c->dev) cu.cudaSetDevice(c->dev[r]);
    if (c->group) free(c->group[r]); /* its communicators: free_comms */
    if (c->arena && c->arena[r]) cu.cudaFree(c->arena[r]);
    if (c->persist && c->persist[r]) cu.cudaFree(c->persist[r]);
    if (c->staging && c->staging[r]) cu.cudaFree(c->staging[r]);
    if (c->lib && c->lib[r]) cu.cudaLibraryUnload(c->lib[r]);
    if (c->kern) free(c->kern[r]);
    bool owner = c->nccl || r == c->rank_lo; /* loopback shares the first rank's stream and handle */
    if (owner && c->workspace && c->workspace[r]) cu.cudaFree(c->workspace[r]);
    if (owner && c->lt && c->lt[r]) cu.cublasLtDestroy(c->lt[r]);
    if (owner && c->stream && c->stream[r]) cu.cudaStreamDestroy(c->stream[r]);
    if (owner && c->overlap && c->comm && c->comm[r]) cu.cudaStreamDestroy(c->comm[r]);
    if (owner && c->fork && c->fork[r]) cu.cudaEventDestroy(c->fork[r]);
    if (owner && c->join && c->join[r]) cu.cudaEventDestroy(c->join[r]);
  }
  for (size_t b = 0; b < c->nbufs; b++) {
    if (on_dead_gpu(c, c->buf_dev[b])) continue;
    cu.cudaSetDevice(c->buf_dev[b]);
    cu.cudaFree(c->bufs[b]);
  }
  free(c->bufs);
  free(c->buf_dev);
  free(c->partials); /* its buffers are among bufs */
  if (c->opt_lib) cu.cudaLibraryUnload(c->opt_lib);
  if (c->comm_lib) cu.cudaLibraryUnload(c->comm_lib);
  if (c->scratch) cu.cudaFree(c->scratch);
  bool ev_dead = c->dev && on_dead_gpu(c, c->dev[c->rank_lo]); /* created there */
  if (c->ev0) ev_dead ? abandon(c->ev0) : (void)cu.cudaEventDestroy(c->ev0);
  if (c->ev1) ev_dead ? abandon(c->ev1) : (void)cu.cudaEventDestroy(c->ev1);
  for (size_t i = 0; c->prof_ev && i <= c->p->n_steps; i++)
    if (c->prof_ev[i]) ev_dead ? abandon(c->prof_ev[i]) : (void)cu.cudaEventDestroy(c->prof_ev[i]);
  free(c->prof_ev);
  free(c->prof_layer);
  free(c->dead);
  free(c->dev);
  free(c->stream);
  free(c->comm);
  free(c->fork);
  free(c->join);
  free(c->done);
  free(c->graph);
  free(c->lt);
  free(c->workspace);
  free(c->workspace_size);
  free(c->arena);
  free(c->persist);
  free(c->staging);
  free(c->staging_bytes);
  free(c->lib);
  free(c->kern);
  free(c->world);
  free(c->group);
  free(c->step_set);
  free(c->sets);
  free(c->set_len);
  free(c->gemms);
  free(c->filled);
  free(c);
}

#else /* built without the CUDA headers: every entry point says so */

int ntp_cuda_available(char *err, size_t cap) {
  snprintf(err, cap, "this runtime was built without the CUDA toolkit headers; the CUDA backend is unavailable");
  return -1;
}
int ntp_cuda_create(const ntp_program *p, const ntp_cuda_options *o, ntp_cuda **out, char *err, size_t cap) {
  (void)p, (void)o;
  *out = NULL;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_set(ntp_cuda *c, int32_t v, const ntp_host_tensor *g, char *err, size_t cap) {
  (void)c, (void)v, (void)g;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_load(ntp_cuda *c, const ntp_safetensors *f, char *err, size_t cap) {
  (void)c, (void)f;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_forward(ntp_cuda *c, uint64_t seed, ntp_cpu_result *res, char *err, size_t cap) {
  (void)c, (void)seed, (void)res;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_run(ntp_cuda *c, uint64_t seed, double *seconds, char *err, size_t cap) {
  (void)c, (void)seed, (void)seconds;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_device_of(ntp_cuda *c, const void *data, int *dev) {
  (void)c, (void)data, (void)dev;
  return -1;
}
int ntp_cuda_copy_to_host(ntp_cuda *c, void *dst, const void *src, size_t bytes, char *err, size_t cap) {
  (void)c, (void)dst, (void)src, (void)bytes;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_set_device(ntp_cuda *c, int32_t v, const void *data, int dev, char *err, size_t cap) {
  (void)c, (void)v, (void)data, (void)dev;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_output_device(ntp_cuda *c, size_t o, void *data, int dev, char *err, size_t cap) {
  (void)c, (void)o, (void)data, (void)dev;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_output_host(ntp_cuda *c, size_t o, ntp_host_tensor *h, char *err, size_t cap) {
  (void)c, (void)o, (void)h;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_alloc(ntp_cuda *c, int rank, size_t bytes, void **dev, char *err, size_t cap) {
  (void)c, (void)rank, (void)bytes, (void)dev;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_put(ntp_cuda *c, int rank, void *dev, const void *host, size_t bytes, char *err, size_t cap) {
  (void)c, (void)rank, (void)dev, (void)host, (void)bytes;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_get(ntp_cuda *c, int rank, void *host, const void *dev, size_t bytes, char *err, size_t cap) {
  (void)c, (void)rank, (void)dev, (void)host, (void)bytes;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_sumsq(ntp_cuda *c, int32_t t, const unsigned char *mask, double *out, char *err, size_t cap) {
  (void)c, (void)t, (void)mask, (void)out;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_adamw(ntp_cuda *c, int32_t param, int32_t grad, float *master, float *m, float *v,
                   const ntp_cuda_adamw_args *h, char *err, size_t cap) {
  (void)c, (void)param, (void)grad, (void)master, (void)m, (void)v, (void)h;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_tensor_get(ntp_cuda *c, int32_t t, float *host, char *err, size_t cap) {
  (void)c, (void)t, (void)host;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_tensor_put(ntp_cuda *c, int32_t t, const float *host, char *err, size_t cap) {
  (void)c, (void)t, (void)host;
  return ntp_cuda_available(err, cap);
}
void ntp_cuda_free(ntp_cuda *c) { (void)c; }
void *ntp_cuda_dl(const char *which, char *err, size_t cap) {
  (void)which;
  return ntp_cuda_available(err, cap), NULL;
}
int ntp_cuda_profile_layers(ntp_cuda *c, bool on, char *err, size_t cap) {
  (void)c, (void)on;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_layer_times(const ntp_cuda *c, double *seconds, size_t n, char *err, size_t cap) {
  (void)c, (void)seconds, (void)n;
  return ntp_cuda_available(err, cap);

}
int ntp_cuda_use_graphs(ntp_cuda *c, bool on) {
  (void)c, (void)on;
  return -1;
}
void ntp_cuda_host_time(const ntp_cuda *c, ntp_cuda_host *h) {
  (void)c;
  memset(h, 0, sizeof *h);
}
int ntp_cuda_lose(ntp_cuda *c, const bool *dead, ntp_cuda_survivors *s, char *err, size_t cap) {
  (void)c, (void)dead;
  memset(s, 0, sizeof *s);
  return ntp_cuda_available(err, cap);
}
void ntp_cuda_survivors_free(ntp_cuda_survivors *s) { memset(s, 0, sizeof *s); }
bool ntp_cuda_runs_rank(const ntp_cuda *c, int r) {
  (void)c, (void)r;
  return true;
}
bool ntp_cuda_all_here(const ntp_cuda *c) {
  (void)c;
  return true;
}
int ntp_cuda_merge(ntp_cuda *c, void *host, size_t bytes, char *err, size_t cap) {
  (void)c, (void)host, (void)bytes;
  return ntp_cuda_available(err, cap);
}
bool ntp_cuda_peer_lost(ntp_cuda *c) {
  (void)c;
  return false;
}
int ntp_cuda_exchange(ntp_cuda *c, float *const *send, const size_t *n_send, float *const *recv, const size_t *n_recv,
                      char *err, size_t cap) {
  (void)c, (void)send, (void)n_send, (void)recv, (void)n_recv;
  return ntp_cuda_available(err, cap);
}
void ntp_cuda_gemm_summary(const ntp_cuda *c, ntp_cuda_gemms *out) {
  (void)c;
  *out = (ntp_cuda_gemms){0};
}
void ntp_cuda_overlap_summary(const ntp_cuda *c, ntp_cuda_overlap *out) {
  (void)c;
  *out = (ntp_cuda_overlap){0};
}
#endif

void ntp_cuda_overlap_line(const ntp_cuda_overlap *s, char *buf, size_t cap) {
  if (!s->on) {
    snprintf(buf, cap, "overlap: off (NTP_CUDA_OVERLAP=0: step order, collectives on the compute stream)");
    return;
  }
  int n = snprintf(buf, cap, "overlap: %d collectives with a consumer, %d with compute in flight (was %d), "
                   "%d launches between them and their consumers (was %d), %d launches moved",
                   s->consumed, s->overlapped, s->overlapped_before, s->launches, s->launches_before, s->moved);
  if (s->ranks > 1 && n > 0 && (size_t)n < cap)
    snprintf(buf + n, cap - (size_t)n, " (collective and rank pairs over this process's %d ranks)", s->ranks);
}

void ntp_cuda_gemm_line(const ntp_cuda_gemms *s, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "cuBLASLt: %d GEMMs, %d distinct shapes (one heuristic query each), workspace %zu bytes "
                   "per GPU on %d (algorithms allowed %zu); epilogues:", s->gemms, s->shapes, s->workspace, s->gpus,
                   s->workspace_cap);
  for (int e = 0; e < CG_EPI_COUNT && n > 0 && (size_t)n < cap; e++)
    n += snprintf(buf + n, cap - (size_t)n, " %s %d", cg_epilogue_name((cg_epilogue)e), s->epilogues[e]);
}

