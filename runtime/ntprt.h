/* ntprt.h — the ntp runtime. For now: the CPU reference backend, which runs the
 * unsharded IR and is the numerical oracle for every later backend and sharding. */
#ifndef NTPRT_H
#define NTPRT_H

#include <stdint.h>
#include <stdio.h>

#include "ir.h"

/* A host tensor: float data (already rounded to its storage dtype) or int32 data. */
typedef struct ntp_host_tensor {
  const char *name;
  ntp_dtype dtype;
  ntp_shape shape;
  float *f;   /* float dtypes */
  int32_t *i; /* i32 */
} ntp_host_tensor;

typedef struct ntp_cpu_result {
  ntp_host_tensor *outputs, *inputs, *params;
  size_t n_outputs, n_inputs, n_params;
  double seconds; /* forward time, init excluded */
} ntp_cpu_result;

/* Deterministic default initialisation: element i of tensor `name` depends only on
 * (seed, name, i), so every sharding regenerates the same global tensors. */
void ntp_init_tensor(const ir_module *m, int32_t value, uint64_t seed, ntp_host_tensor *t);

/* Runs the forward pass of `m` on the CPU with default-initialised inputs and params.
 * Returns 0, or -1 with a message in err. keep_all: also return inputs and params. */
int ntp_cpu_run(const ir_module *m, uint64_t seed, int keep_all, ntp_cpu_result *res, char *err, size_t errlen);
void ntp_cpu_result_free(ntp_cpu_result *res);

/* tensor_io.c */
/* Writes DIR/manifest.tsv and one raw little-endian file per tensor (see docs/cli.md). */
int ntp_dump_tensors(const ntp_cpu_result *res, const char *dir, char *err, size_t errlen);
/* "logits : bf16[2, 16, 256]  sum=... mean|x|=... [v0, v1, v2, v3 ...]" */
void ntp_print_tensor_summary(const ntp_host_tensor *t, FILE *out);

#endif
