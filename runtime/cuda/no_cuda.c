/* no_cuda.c — the CUDA backend's interface (cuda_backend.h) in a runtime built without the CUDA
 * toolkit's headers: every entry point says so (CMakeLists.txt picks this file or the others of
 * runtime/cuda/). */
#include "cuda_backend.h"

#include <stdio.h>
#include <string.h>

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
int ntp_cuda_survivors_order(ntp_cuda *c, ntp_cuda_survivors *s, int world, const int32_t *from, char *err, size_t cap) {
  (void)c, (void)s, (void)world, (void)from;
  return ntp_cuda_available(err, cap);
}
int ntp_cuda_grow(ntp_cuda *c, int world, const int *from, const int *devices, ntp_cuda_survivors *s, char *err,
                  size_t cap) {
  (void)c, (void)world, (void)from, (void)devices;
  memset(s, 0, sizeof *s);
  return ntp_cuda_available(err, cap);
}
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
