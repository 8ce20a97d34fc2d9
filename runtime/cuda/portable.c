/* portable.c — the parts of the CUDA backend's interface (cuda_backend.h) that need no CUDA: the
 * summary lines the CLI prints. Built with or without the toolkit's headers. */
#include "cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>

void ntp_cuda_overlap_line(const ntp_cuda_overlap *s, char *buf, size_t cap) {
  if (!s->on) {
    snprintf(buf, cap, "overlap: off (NTP_CUDA_OVERLAP=0: step order, collectives on the compute stream)");
    return;
  }
  int n = snprintf(buf, cap, "overlap: %d collectives with a consumer, %d with compute in flight (was %d), "
                   "%d launches between them and their consumers (was %d), %d launches moved",
                   s->consumed, s->overlapped, s->overlapped_before, s->launches, s->launches_before, s->moved);
  if (s->ranks > 1 && n > 0 && (size_t)n < cap)
    snprintf(buf + n, cap - (size_t)n, " (collective and rank pairs over this process's %d ranks)", s->ranks);
}

void ntp_cuda_gemm_line(const ntp_cuda_gemms *s, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "cuBLASLt: %d GEMMs, %d distinct shapes (one heuristic query each), workspace %zu bytes "
                   "per GPU on %d (algorithms allowed %zu); epilogues:", s->gemms, s->shapes, s->workspace, s->gpus,
                   s->workspace_cap);
  for (int e = 0; e < CG_EPI_COUNT && n > 0 && (size_t)n < cap; e++)
    n += snprintf(buf + n, cap - (size_t)n, " %s %d", cg_epilogue_name((cg_epilogue)e), s->epilogues[e]);
}
