/* train_failover.h — the survivors' program for `ntpc train --fail-at` (train_failover.c). */
#ifndef NTP_TRAIN_FAILOVER_H
#define NTP_TRAIN_FAILOVER_H

#include <stdbool.h>
#include <stdint.h>

#include "ntp_program.h"

/* What the model was compiled from: the file, its -D overrides, the model and the healthy plan. */
typedef struct train_source {
  const char *file, *model, *plan_file, *plan_name;
  const char *const *defines;
  int ndefines;
  bool cuda; /* the survivors' program carries every rank's CUDA */
} train_source;

/* The training program for the GPUs that survive `failed` (physical ranks of the healthy world
 * `world`): re-planned from the healthy plan, compiled with the gradient pass; *phys[r] is the
 * physical rank of its rank r (free it). NULL with a message in err. The plan's rules are
 * printed. */
ntp_program *train_replan(const train_source *src, int32_t world, const int32_t *failed, int32_t nfailed,
                          int32_t **phys, char *err, size_t cap);

#endif
