/* libraries.c — the CUDA libraries fetched at run time (dlopen: libcudart, libcublasLt, libnccl),
 * the table of their functions every file of the backend calls, and whether a GPU is there. */
#include "cuda_internal.h"

cu_api_table cu_api; /* filled by load_libs and cu_load_nccl */
/* The last NCCL call that failed, by the NC macro (ntp_cuda_peer_lost reads it). */
ncclResult_t cu_nccl_last = ncclSuccess;

/* NCCL only when ranks sit on separate GPUs. */
int cu_load_nccl(char *err, size_t cap) {
  if (cu_api.nccl) return 0;
  const char *names[] = {getenv("NTP_NCCL_LIB"), "libnccl.so.2", "libnccl.so"};
  for (size_t i = 0; i < 3 && !cu_api.nccl; i++)
    if (names[i] && *names[i]) cu_api.nccl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!cu_api.nccl) {
    snprintf(err, cap, "NCCL is not installed (libnccl.so.2 not found; set NTP_NCCL_LIB)");
    return -1;
  }
#define GETN(name)                                                   \
  if (!(*(void **)&cu_api.name = dlsym(cu_api.nccl, #name))) {              \
    snprintf(err, cap, "libnccl lacks %s (NCCL 2.18 or later is needed)", #name); \
    cu_api.nccl = NULL;                                                  \
    return -1;                                                       \
  }
  GETN(ncclGetUniqueId) GETN(ncclCommInitAll) GETN(ncclCommInitRank) GETN(ncclCommSplit) GETN(ncclCommDestroy)
  GETN(ncclCommAbort) GETN(ncclAllReduce) GETN(ncclSend) GETN(ncclRecv) GETN(ncclGroupStart) GETN(ncclGroupEnd) GETN(ncclGetErrorString)
#undef GETN
  *(void **)&cu_api.ncclCommShrink = dlsym(cu_api.nccl, "ncclCommShrink"); /* optional */
  *(void **)&cu_api.ncclCommGetUniqueId = dlsym(cu_api.nccl, "ncclCommGetUniqueId"); /* optional (2.29) */
  *(void **)&cu_api.ncclCommGrow = dlsym(cu_api.nccl, "ncclCommGrow");
  *(void **)&cu_api.ncclCommGetAsyncError = dlsym(cu_api.nccl, "ncclCommGetAsyncError");
  *(void **)&cu_api.ncclCommInitRankConfig = dlsym(cu_api.nccl, "ncclCommInitRankConfig");
  return 0;
}

static int load_libs(char *err, size_t cap) {
  if (cu_api.rt) return 0;
  /* NTP_CUDART_LIB / NTP_CUBLASLT_LIB name other libraries (the emulated GPU of tests/emu) */
  const char *rts[] = {getenv("NTP_CUDART_LIB"), "libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  const char *lts[] = {getenv("NTP_CUBLASLT_LIB"), "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  for (size_t i = 0; i < 4 && !cu_api.rt; i++)
    if (rts[i] && *rts[i]) cu_api.rt = dlopen(rts[i], RTLD_NOW | RTLD_LOCAL);
  for (size_t i = 0; i < 4 && !cu_api.lt; i++)
    if (lts[i] && *lts[i]) cu_api.lt = dlopen(lts[i], RTLD_NOW | RTLD_LOCAL);
  if (!cu_api.rt || !cu_api.lt) {
    snprintf(err, cap, "the CUDA runtime libraries are not installed (libcudart / libcublasLt not found; "
                       "NTP_CUDART_LIB and NTP_CUBLASLT_LIB name them)");
    return -1;
  }
#define GET(lib, name)                                                            \
  if (!(*(void **)&cu_api.name = dlsym(cu_api.lib, #name))) {                             \
    snprintf(err, cap, "%s lacks %s (CUDA 12 or later is needed)", #lib, #name);  \
    cu_api.rt = NULL;                                                                 \
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

int ntp_cuda_available(char *err, size_t cap) {
  if (load_libs(err, cap) != 0) return -1;
  int n = 0;
  cudaError_t e = cu_api.cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    snprintf(err, cap, "no CUDA GPU is available (%s)", e != cudaSuccess ? cu_api.cudaGetErrorString(e) : "0 devices");
    return -1;
  }
  return 0;
}

void *ntp_cuda_dl(const char *which, char *err, size_t cap) {
  if (!strcmp(which, "nccl")) return cu_load_nccl(err, cap) == 0 ? cu_api.nccl : NULL;
  if (load_libs(err, cap) != 0) return NULL;
  return !strcmp(which, "cudart") ? cu_api.rt : !strcmp(which, "cublasLt") ? cu_api.lt : NULL;
}
