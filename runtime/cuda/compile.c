/* compile.c — the ranks' kernels compiled by NVRTC (a thread per rank, the JIT cache first) and
 * loaded as CUDA libraries. */
#include "cuda_internal.h"

int cu_compute_capability(int dev, char *err, size_t cap) {
  int major = 0, minor = 0;
  CU(cu_api.cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CU(cu_api.cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major * 10 + minor;
fail:
  return -1;
}

int cu_load_image(const void *cubin, const char *name, cudaLibrary_t *lib, char *err, size_t cap) {
  cudaError_t e = cu_api.cudaLibraryLoadData(lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
  if (e != cudaSuccess) {
    snprintf(err, cap, "loading %s: %s", name, cu_api.cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

int cu_load_library(const char *src, const char *name, int arch, cudaLibrary_t *lib, char *err, size_t cap) {
  void *cubin;
  size_t size;
  int hit;
  if (ntp_jit_cubin(src, name, arch, &cubin, &size, &hit, err, cap) != 0) return -1;
  int rc = cu_load_image(cubin, name, lib, err, cap);
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

int cu_compile_ranks(ntp_cuda *c, int arch, void **cubin, int *first, char *err, size_t cap) {
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
