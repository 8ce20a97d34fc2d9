/* bench_frontend.c — front-end time (read + parse + sema + IR + verify) for a model,
 * median of N runs, printed against the target. Usage: bench_frontend FILE [N] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ir.h"
#include "ntpc.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  const char *file = argc > 1 ? argv[1] : "examples/gpt3_175b.ntp";
  int n = argc > 2 ? atoi(argv[2]) : 20;
  if (n < 1) n = 1;
  double *t = malloc((size_t)n * sizeof *t);
  size_t ops = 0, layers = 0;
  for (int i = 0; i < n; i++) {
    double t0 = now();
    ntpc_session *s = ntpc_session_new();
    if (ntpc_compile_file(s, file) != NTPC_OK) {
      ntpc_print_diags(s, stderr, 0);
      fprintf(stderr, "bench_frontend: %s does not compile\n", file);
      return 1;
    }
    ops = ntpc_module(s)->n_ops;
    layers = ntpc_module(s)->n_layers;
    ntpc_session_free(s);
    t[i] = now() - t0;
  }
  qsort(t, (size_t)n, sizeof *t, cmp);
  printf("front end (parse + sema + IR + verify) of %s: %zu layers, %zu ops\n", file, layers, ops);
  printf("  median %.2f ms, min %.2f ms, max %.2f ms over %d runs (target < 50 ms)\n", t[n / 2] * 1e3, t[0] * 1e3,
         t[n - 1] * 1e3, n);
  free(t);
  return 0;
}
