/* run_cmd.h — `ntpc run` (run_cmd.c): the forward on the CPU reference, then on the executor the
 * backend gives (the simulation of a sharded program, the GPUs), compared element by element. */
#ifndef NTP_RUN_CMD_H
#define NTP_RUN_CMD_H

#include <stdbool.h>
#include <stdio.h>

#include "ir.h"
#include "ntp_program.h"

typedef struct ntpc_run_options {
  const char *backend;  /* a backend's name (exec.h); NULL: cpu */
  bool loopback;        /* a backend with devices: every rank on one */
  unsigned long long seed;
  long iters;           /* the executor's timed forwards */
  const char *params, *params_format, *save_params, *dump;
  const char *const *inputs; /* --inputs SPEC */
  int ninputs;
  const char *text; /* --text STRING */
} ntpc_run_options;

/* 0, or the exit status: 1 an input (or a result outside tolerance), 2 the environment or an
 * output path. Only `ntpc run` prints. */
int ntpc_run(const ir_module *summary, const ntp_program *p, const ntpc_run_options *o);
/* "model NAME: N layers, ..." */
void ntpc_print_model_summary(const ir_module *m, FILE *out);

#endif
