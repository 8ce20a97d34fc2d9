/* shard_internal.h — shared between the sharding files and the planner. */
#ifndef NTP_SHARD_INTERNAL_H
#define NTP_SHARD_INTERNAL_H

#include "shard.h"

/* Rows per group in proportion to the shares, largest remainders first; sums to rows. */
void shard_split_rows(int64_t rows, const int64_t *shares, int32_t ngroups, int64_t *row_start);

#endif
