/* cuda_internal.h — what the files of the CUDA backend (runtime/cuda/) share: the libraries' function
 * table, the backend's state (struct ntp_cuda), the GEMM records, the error macros and the helpers
 * one file defines and others call. Private: the backend's interface is cuda_backend.h. Only
 * compiled with the CUDA toolkit's headers (types and prototypes; every library is loaded at run time). */
#ifndef NTP_CUDA_INTERNAL_H
#define NTP_CUDA_INTERNAL_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
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
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

/* nothing below leaves the runtime library (libntprt.so, libntp_native.so export only ntp_*) */
#pragma GCC visibility push(hidden)

#define FN(name) __typeof__(&name) name
typedef struct cu_api_table {
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
  /* NCCL 2.29 and later (NULL before): a repaired GPU's rank joins the world (ntp_cuda_grow) */
  ncclResult_t (*ncclCommGetUniqueId)(ncclComm_t, ncclUniqueId *);
  ncclResult_t (*ncclCommGrow)(ncclComm_t, int, const ncclUniqueId *, int, ncclComm_t *, ncclConfig_t *);
  FN(ncclAllReduce);
  FN(ncclSend);
  FN(ncclRecv);
  FN(ncclGroupStart);
  FN(ncclGroupEnd);
  FN(ncclGetErrorString);
  FN(ncclCommGetAsyncError); /* optional: NULL where the library lacks it */
  FN(ncclCommInitRankConfig); /* optional (NCCL 2.14): non-blocking communicators need it */
} cu_api_table;
extern cu_api_table cu_api; /* libraries.c */

/* CUDA and cuBLAS failures become messages with the call and its place. */
#define CU(call)                                                                                          \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    if (e_ != cudaSuccess) {                                                                              \
      snprintf(err, cap, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cu_api.cudaGetErrorString(e_));      \
      goto fail;                                                                                          \
    }                                                                                                     \
  } while (0)
/* A non-blocking communicator's call may return ncclInProgress: NCCL then wants
 * ncclCommGetAsyncError to say ncclSuccess before the next call (cu_settle, wait.c). */
#define NC(call)                                                                                          \
  do {                                                                                                    \
    ncclResult_t n_ = (call);                                                                             \
    if (n_ == ncclInProgress) n_ = cu_settle(c, err, cap) == 0 ? ncclSuccess : cu_nccl_last;              \
    if (n_ != ncclSuccess) {                                                                              \
      cu_nccl_last = n_;                                                                                  \
      snprintf(err, cap, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cu_api.ncclGetErrorString(n_));      \
      goto fail;                                                                                          \
    }                                                                                                     \
  } while (0)
#define LT(call)                                                                                          \
  do {                                                                                                    \
    cublasStatus_t s_ = (call);                                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                    \
      snprintf(err, cap, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cu_api.cublasLtGetStatusString(s_)); \
      goto fail;                                                                                          \
    }                                                                                                     \
  } while (0)

typedef struct box_geom {
  int64_t n;
  int32_t nd, esize;
  int64_t len[NTP_MAX_RANK], sstr[NTP_MAX_RANK], dstr[NTP_MAX_RANK], soff, doff;
} box_geom;

/* What the runtime's own kernels share: storage loads as float and round-to-nearest-even
 * stores, by dtype (0 bf16, 1 fp16, 2 fp32: ntp_dtype's numbers). */
#define RUNTIME_KERNEL_PRELUDE                                                                            \
  "typedef long long i64; typedef unsigned short u16; typedef unsigned int u32;\n"                        \
  NTP_CUDA_F16_CONVERSIONS                                                                                \
  "__device__ float ldv(const unsigned char *p, int dt, i64 i) {\n"                                       \
  "  if (dt == 0) return __uint_as_float(((u32)((const u16 *)p)[i]) << 16);\n"                            \
  "  if (dt == 1) return f16_to_f32(((const u16 *)p)[i]);\n"                                              \
  "  return ((const float *)p)[i];\n"                                                                     \
  "}\n"                                                                                                   \
  "__device__ void stv(unsigned char *p, int dt, i64 i, float f) {\n"                                     \
  "  if (dt == 2) { ((float *)p)[i] = f; return; }\n"                                                     \
  "  if (dt == 1) { ((u16 *)p)[i] = f32_to_f16(f); return; }\n"                                           \
  "  u32 u = __float_as_uint(f);\n"                                                                       \
  "  if ((u & 0x7fffffffu) > 0x7f800000u) { ((u16 *)p)[i] = (u16)((u >> 16) | 0x40u); return; }\n"        \
  "  u += 0x7fffu + ((u >> 16) & 1u); ((u16 *)p)[i] = (u16)(u >> 16);\n"                                  \
  "}\n"

/* What a heuristic's answer depends on: one query per distinct key (the model's GEMMs repeat a
 * few shapes layer after layer), shared by the ranks of one GPU. */
typedef struct gemm_shape {
  int64_t n, cols, k, batch; /* column-major D is n x cols, over k, in batch strided batches */
  int32_t trans, dtype, epilogue, bias_dtype;
  int device;
} gemm_shape;

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
static inline bool stream_owner(const ntp_cuda *c, int r) { return c->nccl || r == c->rank_lo; }

static inline bool local_rank(const ntp_cuda *c, int r) { return r >= c->rank_lo && r < c->rank_hi; }

static inline unsigned char *dev_ptr(const ntp_cuda *c, int32_t t) {
  const ntp_tensor *s = &c->p->tensors[t];
  return (s->persistent ? c->persist[s->rank] : c->arena[s->rank]) + s->offset;
}

/* The last NCCL call that failed, by the NC macro (ntp_cuda_peer_lost reads it). */
extern ncclResult_t cu_nccl_last;
#undef FN

/* libraries.c */
int cu_load_nccl(char *err, size_t cap);

/* wait.c */
double cu_host_now(void);
int cu_comms_state(ntp_cuda *c, char *err, size_t cap);
int cu_settle(ntp_cuda *c, char *err, size_t cap);
int cu_wait_ranks(ntp_cuda *c, int lo, int hi, char *err, size_t cap);
int cu_wait_streams(ntp_cuda *c, char *err, size_t cap);

/* gemm.c */
cudaDataType_t cu_data_type(ntp_dtype dt);
int cu_gemm_setup(ntp_cuda *c, const ntp_step *st, const cg_step *cs, gemm *g, char *err, size_t cap);

/* attention.c */
int cu_attention_gemm_setup(ntp_cuda *c, size_t s, char *err, size_t cap);
int cu_run_attention_gemm(ntp_cuda *c, size_t s, const cg_step *cs, uint64_t seed, char *err, size_t cap);

/* launch.c */
int cu_launch_step_kernel(ntp_cuda *c, int r, const cg_step *cs, int32_t kernel, int64_t grid, uint64_t seed, char *err, size_t cap);
void cu_drop_graphs(ntp_cuda *c);

/* collectives.c */
extern const char cu_comm_src[];
int cu_launch(cudaKernel_t k, int64_t n, void **args, cudaStream_t stream, char *err, size_t cap);
int cu_copy_box(ntp_cuda *c, const ntp_box *x, const ntp_box *sbox, unsigned char *sp, const ntp_box *dbox, unsigned char *dp, ntp_dtype dt, cudaStream_t stream, char *err, size_t cap);
int cu_run_comm_loopback(ntp_cuda *c, const ntp_step *st, char *err, size_t cap);
bool cu_symmetric_reduction(const ntp_program *p, const ntp_step *st);
int cu_run_comm_nccl(ntp_cuda *c, int32_t si, const ntp_step *st, char *err, size_t cap);

/* compile.c */
int cu_compute_capability(int dev, char *err, size_t cap);
int cu_load_image(const void *cubin, const char *name, cudaLibrary_t *lib, char *err, size_t cap);
int cu_load_library(const char *src, const char *name, int arch, cudaLibrary_t *lib, char *err, size_t cap);
int cu_compile_ranks(ntp_cuda *c, int arch, void **cubin, int *first, char *err, size_t cap);

/* world.c */
int cu_share_id(const char *path, bool first, ncclUniqueId *id, char *err, size_t cap);
int cu_nccl_world(ntp_cuda *c, const ntp_cuda_options *o, char *err, size_t cap);
int cu_nccl_groups(ntp_cuda *c, char *err, size_t cap);

/* lifecycle.c */
int cu_comm_rank(const ntp_cuda *c, int r);

/* failover.c */
bool cu_on_dead_gpu(const ntp_cuda *c, int d);
void cu_abandon(void *handle);

#pragma GCC visibility pop
#endif
