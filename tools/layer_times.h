/* layer_times.h — for the programs that run the CUDA backend (ntpc run, bench/bench_model.c):
 * with NTP_CUDA_PROFILE=layers, the last forward's device seconds per layer as lines
 * "layer NAME SECONDS" in layer order, then "layer (model) SECONDS" for the model-level steps —
 * what bench/cost_model_error.sh compares with `ntpc plan --layer-times`. */
#ifndef NTP_LAYER_TIMES_H
#define NTP_LAYER_TIMES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "ntp_program.h"

/* 0 (nothing printed when profiling is off), or -1 with a message */
static inline int layer_times_print(FILE *out, const ntp_cuda *c, const ntp_program *p, char *err, size_t cap) {
  const char *prof = getenv("NTP_CUDA_PROFILE");
  if (!prof || strcmp(prof, "layers") != 0) return 0;
  size_t n = p->global.n_layers + 1;
  double *t = calloc(n, sizeof *t);
  if (!t || ntp_cuda_layer_times(c, t, n, err, cap) != 0) {
    if (!t) snprintf(err, cap, "out of memory");
    free(t);
    return -1;
  }
  for (size_t l = 0; l + 1 < n; l++) fprintf(out, "layer %s %.9g\n", p->global.layers[l], t[l]);
  fprintf(out, "layer (model) %.9g\n", t[n - 1]);
  free(t);
  return 0;
}

#endif
