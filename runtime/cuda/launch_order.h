/* launch_order.h — the order in which the CUDA backend enqueues a step list's launches and
 * collectives (after the initialisation steps, which stay first), so that a collective's
 * communication overlaps compute that does not need it (docs/runtime.md, "Streams, events and
 * CUDA graphs").
 *
 * In step order a collective's first consumer usually comes right after it, and the compute
 * stream waits at once. The launch order is a list schedule per rank over the rank's launches and
 * the collectives it takes part in, with a look-ahead window of NTP_LAUNCH_WINDOW of them: a
 * collective is enqueued as soon as every step it conflicts with before it is; otherwise the
 * launches leading to the next collective come first, then launches that touch no collective
 * still in flight (the weight-gradient GEMM while the input gradient's all-reduce runs, as
 * Megatron overlaps them), and a collective's consumer only when nothing else is ready. A step
 * never passes an earlier one it conflicts with (comm_deps.h's footprints: read after write,
 * write after read, write after write on any byte; a launch and a collective: any common byte),
 * and collectives keep their order (NCCL needs the same on every rank). Every pair of steps whose
 * order could matter thus keeps it, so the kernels read and write exactly what they did in step
 * order — the same bits, whatever bytes the memory plan shared between tensors. The ranks' orders
 * are merged at the collectives; deterministic, O(steps × window) footprint comparisons. */
#ifndef NTP_LAUNCH_ORDER_H
#define NTP_LAUNCH_ORDER_H

#include "comm_deps.h"

#define NTP_LAUNCH_WINDOW 32

typedef struct ntp_launch_order {
  int32_t *step; /* the collectives and the launches of ranks [rank_lo, rank_hi), in enqueue order */
  size_t n;
  int32_t moved; /* launches enqueued ahead of a step (launch or collective of their rank) before them in step order */
} ntp_launch_order;

/* reorder false: step order. 0, or -1 when out of memory. */
int ntp_launch_order_build(const ntp_program *p, const ntp_footprints *f, int rank_lo, int rank_hi, bool reorder,
                           ntp_launch_order *o);
void ntp_launch_order_free(ntp_launch_order *o);

/* How much compute an order puts in flight with the collectives: over the collectives and the
 * ranks [rank_lo, rank_hi) where the rank has a consumer (the launch that waits, d), how many have
 * at least one launch of the rank enqueued between the collective and that consumer, and how many
 * such launches there are in all. */
typedef struct ntp_overlap_count {
  int32_t consumed, overlapped, launches;
} ntp_overlap_count;
void ntp_overlap_measure(const ntp_program *p, const ntp_launch_order *o, const ntp_comm_deps *d, ntp_overlap_count *out);

#endif
