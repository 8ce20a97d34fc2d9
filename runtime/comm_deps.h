/* comm_deps.h — what each compute step must wait for when collectives run on a stream of their
 * own (the CUDA backend's overlap of communication with compute, docs/runtime.md).
 *
 * Compute steps run in step order on their rank's stream; a collective starts once every compute
 * step before it was enqueued (the producers of what it reads are among them), on the rank's comm
 * stream, and may overlap the compute steps after it until the first one that touches its memory:
 * reads or writes what the collective writes, or writes what it reads (kept simple: any byte in
 * common). That step waits for the collective's completion. Memory, not tensor ids, is compared:
 * the arena reuses bytes across tensors whose lives do not overlap. A compute step's bytes are
 * its operands and result and those of the steps fused into its kernel or GEMM epilogue (the
 * CG_FUSED steps of its rank after it, up to the rank's next launch). */
#ifndef NTP_COMM_DEPS_H
#define NTP_COMM_DEPS_H

#include "ntprt.h"

typedef struct ntp_comm_deps {
  int32_t *start; /* per step s: the collectives that s waits for are wait[start[s] .. start[s + 1]) */
  int32_t *wait;  /* step indices of collectives */
} ntp_comm_deps;

/* 0, or -1 when out of memory. */
int ntp_comm_deps_build(const ntp_program *p, ntp_comm_deps *d);
void ntp_comm_deps_free(ntp_comm_deps *d);

#endif
