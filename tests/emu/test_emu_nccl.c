/* test_emu_nccl.c — the emulated NCCL is as strict as NCCL's documentation: what would hang on a
 * GPU (a rank that never joins, a send nobody receives, a blocking wait on an operation whose peer
 * died or aborted, a destroy of one of several ranks of one thread outside a group) stops the
 * process or fails; an operation whose peer died or aborted is accepted and never completes, and
 * only polling (cudaStreamQuery, ncclCommGetAsyncError of its communicator) sees it; non-blocking
 * communicators return ncclInProgress and are to be settled before their next call; CUDA graphs
 * of several GPUs of one process are refused. Each case in a child process (selftest_runner.h). */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "selftest_runner.h"


/* two ranks on GPUs 0 and 1, a buffer of 64 floats each */
static bool two_ranks(ncclComm_t comm[2], float *buf[2]) {
  for (int r = 0; r < 2; r++) cudaSetDevice(r), cudaMalloc((void **)&buf[r], 64 * sizeof(float));
  return ncclCommInitAll(comm, 2, NULL) == ncclSuccess;
}

static cudaError_t c_nccl_missing_rank(void) {
  ncclComm_t comm[2];
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(0);
  ncclGroupStart();
  ncclAllReduce(buf[0], buf[0], 64, ncclFloat32, ncclSum, comm[0], NULL); /* rank 1 never joins */
  return as_cuda(ncclGroupEnd() == ncclSuccess && cudaStreamSynchronize(NULL) == cudaSuccess); /* stream work */
}

static cudaError_t c_nccl_mismatch(void) {
  ncclComm_t comm[2];
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  ncclGroupStart();
  for (int r = 0; r < 2; r++) {
    cudaSetDevice(r);
    ncclAllReduce(buf[r], buf[r], r ? 32 : 64, ncclFloat32, ncclSum, comm[r], NULL);
  }
  return as_cuda(ncclGroupEnd() == ncclSuccess && cudaStreamSynchronize(NULL) == cudaSuccess);
}

static cudaError_t c_nccl_unmatched_send(void) {
  ncclComm_t comm[2];
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(0);
  ncclGroupStart();
  ncclSend(buf[0], 64, ncclFloat32, 1, comm[0], NULL);
  return as_cuda(ncclGroupEnd() == ncclSuccess && cudaStreamSynchronize(NULL) == cudaSuccess);
}

static cudaError_t c_nccl_reduces_in_rank_order(void) {
  ncclComm_t comm[3];
  float *buf[3], h[3][4] = {{1e8f, 1, 0, 0}, {-1e8f, 2, 0, 0}, {1, 3, 0, 0}}, r[4];
  for (int k = 0; k < 3; k++) {
    cudaSetDevice(k);
    cudaMalloc((void **)&buf[k], sizeof h[k]);
    cudaMemcpy(buf[k], h[k], sizeof h[k], cudaMemcpyHostToDevice);
  }
  if (ncclCommInitAll(comm, 3, NULL) != ncclSuccess) return cudaErrorUnknown;
  ncclGroupStart();
  for (int k = 0; k < 3; k++) cudaSetDevice(k), ncclAllReduce(buf[k], buf[k], 4, ncclFloat32, ncclSum, comm[k], NULL);
  if (ncclGroupEnd() != ncclSuccess) return cudaErrorUnknown;
  cudaSetDevice(2);
  cudaMemcpy(r, buf[2], sizeof r, cudaMemcpyDeviceToHost);
  /* fp32 in rank order: (1e8 + -1e8) + 1 = 1, not 1e8 + (-1e8 + 1) = 0 */
  return as_cuda(r[0] == 1.0f && r[1] == 6.0f);
}

/* after a failure: rank 1 of 3 excluded, ranks 0 and 2 shrink (NCCL_SHRINK_ABORT) in a group */
static bool shrink_three(ncclComm_t comm[3], ncclComm_t sub[2], float *buf[3], int flags) {
  for (int r = 0; r < 3; r++) cudaSetDevice(r), cudaMalloc((void **)&buf[r], 4 * sizeof(float));
  if (ncclCommInitAll(comm, 3, NULL) != ncclSuccess) return false;
  int gone = 1;
  bool ok = true;
  ncclGroupStart();
  for (int r = 0; r < 3; r += 2)
    cudaSetDevice(r), ok &= ncclCommShrink(comm[r], &gone, 1, &sub[r / 2], NULL, flags) == ncclSuccess;
  return ncclGroupEnd() == ncclSuccess && ok;
}

static cudaError_t c_nccl_shrink(void) {
  ncclComm_t comm[3], sub[2];
  float *buf[3], h[2][4] = {{1, 2, 3, 4}, {10, 20, 30, 40}}, r[4];
  if (!shrink_three(comm, sub, buf, NCCL_SHRINK_ABORT)) return cudaErrorUnknown;
  int n0, n1, r0, r1;
  ncclCommCount(sub[0], &n0), ncclCommCount(sub[1], &n1), ncclCommUserRank(sub[0], &r0), ncclCommUserRank(sub[1], &r1);
  if (n0 != 2 || n1 != 2 || r0 != 0 || r1 != 1) return cudaErrorUnknown; /* renumbered in order */
  ncclGroupStart();
  for (int k = 0; k < 2; k++) {
    cudaSetDevice(2 * k);
    cudaMemcpy(buf[2 * k], h[k], sizeof h[k], cudaMemcpyHostToDevice);
    ncclAllReduce(buf[2 * k], buf[2 * k], 4, ncclFloat32, ncclSum, sub[k], NULL);
  }
  if (ncclGroupEnd() != ncclSuccess) return cudaErrorUnknown;
  cudaMemcpy(r, buf[2], sizeof r, cudaMemcpyDeviceToHost);
  for (int r_ = 0; r_ < 3; r_ += 2) cudaSetDevice(r_), ncclCommAbort(comm[r_]); /* the parents: only to be freed */
  ncclGroupStart(); /* both ranks of the survivors' communicator live here: freed in one group */
  ncclCommDestroy(sub[0]), ncclCommDestroy(sub[1]);
  return as_cuda(r[0] == 11.0f && r[3] == 44.0f && ncclGroupEnd() == ncclSuccess);
}

static cudaError_t c_nccl_shrink_excluded(void) {
  ncclComm_t comm[2], sub;
  float *buf[2];
  int gone = 1;
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(1);
  return as_cuda(ncclCommShrink(comm[1], &gone, 1, &sub, NULL, NCCL_SHRINK_ABORT) == ncclSuccess);
}

static cudaError_t c_nccl_shrunk_parent(void) {
  ncclComm_t comm[3], sub[2];
  float *buf[3];
  if (!shrink_three(comm, sub, buf, NCCL_SHRINK_ABORT)) return cudaErrorUnknown;
  cudaSetDevice(0);
  return as_cuda(ncclAllReduce(buf[0], buf[0], 4, ncclFloat32, ncclSum, comm[0], NULL) == ncclSuccess);
}

/* a peer aborts: the survivor's all-reduce is accepted and never completes; no call fails, and only
 * ncclCommGetAsyncError of that communicator says ncclRemoteError */
static cudaError_t c_nccl_peer_aborted(void) {
  ncclComm_t comm[2];
  float *buf[2];
  cudaStream_t s;
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(1);
  ncclCommAbort(comm[1]);
  cudaSetDevice(0);
  cudaStreamCreate(&s);
  ncclResult_t a0 = ncclInternalError, a1 = ncclSuccess;
  ncclCommGetAsyncError(comm[0], &a0); /* nothing in flight yet: nothing to report */
  if (ncclAllReduce(buf[0], buf[0], 64, ncclFloat32, ncclSum, comm[0], s) != ncclSuccess) return cudaErrorUnknown;
  for (int i = 0; i < 100; i++)
    if (cudaStreamQuery(s) != cudaErrorNotReady) return cudaErrorUnknown;
  ncclCommGetAsyncError(comm[0], &a1);
  if (a0 != ncclSuccess || a1 != ncclRemoteError || cudaGetLastError() != cudaSuccess) return cudaErrorUnknown;
  ncclCommAbort(comm[0]); /* ends it: the stream is idle again */
  return as_cuda(cudaStreamQuery(s) == cudaSuccess);
}
/* ... and a blocking wait on it never returns: the emulator stops the process */
static cudaError_t c_nccl_peer_aborted_sync(void) {
  ncclComm_t comm[2];
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(1);
  ncclCommAbort(comm[1]);
  cudaSetDevice(0);
  ncclAllReduce(buf[0], buf[0], 64, ncclFloat32, ncclSum, comm[0], NULL);
  return cudaStreamSynchronize(NULL);
}
/* two processes: rank 1's joins the world and a split of it, then dies (exits without its
 * all-reduce; a zombie until reaped) */
static bool world_with_dead_peer(ncclComm_t *world, ncclComm_t *split, pid_t *child, ncclUniqueId *id) {
  if (ncclGetUniqueId(id) != ncclSuccess) return false;
  setenv("NTP_EMU_NCCL_TIMEOUT", "60", 1);
  *child = fork();
  if (*child == 0) {
    ncclComm_t peer, peer_split;
    cudaSetDevice(1);
    bool ok = ncclCommInitRank(&peer, 2, *id, 1) == ncclSuccess && ncclCommSplit(peer, 0, 1, &peer_split, NULL) == ncclSuccess;
    _exit(ok ? 0 : 3);
  }
  cudaSetDevice(0);
  return ncclCommInitRank(world, 2, *id, 0) == ncclSuccess && ncclCommSplit(*world, 0, 0, split, NULL) == ncclSuccess;
}
/* the survivor's all-reduce on the split is accepted and never completes: cudaStreamQuery says not
 * ready for ever, ncclCommGetAsyncError of the split says ncclRemoteError, that of the world (the
 * same dead peer, nothing in flight) nothing; ncclCommAbort ends it */
static cudaError_t c_nccl_dead_process_polled(void) {
  ncclComm_t world, split;
  ncclUniqueId id;
  pid_t child;
  float *buf;
  cudaStream_t s;
  if (!world_with_dead_peer(&world, &split, &child, &id)) return cudaErrorUnknown;
  cudaMalloc((void **)&buf, 64 * sizeof(float));
  cudaStreamCreate(&s);
  int st;
  waitpid(child, &st, 0); /* dead (and reaped): its /proc entry is gone */
  bool ok = ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, split, s) == ncclSuccess;
  for (int i = 0; ok && i < 200; i++) {
    ok = cudaStreamQuery(s) == cudaErrorNotReady;
    usleep(1000);
  }
  ncclResult_t a_split = ncclSuccess, a_world = ncclInternalError;
  ncclCommGetAsyncError(split, &a_split);
  ncclCommGetAsyncError(world, &a_world);
  ok &= a_split == ncclRemoteError && a_world == ncclSuccess && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  ncclCommAbort(split);
  ok &= cudaStreamQuery(s) == cudaSuccess;
  ncclCommAbort(world);
  unlink(id.internal + strlen("ntp-emu:")); /* the dead peer never lets go of the fabric */
  return as_cuda(ok);
}
/* ... and a blocking wait on it never returns: the emulator stops the process */
static cudaError_t c_nccl_dead_process(void) {
  ncclComm_t world, split;
  ncclUniqueId id;
  pid_t child;
  float *buf;
  if (!world_with_dead_peer(&world, &split, &child, &id)) return cudaErrorUnknown;
  cudaMalloc((void **)&buf, 64 * sizeof(float));
  int st;
  waitpid(child, &st, 0);
  unlink(id.internal + strlen("ntp-emu:"));
  ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, split, NULL);
  return cudaStreamSynchronize(NULL);
}
/* NTP_EMU_FAIL_GPUS: GPU 1 fails at the first abort or shrink; then nothing may touch it */
static cudaError_t c_failed_gpu_touched(void) {
  ncclComm_t comm[2];
  float *buf[2], h[64];
  setenv("NTP_EMU_FAIL_GPUS", "1", 1);
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(0);
  ncclCommAbort(comm[0]);
  cudaMemcpy(h, buf[0], sizeof h, cudaMemcpyDeviceToHost); /* GPU 0's memory: fine */
  return cudaMemcpy(h, buf[1], sizeof h, cudaMemcpyDeviceToHost); /* GPU 1's: stops the process */
}

static cudaError_t c_failed_peer_destroy(void) {
  ncclComm_t comm[3], sub[2];
  float *buf[3];
  setenv("NTP_EMU_FAIL_GPUS", "1", 1);
  if (!shrink_three(comm, sub, buf, NCCL_SHRINK_ABORT)) return cudaErrorUnknown;
  cudaSetDevice(0);
  return as_cuda(ncclCommDestroy(comm[0]) == ncclSuccess); /* waits for rank 1, on the failed GPU */
}

static cudaError_t c_failed_peer_shrink_default(void) {
  ncclComm_t comm[3], sub[2];
  float *buf[3];
  setenv("NTP_EMU_FAIL_GPUS", "1", 1);
  return as_cuda(shrink_three(comm, sub, buf, NCCL_SHRINK_DEFAULT));
}

/* a graph per rank, each capturing its rank's part of one group of all-reduces; the launches
 * meet at the replay, as NCCL's kernels do */
static cudaError_t c_nccl_graph_per_rank(void) {
  setenv("NTP_EMU_STREAMS", "lazy", 1);
  ncclComm_t comm[2];
  float *buf[2], h[64], r[64];
  cudaStream_t s[2];
  cudaGraphExec_t e[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  for (int k = 0; k < 2; k++) cudaSetDevice(k), cudaStreamCreate(&s[k]);
  for (int k = 0; k < 2; k++) cudaSetDevice(k), cudaStreamBeginCapture(s[k], cudaStreamCaptureModeThreadLocal);
  ncclGroupStart();
  for (int k = 0; k < 2; k++) cudaSetDevice(k), ncclAllReduce(buf[k], buf[k], 64, ncclFloat32, ncclSum, comm[k], s[k]);
  if (ncclGroupEnd() != ncclSuccess) return cudaErrorUnknown;
  for (int k = 0; k < 2; k++) {
    cudaGraph_t g;
    cudaSetDevice(k);
    if (cudaStreamEndCapture(s[k], &g) != cudaSuccess || cudaGraphInstantiate(&e[k], g, 0) != cudaSuccess)
      return cudaErrorUnknown;
    cudaGraphDestroy(g);
  }
  for (int rep = 1; rep <= 2; rep++) {
    for (int k = 0; k < 2; k++) {
      for (int i = 0; i < 64; i++) h[i] = (float)(rep * (k + 1) + i);
      cudaSetDevice(k), cudaMemcpy(buf[k], h, sizeof h, cudaMemcpyHostToDevice);
    }
    for (int k = 0; k < 2; k++) cudaSetDevice(k), cudaGraphLaunch(e[k], s[k]);
    for (int k = 0; k < 2; k++)
      if (cudaSetDevice(k), cudaStreamSynchronize(s[k]) != cudaSuccess) return cudaErrorUnknown;
    cudaSetDevice(1), cudaMemcpy(r, buf[1], sizeof r, cudaMemcpyDeviceToHost);
    if (r[0] != (float)(3 * rep) || r[63] != (float)(3 * rep + 126)) return cudaErrorUnknown;
  }
  return cudaSuccess;
}

/* NCCL refuses a group that straddles the start of a capture */
static cudaError_t c_nccl_group_capture_boundary(void) {
  ncclComm_t comm[2];
  float *buf[2];
  cudaStream_t s;
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(0);
  cudaStreamCreate(&s);
  ncclGroupStart();
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  ncclAllReduce(buf[0], buf[0], 64, ncclFloat32, ncclSum, comm[0], s);
  return as_cuda(ncclGroupEnd() == ncclSuccess);
}

/* a graph that captured a collective, launched after its communicator was aborted */
static cudaError_t c_nccl_graph_dead_comm(void) {
  ncclComm_t comm;
  float *buf;
  cudaStream_t s;
  cudaGraph_t g;
  cudaGraphExec_t e;
  cudaSetDevice(0);
  cudaMalloc((void **)&buf, 64 * sizeof(float));
  cudaStreamCreate(&s);
  if (ncclCommInitAll(&comm, 1, NULL) != ncclSuccess) return cudaErrorUnknown;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, comm, s);
  if (cudaStreamEndCapture(s, &g) != cudaSuccess || cudaGraphInstantiate(&e, g, 0) != cudaSuccess) return cudaErrorUnknown;
  if (cudaGraphLaunch(e, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) return cudaErrorUnknown;
  ncclCommAbort(comm);
  return cudaGraphLaunch(e, s);
}

/* a non-blocking communicator (ncclConfig_t.blocking = 0): its creation and its first collective
 * return ncclInProgress; ncclCommGetAsyncError is polled until ncclSuccess before the next call */
static bool nonblocking_comm(ncclComm_t *comm, ncclUniqueId *id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  cudaSetDevice(0);
  return ncclGetUniqueId(id) == ncclSuccess && ncclCommInitRankConfig(comm, 1, *id, 0, &config) == ncclInProgress;
}
static bool settle(ncclComm_t comm) {
  ncclResult_t a = ncclInProgress;
  for (int i = 0; i < 1000 && a == ncclInProgress; i++) ncclCommGetAsyncError(comm, &a);
  return a == ncclSuccess;
}
static cudaError_t c_nccl_nonblocking(void) {
  ncclComm_t comm;
  ncclUniqueId id;
  float *buf, h[4] = {1, 2, 3, 4}, r[4];
  if (!nonblocking_comm(&comm, &id) || !settle(comm)) return cudaErrorUnknown;
  cudaMalloc((void **)&buf, sizeof h);
  cudaMemcpy(buf, h, sizeof h, cudaMemcpyHostToDevice);
  ncclResult_t first = ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comm, NULL); /* connects: in progress */
  if (first != ncclInProgress || !settle(comm)) return cudaErrorUnknown;
  ncclResult_t second = ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comm, NULL);
  cudaMemcpy(r, buf, sizeof r, cudaMemcpyDeviceToHost);
  unlink(id.internal + strlen("ntp-emu:"));
  return as_cuda(second == ncclSuccess && r[3] == 4.0f && ncclCommDestroy(comm) == ncclSuccess);
}
static cudaError_t c_nccl_nonblocking_unsettled(void) {
  ncclComm_t comm;
  ncclUniqueId id;
  float *buf;
  if (!nonblocking_comm(&comm, &id)) return cudaErrorUnknown;
  unlink(id.internal + strlen("ntp-emu:"));
  cudaMalloc((void **)&buf, 16);
  return as_cuda(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comm, NULL) == ncclSuccess);
}
/* one thread holding both ranks: destroying one of them alone would wait for the other */
static cudaError_t c_nccl_destroy_ungrouped(void) {
  ncclComm_t comm[2];
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  return as_cuda(ncclCommDestroy(comm[0]) == ncclSuccess);
}
static cudaError_t c_nccl_destroy_grouped(void) {
  ncclComm_t comm[2];
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  ncclGroupStart();
  ncclCommDestroy(comm[0]), ncclCommDestroy(comm[1]);
  return as_cuda(ncclGroupEnd() == ncclSuccess);
}

/* NCCL 2.29's grow: two ranks and a new one on GPU 2 (the coordinator passes the id, the other
 * existing rank NULL, the new rank the id and its number); the three then all-reduce */
extern ncclResult_t ncclCommGetUniqueId(ncclComm_t, ncclUniqueId *);
extern ncclResult_t ncclCommGrow(ncclComm_t, int, const ncclUniqueId *, int, ncclComm_t *, void *);
static ncclUniqueId id;
static bool grow_three(ncclComm_t comm[2], ncclComm_t grown[3], float *buf[3], int new_rank) {
  if (!two_ranks(comm, buf)) return false;
  cudaSetDevice(2), cudaMalloc((void **)&buf[2], 64 * sizeof(float));
  cudaSetDevice(0);
  if (ncclCommGetUniqueId(comm[0], &id) != ncclSuccess) return false;
  ncclGroupStart();
  for (int r = 0; r < 2; r++) cudaSetDevice(r), ncclCommGrow(comm[r], 3, r ? NULL : &id, -1, &grown[r], NULL);
  cudaSetDevice(2), ncclCommGrow(NULL, 3, &id, new_rank, &grown[2], NULL);
  return ncclGroupEnd() == ncclSuccess;
}
static cudaError_t c_nccl_grow(void) {
  ncclComm_t comm[2], grown[3];
  float *buf[3], h[64];
  if (!grow_three(comm, grown, buf, 2)) return cudaErrorUnknown;
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < 64; i++) h[i] = (float)(r + 1);
    cudaSetDevice(r), cudaMemcpy(buf[r], h, sizeof h, cudaMemcpyHostToDevice);
  }
  ncclGroupStart();
  for (int r = 0; r < 3; r++) cudaSetDevice(r), ncclAllReduce(buf[r], buf[r], 64, ncclFloat32, ncclSum, grown[r], NULL);
  if (ncclGroupEnd() != ncclSuccess) return cudaErrorUnknown;
  int n = 0, me = -1;
  ncclCommCount(grown[2], &n), ncclCommUserRank(grown[2], &me);
  cudaSetDevice(2), cudaMemcpy(h, buf[2], sizeof h, cudaMemcpyDeviceToHost);
  return as_cuda(n == 3 && me == 2 && h[0] == 6 && h[63] == 6);
}
/* the new rank numbered inside the parent's range */
static cudaError_t c_nccl_grow_bad_rank(void) {
  ncclComm_t comm[2], grown;
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(0);
  if (ncclCommGetUniqueId(comm[0], &id) != ncclSuccess) return cudaErrorUnknown;
  cudaSetDevice(2);
  return as_cuda(ncclCommGrow(NULL, 3, &id, 1, &grown, NULL) == ncclSuccess);
}
/* a grow's id used a second time */
static cudaError_t c_nccl_grow_id_reused(void) {
  ncclComm_t comm[2], grown[3], again;
  float *buf[3];
  if (!grow_three(comm, grown, buf, 2)) return cudaErrorUnknown;
  cudaSetDevice(3);
  return as_cuda(ncclCommGrow(NULL, 3, &id, 2, &again, NULL) == ncclSuccess); /* the same id again */
}
/* a grow while an all-reduce of the parent is still queued on a stream */
static cudaError_t c_nccl_grow_outstanding(void) {
  setenv("NTP_EMU_STREAMS", "lazy", 1);
  ncclComm_t comm[2], grown;
  float *buf[2];
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  ncclGroupStart();
  for (int r = 0; r < 2; r++) cudaSetDevice(r), ncclAllReduce(buf[r], buf[r], 64, ncclFloat32, ncclSum, comm[r], NULL);
  if (ncclGroupEnd() != ncclSuccess) return cudaErrorUnknown;
  cudaSetDevice(0);
  if (ncclCommGetUniqueId(comm[0], &id) != ncclSuccess) return cudaErrorUnknown;
  return as_cuda(ncclCommGrow(comm[0], 3, &id, -1, &grown, NULL) == ncclSuccess);
}
/* NTP_EMU_REPAIR_GPUS: GPU 1 fails, is repaired when the program inspects it, and works again as a
 * new device: what was made on it before it failed may not be used */
static cudaError_t c_repaired_gpu_old_memory(void) {
  ncclComm_t comm[2];
  float *buf[2], *fresh, h[64] = {0};
  setenv("NTP_EMU_FAIL_GPUS", "1", 1);
  setenv("NTP_EMU_REPAIR_GPUS", "1", 1);
  if (!two_ranks(comm, buf)) return cudaErrorUnknown;
  cudaSetDevice(0);
  ncclCommAbort(comm[0]); /* GPU 1 fails */
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 1) != cudaSuccess || major < 7)
    return cudaErrorUnknown; /* the replacement inspected: repaired */
  cudaSetDevice(1);
  if (cudaMalloc((void **)&fresh, sizeof h) != cudaSuccess || cudaMemcpy(fresh, h, sizeof h, cudaMemcpyHostToDevice))
    return cudaErrorUnknown; /* the new device works */
  return cudaMemcpy(h, buf[1], sizeof h, cudaMemcpyDeviceToHost); /* the old memory: stops the process */
}

static const selftest_case cases[] = {
    {"NCCL: a rank that never joins", c_nccl_missing_rank, "ncclAllReduce on rank 0 of a communicator of 2 ranks would hang"},
    {"NCCL: all-reduce counts that differ", c_nccl_mismatch, "ncclAllReduce mismatch"},
    {"NCCL: a send nobody receives", c_nccl_unmatched_send, "ncclSend on rank 0 of a communicator of 2 ranks would hang"},
    {"NCCL: all-reduce in fp32 in rank order", c_nccl_reduces_in_rank_order, NULL},
    {"NCCL: shrink renumbers the ranks left", c_nccl_shrink, NULL},
    {"NCCL: an excluded rank calls ncclCommShrink", c_nccl_shrink_excluded, "an excluded rank does not call"},
    {"NCCL: the parent after NCCL_SHRINK_ABORT", c_nccl_shrunk_parent, "terminated this communicator"},
    {"NCCL: after a peer's abort, an operation never completes (polled)", c_nccl_peer_aborted, NULL},
    {"NCCL: ... and a blocking wait on it", c_nccl_peer_aborted_sync, "would never return: ncclAllReduce on rank 0: a peer aborted"},
    {"NCCL: a dead peer process: never completes, only polling says so", c_nccl_dead_process_polled, NULL},
    {"NCCL: ... and a blocking wait on it", c_nccl_dead_process, "would never return: ncclAllReduce on rank 0 of a communicator of 2 ranks: the process of rank 1 (pid"},
    {"NCCL: non-blocking: in progress, settled, then used", c_nccl_nonblocking, NULL},
    {"NCCL: non-blocking: used before it settled", c_nccl_nonblocking_unsettled, "has not yet said ncclSuccess"},
    {"NCCL: one of a thread's two ranks destroyed alone", c_nccl_destroy_ungrouped, "1 other rank(s) of the communicator live in this process"},
    {"NCCL: a thread's two ranks destroyed in one group", c_nccl_destroy_grouped, NULL},
    {"a failed GPU's memory read", c_failed_gpu_touched, "cudaMemcpy (source) touches GPU 1, which has failed"},
    {"NCCL: grow by a rank on a new GPU, then all-reduce", c_nccl_grow, NULL},
    {"NCCL: grow with a new rank inside the parent's range", c_nccl_grow_bad_rank, "the new ranks are numbered from the parent's size"},
    {"NCCL: a grow's id used twice", c_nccl_grow_id_reused, "the grow's unique id was used already"},
    {"NCCL: a grow with the parent's all-reduce in flight", c_nccl_grow_outstanding, "the parent has operations outstanding"},
    {"a repaired GPU: memory from before its failure", c_repaired_gpu_old_memory, "before it failed and was replaced"},
    {"NCCL: a destroy that waits for a failed GPU", c_failed_peer_destroy, "ncclCommDestroy on rank 0 would hang"},
    {"NCCL: NCCL_SHRINK_DEFAULT after a failure", c_failed_peer_shrink_default, "after a failure: NCCL_SHRINK_ABORT"},
    {"NCCL: graphs of two GPUs of one process, launched from one thread", c_nccl_graph_per_rank, "may deadlock"},
    {"NCCL: a group across a capture boundary", c_nccl_group_capture_boundary, "spans a capture boundary"},
    {"NCCL: a graph replayed after its communicator was aborted", c_nccl_graph_dead_comm, "destroyed or aborted"},
};

int main(void) { return run_cases(cases, (int)(sizeof cases / sizeof cases[0])); }
