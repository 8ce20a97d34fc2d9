/* goodput.h — cluster-scale goodput under GPU failures and stragglers, by simulation
 * (docs/goodput.md).
 *
 * A cluster of scale-up domains runs data-parallel replicas of a pipeline of TP groups; GPUs fail,
 * are repaired and slow down over weeks. Six policies answer: drop the replicas a failure touches
 * (DP-drop), restart at the best uniform TP degree, restart with two degrees (Megatron's
 * non-uniform TP), re-plan each degraded group live at uniform TP (ntp-uni) or per layer (ntp), or
 * per layer and move layers between a replica's stages and re-split around stragglers (ntp-3d,
 * what `ntpc train` does with a staged plan). What a group of t GPUs
 * achieves comes from the planner, as seconds per micro-batch of one pipeline stage at t GPUs
 * (the caller fills gp_config's tables); everything here is arithmetic on those tables, so it is
 * tested without a model. */
#ifndef NTP_GOODPUT_H
#define NTP_GOODPUT_H

#include <stdbool.h>
#include <stdint.h>

#define GP_MAX_DOMAIN 1024
#define GP_MORE_LAYERS 4

typedef enum { GP_DP_DROP, GP_UNIFORM, GP_TWO_DEGREE, GP_NTP_UNI, GP_NTP, GP_NTP_3D, GP_NPOLICIES } gp_policy;
const char *gp_policy_name(gp_policy p);  /* "dp-drop", "uniform", "two-degree", "ntp-uni", "ntp", "ntp-3d" */
const char *gp_policy_title(gp_policy p); /* what it does, a few words */
static inline bool gp_policy_live(gp_policy p) { return p >= GP_NTP_UNI; } /* reconfigures without a restart */

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
  /* ntp-3d moves whole layers between a replica's stages: a stage holds stage_layers alike (< 2:
   * none move); a degraded group gives some away, a healthy group takes up to GP_MORE_LAYERS
   * more, tau_more[k] seconds a micro-batch holding stage_layers + k (the planner's plan in the
   * memory that leaves room for them; 0: they do not fit) */
  int32_t stage_layers;
  double tau_more[GP_MORE_LAYERS + 1];
} gp_config;

/* NULL when the configuration is usable, else why not. */
const char *gp_config_check(const gp_config *c);
static inline int32_t gp_groups(const gp_config *c) { return c->gpus / c->tp; }
static inline int32_t gp_replicas(const gp_config *c) { return gp_groups(c) / c->pp; }

/* The least step time when `n` classes of replicas (count[j] replicas taking tau[j] seconds a
 * micro-batch) share `total` micro-batches, each replica taking a whole number of them:
 * min S with sum_j count[j] floor(S / tau[j]) >= total. 0 when there is no replica. */
double gp_step_time(int32_t n, const int32_t *count, const double *tau, int64_t total);

/* ntp-3d: the least seconds a micro-batch takes a replica of P stages when whole layers move
 * between them: stage i takes tau[i] for stage_layers layers, n / stage_layers of it for n fewer,
 * and, healthy[i], tau_more[k] for k more. Without the room to move, max tau. */
double gp_replica_time(const gp_config *c, int32_t P, const double *tau, const bool *healthy);

/* What a policy runs for a failure state: lost[g] = GPUs lost by TP group g (group g is GPUs
 * [g tp, (g+1) tp), domain g tp / domain). */
typedef struct gp_state_eval {
  double throughput;   /* of the healthy cluster's (1 = no loss) */
  int32_t replicas;    /* replicas running */
  int32_t degraded;    /* of them, slowed by a degraded group */
  int32_t degree;      /* GP_UNIFORM: the degree chosen; else the healthy tp */
  double slowed;       /* the straggler's factor the throughput was divided by (1: none) */
  int32_t slow_domains;/* domains holding a straggler that slows it (a spare would replace each) */
} gp_state_eval;
gp_state_eval gp_evaluate(const gp_config *c, gp_policy p, const int32_t *lost);
/* The same with stragglers: slow[g] >= 1, the factor of group g's slowest GPU (NULL: none). A
 * synchronous step waits for the slowest GPU in use, so every policy but ntp-3d runs at
 * 1/max slow; ntp-3d re-splits the group around it (its work cut to its speed, or the group
 * without it, whichever is faster) and moves layers as for a failure. */
gp_state_eval gp_evaluate_slow(const gp_config *c, gp_policy p, const int32_t *lost, const double *slow);

/* Spare scale-up domains that bring a policy at `throughput` (of the healthy cluster's) back to
 * the healthy throughput: whole healthy replicas, each pp x tp GPUs. */
int32_t gp_spare_domains(const gp_config *c, double throughput);
/* The same for a state: spares can make up lost replicas but not a straggler that gates every
 * step, so each domain holding one (gp_state_eval.slow_domains) is replaced by a spare. */
int32_t gp_state_spares(const gp_config *c, const gp_state_eval *e);

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
  /* stragglers: an up GPU slows down at this rate (per GPU-hour; 0: never), by a factor uniform
   * in slow_min .. slow_max, for a time log-uniform in slow_min_h .. slow_max_h */
  double slow_rate_per_gpu_h, slow_min, slow_max, slow_min_h, slow_max_h;
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
  int64_t failures, repairs, slowdowns;
  double mean_failed_frac, max_failed_frac;
  double throughput[GP_NPOLICIES];    /* time average of the running configuration's */
  double goodput[GP_NPOLICIES];       /* the same, less the pauses and the work lost to restarts */
  int64_t stops[GP_NPOLICIES];        /* restarts (ntp: live reconfigurations) */
  double paused_h[GP_NPOLICIES];      /* hours paused or redone */
  /* spare domains that keep the healthy throughput (gp_spare_domains): at every moment of the
   * run, and 99% of the time */
  int32_t spares_max[GP_NPOLICIES], spares_p99[GP_NPOLICIES];
} gp_run_result;

/* A run of `days` (after `burn_days` from a healthy cluster, not measured) with failures and
 * repairs drawn from `seed`. false when out of memory. */
bool gp_simulate(const gp_config *c, const gp_failures *f, const gp_costs *k, double days, double burn_days,
                 uint64_t seed, gp_run_result *out);

/* Throughput of each policy with round(frac x gpus) failed GPUs placed at random, averaged over
 * `samples` draws (out[GP_NPOLICIES]), and the spare domains the worst draw needs (spares, NULL
 * for none). false when out of memory. */
bool gp_static_loss(const gp_config *c, double frac, int32_t samples, uint64_t seed, double *out, int32_t *spares);

#endif
