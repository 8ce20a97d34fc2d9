/* goodput_cmd.h — `ntpc goodput`'s options and its report, shared by the command
 * (goodput_cmd.c: options, the planner's prices) and the report (goodput_report.c: the tables
 * and the picture). */
#ifndef NTP_GOODPUT_CMD_H
#define NTP_GOODPUT_CMD_H

#include <stdbool.h>

#include "goodput.h"
#include "ir.h"
#include "planner.h"

typedef struct gp_opts {
  const char *file, *model, *gpu, *profile, *svg, *color;
  const char *defines[256];
  int ndefines;
  double gpus, domain, tp, pp, micro, max_lost, mem_cap_gib;
  double stage_layers;        /* -1: the model's repeated blocks */
  bool forward;
  gp_failures f;
  double mtbf_h, failed_frac; /* failed_frac >= 0: sets the rate */
  double slow_per_day;        /* stragglers per GPU-day */
  double replan_s;            /* ntp: the re-plan's share of a resume */
  gp_costs k;
  double days, seed, samples;
  double fractions[32];
  int nfractions;
} gp_opts;

/* what the planner's prices tell the report besides the tables */
typedef struct gp_priced {
  double search_ms;   /* the planner's time for one degraded group's plan */
  double state_bytes; /* per GPU of the healthy group: what the hand-over after a failure refills */
} gp_priced;

/* The report, in order. Each returns 0, or an exit status (2: the picture's file, 3: out of
 * memory); gp_report_costs returns the long-run failed fraction. */
void gp_report_steps(const gp_opts *o, const gp_config *c, const ir_module *m, const plan_profile *prof, double tokens);
double gp_report_costs(const gp_opts *o, const plan_profile *prof, const gp_priced *pr, gp_failures *f, gp_costs *k);
int gp_report_loss(const gp_opts *o, const gp_config *c, double (*loss)[GP_NPOLICIES], int32_t (*spares)[GP_NPOLICIES]);
int gp_report_run(const gp_opts *o, const gp_config *c, const gp_failures *f, const gp_costs *k);
int gp_report_picture(const gp_opts *o, const gp_config *c, const ir_module *m, const plan_profile *prof,
                      const double (*loss)[GP_NPOLICIES], const int32_t (*spares)[GP_NPOLICIES], double steady);

#endif
