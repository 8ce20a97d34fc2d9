/* cuda_backend.h — the CUDA backend of libntprt: the same step list as the CPU simulation,
 * with NVRTC-compiled kernels (disk-cached), cuBLASLt GEMMs and, across GPUs, NCCL.
 * Every CUDA library is loaded with dlopen: binaries start on machines without a GPU, and
 * the calls below then fail with a message saying so. */
#ifndef NTP_CUDA_BACKEND_H
#define NTP_CUDA_BACKEND_H

#include "ntprt.h"

typedef struct ntp_cuda_options {
  int loopback;   /* every rank on one GPU; collectives as device copies and reductions */
  int device;     /* loopback: the GPU; else the first GPU of this process's ranks */
  int rank_lo, rank_hi; /* ranks run by this process (a thread per GPU); [0, world) by default */
  void *nccl_comm; /* an existing world communicator (one local rank), or NULL to create one */
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
int ntp_cuda_output_host(ntp_cuda *c, size_t output, ntp_host_tensor *h, char *err, size_t cap);
int ntp_cuda_output_device(ntp_cuda *c, size_t output, void *data, int dev, char *err, size_t cap);
/* Value v (an input or parameter) from a global tensor in device memory on GPU dev, storage dtype. */
int ntp_cuda_set_device(ntp_cuda *c, int32_t v, const void *data, int dev, char *err, size_t cap);
int ntp_cuda_copy_to_host(ntp_cuda *c, void *dst, const void *src, size_t bytes, char *err, size_t cap);
/* 0 and the GPU when data is device memory (cudaPointerGetAttributes); -1 otherwise. */
int ntp_cuda_device_of(ntp_cuda *c, const void *data, int *dev);
void ntp_cuda_free(ntp_cuda *c);

/* The NVRTC JIT with its disk cache: key = hash of (source, options, NVRTC version, arch),
 * in $NTP_CACHE_DIR (default ~/.cache/ntp), written to a temporary file and renamed into
 * place; NTP_NO_CACHE=1 bypasses it. *hit tells whether the cache served the CUBIN. */
int ntp_jit_cubin(const char *src, const char *name, int arch, void **cubin, size_t *size, int *hit, char *err,
                  size_t cap);

#endif
