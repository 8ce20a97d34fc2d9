/* exec.c — the one place that picks an executor (exec.h): the CUDA backend when CUDA options are
 * given, else the CPU simulation. */
#include "exec.h"

#include <stdio.h>
#include <stdlib.h>

int ntp_exec_new(const ntp_program *p, const struct ntp_cuda_options *cuda, ntp_exec **out, char *err, size_t cap) {
  *out = NULL;
  ntp_exec *e = calloc(1, sizeof *e);
  if (!e) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  e->ops = cuda ? &ntp_exec_cuda_ops : &ntp_exec_sim_ops;
  if ((cuda ? ntp_exec_cuda_new(p, cuda, &e->be, err, cap) : ntp_exec_sim_new(p, &e->be, err, cap)) != 0) {
    free(e);
    return -1;
  }
  *out = e;
  return 0;
}

void ntp_exec_free(ntp_exec *e) {
  if (!e) return;
  e->ops->free(e->be);
  free(e);
}

struct ntp_cuda *ntp_exec_cuda(const ntp_exec *e) { return e && e->ops == &ntp_exec_cuda_ops ? e->be : NULL; }
