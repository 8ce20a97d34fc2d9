/* cuda_measure.c — measurements on the local GPUs (see cuda_measure.h).
 *
 * The calls come from the libraries the CUDA backend loaded (ntp_cuda_dl), fetched here by
 * name into a small table of our own, so the backend's table stays the backend's. Every
 * measurement is: set up, one warm-up, `iters` repetitions between two CUDA events, clean up. */
#define _GNU_SOURCE
#include "cuda_measure.h"
#include "cuda_backend.h"
#include "nvrtc_dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ntp_measure_coll_name(ntp_measure_coll k) {
  static const char *const names[] = {"all-reduce", "reduce-scatter", "all-gather"};
  return k < NTP_MEASURE_NCOLLS ? names[k] : "?";
}

#if NTP_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#define FN(name) __typeof__(&name) name
static struct {
  bool ready;
  FN(cudaGetDeviceCount);
  FN(cudaSetDevice);
  FN(cudaDeviceGetAttribute);
  FN(cudaMalloc);
  FN(cudaFree);
  FN(cudaMemcpyAsync);
  FN(cudaMemsetAsync);
  FN(cudaStreamCreate);
  FN(cudaStreamDestroy);
  FN(cudaStreamSynchronize);
  FN(cudaGetErrorString);
  FN(cudaEventCreate);
  FN(cudaEventRecord);
  FN(cudaEventSynchronize);
  FN(cudaEventElapsedTime);
  FN(cudaEventDestroy);
  FN(cudaLibraryLoadData);
  FN(cudaLibraryUnload);
  FN(cudaLibraryGetKernel);
  FN(cudaLaunchKernel);
  FN(cudaMemGetInfo); /* optional */
  cudaError_t (*get_props)(struct cudaDeviceProp *, int); /* optional: cudaGetDeviceProperties(_v2) */
  FN(cublasLtCreate);
  FN(cublasLtDestroy);
  FN(cublasLtMatmulDescCreate);
  FN(cublasLtMatmulDescDestroy);
  FN(cublasLtMatrixLayoutCreate);
  FN(cublasLtMatrixLayoutDestroy);
  FN(cublasLtMatmulPreferenceCreate);
  FN(cublasLtMatmulPreferenceDestroy);
  FN(cublasLtMatmulPreferenceSetAttribute);
  FN(cublasLtMatmulAlgoGetHeuristic);
  FN(cublasLtMatmul);
  FN(cublasLtGetStatusString);
} m;
#undef FN

static int load(char *err, size_t cap) {
  if (m.ready) return 0;
  void *rt = ntp_cuda_dl("cudart", err, cap), *lt = rt ? ntp_cuda_dl("cublasLt", err, cap) : NULL;
  if (!rt || !lt) return -1;
#define GET(lib, name)                                                             \
  if (!(*(void **)&m.name = dlsym(lib, #name))) {                                  \
    snprintf(err, cap, "%s lacks %s", lib == rt ? "libcudart" : "libcublasLt", #name); \
    return -1;                                                                     \
  }
  GET(rt, cudaGetDeviceCount) GET(rt, cudaSetDevice) GET(rt, cudaDeviceGetAttribute) GET(rt, cudaMalloc)
  GET(rt, cudaFree) GET(rt, cudaMemcpyAsync) GET(rt, cudaMemsetAsync) GET(rt, cudaStreamCreate)
  GET(rt, cudaStreamDestroy) GET(rt, cudaStreamSynchronize) GET(rt, cudaGetErrorString) GET(rt, cudaEventCreate)
  GET(rt, cudaEventRecord) GET(rt, cudaEventSynchronize) GET(rt, cudaEventElapsedTime) GET(rt, cudaEventDestroy)
  GET(rt, cudaLibraryLoadData) GET(rt, cudaLibraryUnload) GET(rt, cudaLibraryGetKernel) GET(rt, cudaLaunchKernel)
  GET(lt, cublasLtCreate) GET(lt, cublasLtDestroy) GET(lt, cublasLtMatmulDescCreate) GET(lt, cublasLtMatmulDescDestroy)
  GET(lt, cublasLtMatrixLayoutCreate) GET(lt, cublasLtMatrixLayoutDestroy) GET(lt, cublasLtMatmulPreferenceCreate)
  GET(lt, cublasLtMatmulPreferenceDestroy) GET(lt, cublasLtMatmulPreferenceSetAttribute)
  GET(lt, cublasLtMatmulAlgoGetHeuristic) GET(lt, cublasLtMatmul) GET(lt, cublasLtGetStatusString)
#undef GET
  *(void **)&m.cudaMemGetInfo = dlsym(rt, "cudaMemGetInfo");
  *(void **)&m.get_props = dlsym(rt, "cudaGetDeviceProperties_v2");
  if (!m.get_props) *(void **)&m.get_props = dlsym(rt, "cudaGetDeviceProperties");
  m.ready = true;
  return 0;
}

#define CU(call)                                                                                \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) {                                                                    \
      snprintf(err, cap, "%s:%d: %s: %s", __FILE__, __LINE__, #call, m.cudaGetErrorString(e_)); \
      goto fail;                                                                                \
    }                                                                                           \
  } while (0)
#define LT(call)                                                                                     \
  do {                                                                                               \
    cublasStatus_t s_ = (call);                                                                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                               \
      snprintf(err, cap, "%s:%d: %s: %s", __FILE__, __LINE__, #call, m.cublasLtGetStatusString(s_)); \
      goto fail;                                                                                     \
    }                                                                                                \
  } while (0)

int ntp_measure_devices(int *count, char *err, size_t cap) {
  *count = 0;
  if (ntp_cuda_available(err, cap) != 0 || load(err, cap) != 0) return -1;
  CU(m.cudaGetDeviceCount(count));
  return 0;
fail:
  return -1;
}

int ntp_measure_device_info(int dev, char *name, size_t name_cap, double *mem_bytes, char *err, size_t cap) {
  name[0] = 0;
  *mem_bytes = 0;
  if (load(err, cap) != 0) return -1;
  CU(m.cudaSetDevice(dev));
  if (m.get_props) {
    /* room for a newer runtime's larger struct; the name is its first field in every version */
    union { struct cudaDeviceProp p; char pad[16384]; } *u = calloc(1, sizeof *u);
    if (u && m.get_props(&u->p, dev) == cudaSuccess) snprintf(name, name_cap, "%.255s", u->p.name);
    free(u);
  }
  size_t free_b = 0, total = 0;
  if (m.cudaMemGetInfo && m.cudaMemGetInfo(&free_b, &total) == cudaSuccess) *mem_bytes = (double)total;
  return 0;
fail:
  return -1;
}

/* The events around a measurement, on one stream. */
typedef struct timer {
  cudaStream_t s;
  cudaEvent_t a, b;
} timer;

static int timer_new(timer *t, char *err, size_t cap) {
  CU(m.cudaStreamCreate(&t->s));
  CU(m.cudaEventCreate(&t->a));
  CU(m.cudaEventCreate(&t->b));
  return 0;
fail:
  return -1;
}
static int timer_read(timer *t, int iters, double *seconds, char *err, size_t cap) {
  float ms = 0;
  CU(m.cudaEventSynchronize(t->b));
  CU(m.cudaEventElapsedTime(&ms, t->a, t->b));
  *seconds = ms / 1e3 / (iters > 0 ? iters : 1);
  return 0;
fail:
  return -1;
}
static void timer_free(timer *t) {
  if (t->a) m.cudaEventDestroy(t->a);
  if (t->b) m.cudaEventDestroy(t->b);
  if (t->s) m.cudaStreamDestroy(t->s);
}

static cudaDataType_t cuda_type(ntp_dtype dt) {
  return dt == NTP_BF16 ? CUDA_R_16BF : dt == NTP_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

int ntp_measure_gemm(int dev, ntp_dtype dt, int64_t M, int64_t N, int64_t K, int iters, double *seconds, char *err,
                     size_t cap) {
  if (load(err, cap) != 0) return -1;
  int rc = -1;
  timer t = {0};
  void *a = NULL, *b = NULL, *d = NULL, *ws = NULL;
  size_t ws_bytes = 32u << 20, es = dtype_bytes(dt);
  cublasLtHandle_t lt = NULL;
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t algo;
  static const float one = 1.0f, zero = 0.0f;
  CU(m.cudaSetDevice(dev));
  if (timer_new(&t, err, cap) != 0) goto fail;
  CU(m.cudaMalloc(&a, (size_t)(M * K) * es));
  CU(m.cudaMalloc(&b, (size_t)(K * N) * es));
  CU(m.cudaMalloc(&d, (size_t)(M * N) * es));
  CU(m.cudaMalloc(&ws, ws_bytes));
  /* 0x3c in every byte: a small finite number in bf16, fp16 and fp32 (timing only) */
  CU(m.cudaMemsetAsync(a, 0x3c, (size_t)(M * K) * es, t.s));
  CU(m.cudaMemsetAsync(b, 0x3c, (size_t)(K * N) * es, t.s));
  LT(m.cublasLtCreate(&lt));
  LT(m.cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  /* column-major: D (M x N) = A (M x K) * B (K x N) */
  LT(m.cublasLtMatrixLayoutCreate(&la, cuda_type(dt), (uint64_t)M, (uint64_t)K, M));
  LT(m.cublasLtMatrixLayoutCreate(&lb, cuda_type(dt), (uint64_t)K, (uint64_t)N, K));
  LT(m.cublasLtMatrixLayoutCreate(&ld, cuda_type(dt), (uint64_t)M, (uint64_t)N, M));
  LT(m.cublasLtMatmulPreferenceCreate(&pref));
  LT(m.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  int found = 0;
  LT(m.cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &algo, &found));
  if (!found) {
    snprintf(err, cap, "cuBLASLt has no algorithm for a %lldx%lldx%lld %s GEMM", (long long)M, (long long)N,
             (long long)K, dtype_name(dt));
    goto fail;
  }
  for (int i = -1; i < iters; i++) { /* i == -1: the warm-up */
    if (i == 0) CU(m.cudaEventRecord(t.a, t.s));
    LT(m.cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, d, ld, d, ld, &algo.algo, ws, ws_bytes, t.s));
  }
  CU(m.cudaEventRecord(t.b, t.s));
  rc = timer_read(&t, iters, seconds, err, cap);
fail:
  if (pref) m.cublasLtMatmulPreferenceDestroy(pref);
  if (la) m.cublasLtMatrixLayoutDestroy(la);
  if (lb) m.cublasLtMatrixLayoutDestroy(lb);
  if (ld) m.cublasLtMatrixLayoutDestroy(ld);
  if (op) m.cublasLtMatmulDescDestroy(op);
  if (lt) m.cublasLtDestroy(lt);
  if (t.s) m.cudaStreamSynchronize(t.s);
  m.cudaFree(a), m.cudaFree(b), m.cudaFree(d), m.cudaFree(ws);
  timer_free(&t);
  return rc;
}

int ntp_measure_copy(int dev, size_t bytes, int iters, double *seconds, char *err, size_t cap) {
  if (load(err, cap) != 0) return -1;
  int rc = -1;
  timer t = {0};
  void *x = NULL, *y = NULL;
  CU(m.cudaSetDevice(dev));
  if (timer_new(&t, err, cap) != 0) goto fail;
  CU(m.cudaMalloc(&x, bytes));
  CU(m.cudaMalloc(&y, bytes));
  CU(m.cudaMemsetAsync(x, 0x3c, bytes, t.s));
  for (int i = -1; i < iters; i++) {
    if (i == 0) CU(m.cudaEventRecord(t.a, t.s));
    CU(m.cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, t.s));
  }
  CU(m.cudaEventRecord(t.b, t.s));
  rc = timer_read(&t, iters, seconds, err, cap);
fail:
  if (t.s) m.cudaStreamSynchronize(t.s);
  m.cudaFree(x), m.cudaFree(y);
  timer_free(&t);
  return rc;
}

/* the streaming kernel (fp32, grid-stride: as many blocks as fill the GPU) and the empty one */
static const char measure_src[] =
    "extern \"C\" __global__ void ntp_measure_stream(const float *x, float *y, long long n) {\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)\n"
    "    y[i] = 2.0f * x[i] + 1.0f;\n"
    "}\n"
    "extern \"C\" __global__ void ntp_measure_empty(void) {}\n";

static int measure_kernel(int dev, const char *name, cudaLibrary_t *lib, cudaKernel_t *k, char *err, size_t cap) {
  int major = 0, minor = 0, hit = 0;
  void *cubin = NULL;
  size_t size = 0;
  CU(m.cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CU(m.cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (ntp_jit_cubin(measure_src, "ntp_measure.cu", major * 10 + minor, &cubin, &size, &hit, err, cap) != 0) return -1;
  cudaError_t e = m.cudaLibraryLoadData(lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
  free(cubin);
  CU(e);
  CU(m.cudaLibraryGetKernel(k, *lib, name));
  return 0;
fail:
  return -1;
}

int ntp_measure_stream(int dev, size_t bytes, int iters, double *seconds, char *err, size_t cap) {
  if (load(err, cap) != 0) return -1;
  int rc = -1, sms = 1;
  timer t = {0};
  float *x = NULL, *y = NULL;
  cudaLibrary_t lib = NULL;
  cudaKernel_t k;
  long long n = (long long)(bytes / sizeof(float));
  CU(m.cudaSetDevice(dev));
  if (measure_kernel(dev, "ntp_measure_stream", &lib, &k, err, cap) != 0 || timer_new(&t, err, cap) != 0) goto fail;
  CU(m.cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CU(m.cudaMalloc((void **)&x, bytes));
  CU(m.cudaMalloc((void **)&y, bytes));
  CU(m.cudaMemsetAsync(x, 0x3c, bytes, t.s));
  unsigned blocks = (unsigned)((n + 255) / 256 < 8LL * sms ? (n + 255) / 256 : 8LL * sms);
  void *args[] = {&x, &y, &n};
  for (int i = -1; i < iters; i++) {
    if (i == 0) CU(m.cudaEventRecord(t.a, t.s));
    CU(m.cudaLaunchKernel((const void *)k, (dim3){blocks ? blocks : 1, 1, 1}, (dim3){256, 1, 1}, args, 0, t.s));
  }
  CU(m.cudaEventRecord(t.b, t.s));
  rc = timer_read(&t, iters, seconds, err, cap);
fail:
  if (t.s) m.cudaStreamSynchronize(t.s);
  m.cudaFree(x), m.cudaFree(y);
  if (lib) m.cudaLibraryUnload(lib);
  timer_free(&t);
  return rc;
}

int ntp_measure_launch(int dev, int iters, double *seconds, char *err, size_t cap) {
  if (load(err, cap) != 0) return -1;
  int rc = -1;
  timer t = {0};
  cudaLibrary_t lib = NULL;
  cudaKernel_t k;
  CU(m.cudaSetDevice(dev));
  if (measure_kernel(dev, "ntp_measure_empty", &lib, &k, err, cap) != 0 || timer_new(&t, err, cap) != 0) goto fail;
  for (int i = -1; i < iters; i++) {
    if (i == 0) CU(m.cudaEventRecord(t.a, t.s));
    CU(m.cudaLaunchKernel((const void *)k, (dim3){1, 1, 1}, (dim3){32, 1, 1}, NULL, 0, t.s));
  }
  CU(m.cudaEventRecord(t.b, t.s));
  rc = timer_read(&t, iters, seconds, err, cap);
fail:
  if (t.s) m.cudaStreamSynchronize(t.s);
  if (lib) m.cudaLibraryUnload(lib);
  timer_free(&t);
  return rc;
}

/* ---- collectives ---------------------------------------------------------------------------- */

/* The NCCL calls a measurement makes, fetched by name from the library the backend loads. */
typedef struct nccl_calls {
  __typeof__(&ncclCommInitAll) init;
  __typeof__(&ncclCommDestroy) destroy;
  __typeof__(&ncclGroupStart) gstart;
  __typeof__(&ncclGroupEnd) gend;
  __typeof__(&ncclAllReduce) ar;
  __typeof__(&ncclReduceScatter) rs;
  __typeof__(&ncclAllGather) ag;
} nccl_calls;

static const char *const coll_calls[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather"};

static int nccl_load(ntp_measure_coll kind, nccl_calls *f, char *err, size_t cap) {
  void *nc = ntp_cuda_dl("nccl", err, cap);
  if (!nc) return -1;
  f->init = (__typeof__(&ncclCommInitAll))dlsym(nc, "ncclCommInitAll");
  f->destroy = (__typeof__(&ncclCommDestroy))dlsym(nc, "ncclCommDestroy");
  f->gstart = (__typeof__(&ncclGroupStart))dlsym(nc, "ncclGroupStart");
  f->gend = (__typeof__(&ncclGroupEnd))dlsym(nc, "ncclGroupEnd");
  f->ar = (__typeof__(&ncclAllReduce))dlsym(nc, "ncclAllReduce");
  f->rs = (__typeof__(&ncclReduceScatter))dlsym(nc, "ncclReduceScatter");
  f->ag = (__typeof__(&ncclAllGather))dlsym(nc, "ncclAllGather");
  void *want = kind == NTP_MEASURE_ALL_REDUCE       ? (void *)f->ar
               : kind == NTP_MEASURE_REDUCE_SCATTER ? (void *)f->rs
                                                    : (void *)f->ag;
  if (!f->init || !f->destroy || !f->gstart || !f->gend || !want) {
    snprintf(err, cap, "libnccl lacks %s", !want ? coll_calls[kind] : "ncclCommInitAll, ncclGroupStart or ncclGroupEnd");
    return -1;
  }
  return 0;
}

/* One GPU per rank: its communicator, its buffers and the events on its stream. */
typedef struct coll_ranks {
  int n;
  ncclComm_t *comm;
  int *devs;
  void **in, **out;
  timer *t;
} coll_ranks;

/* Every rank's stream, events and two buffers of nmax bf16 elements (the input set), then the
 * communicators over all of them. */
static int coll_setup(const nccl_calls *f, coll_ranks *g, size_t nmax, char *err, size_t cap) {
  int ngpus = g->n;
  g->comm = calloc((size_t)ngpus, sizeof *g->comm);
  g->devs = calloc((size_t)ngpus, sizeof *g->devs);
  g->in = calloc((size_t)ngpus, sizeof *g->in), g->out = calloc((size_t)ngpus, sizeof *g->out);
  g->t = calloc((size_t)ngpus, sizeof *g->t);
  if (!g->comm || !g->devs || !g->in || !g->out || !g->t) {
    snprintf(err, cap, "out of memory");
    goto fail;
  }
  for (int r = 0; r < ngpus; r++) {
    g->devs[r] = r;
    CU(m.cudaSetDevice(r));
    if (timer_new(&g->t[r], err, cap) != 0) goto fail;
    CU(m.cudaMalloc(&g->in[r], nmax * 2 + 256));
    CU(m.cudaMalloc(&g->out[r], nmax * 2 + 256));
    CU(m.cudaMemsetAsync(g->in[r], 0x3c, nmax * 2, g->t[r].s));
    CU(m.cudaStreamSynchronize(g->t[r].s));
  }
  ncclResult_t nr = f->init(g->comm, ngpus, g->devs);
  if (nr != ncclSuccess) {
    snprintf(err, cap, "ncclCommInitAll over %d GPUs failed (NCCL error %d)", ngpus, (int)nr);
    memset(g->comm, 0, (size_t)ngpus * sizeof *g->comm);
    goto fail;
  }
  return 0;
fail:
  return -1;
}

/* One collective of n bf16 elements (part per rank) on every rank, in one group. */
static ncclResult_t coll_launch(const nccl_calls *f, ntp_measure_coll kind, const coll_ranks *g, size_t n, size_t part) {
  ncclResult_t nr = f->gstart();
  for (int r = 0; r < g->n && nr == ncclSuccess; r++) {
    m.cudaSetDevice(r);
    nr = kind == NTP_MEASURE_ALL_REDUCE ? f->ar(g->in[r], g->out[r], n, ncclBfloat16, ncclSum, g->comm[r], g->t[r].s)
         : kind == NTP_MEASURE_REDUCE_SCATTER ? f->rs(g->in[r], g->out[r], part, ncclBfloat16, ncclSum, g->comm[r], g->t[r].s)
                                              : f->ag(g->in[r], g->out[r], part, ncclBfloat16, g->comm[r], g->t[r].s);
  }
  ncclResult_t ne = f->gend();
  return nr == ncclSuccess ? ne : nr;
}

/* Seconds of one collective of `bytes`: a warm-up, then `iters` between rank 0's events. */
static int coll_time(const nccl_calls *f, ntp_measure_coll kind, const coll_ranks *g, size_t bytes, int iters,
                     double *seconds, char *err, size_t cap) {
  int ngpus = g->n;
  size_t n = bytes / 2 / (size_t)ngpus * (size_t)ngpus; /* bf16 elements, a multiple of the ranks */
  size_t part = n / (size_t)ngpus;
  for (int i = -1; i < iters; i++) {
    if (i == 0) {
      for (int r = 0; r < ngpus; r++) { /* every rank idle: the events time this size alone */
        CU(m.cudaSetDevice(r));
        CU(m.cudaStreamSynchronize(g->t[r].s));
      }
      CU(m.cudaSetDevice(0));
      CU(m.cudaEventRecord(g->t[0].a, g->t[0].s));
    }
    ncclResult_t nr = coll_launch(f, kind, g, n, part);
    if (nr != ncclSuccess) {
      snprintf(err, cap, "%s of %zu bytes over %d GPUs failed (NCCL error %d)", coll_calls[kind], bytes, ngpus, (int)nr);
      goto fail;
    }
  }
  for (int r = 1; r < ngpus; r++) { /* the slowest rank ends the measurement */
    CU(m.cudaSetDevice(r));
    CU(m.cudaStreamSynchronize(g->t[r].s));
  }
  CU(m.cudaSetDevice(0));
  CU(m.cudaEventRecord(g->t[0].b, g->t[0].s));
  return timer_read(&g->t[0], iters, seconds, err, cap);
fail:
  return -1;
}

static void coll_free(const nccl_calls *f, coll_ranks *g) {
  for (int r = 0; g->t && r < g->n; r++) { /* nothing queued when the communicators go */
    m.cudaSetDevice(r);
    if (g->t[r].s) m.cudaStreamSynchronize(g->t[r].s);
  }
  if (g->comm && g->comm[0]) { /* one thread frees several GPUs' communicators: in one group (NCCL's guide) */
    f->gstart();
    for (int r = 0; r < g->n; r++)
      if (g->comm[r]) f->destroy(g->comm[r]);
    f->gend();
  }
  for (int r = 0; g->t && r < g->n; r++) {
    m.cudaSetDevice(r);
    if (g->in) m.cudaFree(g->in[r]);
    if (g->out) m.cudaFree(g->out[r]);
    timer_free(&g->t[r]);
  }
  free(g->comm), free(g->devs), free(g->in), free(g->out), free(g->t);
}

int ntp_measure_collective(int ngpus, ntp_measure_coll kind, const size_t *sizes, int nsizes, int iters, double *seconds,
                           char *err, size_t cap) {
  if (load(err, cap) != 0) return -1;
  nccl_calls f;
  if (nccl_load(kind, &f, err, cap) != 0) return -1;
  if (ngpus < 2) {
    snprintf(err, cap, "a collective needs 2 GPUs or more, not %d", ngpus);
    return -1;
  }
  int rc = -1;
  size_t most = 0;
  for (int j = 0; j < nsizes; j++)
    if (sizes[j] > most) most = sizes[j];
  size_t nmax = most / 2 + (size_t)ngpus; /* bf16 elements of the largest buffer, rounded up */
  coll_ranks g = {.n = ngpus};
  if (coll_setup(&f, &g, nmax, err, cap) != 0) goto done;
  for (int j = 0; j < nsizes; j++) /* one communicator for every size */
    if (coll_time(&f, kind, &g, sizes[j], iters, &seconds[j], err, cap) != 0) goto done;
  rc = 0;
done:
  coll_free(&f, &g);
  return rc;
}

#else /* built without the CUDA headers */

static int no_cuda(char *err, size_t cap) { return ntp_cuda_available(err, cap); }
int ntp_measure_devices(int *count, char *err, size_t cap) {
  *count = 0;
  return no_cuda(err, cap);
}
int ntp_measure_device_info(int dev, char *name, size_t name_cap, double *mem_bytes, char *err, size_t cap) {
  (void)dev, (void)name_cap;
  name[0] = 0;
  *mem_bytes = 0;
  return no_cuda(err, cap);
}
int ntp_measure_gemm(int dev, ntp_dtype dt, int64_t M, int64_t N, int64_t K, int iters, double *seconds, char *err,
                     size_t cap) {
  (void)dev, (void)dt, (void)M, (void)N, (void)K, (void)iters, (void)seconds;
  return no_cuda(err, cap);
}
int ntp_measure_copy(int dev, size_t bytes, int iters, double *seconds, char *err, size_t cap) {
  (void)dev, (void)bytes, (void)iters, (void)seconds;
  return no_cuda(err, cap);
}
int ntp_measure_stream(int dev, size_t bytes, int iters, double *seconds, char *err, size_t cap) {
  (void)dev, (void)bytes, (void)iters, (void)seconds;
  return no_cuda(err, cap);
}
int ntp_measure_launch(int dev, int iters, double *seconds, char *err, size_t cap) {
  (void)dev, (void)iters, (void)seconds;
  return no_cuda(err, cap);
}
int ntp_measure_collective(int ngpus, ntp_measure_coll kind, const size_t *sizes, int nsizes, int iters, double *seconds,
                           char *err, size_t cap) {
  (void)ngpus, (void)kind, (void)sizes, (void)nsizes, (void)iters, (void)seconds;
  return no_cuda(err, cap);
}
#endif
