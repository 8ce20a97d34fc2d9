/* comm_deps.h — the bytes each launch and collective touches, and what each compute step must
 * wait for when collectives run on a stream of their own (the CUDA backend's overlap of
 * communication with compute, docs/runtime.md).
 *
 * Footprints: a launch's bytes are its operands (read) and result (written) and those of the
 * steps fused into its kernel or GEMM epilogue (the CG_FUSED steps of its rank after it, up to
 * the rank's next launch), a GEMM's output, bias (read, or written by a bias-gradient epilogue)
 * and aux, and for a GEMM moved to a later step the operands of its matmul; a collective reads
 * its sources and writes its destinations. Memory, not tensor ids, is compared: the arena reuses
 * bytes across tensors whose lives do not overlap, so two steps that share no byte are
 * independent whatever the memory plan did. The launch order (launch_order.h) and the waits below
 * are both decided on these footprints.
 *
 * Waits: compute steps run in their enqueue order (launch_order.h) on their rank's stream; a
 * collective starts once every compute step enqueued before it has run (the producers of what it
 * reads are among them), on the rank's comm stream, and may overlap the compute steps enqueued
 * after it until the first one that touches its memory: reads or writes what the collective
 * writes, or writes what it reads (kept simple: any byte in common). That step waits for the
 * collective's completion; the rank's later steps follow it on the stream. */
#ifndef NTP_COMM_DEPS_H
#define NTP_COMM_DEPS_H

#include "ntprt.h"

/* bytes [lo, hi) of one rank's arena or parameter block */
typedef struct ntp_span {
  int32_t rank;
  bool persistent;
  bool write; /* written by the step (else only read) */
  int64_t lo, hi;
} ntp_span;

/* per step s: span[start[s] .. start[s + 1]); empty for a step that neither launches nor communicates */
typedef struct ntp_footprints {
  size_t *start;
  ntp_span *span;
} ntp_footprints;

/* a parameter's or input's initialisation (run before everything else: they read nothing) */
bool ntp_step_inits(const ntp_step *st);
/* a compute step the CUDA backend launches (kernel, GEMM, GEMM attention; not an initialisation) */
bool ntp_step_launches(const ntp_program *p, size_t s);
/* rank r runs part of collective s (a participant, or bytes of its own moved) */
bool ntp_comm_takes_part(const ntp_program *p, size_t s, int r);
/* 0, or -1 when out of memory. */
int ntp_footprints_build(const ntp_program *p, ntp_footprints *f);
void ntp_footprints_free(ntp_footprints *f);
/* steps a and b share a byte */
bool ntp_footprints_touch(const ntp_footprints *f, size_t a, size_t b);
/* ... that one of them writes (read after write, write after read, write after write) */
bool ntp_footprints_conflict(const ntp_footprints *f, size_t a, size_t b);

typedef struct ntp_comm_deps {
  int32_t *start; /* per step s: the collectives that s waits for are wait[start[s] .. start[s + 1]) */
  int32_t *wait;  /* step indices of collectives */
} ntp_comm_deps;

/* The waits for steps enqueued in order[0 .. n) (collectives and launches; NULL: every step in
 * step order). 0, or -1 when out of memory. */
int ntp_comm_deps_build(const ntp_program *p, const ntp_footprints *f, const int32_t *order, size_t n,
                        ntp_comm_deps *d);
void ntp_comm_deps_free(ntp_comm_deps *d);

#endif
