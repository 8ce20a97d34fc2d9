/* train_failover.h — the survivors' program for `ntpc train --fail-at` (train_failover.c). */
#ifndef NTP_TRAIN_FAILOVER_H
#define NTP_TRAIN_FAILOVER_H

#include <stdbool.h>
#include <stdint.h>

#include "ntp_program.h"
#include "ntp_train.h"
#include "cli.h"

/* What the model was compiled from: the file, its -D overrides, the model and the healthy plan. */
typedef struct train_source {
  const char *file, *model, *plan_file, *plan_name;
  const char *const *defines;
  int ndefines;
  bool kernels; /* the survivors' program carries every rank's CUDA (the backend runs it) */
  int32_t micro_batches; /* --micro-batches (1: none) */
  const char *schedule;  /* --schedule: a name or FILE.csv */
  cli_optimizer opt;     /* --zero, --redundancy, --domain-size (else the plan's: kept by the survivors) */
} train_source;

/* A run's failures (--fail-at) so far, and what it needs to go on after one. */
typedef struct failover_run {
  train_source src;
  const char *ckpt;  /* --checkpoint: where the run goes back to when a failed GPU held the only copy */
  int phys_rank;     /* one rank per process: this process's GPU (--rank); -1: every rank here */
  uint64_t seed;
  int32_t world0;    /* the healthy world */
  int32_t failed[64];
  int32_t nfailed;
  ntp_program *keep[64]; /* the programs failed over from: the batch's tensors name their values */
  int nkeep;
  bool fired[64];    /* per --fail-at entry: happened (a run that went back to a checkpoint does not fail twice) */
  double detected;   /* one rank per process: when the backend reported the lost peer */
  const char *backend; /* where a repaired world's ranks run: a fresh executor (--backend, --loopback) */
  bool loopback;
  double *slow_known;  /* per physical GPU: the slowdown of a straggler absorbed (1: none), NULL before
                          the first; a staged plan's later re-plans cut their stages around it */
  bool idle;           /* one rank per process: this process's GPU has no rank in the survivors' plan */
} failover_run;

/* GPUs `now` fail before step `step` (1-based): their ranks are let go on the executor
 * (ntp_exec_lose: NCCL's communicators aborted, the world shrunk), the survivors' program made
 * (train_replan), and a trainer on it takes the state from the surviving replicas, or from the
 * checkpoint when a failed GPU held the only copy (the run then goes back to the checkpoint's
 * step). *tr, *prog and *phys are replaced (the old program is kept in fr until the end). 0, or -1
 * with err. What happens is printed. */
int train_fail_over(failover_run *fr, long step, const int32_t *now, int nnow, ntp_program **prog, ntp_trainer **tr,
                    int32_t **phys, const ntp_adamw *aw, ntp_tokens *data, char *err, size_t cap);
/* GPUs `now` (failed before) are back, repaired, before step `step`: the planner re-plans for the
 * larger world (the healthy plan itself when none is down any more), a fresh executor runs it
 * (NCCL: communicators over the new world's GPUs, ncclCommInitAll), and its trainer takes every
 * element of the state from the ranks that hold it (the newcomers' from their replicas). *tr, *prog
 * and *phys are replaced. 0, or -1 with err. */
int train_rejoin(failover_run *fr, long step, const int32_t *now, int nnow, ntp_program **prog, ntp_trainer **tr,
                 int32_t **phys, const ntp_adamw *aw, char *err, size_t cap);
/* STEP:RANK[,STEP:RANK...] (decimal; steps 1 to 10^9, ranks 0 to 4095) appended to steps[], ranks[]
 * (at most 64 in all); false when malformed */
bool train_parse_events(const char *v, long *steps, int32_t *ranks, int *n);
/* Moves the run onto np (rank r on physical GPU nphys[r], NULL: r; its executor made with x): a
 * trainer on it takes every element of *tr's state from the ranks that hold it (none lost but
 * those fr says failed); *tr, *prog and *phys are replaced (the old program kept in fr), and np and
 * nphys are the run's. On failure (-1, err) np and nphys are freed and the run is as it was. */
struct ntp_exec_options;
int train_switch(failover_run *fr, ntp_program *np, int32_t *nphys, const struct ntp_exec_options *x,
                 const ntp_adamw *aw, ntp_program **prog, ntp_trainer **tr, int32_t **phys, int64_t *moved, char *err,
                 size_t cap);
/* seconds on a monotonic clock (when a lost peer was reported: fr->detected) */
double train_now_s(void);
/* the programs kept */
void failover_run_free(failover_run *fr);

/* The model compiled from src under `plan_file` (and `plan_name`) for `world` ranks, with the
 * gradient pass when grad, its ranks on GPUs gpus[] (NULL: their numbers); NULL with err. */
ntpc_session *train_session(const train_source *src, bool grad, int32_t world, const char *plan_file,
                            const char *plan_name, const int32_t *gpus, char *err, size_t cap);
/* The training program for the GPUs that survive `failed` (physical ranks of the healthy world
 * `world`): re-planned from the healthy plan, compiled with the gradient pass; *phys[r] is the
 * physical rank of its rank r (free it). NULL with a message in err. The plan's rules are
 * printed (into log instead, when given). */
typedef struct replan_ask {
  const int32_t *failed; /* physical GPUs down */
  int32_t nfailed;
  const double *slow;       /* each physical GPU's slowdown (a staged plan's stages cut around it), or NULL */
  const double *pipe_scale; /* each healthy pipeline's pace times this (rows shared as measured), or NULL */
  char *log;                /* the plan's lines go here (log_cap bytes) instead of stdout, or NULL */
  size_t log_cap;
} replan_ask;
ntp_program *train_replan(const train_source *src, int32_t world, const replan_ask *ask, int32_t **phys, char *err,
                          size_t cap);
/* The same plan compiled (with the gradient pass when grad), the session returned (the caller
 * frees it) instead of its program: what a re-split reads the survivors' placements from. */
ntpc_session *train_replan_session(const train_source *src, int32_t world, const replan_ask *ask, bool grad,
                                   int32_t **phys, char *err, size_t cap);

#endif
