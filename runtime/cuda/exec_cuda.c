/* exec_cuda.c — the CUDA backend (cuda_backend.h) as an executor (exec.h). Each operation is one
 * of the backend's entry points; this file only adapts their shapes. Built with or without the
 * CUDA headers (without them every entry point says so: no_cuda.c). */
#include "cuda_backend.h"
#include "exec.h"

#include <stdio.h>

int ntp_exec_cuda_new(const ntp_program *p, const struct ntp_cuda_options *o, void **be, char *err, size_t cap) {
  ntp_cuda *c = NULL;
  if (ntp_cuda_create(p, o, &c, err, cap) != 0) return -1;
  *be = c;
  return 0;
}

static void exec_free(void *be) { ntp_cuda_free(be); }
static bool exec_runs_rank(const void *be, int rank) { return ntp_cuda_runs_rank(be, rank); }
static bool exec_all_here(const void *be) { return ntp_cuda_all_here(be); }

static int exec_set(void *be, int32_t value, const ntp_host_tensor *global, char *err, size_t cap) {
  return ntp_cuda_set(be, value, global, err, cap);
}

static int exec_load(void *be, const ntp_safetensors *f, char *err, size_t cap) { return ntp_cuda_load(be, f, err, cap); }

static int exec_value_get(void *be, int32_t v, uint64_t seed, ntp_host_tensor *out, char *err, size_t cap) {
  (void)be, (void)v, (void)seed, (void)out;
  snprintf(err, cap, "the cuda backend keeps parameters on the GPUs (cpu backend or a training library)");
  return -1;
}

/* *dev = -1 where data is not device memory (the caller says whose GPU it expected) */
static int exec_device_of(void *be, const void *data, int *dev, char *err, size_t cap) {
  (void)err, (void)cap;
  if (ntp_cuda_device_of(be, data, dev) != 0) *dev = -1;
  return 0;
}

static int exec_copy_to_host(void *be, void *dst, const void *src, size_t bytes, char *err, size_t cap) {
  return ntp_cuda_copy_to_host(be, dst, src, bytes, err, cap);
}

static int exec_set_device(void *be, int32_t value, const void *data, int dev, char *err, size_t cap) {
  return ntp_cuda_set_device(be, value, data, dev, err, cap);
}

static int exec_output_device(void *be, size_t output, void *data, int dev, char *err, size_t cap) {
  return ntp_cuda_output_device(be, output, data, dev, err, cap);
}

static int exec_forward(void *be, uint64_t seed, ntp_cpu_result *res, char *err, size_t cap) {
  return ntp_cuda_forward(be, seed, res, err, cap);
}

static int exec_run(void *be, uint64_t seed, char *err, size_t cap) { return ntp_cuda_run(be, seed, NULL, err, cap); }

static int exec_output(void *be, size_t output, ntp_host_tensor *h, char *err, size_t cap) {
  return ntp_cuda_output_host(be, output, h, err, cap);
}

static int exec_alloc(void *be, int rank, size_t bytes, void **buf, char *err, size_t cap) {
  return ntp_cuda_alloc(be, rank, bytes, buf, err, cap);
}

static int exec_put(void *be, int rank, void *buf, const void *host, size_t bytes, char *err, size_t cap) {
  return ntp_cuda_put(be, rank, buf, host, bytes, err, cap);
}

static int exec_get(void *be, int rank, void *host, const void *buf, size_t bytes, char *err, size_t cap) {
  return ntp_cuda_get(be, rank, host, buf, bytes, err, cap);
}

static int exec_tensor_put(void *be, int32_t tensor, const float *values, char *err, size_t cap) {
  return ntp_cuda_tensor_put(be, tensor, values, err, cap);
}

static int exec_sumsq(void *be, int32_t tensor, const void *mask, double *acc, char *err, size_t cap) {
  double part = 0;
  if (ntp_cuda_sumsq(be, tensor, mask, &part, err, cap) != 0) return -1;
  *acc += part;
  return 0;
}

/* the kernel's arithmetic is fp32 (ntp_cuda_adamw_args) */
static int exec_adamw(void *be, int32_t param, int32_t grad, void *master, void *m, void *v, const ntp_exec_adamw *a,
                    char *err, size_t cap) {
  ntp_cuda_adamw_args h = {(float)a->lr, (float)a->beta1, (float)a->beta2, (float)a->c1, (float)a->c2, (float)a->eps,
                           (float)a->wd, (float)a->scale};
  return ntp_cuda_adamw(be, param, grad, master, m, v, &h, err, cap);
}

static int exec_merge(void *be, void *host, size_t bytes, char *err, size_t cap) {
  return ntp_cuda_merge(be, host, bytes, err, cap);
}

static int exec_exchange(void *be, float *const *send, const size_t *n_send, float *const *recv, const size_t *n_recv,
                       char *err, size_t cap) {
  return ntp_cuda_exchange(be, send, n_send, recv, n_recv, err, cap);
}

const ntp_exec_ops ntp_exec_cuda_ops = {
    .name = "cuda", .runs_rank = exec_runs_rank, .all_here = exec_all_here, .set = exec_set, .load = exec_load,
    .value_get = exec_value_get, .forward = exec_forward, .device_of = exec_device_of,
    .copy_to_host = exec_copy_to_host, .set_device = exec_set_device, .output_device = exec_output_device,
    .run = exec_run, .output = exec_output, .alloc = exec_alloc, .put = exec_put, .get = exec_get,
    .tensor_put = exec_tensor_put, .sumsq = exec_sumsq, .adamw = exec_adamw, .merge = exec_merge,
    .exchange = exec_exchange, .free = exec_free};
