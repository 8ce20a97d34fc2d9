/* cuda_backend.h — the CUDA backend of libntprt: the same step list as the CPU simulation,
 * with NVRTC-compiled kernels (disk-cached), cuBLASLt GEMMs and, across GPUs, NCCL.
 * Every CUDA library is loaded with dlopen: binaries start on machines without a GPU, and
 * the calls below then fail with a message saying so. */
#ifndef NTP_CUDA_BACKEND_H
#define NTP_CUDA_BACKEND_H

#include <stdbool.h>

#include "ntprt.h"

typedef struct ntp_cuda_options {
  int loopback;   /* every rank on one GPU; collectives as device copies and reductions */
  int device;     /* loopback: the GPU; else the first GPU of this process's ranks */
  int rank_lo, rank_hi; /* ranks run by this process (a thread per GPU); [0, world) by default */
  void *nccl_comm; /* an existing world communicator (one local rank), or NULL to create one */
  /* NCCL, every rank in this process (the survivors of a failure, ntp_cuda_lose): per rank, its
   * GPU (NULL: device + rank), and its world communicator, taken over by ntp_cuda_create (each
   * entry set to NULL as it is taken; freed with the backend, also when the create fails) */
  const int *devices;
  void **nccl_world;
} ntp_cuda_options;

typedef struct ntp_cuda ntp_cuda;

/* 0 when a CUDA GPU is usable; else -1 with the reason ("no CUDA driver", "no GPU"). */
int ntp_cuda_available(char *err, size_t cap);
/* p must carry every rank's CUDA (p->cuda: an image written after the codegen pass). */
int ntp_cuda_create(const ntp_program *p, const ntp_cuda_options *o, ntp_cuda **out, char *err, size_t cap);
int ntp_cuda_set(ntp_cuda *c, int32_t value, const ntp_host_tensor *global, char *err, size_t cap);
int ntp_cuda_load(ntp_cuda *c, const ntp_safetensors *f, char *err, size_t cap);
/* One forward; outputs assembled on the host. seconds: device time of the forward. With one
 * rank per process, output elements held by other processes are NaN. */
int ntp_cuda_forward(ntp_cuda *c, uint64_t seed, ntp_cpu_result *res, char *err, size_t cap);
/* The same in parts: the forward (outputs stay on the GPUs), then each output to the host, or
 * into a global tensor in device memory on GPU dev (storage dtype; only the elements this
 * process holds are written). */
int ntp_cuda_run(ntp_cuda *c, uint64_t seed, double *seconds, char *err, size_t cap);
/* Host time of the runs: how long the host took to enqueue a run's work (graph launches, or every
 * step's calls launched one by one; not the capture, not the GPU's time), for the last run, and
 * the last run of each mode (0 where none ran), and the program's layer count, for the per-layer
 * figure `ntpc run --backend cuda` prints ("host ... us per layer with graphs ..., without ..."). */
typedef struct ntp_cuda_host {
  double last_s, graph_s, direct_s;
  int layers;  /* distinct layer numbers, at least 1 */
  bool graphs; /* the mode runs use now */
} ntp_cuda_host;
void ntp_cuda_host_time(const ntp_cuda *c, ntp_cuda_host *h);
/* Graphs on (the default; NTP_CUDA_GRAPHS=0 starts with them off) or off: launched step by step.
 * 0, or -1 where the backend is a stub or graphs cannot be had: NCCL joins several GPUs of this
 * process (NCCL's guide: their graphs launched from one thread may deadlock; one rank per process
 * keeps them). */
int ntp_cuda_use_graphs(ntp_cuda *c, bool on);
int ntp_cuda_output_host(ntp_cuda *c, size_t output, ntp_host_tensor *h, char *err, size_t cap);
int ntp_cuda_output_device(ntp_cuda *c, size_t output, void *data, int dev, char *err, size_t cap);
/* Value v (an input or parameter) from a global tensor in device memory on GPU dev, storage dtype. */
int ntp_cuda_set_device(ntp_cuda *c, int32_t v, const void *data, int dev, char *err, size_t cap);
int ntp_cuda_copy_to_host(ntp_cuda *c, void *dst, const void *src, size_t bytes, char *err, size_t cap);
/* 0 and the GPU when data is device memory (cudaPointerGetAttributes); -1 otherwise. */
int ntp_cuda_device_of(ntp_cuda *c, const void *data, int *dev);
void ntp_cuda_free(ntp_cuda *c);
/* The GEMMs this process runs, for NTP_VERBOSE: how many, the distinct shapes (one cuBLASLt
 * heuristic query each), the workspace (the largest of any GPU's, sized from the chosen
 * algorithms; at most workspace_cap, NTP_CUBLASLT_WORKSPACE), and how many per epilogue. */
typedef struct ntp_cuda_gemms {
  int gemms, shapes, gpus;
  size_t workspace, workspace_cap;
  int epilogues[CG_EPI_COUNT];
} ntp_cuda_gemms;
void ntp_cuda_gemm_summary(const ntp_cuda *c, ntp_cuda_gemms *out);
/* the summary as one line, "cuBLASLt: ..." (no newline) */
void ntp_cuda_gemm_line(const ntp_cuda_gemms *s, char *buf, size_t cap);
/* The overlap of collectives with compute in this process, for NTP_VERBOSE (launch_order.h):
 * over the collectives and this process's ranks where the rank has a consumer (the first launch
 * that waits for it), how many have compute of the rank enqueued between the collective and that
 * consumer, in the launch order and (before) in step order, and how many launches were moved
 * ahead of an earlier step; off: NTP_CUDA_OVERLAP=0 (step order, one stream). */
typedef struct ntp_cuda_overlap {
  bool on;
  int ranks;
  int32_t consumed, overlapped, overlapped_before, launches, launches_before, moved;
} ntp_cuda_overlap;
void ntp_cuda_overlap_summary(const ntp_cuda *c, ntp_cuda_overlap *out);
/* "overlap: ..." (no newline) */
void ntp_cuda_overlap_line(const ntp_cuda_overlap *s, char *buf, size_t cap);
/* Does rank r run in this process? (every rank does, but with one rank per process) */
bool ntp_cuda_runs_rank(const ntp_cuda *c, int r);
/* Does every rank of the program run in this process? */
bool ntp_cuda_all_here(const ntp_cuda *c);
/* One rank per process: every process's `bytes` (a multiple of 4) merged, in place: each 4-byte
 * word becomes the sum, as int32, of the processes' words; so where at most one process sets a
 * word and the others leave it 0, every process gets that word's bits exactly (an all-gather of
 * disjoint pieces as one all-reduce on the world communicator). Nothing when every rank is here. */
int ntp_cuda_merge(ntp_cuda *c, void *host, size_t bytes, char *err, size_t cap);
/* One rank per process: host floats to and from the other ranks' processes, as one group of
 * ncclSend/ncclRecv on the world communicator: send[q] (n_send[q] floats) to rank q, recv[q]
 * (n_recv[q]) from it; the entries of this process's own rank are ignored. Bits are kept. */
int ntp_cuda_exchange(ntp_cuda *c, float *const *send, const size_t *n_send, float *const *recv, const size_t *n_recv,
                      char *err, size_t cap);
/* After a call failed: did NCCL report a lost peer (ncclRemoteError or ncclSystemError from a call,
 * or from ncclCommGetAsyncError on this process's world communicator)? */
bool ntp_cuda_peer_lost(ntp_cuda *c);

/* ---- after a failure (NCCL: every rank in this process, one GPU each; or one rank per process) ---- */
/* The ranks marked in dead (by rank) have failed with their GPUs. On the survivors, every
 * communicator with a dead member is aborted (ncclCommAbort: a destroy would wait for the dead
 * peer), and the world comes back over the survivors alone: ncclCommShrink (NCCL_SHRINK_ABORT)
 * where the loaded libnccl has it and NTP_NCCL_NO_SHRINK is not 1, else a new ncclCommInitAll
 * over their GPUs. The dead ranks' own communicators, memory and streams are left as they are:
 * nothing touches a failed GPU again, in this call, in ntp_cuda_get of a survivor's memory, or
 * in ntp_cuda_free(c). c runs no step afterwards.
 * With one rank per process (a dead rank's process is gone), every survivor process calls it:
 * every communicator of c is aborted (a peer may be waiting in any of them, for a rank that left
 * the step at its error), and the world shrunk with the others, or, without ncclCommShrink, made
 * again by ncclCommInitRank from a unique id that the first survivor writes to
 * $NTP_NCCL_ID_FILE.wN (N: the survivors). s->local is then this process's rank among the
 * survivors and s->world[s->local] its world communicator; -1 with every rank here. */
typedef struct ntp_cuda_survivors {
  int n;         /* the surviving ranks, in rank order */
  int *devices;  /* [n] their GPUs */
  void **world;  /* [n] their world communicator (rank i of n): for ntp_cuda_options.nccl_world */
  int aborted;   /* communicators aborted */
  bool shrunk;   /* by ncclCommShrink; else ncclCommInitAll */
  const char *how; /* which, and why: "ncclCommShrink", "ncclCommInitAll (NTP_NCCL_NO_SHRINK=1)", ... */
  int local;     /* one rank per process: this process's new rank; -1: every rank here */
} ntp_cuda_survivors;
int ntp_cuda_lose(ntp_cuda *c, const bool *dead, ntp_cuda_survivors *s, char *err, size_t cap);
/* A repair: the next program's `world` ranks are c's ranks (from[r]: the rank of c that is its
 * rank r) and new ones (from[r] = -1) on GPUs devices[r]. The newcomers' GPUs are inspected first
 * (the same architecture as c's), then c's world communicator grows by them (ncclCommGrow; c's
 * ranks keep their NCCL numbers, the newcomers follow) and is split into the next program's rank
 * order; s->world[r] is its rank r's world communicator, for ntp_cuda_options.nccl_world. 0 grown;
 * 1 not here (s->how says why: the loaded libnccl has no ncclCommGrow, NTP_NCCL_NO_GROW=1, one rank
 * per process, or the next world drops a rank of c) and nothing changed; -1 with err. c's own
 * communicators are c's still (freed with it). */
int ntp_cuda_grow(ntp_cuda *c, int world, const int *from, const int *devices, ntp_cuda_survivors *s, char *err,
                  size_t cap);
/* After ntp_cuda_lose: the next program's `world` ranks in their own order, rank r being survivor
 * from[r] (0 .. s->n - 1; not the survivors' own order: ntp_exec_survivors_order calls only then);
 * a survivor no rank names is idle. Their world is split into it (ncclCommSplit, the idle ones NCCL_SPLIT_NOCOLOR; with one rank per
 * process every survivor's process takes part) and the shrunk one destroyed; s then describes the
 * next world. 0; 1 when this process's rank is idle (its world let go: it has nothing more to
 * run); -1 with err. */
int ntp_cuda_survivors_order(ntp_cuda *c, ntp_cuda_survivors *s, int world, const int32_t *from, char *err, size_t cap);
/* the arrays, and the communicators ntp_cuda_create did not take (destroyed) */
void ntp_cuda_survivors_free(ntp_cuda_survivors *s);

/* ---- the optimizer on the GPUs (train.c keeps its state beside each rank's slices) ---- */
/* `bytes` of zeroed device memory on `rank`'s GPU, freed with c. */
int ntp_cuda_alloc(ntp_cuda *c, int rank, size_t bytes, void **dev, char *err, size_t cap);
/* host -> device and device -> host copies on rank's GPU (get waits for the rank's stream) */
int ntp_cuda_put(ntp_cuda *c, int rank, void *dev, const void *host, size_t bytes, char *err, size_t cap);
int ntp_cuda_get(ntp_cuda *c, int rank, void *host, const void *dev, size_t bytes, char *err, size_t cap);
/* tensor t of the program (on its rank's GPU) as fp32 on the host, and set from fp32 (rounded
 * to its dtype; a persistent slice so set is not initialised any more) */
int ntp_cuda_tensor_get(ntp_cuda *c, int32_t t, float *host, char *err, size_t cap);
int ntp_cuda_tensor_put(ntp_cuda *c, int32_t t, const float *host, char *err, size_t cap);
/* the sum of t[e]^2 over the elements whose mask byte (device memory, box_volume bytes) is set */
int ntp_cuda_sumsq(ntp_cuda *c, int32_t t, const unsigned char *mask, double *out, char *err, size_t cap);
/* One AdamW step of parameter slice `param` (a persistent tensor) from its gradient `grad`
 * (-1: none, a zero gradient) in place: fp32 master, moments m and v (device memory of the
 * slice's size on its GPU), the slice rounded from the master. Enqueued on the rank's stream. */
typedef struct ntp_cuda_adamw_args {
  float lr, beta1, beta2, c1, c2, eps; /* c1, c2: the bias corrections 1 - beta^k */
  float wd;                            /* this parameter's decoupled weight decay (0: none) */
  float scale;                         /* the gradients' clipping factor */
} ntp_cuda_adamw_args;
int ntp_cuda_adamw(ntp_cuda *c, int32_t param, int32_t grad, float *master, float *m, float *v,
                   const ntp_cuda_adamw_args *h, char *err, size_t cap);

/* ---- measurement (ntpc calibrate, bench/) ---- */
/* Per-layer device times: while on, ntp_cuda_run launches the steps one by one (no CUDA graph)
 * with a CUDA event on the first rank's stream wherever the step list enters another layer;
 * NTP_CUDA_PROFILE=layers turns it on at ntp_cuda_create. ntp_cuda_layer_times gives the last
 * run's seconds per global layer (seconds[l], l < n - 1; the model-level steps, and layers past
 * n - 2, in seconds[n - 1]); the initialisation steps are not counted. */
int ntp_cuda_profile_layers(ntp_cuda *c, bool on, char *err, size_t cap);
int ntp_cuda_layer_times(const ntp_cuda *c, double *seconds, size_t n, char *err, size_t cap);
/* With NTP_CUDA_PROFILE=layers, the last run's times as lines appended to buf: "layer NAME SECONDS"
 * in layer order, then "layer (model) SECONDS" for the model-level steps (what `ntpc run --backend
 * cuda` and bench/bench_model print, and bench/cost_model_error.sh compares with `ntpc plan
 * --layer-times`); nothing when profiling is off. 0, or -1 with a message. */
int ntp_cuda_layer_report(const ntp_cuda *c, const ntp_program *p, char *buf, size_t cap, char *err, size_t ecap);
/* The dlopen handle of "cudart", "cublasLt" or "nccl", loaded as the backend loads them
 * (NTP_CUDART_LIB, ...): runtime/cuda/cuda_measure.c fetches what it calls from the same libraries. */
void *ntp_cuda_dl(const char *which, char *err, size_t cap);

/* The NVRTC JIT with its disk cache: key = hash of (source, options, NVRTC version, arch),
 * in $NTP_CACHE_DIR (default ~/.cache/ntp), written to a temporary file and renamed into
 * place; NTP_NO_CACHE=1 bypasses it. *hit tells whether the cache served the CUBIN. */
int ntp_jit_cubin(const char *src, const char *name, int arch, void **cubin, size_t *size, int *hit, char *err,
                  size_t cap);

#endif
