/* plan_cmd.h — what `ntpc plan`'s files share (tools/ntpc/plan_cmd.c, the command;
 * tools/ntpc/plan_stages.c, the model at other batch sizes and the check of a pipelined plan). */
#ifndef NTP_PLAN_CMD_H
#define NTP_PLAN_CMD_H

#include <stdbool.h>

#include "ntpc.h"
#include "planner.h"

typedef struct plan_opts {
  const char *file, *model, *plan_file, *plan_name, *gpu, *profile, *out, *svg, *name, *color, *fail;
  const char *layer_times; /* --layer-times FILE */
  const char *defines[256];
  int ndefines;
  long world, nodes_of, quanta;
  double mem_cap_gib;
  bool train; /* plan a training step (plan_request.train) */
  /* training: --zero (PLAN_ZERO_AUTO: chosen), --redundancy (0: chosen), --domain-size (0: a node);
     given: said on the command line (else a --plan's 'optimizer' statement decides) */
  long zero, redundancy, domain_size;
  bool zero_given, redundancy_given;
  long stages, micro_batches; /* --stages, --micro-batches: 0 chosen (the 3D search) */
  int schedule;               /* --schedule: 0 chosen, else ir_schedule_code's 2 (1f1b) or 4 (zb-h1) */
} plan_opts;

/* A pipelined plan checked as `ntpc check` would read it: its text compiled for its world (the
 * training program with --train), every rank's memory plan within the cap; the compiler's figures
 * printed, and the text returned (malloc'd) for the caller to write. NULL and *rc (2 or 3) on
 * failure, reported. */
char *plan_check_pipelined(const plan_opts *o, const plan_model *pm, const ir_module *m, const plan_solution *sol,
                           const ntpc_rows_models *rows, const char *name, const char *header, int *rc);

/* `--fail` on a --plan with pipeline stages: the survivors' staged plan printed, checked and written to
 * path (plan_failover_stages). The exit status. */
int plan_fail_staged(const plan_opts *o, const plan_model *pm, const ir_module *m, const plan_request *rq,
                     const char *path);

#endif
