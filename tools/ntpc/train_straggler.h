/* train_straggler.h — `ntpc train --slow GPU:FACTOR`: a slow GPU found on the run's timeline
 * and absorbed by re-splitting the plan around it (train_straggler.c). */
#ifndef NTP_TRAIN_STRAGGLER_H
#define NTP_TRAIN_STRAGGLER_H

#include <stdbool.h>
#include <stdint.h>

#include "train_failover.h"

/* The simulated timeline of one step of p: each compute step its operations times slow[GPU] (the
 * GPU of rank r: phys[r], NULL the identity), a step waiting for what it reads. Per rank its busy
 * time and its work (operations) into busy[], work[]; the makespan (NAN when out of memory). */
double straggler_timeline(const ntp_program *p, const int32_t *phys, const double *slow, double *busy, double *work);

/* --slow GPU:FACTOR[,...] into slow[4096] (1 for the others); false when malformed */
bool straggler_parse(const char *v, double *slow);

/* Per GPU (physical, 4096): steps in a row it was slow, and whether it was handled. */
typedef struct straggler_watch_state {
  int32_t streak[4096];
  bool handled[4096];
} straggler_watch_state;
/* After a step: every GPU's measured speed against the median's into speed[GPU]; the GPU that has
 * been slower than 1/1.2 of it for 3 steps in a row (once), or -1. */
int32_t straggler_watch(straggler_watch_state *w, const ntp_program *p, const int32_t *phys, const double *slow,
                        double *speed);
/* The program re-split around slow GPU `slow_gpu` (speed: its measured speed against the median):
 * candidates with its groups cut so it is a group of its own, and with the groups kept; each
 * layer's rows to the pieces that finish them soonest, at their GPUs times their speed, then twice
 * more at the rates measured on the candidate's timeline (uneven unit splits show there); the
 * fastest on the timeline (its step in *best_span) is compiled and returned, its plan printed.
 * A plan with pipeline stages: the stage that holds the straggler goes on without it (one GPU
 * short, as after a failure of it: plan_failover_stages re-cuts that replica's layers and shares the
 * batch rows by the replicas' pace), the GPUs `failed` down too; rank r of the program on physical
 * GPU (*nphys)[r] (flat plans: *nphys NULL, rank r on GPU r, and no GPU may be down). `world`: the
 * healthy world. NULL with err. */
ntp_program *straggler_resplit(const train_source *src, int32_t world, const int32_t *failed, int32_t nfailed,
                               int32_t slow_gpu, double speed, const double *slow, double *best_span, int32_t **nphys,
                               char *err, size_t cap);

/* After step `step`: a straggler found is absorbed (the plan re-split, a trainer on it taking the
 * state, the timeline's step before and after printed); *prog, *tr, *phys replaced. 0 (also when
 * none is found), or -1 with err. */
int train_absorb_straggler(straggler_watch_state *w, failover_run *fr, const double *slow, long step,
                           ntp_program **prog, ntp_trainer **tr, int32_t **phys, const ntp_adamw *aw, char *err,
                           size_t cap);

#endif
