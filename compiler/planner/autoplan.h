/* autoplan.h — the autoplan pass: 'tp auto' placements chosen by the planner. */
#ifndef NTP_AUTOPLAN_H
#define NTP_AUTOPLAN_H

#include "shard.h"

/* Every is_auto placement of `placements` (world ranks) becomes the planner's choice for the
 * device profile `gpu` (a built-in name or a profile file, as plan_profile_find reads it; NULL:
 * h100); the others stay as they are and pin the search. A note at each 'tp auto' says what was
 * chosen; *notes (heap, may be NULL) gets the same as text lines.
 * false when it cannot (reported), or out of memory (nothing reported). */
bool autoplan_resolve(const ir_module *m, int32_t world, sh_placement *placements, const char *gpu, diag_sink *diags,
                      char **notes);

#endif
