/* shard_internal.h — shared between the sharding files. */
#ifndef NTP_SHARD_INTERNAL_H
#define NTP_SHARD_INTERNAL_H

#include "shard.h"

typedef struct placement_ctx {
  const ir_module *m;
  diag_sink *diags;
  int32_t world_opt; /* --world, 0 = not given */
  int32_t world;     /* resolved */
  sh_placement *out; /* per layer */
  int64_t (*shares)[NTP_MAX_GROUPS]; /* per layer: batch share of each group */
  ntp_loc *auto_locs;                /* per layer: where its 'tp auto' came from */
} placement_ctx;

bool shard_resolve_placements(placement_ctx *c);
void shard_split_rows(int64_t rows, const int64_t *shares, int32_t ngroups, int64_t *row_start);

#endif
