/* emu_nccl.c — the subset of libnccl the backend calls, over emulated GPUs, in one process
 * (ncclCommInitAll) or across processes (ncclGetUniqueId + ncclCommInitRank: the id names a
 * shared-memory file that every rank maps).
 *
 * Every call posts an operation on a board in that memory. Communicator calls (init, split,
 * shrink) post at the outermost ncclGroupEnd and complete there; all-reduces, sends and receives
 * are stream work (emu_streams.c): a group's calls on one stream are one node, started at the call
 * (or at each launch of a graph that captured it), posted when the node reaches the head of its
 * stream, done when matched. An operation completes when all its participants have posted a
 * matching one: an all-reduce of every rank of the communicator (summed in fp32 in rank
 * order and rounded once, as the loopback collectives do), a send with the receive that
 * names it, a split of every rank of the parent. A mismatch (counts, types, a rank that
 * never joins) would hang a real job; here it is an error: at once when every rank of the
 * communicator lives in this process, after NTP_EMU_NCCL_TIMEOUT seconds (default 300)
 * otherwise.
 *
 * After a failure (NCCL's fault-tolerance calls, as nccl.h and the user guide describe them):
 * - ncclCommAbort frees a communicator without waiting for its peers, and marks its clique
 *   aborted: a peer's operation on it never completes (below).
 * - ncclCommShrink(comm, exclude, n, &newcomm, config, flags) is called by every rank that is not
 *   excluded (an excluded rank does not call it; several ranks of one thread in a group, as for
 *   ncclCommSplit) and gives them a communicator without the excluded ranks, renumbered in their
 *   order; config NULL inherits the parent's. NCCL_SHRINK_DEFAULT is for a healthy parent: here
 *   one whose clique nobody aborted and with no member on a failed GPU. NCCL_SHRINK_ABORT first
 *   terminates the parent's operations: the parent is then only to be freed (abort or destroy).
 * - ncclCommDestroy waits for its operations and its peers: destroying a communicator with a
 *   member on a failed GPU (NTP_EMU_FAIL_GPUS, emu.h), or one of several ranks of this process
 *   outside a group (the guide: one thread frees them in one group), would hang, and stops the
 *   process here (emu_fatal). Destroys and aborts in a group run at its ncclGroupEnd.
 * The first ncclCommAbort or ncclCommShrink is when the GPUs of NTP_EMU_FAIL_GPUS fail.
 *
 * Faults as NCCL delivers them ("Asynchronous errors", "Fault tolerance"): an operation whose
 * peer process died (every member records its process id in the fabric; gone: no /proc entry, or
 * a zombie) or whose peer aborted the communicator never completes, and no call fails. Only
 * ncclCommGetAsyncError of its communicator says ncclRemoteError (sticky); cudaStreamQuery says
 * not ready; a blocking wait on it stops the process (emu_streams.c: on a GPU it never returns);
 * ncclCommAbort ends it. Non-blocking communicators (ncclConfig_t.blocking = 0) return
 * ncclInProgress from their creation and their first collective or point-to-point call, and are
 * not to be used again until ncclCommGetAsyncError said ncclSuccess. NTP_EMU_NCCL_KILL=K and
 * NTP_EMU_NCCL_STOP=K lose the process inside its K-th operation on a split communicator. The
 * fabric's lock is a robust mutex, so a process killed while holding it does not stop the others. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include "emu.h"
#include "emu_nccl.h"

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclInvalidArgument: return "invalid argument (emulated NCCL: see the message above)";
  case ncclInvalidUsage: return "invalid usage (emulated NCCL: see the message above)";
  case ncclSystemError: return "system error (emulated NCCL)";
  case ncclRemoteError: return "remote process exited or there was a network error (emulated NCCL: see the message above)";
  default: return "internal error (emulated NCCL)";
  }
}
const char *ncclGetLastError(ncclComm_t c) {
  (void)c;
  return emu_last_message();
}
ncclResult_t ncclGetVersion(int *v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}


/* ---- groups: operations queue until the outermost ncclGroupEnd ---------------------------------- */


static __thread int depth;
static __thread pending *queue;
static __thread int nqueue, capqueue;
static __thread uint64_t group_epoch; /* emu_capture_epoch() at the outermost ncclGroupStart */
static __thread bool went_async;      /* the group's calls left a non-blocking communicator in progress */

static bool stream_op(int kind) { return kind == OP_ALLREDUCE || kind == OP_SEND || kind == OP_RECV; }

static ncclResult_t enqueue(pending p) {
  if (nqueue == capqueue) {
    capqueue = capqueue ? 2 * capqueue : 64;
    pending *q = realloc(queue, (size_t)capqueue * sizeof *q);
    if (!q) return ncclSystemError;
    queue = q;
  }
  queue[nqueue++] = p;
  return ncclSuccess;
}


static ncclResult_t flush_streams(void);

/* The group's communicator calls (init, split, shrink) complete here, on the host; its
 * collectives and point-to-point calls become stream work (flush_streams). */
static void finalize_queued(void);
static ncclResult_t flush_host(void);
static ncclResult_t flush(void) {
  went_async = false;
  finalize_queued();
  ncclResult_t rc = flush_host();
  return rc == ncclSuccess && went_async ? ncclInProgress : rc;
}
static ncclResult_t flush_host(void) {
  ncclResult_t rc = flush_streams();
  if (rc == ncclSuccess && nqueue) rc = fab_host_calls(queue, nqueue, &went_async);
  nqueue = 0;
  return rc;
}

/* ---- collectives and point-to-point calls: stream work (emu_streams.c) ----------------------------
 * The calls of a group on one stream are one node: started at the call (or each graph launch: its
 * place in each communicator, the sequence numbers peers match by), posted to the board when the
 * node reaches the head of its stream (the send data read then, after what the stream waited for),
 * done when the board matched every call, the results written then. */

typedef struct comm_work {
  size_t bytes;
  fabric *fab;
  double limit; /* when a wait for a peer in another process times out */
  bool stuck;   /* a peer died or aborted: it never completes (why says which) */
  char why[256];
  int n;
  pending ops[];
} comm_work;

static __thread ncclResult_t start_rc; /* why the last start failed */
static bool comm_live(ncclComm_t c, const char *call);

static int cw_start(void *ctx) {
  comm_work *w = ctx;
  for (int i = 0; i < w->n; i++) {
    pending *p = &w->ops[i];
    p->slot = -1;
    if (!fab_comm_alive(p->comm)) {
      emu_fail("%s: a graph replays a call on a communicator that was destroyed or aborted (the graphs that hold a "
               "communicator are to be dropped with it)", OP_NAME[p->kind]);
      start_rc = ncclInvalidUsage;
      return -1;
    }
    if (!comm_live(p->comm, OP_NAME[p->kind])) {
      start_rc = ncclInvalidArgument;
      return -1;
    }
    ncclComm_t c = p->comm;
    p->seq = p->kind == OP_SEND ? c->send_seq[p->peer]++ : p->kind == OP_RECV ? c->recv_seq[p->peer]++ : c->coll_seq++;
  }
  return 0;
}

/* our board slots back (the lock is held) */
static void cw_unpost(comm_work *w) {
  for (int i = 0; i < w->n; i++)
    if (w->ops[i].slot >= 0 && w->ops[i].slot < MAX_OPS) {
      w->fab->ops[w->ops[i].slot].state = FREE;
      w->ops[i].slot = -1;
    }
}

/* NTP_EMU_NCCL_KILL=K (or NTP_EMU_NCCL_STOP=K): the process is killed (stopped) when its stream
 * reaches its K-th operation on a group's communicator (one made by ncclCommSplit), before it
 * posts it: its peers' matching operations wait for a process that is gone (or silent). */
static void lose_this_process(const comm_work *w) {
  static int seen;
  bool split = false;
  for (int i = 0; i < w->n; i++) split |= w->ops[i].comm->split_child;
  const char *kill_at = getenv("NTP_EMU_NCCL_KILL"), *stop_at = getenv("NTP_EMU_NCCL_STOP");
  if (!split || (!kill_at && !stop_at)) return;
  seen++;
  int sig = kill_at && atoi(kill_at) == seen ? SIGKILL : stop_at && atoi(stop_at) == seen ? SIGSTOP : 0;
  if (!sig) return;
  fprintf(stderr, "ntp-emu: NTP_EMU_NCCL_%s=%d: process %ld %s inside %s on rank %d of a group's communicator\n",
          sig == SIGKILL ? "KILL" : "STOP", seen, (long)getpid(), sig == SIGKILL ? "killed" : "stopped",
          OP_NAME[w->ops[0].kind], w->ops[0].comm->rank);
  fflush(NULL);
  raise(sig);
}

static int cw_post(void *ctx) {
  comm_work *w = ctx;
  fabric *f = w->fab;
  lose_this_process(w);
  fab_lock(f);
  for (int i = 0; i < w->n; i++)
    if ((w->ops[i].slot = fab_post(f, &w->ops[i])) < 0) goto failed;
  if (fab_complete(f) != 0) goto failed;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  w->limit = fab_now() + (getenv("NTP_EMU_NCCL_TIMEOUT") ? atof(getenv("NTP_EMU_NCCL_TIMEOUT")) : 300.0);
  return 0;
failed:
  cw_unpost(w);
  pthread_mutex_unlock(&f->mu);
  return -1;
}

static int cw_poll(void *ctx) {
  comm_work *w = ctx;
  fabric *f = w->fab;
  fab_lock(f);
  if (fab_complete(f) != 0) goto failed;
  bool all = true;
  for (int i = 0; i < w->n; i++) {
    pending *p = &w->ops[i];
    if (f->ops[p->slot].state == DONE) continue;
    all = false;
    if (!w->stuck && fab_stuck(f, p->comm->uid, p->comm->rank, p->comm->nranks, p->kind, p->peer, w->why, sizeof w->why)) {
      /* NCCL: it never completes, and no call fails; ncclCommGetAsyncError of its communicator says so */
      w->stuck = true;
      p->comm->async = ncclRemoteError;
      fab_drop_dead(f);
    }
    if (!w->stuck && !p->comm->all_local && fab_now() > w->limit) { /* a real job would wait for ever */
      pthread_mutex_unlock(&f->mu);
      emu_fatal("%s on rank %d of a communicator of %d ranks has waited NTP_EMU_NCCL_TIMEOUT seconds: %s; on a GPU "
                "it would never complete, and nothing reports an error", OP_NAME[p->kind], p->comm->rank,
                p->comm->nranks, p->kind == OP_SEND || p->kind == OP_RECV ? "no matching call of the peer"
                                                                          : "not every rank of the communicator makes this call");
    }
  }
  if (!all) {
    pthread_mutex_unlock(&f->mu);
    return 0;
  }
  for (int i = 0; i < w->n; i++) { /* results back to this process's buffers */
    pending *p = &w->ops[i];
    if (p->kind == OP_ALLREDUCE || p->kind == OP_RECV)
      memcpy(p->recv, fab_heap(f) + f->ops[p->slot].result, p->count * fab_esize(p->dtype));
  }
  cw_unpost(w);
  bool idle = true;
  for (int k = 0; k < MAX_OPS && idle; k++) idle = f->ops[k].state == FREE;
  if (idle) f->heap_used = 0;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return 1;
failed:
  cw_unpost(w);
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return -1;
}

static bool cw_local(void *ctx) {
  comm_work *w = ctx;
  for (int i = 0; i < w->n; i++)
    if (!w->ops[i].comm->all_local) return false;
  return true;
}
static void cw_hang(void *ctx) {
  comm_work *w = ctx;
  fab_lock(w->fab);
  for (int i = 0; i < w->n; i++) {
    pending *p = &w->ops[i];
    if (p->slot >= 0 && w->fab->ops[p->slot].state == DONE) continue;
    emu_fail("%s on rank %d of a communicator of %d ranks would hang: %s (every rank is in this process and has made "
             "its calls)", OP_NAME[p->kind], p->comm->rank, p->comm->nranks,
             p->kind == OP_SEND || p->kind == OP_RECV ? "no matching call of the peer"
                                                      : "not every rank of the communicator makes this call");
    break;
  }
  pthread_mutex_unlock(&w->fab->mu);
}
static void cw_idle(void *ctx) {
  comm_work *w = ctx;
  fab_lock(w->fab);
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_nsec += 50000000;
  if (t.tv_nsec >= 1000000000) t.tv_sec++, t.tv_nsec -= 1000000000;
  fab_wait(w->fab, &t);
  pthread_mutex_unlock(&w->fab->mu);
}
static bool cw_uses(void *ctx, const void *comm) {
  comm_work *w = ctx;
  for (int i = 0; i < w->n; i++)
    if (w->ops[i].comm == comm) return true;
  return false;
}
static void cw_copied(void *ctx) {
  comm_work *w = ctx;
  for (int i = 0; i < w->n; i++) w->ops[i].slot = -1;
}
static void cw_release(void *ctx) { /* freed while posted (cancelled by an abort): the board slots back */
  comm_work *w = ctx;
  bool posted = false;
  for (int i = 0; i < w->n; i++) posted |= w->ops[i].slot >= 0;
  if (!posted) return;
  fab_lock(w->fab);
  cw_unpost(w);
  pthread_cond_broadcast(&w->fab->cv);
  pthread_mutex_unlock(&w->fab->mu);
}
static bool cw_stuck(void *ctx, char *why, size_t cap) {
  comm_work *w = ctx;
  if (w->stuck) snprintf(why, cap, "%s", w->why);
  return w->stuck;
}
static bool cw_shared(void *ctx) {
  comm_work *w = ctx;
  for (int i = 0; i < w->n; i++)
    if (fab_local_ranks(w->ops[i].comm) > 1) return true;
  return false;
}
static const emu_comm_ops comm_work_ops = {cw_start, cw_post, cw_poll, cw_local, cw_hang, cw_idle, cw_uses, cw_copied,
                                           cw_release, cw_stuck, cw_shared};

/* The queue's stream calls, one node per stream, out of the queue. Real NCCL refuses a group whose
 * calls straddle the beginning or end of a capture, or mix captured and direct streams. */
static ncclResult_t flush_streams(void) {
  int nstream = 0, ncap = 0;
  for (int i = 0; i < nqueue; i++)
    if (stream_op(queue[i].kind)) nstream++, ncap += emu_capturing(queue[i].stream);
  if (!nstream) return ncclSuccess;
  if (ncap && (ncap != nstream || group_epoch != emu_capture_epoch())) {
    emu_fail("a NCCL group spans a capture boundary: %s", ncap != nstream ? "some of its calls are on capturing streams, "
             "some not" : "a capture began or ended between ncclGroupStart and ncclGroupEnd");
    return ncclInvalidUsage;
  }
  ncclComm_t connecting[64];
  int nconnecting = 0;
  for (int i = 0; i < nqueue; i++) { /* a non-blocking communicator's first call: NCCL connects its peers */
    ncclComm_t c = queue[i].comm;
    if (!stream_op(queue[i].kind) || !c->nonblocking || c->connected) continue;
    c->connected = true;
    if (nconnecting < 64) connecting[nconnecting++] = c;
  }
  for (int i = 0; i < nqueue; i++) {
    if (!stream_op(queue[i].kind)) continue;
    const void *stream = queue[i].stream;
    int n = 0;
    for (int j = i; j < nqueue; j++) n += stream_op(queue[j].kind) && queue[j].stream == stream;
    size_t bytes = sizeof(comm_work) + (size_t)n * sizeof(pending);
    comm_work *w = malloc(bytes);
    if (!w) return ncclSystemError;
    *w = (comm_work){.bytes = bytes, .fab = queue[i].comm->fab, .n = 0};
    int device = queue[i].comm->device;
    for (int j = i; j < nqueue; j++)
      if (stream_op(queue[j].kind) && queue[j].stream == stream) {
        if (queue[j].comm->fab != w->fab) {
          emu_fail("a NCCL group mixes communicators of different worlds on one stream (not emulated)");
          free(w);
          return ncclInvalidUsage;
        }
        w->ops[w->n++] = queue[j];
        queue[j].kind = -1; /* taken */
      }
    start_rc = ncclInvalidUsage;
    int cur = emu_current_device();
    emu_use_device(device);
    int rc = emu_enqueue_comm(stream, &comm_work_ops, w);
    emu_use_device(cur);
    if (rc != 0) return start_rc;
  }
  for (int i = 0; i < nconnecting; i++) connecting[i]->in_progress = true, went_async = true;
  int k = 0; /* what is left: the host's calls */
  for (int i = 0; i < nqueue; i++)
    if (queue[i].kind >= 0) queue[k++] = queue[i];
  nqueue = k;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  if (depth++ == 0) group_epoch = emu_capture_epoch();
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  if (depth == 0) {
    emu_fail("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  return --depth == 0 ? flush() : ncclSuccess;
}
static ncclResult_t submit(pending p) {
  p.slot = -1;
  ncclResult_t r = enqueue(p);
  if (r != ncclSuccess || depth) return r;
  group_epoch = emu_capture_epoch(); /* a call of its own is a group of one */
  return flush();
}

/* a communicator, on a GPU that has not failed */
static bool comm_ok(ncclComm_t c, const char *call) {
  if (!c || c->magic != COMM_MAGIC) {
    emu_fail("%s: not a communicator (destroyed or aborted, or never created)", call);
    return false;
  }
  return emu_object_ok(c->device, c->gen, call);
}
/* ... that can still communicate: not the parent of an NCCL_SHRINK_ABORT shrink */
static bool comm_live(ncclComm_t c, const char *call) {
  if (!comm_ok(c, call)) return false;
  if (c->in_progress) {
    emu_fail("%s on rank %d: the non-blocking communicator's last call returned ncclInProgress and "
             "ncclCommGetAsyncError has not yet said ncclSuccess (NCCL: wait for it before the next call)", call, c->rank);
    return false;
  }
  if (!c->shrunk_abort) return true;
  emu_fail("%s on rank %d: ncclCommShrink(NCCL_SHRINK_ABORT) terminated this communicator; it is only to be freed "
           "(ncclCommAbort or ncclCommDestroy)", call, c->rank);
  return false;
}
bool emu_nccl_comm_live(ncclComm_t c, const char *call) { return comm_live(c, call); }
bool emu_nccl_comm_idle(ncclComm_t c) {
  for (int i = 0; i < nqueue; i++)
    if (queue[i].comm == c && queue[i].kind != OP_INIT) return false; /* a call of this group */
  return !emu_streams_comm_busy(c);
}
static bool buffer_ok(ncclComm_t c, const void *p, size_t bytes, const char *call) {
  emu_alloc *a = emu_find(p, bytes);
  if (!a) emu_fail("%s on rank %d: %zu bytes at %p are not inside one device allocation", call, c->rank, bytes, p);
  else if (a->device != c->device)
    emu_fail("%s on rank %d (GPU %d): the buffer is memory of GPU %d", call, c->rank, c->device, a->device);
  return a && a->device == c->device;
}
static bool type_ok(int dt, const char *call) {
  if (dt == ncclFloat32 || dt == ncclFloat16 || dt == ncclBfloat16 || dt == ncclInt32) return true;
  emu_fail("%s: data type %d is not emulated", call, dt);
  return false;
}

/* ---- communicators ------------------------------------------------------------------------------ */

/* a config's blocking: NULL inherits the parent's (-1); a field left undefined is NCCL's default, blocking */
static int config_blocking(const ncclConfig_t *config) { return !config ? -1 : config->blocking == 0 ? 0 : 1; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static unsigned counter;
  char path[100];
  const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(path, sizeof path, "%s/ntp-emu-nccl-%ld-%u", dir, (long)getpid(), counter++);
  unlink(path);
  fabric *f = fabric_map(path, true);
  if (!f) {
    emu_fail("ncclGetUniqueId: cannot create %s: %s", path, strerror(errno));
    return ncclSystemError;
  }
  munmap(f, fabric_bytes());
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "ntp-emu:%s", path);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return emu_nccl_join(comm, nranks, id, rank, "ncclCommInitRank");
}

/* the fabric of a unique id, mapped once in this process: the ranks of one world that a thread
 * joins in a group (a grow's existing and new ranks) share one mapping, as one world */
static fabric *map_once(const char *path) {
  static struct {
    char path[256];
    fabric *f;
  } maps[64];
  static int n;
  for (int i = 0; i < n; i++)
    if (!strcmp(maps[i].path, path)) return maps[i].f;
  fabric *f = fabric_map(path, false);
  if (f && n < 64) snprintf(maps[n].path, sizeof maps[n].path, "%s", path), maps[n++].f = f;
  return f;
}

ncclResult_t emu_nccl_join(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, const char *call) {
  *comm = NULL;
  if (strncmp(id.internal, "ntp-emu:", 8) != 0) {
    emu_fail("%s: not a unique id of the emulated NCCL", call);
    return ncclInvalidArgument;
  }
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) {
    emu_fail("%s: rank %d of %d ranks (at most %d emulated)", call, rank, nranks, MAX_RANKS);
    return ncclInvalidArgument;
  }
  char path[256];
  snprintf(path, sizeof path, "%.*s", (int)(sizeof id.internal - 8), id.internal + 8);
  fabric *f = map_once(path);
  if (!f) {
    emu_fail("%s: cannot map %s: %s", call, path, strerror(errno));
    return ncclSystemError;
  }
  if (!emu_device_ok(emu_current_device(), call)) return ncclInvalidUsage;
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  *c = (struct ncclComm){.magic = COMM_MAGIC, .fab = f, .uid = fab_mix(0x4e54504e43434cull, 1), .rank = rank, .nranks = nranks,
                         .device = emu_current_device(), .gen = emu_device_gen(emu_current_device()),
                         .all_local = nranks == 1};
  __atomic_add_fetch(&f->refs, 1, __ATOMIC_SEQ_CST);
  ncclResult_t r = submit((pending){.comm = c, .kind = OP_INIT}); /* everyone joins before anyone proceeds */
  if (r != ncclSuccess) {
    free(c);
    return r;
  }
  fab_live_add(c);
  *comm = c;
  return ncclSuccess;
}

/* ncclCommInitRank with a config: blocking = 0 makes a non-blocking communicator, whose calls may
 * return ncclInProgress (this one does; the first collective or point-to-point call does too), and
 * which is not to be used until ncclCommGetAsyncError says ncclSuccess. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
  ncclResult_t r = ncclCommInitRank(comm, nranks, id, rank);
  if (r != ncclSuccess || config_blocking(config) != 0) return r;
  (*comm)->nonblocking = (*comm)->in_progress = true;
  return ncclInProgress;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devlist) {
  if (n < 1 || n > MAX_RANKS) return ncclInvalidArgument;
  fabric *f = mmap(NULL, fabric_bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (f == MAP_FAILED) return ncclSystemError;
  fabric_init(f);
  static uint64_t worlds;
  uint64_t uid = fab_mix(0x494e4954414c4cull, ++worlds);
  for (int i = 0; i < n; i++) {
    int dev = devlist ? devlist[i] : i;
    if (dev < 0 || dev >= emu_device_count()) {
      emu_fail("ncclCommInitAll: GPU %d does not exist (%d emulated)", dev, emu_device_count());
      return ncclInvalidArgument;
    }
    if (!emu_device_ok(dev, "ncclCommInitAll")) return ncclInvalidUsage;
    comms[i] = calloc(1, sizeof(struct ncclComm));
    if (!comms[i]) return ncclSystemError;
    *comms[i] = (struct ncclComm){.magic = COMM_MAGIC, .fab = f, .uid = uid, .rank = i, .nranks = n, .device = dev,
                                  .gen = emu_device_gen(dev), .all_local = true};
    f->refs++;
    fab_live_add(comms[i]);
  }
  return ncclSuccess;
}


ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  if (!comm_live(comm, "ncclCommSplit")) return ncclInvalidArgument;
  return submit((pending){.comm = comm, .kind = OP_SPLIT, .color = color < 0 ? -1 : color, .key = key, .newcomm = newcomm,
                          .blocking = config_blocking(config)});
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int *exclude, int nexclude, ncclComm_t *newcomm, ncclConfig_t *config,
                            int flags) {
  emu_gpus_fail();
  if (!comm_live(comm, "ncclCommShrink")) return ncclInvalidArgument;
  if (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT) {
    emu_fail("ncclCommShrink: flags %d (NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT)", flags);
    return ncclInvalidArgument;
  }
  if (nexclude < 0 || nexclude >= comm->nranks || (nexclude && !exclude)) {
    emu_fail("ncclCommShrink: %d ranks excluded from a communicator of %d", nexclude, comm->nranks);
    return ncclInvalidArgument;
  }
  uint64_t mask = 0;
  for (int i = 0; i < nexclude; i++) {
    if (exclude[i] < 0 || exclude[i] >= comm->nranks || (mask >> exclude[i] & 1)) {
      emu_fail("ncclCommShrink: excluded rank %d is not a rank of the communicator of %d, or named twice", exclude[i],
               comm->nranks);
      return ncclInvalidArgument;
    }
    mask |= 1ull << exclude[i];
  }
  if (mask >> comm->rank & 1) {
    emu_fail("ncclCommShrink on rank %d, which it excludes (an excluded rank does not call ncclCommShrink)", comm->rank);
    return ncclInvalidUsage;
  }
  int dev = -1, bad = fab_member_on_failed_gpu(comm, &dev);
  fab_lock(comm->fab);
  bool aborted = fab_aborted(comm->fab, comm->uid);
  pthread_mutex_unlock(&comm->fab->mu);
  if (flags == NCCL_SHRINK_DEFAULT && (bad >= 0 || aborted)) {
    if (aborted) emu_fail("ncclCommShrink(NCCL_SHRINK_DEFAULT) on rank %d: a peer aborted the parent (after a failure: "
                          "NCCL_SHRINK_ABORT)", comm->rank);
    else emu_fail("ncclCommShrink(NCCL_SHRINK_DEFAULT) on rank %d: rank %d of the parent is on GPU %d, which has failed "
                  "(after a failure: NCCL_SHRINK_ABORT)", comm->rank, bad, dev);
    return ncclInvalidUsage;
  }
  if (flags == NCCL_SHRINK_ABORT) { /* the parent's operations end now, in every process */
    fab_lock(comm->fab);
    if (!fab_aborted(comm->fab, comm->uid) && comm->fab->naborted < MAX_ABORTED)
      comm->fab->aborted[comm->fab->naborted++] = comm->uid;
    pthread_cond_broadcast(&comm->fab->cv);
    pthread_mutex_unlock(&comm->fab->mu);
  }
  return submit((pending){.comm = comm, .kind = OP_SHRINK, .exclude = mask, .flags = flags, .newcomm = newcomm,
                          .blocking = config_blocking(config)});
}

static void comm_free(ncclComm_t comm) {
  fabric *f = comm->fab;
  fab_live_remove(comm);
  comm->magic = 0;
  free(comm);
  if (__atomic_sub_fetch(&f->refs, 1, __ATOMIC_SEQ_CST) == 0 && f->path[0]) unlink(f->path);
}
/* Frees a communicator: a destroy waits for its operations (a blocking wait: one that can never
 * complete stops the process, emu_streams.c) and for its peers; an abort does not, and ends its
 * operations in every process: a peer's operation on it never completes, and its
 * ncclCommGetAsyncError says ncclRemoteError. */
static void destroy_failed_peer(ncclComm_t comm) {
  int dev = -1, r = fab_member_on_failed_gpu(comm, &dev);
  if (r >= 0) /* a hang on a real machine */
    emu_fatal("ncclCommDestroy on rank %d would hang: rank %d of the communicator is on GPU %d, which has failed "
              "(ncclCommAbort frees a communicator without waiting for its peers)", comm->rank, r, dev);
}
static void finalize(ncclComm_t comm, bool abort) {
  if (abort) {
    fabric *f = comm->fab;
    fab_lock(f);
    if (!fab_aborted(f, comm->uid) && f->naborted < MAX_ABORTED) f->aborted[f->naborted++] = comm->uid;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
  } else {
    destroy_failed_peer(comm);
    emu_sync_all(); /* its operations complete first */
  }
  emu_streams_cancel_comm(comm); /* an abort's queued operations never complete */
  comm_free(comm);
}

/* A group's destroys and aborts, at its end (NCCL's guide, "Destroying a communicator": one thread
 * that manages several ranks of a communicator frees them in one group; freeing them one by one,
 * the first waits for the others). Aborts first: they end what a destroy would wait for. */
static void finalize_queued(void) {
  for (int i = 0; i < nqueue; i++) {
    if (queue[i].kind != OP_DESTROY) continue;
    ncclComm_t c = queue[i].comm;
    destroy_failed_peer(c);
    int in_group = 0, here = fab_local_ranks(c);
    for (int j = 0; j < nqueue; j++)
      in_group += (queue[j].kind == OP_DESTROY || queue[j].kind == OP_ABORT) && queue[j].comm->fab == c->fab &&
                  queue[j].comm->uid == c->uid;
    if (in_group < here)
      emu_fatal("ncclCommDestroy on rank %d would hang: the group frees %d of the %d ranks of the communicator that "
                "live in this process; the others never reach the destroy (free them in the same group)", c->rank,
                in_group, here);
  }
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < nqueue; i++)
      if (queue[i].kind == (pass ? OP_DESTROY : OP_ABORT)) {
        finalize(queue[i].comm, !pass);
        queue[i].kind = -1;
      }
  int k = 0;
  for (int i = 0; i < nqueue; i++)
    if (queue[i].kind >= 0) queue[k++] = queue[i];
  nqueue = k;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm_ok(comm, "ncclCommDestroy")) return ncclInvalidArgument;
  if (depth) return enqueue((pending){.comm = comm, .kind = OP_DESTROY, .slot = -1});
  destroy_failed_peer(comm);
  int here = fab_local_ranks(comm);
  if (here > 1) /* the guide: with several ranks in one thread, in a group; else the first waits for the others */
    emu_fatal("ncclCommDestroy on rank %d would hang: %d other rank(s) of the communicator live in this process and "
              "have not reached their destroy (one thread frees them in one group: ncclGroupStart/ncclGroupEnd)",
              comm->rank, here - 1);
  finalize(comm, false);
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  emu_gpus_fail();
  if (!comm_ok(comm, "ncclCommAbort")) return ncclInvalidArgument;
  if (depth) return enqueue((pending){.comm = comm, .kind = OP_ABORT, .slot = -1});
  finalize(comm, true);
  return ncclSuccess;
}
/* What NCCL's proxy would have seen: ncclInProgress once after a non-blocking call returned it;
 * ncclRemoteError (sticky) once an operation of this communicator posted in this process waits for a
 * peer that died or aborted; else ncclSuccess. A communicator with a dead peer and nothing in
 * flight reports nothing. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async) {
  if (!comm_ok(comm, "ncclCommGetAsyncError")) return ncclInvalidArgument;
  if (comm->in_progress) {
    comm->in_progress = false;
    *async = ncclInProgress;
    return ncclSuccess;
  }
  fabric *f = comm->fab;
  char why[256];
  fab_lock(f);
  fab_complete(f);
  for (int s = 0; s < MAX_OPS && comm->async == ncclSuccess; s++) {
    board_op *x = &f->ops[s];
    if (x->state == POSTED && x->pid == getpid() && x->comm == comm->uid && x->rank == comm->rank &&
        fab_stuck(f, comm->uid, comm->rank, comm->nranks, x->kind, x->peer, why, sizeof why)) {
      comm->async = ncclRemoteError;
      emu_fail("%s", why);
    }
  }
  pthread_mutex_unlock(&f->mu);
  *async = comm->async;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm_ok(comm, "ncclCommCount")) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm_ok(comm, "ncclCommUserRank")) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

/* ---- communication -------------------------------------------------------------------------------- */

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (!emu_stream_ok(stream, "ncclAllReduce")) return ncclInvalidArgument;
  if (!comm_live(comm, "ncclAllReduce") || !type_ok(dt, "ncclAllReduce")) return ncclInvalidArgument;
  if (op != ncclSum) {
    emu_fail("ncclAllReduce: reduction %d is not emulated (only ncclSum)", (int)op);
    return ncclInvalidArgument;
  }
  size_t bytes = count * fab_esize(dt);
  if (!buffer_ok(comm, send, bytes, "ncclAllReduce (send)") || !buffer_ok(comm, recv, bytes, "ncclAllReduce (receive)"))
    return ncclInvalidArgument;
  return submit((pending){.comm = comm, .stream = stream, .kind = OP_ALLREDUCE, .send = send, .recv = recv, .count = count, .dtype = dt,
                          .redop = op});
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (!emu_stream_ok(stream, "ncclSend")) return ncclInvalidArgument;
  if (!comm_live(comm, "ncclSend") || !type_ok(dt, "ncclSend")) return ncclInvalidArgument;
  if (peer < 0 || peer >= comm->nranks) {
    emu_fail("ncclSend: peer %d of a communicator of %d ranks", peer, comm->nranks);
    return ncclInvalidArgument;
  }
  if (!buffer_ok(comm, buf, count * fab_esize(dt), "ncclSend")) return ncclInvalidArgument;
  return submit((pending){.comm = comm, .stream = stream, .kind = OP_SEND, .send = buf, .count = count, .dtype = dt, .peer = peer});
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (!emu_stream_ok(stream, "ncclRecv")) return ncclInvalidArgument;
  if (!comm_live(comm, "ncclRecv") || !type_ok(dt, "ncclRecv")) return ncclInvalidArgument;
  if (peer < 0 || peer >= comm->nranks) {
    emu_fail("ncclRecv: peer %d of a communicator of %d ranks", peer, comm->nranks);
    return ncclInvalidArgument;
  }
  if (!buffer_ok(comm, buf, count * fab_esize(dt), "ncclRecv")) return ncclInvalidArgument;
  return submit((pending){.comm = comm, .stream = stream, .kind = OP_RECV, .recv = buf, .count = count, .dtype = dt, .peer = peer});
}
