/* wait.c — every wait of the CUDA backend on its GPUs: polled, never blocking.
 *
 * NCCL's guide ("Asynchronous errors", "Fault tolerance"): an operation whose peer died "will
 * usually not progress and never complete", so cudaStreamSynchronize on it never returns; the
 * error shows only through ncclCommGetAsyncError, per communicator. Every wait here polls
 * cudaStreamQuery together with the async error of every communicator of this process, and gives
 * up after NTP_NCCL_TIMEOUT seconds (default 600) with no progress and no error (a peer stopped,
 * or too slow). After a failed wait the communicators are aborted, never destroyed. */
#include "cuda_internal.h"

double cu_host_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* the set of ranks of communicator k of rank r ("the world" for k < 0), for messages */
static void comm_name(const ntp_cuda *c, int r, int k, char *out, size_t cap) {
  if (k < 0) {
    snprintf(out, cap, "rank %d's world communicator", r);
    return;
  }
  size_t n = (size_t)snprintf(out, cap, "rank %d's communicator of ranks {", r);
  for (int i = 0; i < c->set_len[k] && n < cap; i++) n += (size_t)snprintf(out + n, cap - n, "%s%d", i ? "," : "", c->sets[k][i]);
  if (n < cap) snprintf(out + n, cap - n, "}");
}

/* One look at every communicator of this process: 1 while some call is still in progress, 0
 * when all are settled and well, -1 (err, nccl_last) when one reports an error. */
int cu_comms_state(ntp_cuda *c, char *err, size_t cap) {
  if (!c->nccl || !cu_api.ncclCommGetAsyncError) return 0;
  int busy = 0;
  if (c->settling) { /* a failover's new world: the old communicators are being aborted */
    ncclResult_t a = ncclSuccess;
    if (*c->settling && cu_api.ncclCommGetAsyncError(*c->settling, &a) != ncclSuccess) a = ncclInternalError;
    if (a == ncclInProgress || a == ncclSuccess) return a == ncclInProgress;
    cu_nccl_last = a;
    snprintf(err, cap, "NCCL reports %s on rank %d's new world communicator (ncclCommGetAsyncError)",
             cu_api.ncclGetErrorString(a), c->rank_lo);
    return -1;
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++) {
    if (c->dead && c->dead[r]) continue;
    for (int k = -1; k < c->nsets; k++) {
      ncclComm_t m = k < 0 ? (c->world ? c->world[r] : NULL) : c->group && c->group[r] ? c->group[r][k] : NULL;
      if (!m) continue;
      ncclResult_t a = ncclSuccess;
      if (cu_api.ncclCommGetAsyncError(m, &a) != ncclSuccess) a = ncclInternalError;
      if (a == ncclInProgress) busy = 1;
      else if (a != ncclSuccess) {
        char name[256];
        comm_name(c, r, k, name, sizeof name);
        cu_nccl_last = a;
        c->wait_failed = true;
        snprintf(err, cap, "NCCL reports %s on %s (ncclCommGetAsyncError)", cu_api.ncclGetErrorString(a), name);
        return -1;
      }
    }
  }
  return busy;
}

/* a moment's pause in a polled wait: a yield at first, then sleeps growing to 1 ms */
static void poll_pause(int spins) {
  if (spins < 64) {
    sched_yield();
    return;
  }
  long ns = spins < 128 ? 50000L : spins < 256 ? 200000L : 1000000L;
  nanosleep(&(struct timespec){0, ns}, NULL);
}

/* Until no communicator's call is in progress (a non-blocking one returned ncclInProgress). */
int cu_settle(ntp_cuda *c, char *err, size_t cap) {
  if (!c) {
    cu_nccl_last = ncclInternalError;
    snprintf(err, cap, "internal: ncclInProgress from a call outside a communicator");
    return -1;
  }
  double t0 = cu_host_now();
  for (int spins = 0;; spins++) {
    int st = cu_comms_state(c, err, cap);
    if (st <= 0) return st;
    if (cu_host_now() - t0 > c->nccl_timeout) {
      cu_nccl_last = ncclInProgress;
      c->wait_failed = true;
      snprintf(err, cap, "a non-blocking NCCL call of rank %d was still in progress after %g s (NTP_NCCL_TIMEOUT): a "
               "peer never joined", c->rank_lo, c->nccl_timeout);
      return -1;
    }
    poll_pause(spins);
  }
}

/* Until the streams of ranks [lo, hi) of this process have done their work. */
int cu_wait_ranks(ntp_cuda *c, int lo, int hi, char *err, size_t cap) {
  if (!c->nccl) { /* loopback: no peer to lose */
    for (int r = lo; r < hi; r++) {
      if (!stream_owner(c, r)) continue;
      CU(cu_api.cudaSetDevice(c->dev[r]));
      CU(cu_api.cudaStreamSynchronize(c->stream[r]));
    }
    return 0;
  }
  double t0 = cu_host_now();
  for (int spins = 0;; spins++) {
    bool busy = false;
    for (int r = lo; r < hi; r++) {
      if ((c->dead && c->dead[r]) || !c->stream[r]) continue;
      CU(cu_api.cudaSetDevice(c->dev[r]));
      cudaError_t e = cu_api.cudaStreamQuery(c->stream[r]);
      if (e == cudaErrorNotReady) busy = true;
      else CU(e);
    }
    if (!busy) return 0;
    if (cu_comms_state(c, err, cap) < 0) return -1;
    if (cu_host_now() - t0 > c->nccl_timeout) {
      c->wait_failed = true;
      snprintf(err, cap, "rank %d's work made no progress for %g s (NTP_NCCL_TIMEOUT) and NCCL reported no error: a "
               "peer is stopped or too slow", lo, c->nccl_timeout);
      return -1;
    }
    poll_pause(spins);
  }
fail:
  return -1;
}
int cu_wait_streams(ntp_cuda *c, char *err, size_t cap) { return cu_wait_ranks(c, c->rank_lo, c->rank_hi, err, cap); }
