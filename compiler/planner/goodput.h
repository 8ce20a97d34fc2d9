/* goodput.h — cluster-scale goodput under GPU failures, by simulation (docs/goodput.md).
 *
 * A cluster of scale-up domains runs data-parallel replicas of a pipeline of TP groups; GPUs fail
 * and are repaired over weeks. Four policies answer a failure: drop the replicas it touches
 * (DP-drop), restart at the best uniform TP degree, restart with two degrees (Megatron's
 * non-uniform TP), or re-plan every degraded group per layer, live (ntp). What a group of t GPUs
 * achieves comes from the planner, as seconds per micro-batch of one pipeline stage at t GPUs
 * (the caller fills gp_config's tables); everything here is arithmetic on those tables, so it is
 * tested without a model. */
#ifndef NTP_GOODPUT_H
#define NTP_GOODPUT_H

#include <stdbool.h>
#include <stdint.h>

#define GP_MAX_DOMAIN 1024

typedef enum { GP_DP_DROP, GP_UNIFORM, GP_TWO_DEGREE, GP_NTP, GP_NPOLICIES } gp_policy;
const char *gp_policy_name(gp_policy p);  /* "dp-drop", "uniform", "two-degree", "ntp" */
const char *gp_policy_title(gp_policy p); /* what it does, a few words */

typedef struct gp_config {
  int32_t gpus;     /* in the cluster: a multiple of domain */
  int32_t domain;   /* GPUs per scale-up domain */
  int32_t tp;       /* healthy TP degree: divides domain */
  int32_t pp;       /* pipeline stages (TP groups) per data-parallel replica; groups / pp replicas */
  int32_t micro;    /* micro-batches per replica per step: the global batch is replicas x micro, each
                       taken whole by one replica; 0: the batch divides in proportion to speed */
  int32_t max_lost; /* a group that lost more GPUs than this is dropped by every policy */
  /* seconds per micro-batch of one stage at t GPUs (t <= domain; 0: no plan fits): */
  double tau_ntp[GP_MAX_DOMAIN + 1]; /* the planner's per-layer plan; [tp] is the healthy plan, every policy's */
  double tau_uni[GP_MAX_DOMAIN + 1]; /* every layer over all t GPUs (uniform TP) */
} gp_config;

/* NULL when the configuration is usable, else why not. */
const char *gp_config_check(const gp_config *c);
static inline int32_t gp_groups(const gp_config *c) { return c->gpus / c->tp; }
static inline int32_t gp_replicas(const gp_config *c) { return gp_groups(c) / c->pp; }

/* The least step time when `n` classes of replicas (count[j] replicas taking tau[j] seconds a
 * micro-batch) share `total` micro-batches, each replica taking a whole number of them:
 * min S with sum_j count[j] floor(S / tau[j]) >= total. 0 when there is no replica. */
double gp_step_time(int32_t n, const int32_t *count, const double *tau, int64_t total);

/* What a policy runs for a failure state: lost[g] = GPUs lost by TP group g (group g is GPUs
 * [g tp, (g+1) tp), domain g tp / domain). */
typedef struct gp_state_eval {
  double throughput;   /* of the healthy cluster's (1 = no loss) */
  int32_t replicas;    /* replicas running */
  int32_t degraded;    /* of them, slowed by a degraded group */
  int32_t degree;      /* GP_UNIFORM: the degree chosen; else the healthy tp */
} gp_state_eval;
gp_state_eval gp_evaluate(const gp_config *c, gp_policy p, const int32_t *lost);

/* Whether a failure of a GPU of group g interrupts a policy's configuration chosen for
 * `cfg_lost` (at `degree`, gp_state_eval's): the GPU's replica (dp-drop), domain (uniform) or
 * group (the others) is in use. */
bool gp_in_use(const gp_config *c, gp_policy p, const int32_t *cfg_lost, int32_t degree, int32_t g);

/* ---------------------------------- the failure process ---------------------------------- */

typedef struct gp_failures {
  double rate_per_gpu_h;   /* failures per GPU-hour of an up GPU */
  double hw_frac;          /* of failures, hardware: repaired in hw_min_h .. hw_max_h (uniform) */
  double hw_min_h, hw_max_h;
  double sw_h;             /* the others (software) take sw_h hours */
} gp_failures;
double gp_mean_repair_h(const gp_failures *f);
/* the long-run failed fraction: rate x mean repair / (1 + rate x mean repair) */
double gp_steady_fraction(const gp_failures *f);
/* the rate that gives a long-run failed fraction `frac` with f's repair times */
double gp_rate_for_fraction(const gp_failures *f, double frac);

typedef struct gp_costs {
  double restart_s;   /* a restart-based policy's restart (re-launch, re-initialise, load the checkpoint) */
  double ckpt_s;      /* checkpoint interval: a restart loses half of it on average */
  double detect_s;    /* ntp: noticing a failed GPU (timeouts) */
  double resume_s;    /* ntp: re-plan and move the state (per reconfiguration) */
} gp_costs;

typedef struct gp_run_result {
  double hours;                       /* measured (after the burn-in) */
  int64_t failures, repairs;
  double mean_failed_frac, max_failed_frac;
  double throughput[GP_NPOLICIES];    /* time average of the running configuration's */
  double goodput[GP_NPOLICIES];       /* the same, less the pauses and the work lost to restarts */
  int64_t stops[GP_NPOLICIES];        /* restarts (ntp: live reconfigurations) */
  double paused_h[GP_NPOLICIES];      /* hours paused or redone */
} gp_run_result;

/* A run of `days` (after `burn_days` from a healthy cluster, not measured) with failures and
 * repairs drawn from `seed`. false when out of memory. */
bool gp_simulate(const gp_config *c, const gp_failures *f, const gp_costs *k, double days, double burn_days,
                 uint64_t seed, gp_run_result *out);

/* Throughput of each policy with round(frac x gpus) failed GPUs placed at random, averaged over
 * `samples` draws (out[GP_NPOLICIES]). false when out of memory. */
bool gp_static_loss(const gp_config *c, double frac, int32_t samples, uint64_t seed, double *out);

#endif
