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
 *   aborted: a peer's later operation on it fails (ncclRemoteError) instead of hanging.
 * - ncclCommShrink(comm, exclude, n, &newcomm, config, flags) is called by every rank that is not
 *   excluded (an excluded rank does not call it; several ranks of one thread in a group, as for
 *   ncclCommSplit) and gives them a communicator without the excluded ranks, renumbered in their
 *   order; config NULL inherits the parent's. NCCL_SHRINK_DEFAULT is for a healthy parent: here
 *   one whose clique nobody aborted and with no member on a failed GPU. NCCL_SHRINK_ABORT first
 *   terminates the parent's operations: the parent is then only to be freed (abort or destroy).
 * - ncclCommDestroy waits for its peers: destroying a communicator with a member on a failed GPU
 *   (NTP_EMU_FAIL_GPUS, emu.h) would hang, and stops the process here (emu_fatal).
 * The first ncclCommAbort or ncclCommShrink is when the GPUs of NTP_EMU_FAIL_GPUS fail.
 *
 * A peer process that dies (killed, or exited without its calls): every communicator's member
 * records its process id in the fabric when it is created, and an operation waiting for a member
 * whose process is gone (no /proc entry, or a zombie) fails with ncclRemoteError, as NCCL reports
 * a peer lost after its timeout; ncclCommGetAsyncError then says ncclRemoteError too. The dead
 * process's posted operations are taken off the board. The fabric's lock is a robust mutex, so a
 * process killed while holding it does not stop the others. NCCL_SHRINK_ABORT terminates the
 * parent's operations in every process (a peer waiting on it gets ncclRemoteError and can join
 * the shrink), and the shrink matches its participants whatever calls each made on the parent
 * before (a rank that failed out of an operation its peers never reached). */
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

enum { MAX_OPS = 4096, MAX_RANKS = 64, HEAP_BYTES = 1 << 30 };
enum { FREE, POSTED, DONE };
enum { OP_INIT, OP_ALLREDUCE, OP_SEND, OP_RECV, OP_SPLIT, OP_SHRINK };
static const char *const OP_NAME[] = {"ncclCommInitRank", "ncclAllReduce", "ncclSend", "ncclRecv", "ncclCommSplit",
                                      "ncclCommShrink"};
enum { MAX_ABORTED = 256, MAX_MEMBERS = 2048 };

typedef struct board_op {
  int state, kind;
  uint64_t comm, seq;
  int rank, nranks, peer;
  size_t count;
  int dtype, redop;
  uint64_t data, result; /* heap offsets */
  int color, key;
  uint64_t exclude;       /* shrink: the excluded ranks, a bit each */
  int new_rank, new_size; /* split and shrink results */
  uint64_t new_comm;
  int pid; /* the posting process */
} board_op;

typedef struct member { /* rank `rank` of communicator `uid` lives in process `pid` */
  uint64_t uid;
  int rank, pid;
} member;

typedef struct fabric {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;
  uint64_t heap_used;
  board_op ops[MAX_OPS];
  uint64_t aborted[MAX_ABORTED]; /* communicators (uids) a member aborted */
  int naborted;
  member members[MAX_MEMBERS];
  int nmembers;
  char path[256];
} fabric;

struct ncclComm {
  int magic;
  fabric *fab;
  uint64_t uid;
  int rank, nranks, device;
  bool all_local; /* every rank in this process: a wait that cannot complete is a hang */
  bool shrunk_abort; /* the parent of an NCCL_SHRINK_ABORT shrink: only to be freed now */
  uint64_t coll_seq;
  uint64_t send_seq[MAX_RANKS], recv_seq[MAX_RANKS];
  struct ncclComm *next; /* the communicators alive in this process */
};
enum { COMM_MAGIC = 0x4e43434c };

static unsigned char *heap(fabric *f) { return (unsigned char *)f + ((sizeof *f + 4095) & ~(size_t)4095); }
static size_t fabric_bytes(void) { return ((sizeof(fabric) + 4095) & ~(size_t)4095) + HEAP_BYTES; }

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

static void fabric_init(fabric *f) {
  pthread_mutexattr_t ma;
  pthread_condattr_t ca;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  pthread_condattr_init(&ca);
  pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&f->mu, &ma);
  pthread_cond_init(&f->cv, &ca);
}

static fabric *fabric_map(const char *path, bool create) {
  int fd = open(path, O_RDWR | (create ? O_CREAT | O_EXCL : 0), 0600);
  if (fd < 0) return NULL;
  if (create && ftruncate(fd, (off_t)fabric_bytes()) != 0) {
    close(fd);
    return NULL;
  }
  void *m = mmap(NULL, fabric_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return NULL;
  fabric *f = m;
  if (create) {
    fabric_init(f);
    snprintf(f->path, sizeof f->path, "%s", path);
  }
  return f;
}

/* The fabric's lock: robust, so a process that died holding it leaves it usable. */
static void fab_lock(fabric *f) {
  if (pthread_mutex_lock(&f->mu) == EOWNERDEAD) pthread_mutex_consistent(&f->mu);
}
static void fab_wait(fabric *f, const struct timespec *until) {
  if (pthread_cond_timedwait(&f->cv, &f->mu, until) == EOWNERDEAD) pthread_mutex_consistent(&f->mu);
}

/* ---- processes: who holds each rank, and whether it is still alive ----------------------------- */

/* gone: no such process, or a zombie (killed, not yet reaped by its parent) */
static bool pid_dead(int pid) {
  if (pid <= 0 || pid == getpid()) return false;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *fp = fopen(path, "r");
  if (!fp) return kill(pid, 0) != 0 && errno == ESRCH;
  size_t n = fread(buf, 1, sizeof buf - 1, fp);
  fclose(fp);
  buf[n] = 0;
  const char *rp = strrchr(buf, ')');
  return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}
/* records that this process holds rank `rank` of `uid` (the lock is held) */
static void member_add(fabric *f, uint64_t uid, int rank) {
  if (f->nmembers < MAX_MEMBERS) f->members[f->nmembers++] = (member){uid, rank, getpid()};
}
static int member_pid(fabric *f, uint64_t uid, int rank) {
  for (int i = f->nmembers - 1; i >= 0; i--)
    if (f->members[i].uid == uid && f->members[i].rank == rank) return f->members[i].pid;
  return 0;
}
/* A rank of comm c (every rank; a send's or receive's peer only; a shrink's ranks not excluded)
 * whose process has died: its rank, its pid in *pid; else -1. The lock is held. */
static int dead_peer(fabric *f, uint64_t uid, int nranks, int kind, int peer, uint64_t exclude, int *pid) {
  for (int r = 0; r < nranks; r++) {
    if ((kind == OP_SEND || kind == OP_RECV) && r != peer) continue;
    if (kind == OP_SHRINK && (exclude >> r & 1)) continue;
    int p = member_pid(f, uid, r);
    if (p && pid_dead(p)) {
      *pid = p;
      return r;
    }
  }
  return -1;
}
/* what dead processes posted can never complete: off the board (the lock is held) */
static void drop_dead_ops(fabric *f) {
  for (int s = 0; s < MAX_OPS; s++)
    if (f->ops[s].state != FREE && f->ops[s].pid != getpid() && pid_dead(f->ops[s].pid)) f->ops[s].state = FREE;
}

/* ---- the communicators alive in this process (a destroy looks for members on failed GPUs) ---- */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *live;
static void live_add(ncclComm_t c) {
  pthread_mutex_lock(&live_mu);
  c->next = live;
  live = c;
  pthread_mutex_unlock(&live_mu);
}
static void live_remove(ncclComm_t c) {
  pthread_mutex_lock(&live_mu);
  for (ncclComm_t *p = &live; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  pthread_mutex_unlock(&live_mu);
}
/* a member of c's clique in this process on a failed GPU: its rank, or -1 */
static int member_on_failed_gpu(ncclComm_t c, int *device) {
  int r = -1;
  pthread_mutex_lock(&live_mu);
  for (ncclComm_t x = live; x && r < 0; x = x->next)
    if (x->fab == c->fab && x->uid == c->uid && x != c && emu_device_failed(x->device)) r = x->rank, *device = x->device;
  pthread_mutex_unlock(&live_mu);
  return r;
}
static bool clique_aborted(fabric *f, uint64_t uid) {
  for (int i = 0; i < f->naborted && i < MAX_ABORTED; i++)
    if (f->aborted[i] == uid) return true;
  return false;
}

/* ---- the board ------------------------------------------------------------------------------ */

static uint64_t heap_alloc(fabric *f, size_t n) {
  uint64_t at = f->heap_used;
  f->heap_used += (n + 255) / 256 * 256;
  return f->heap_used > HEAP_BYTES ? UINT64_MAX : at;
}

static size_t esize(int dt) { return dt == ncclFloat32 || dt == ncclInt32 || dt == ncclUint32 ? 4 : 2; }
static emu_format format(int dt) { return dt == ncclFloat32 ? EMU_F32 : dt == ncclBfloat16 ? EMU_BF16 : EMU_F16; }
static float ld(const unsigned char *p, int dt, size_t i) { return emu_load(p, format(dt), i); }
static void st(unsigned char *p, int dt, size_t i, float v) { emu_store(p, format(dt), i, v); }

static uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  return z ^ (z >> 31);
}

/* Completes what can be completed (the lock is held). Returns -1 on a mismatch. */
static int complete(fabric *f) {
  board_op *ops = f->ops;
  for (int i = 0; i < MAX_OPS; i++) {
    board_op *x = &ops[i];
    if (x->state != POSTED) continue;
    if (x->kind == OP_SEND || x->kind == OP_RECV) {
      if (x->kind != OP_SEND) continue;
      for (int j = 0; j < MAX_OPS; j++) {
        board_op *y = &ops[j];
        if (y->state != POSTED || y->kind != OP_RECV || y->comm != x->comm || y->rank != x->peer || y->peer != x->rank ||
            y->seq != x->seq)
          continue;
        if (y->count != x->count || y->dtype != x->dtype) {
          emu_fail("ncclSend/ncclRecv mismatch: rank %d sends %zu elements of type %d to rank %d, which receives %zu of "
                   "type %d",
                   x->rank, x->count, x->dtype, y->rank, y->count, y->dtype);
          return -1;
        }
        y->result = x->data;
        x->state = y->state = DONE;
        break;
      }
      continue;
    }
    /* collectives: every rank of the communicator with the same sequence number; a shrink: every
     * rank's shrink of the communicator (the ranks may have made different calls on it before) */
    int idx[MAX_RANKS], n = 0;
    for (int j = 0; j < MAX_OPS && n <= x->nranks; j++) {
      board_op *y = &ops[j];
      bool same = x->kind == OP_SHRINK ? y->kind == OP_SHRINK : y->seq == x->seq && y->kind != OP_SHRINK;
      if (y->state == POSTED && y->comm == x->comm && same && y->kind != OP_SEND && y->kind != OP_RECV) {
        if (y->kind != x->kind) {
          emu_fail("communicator mismatch: rank %d calls %s where rank %d calls %s (call %llu of the communicator)",
                   x->rank, OP_NAME[x->kind], y->rank, OP_NAME[y->kind], (unsigned long long)x->seq);
          return -1;
        }
        if (y->rank >= 0 && y->rank < MAX_RANKS) idx[n++] = j;
      }
    }
    int need = x->kind == OP_SHRINK ? x->nranks - __builtin_popcountll(x->exclude) : x->nranks;
    if (n < need) continue;
    board_op *by_rank[MAX_RANKS] = {0};
    for (int k = 0; k < n; k++) by_rank[ops[idx[k]].rank] = &ops[idx[k]];
    if (x->kind == OP_ALLREDUCE) {
      for (int r = 0; r < x->nranks; r++)
        if (!by_rank[r] || by_rank[r]->count != x->count || by_rank[r]->dtype != x->dtype || by_rank[r]->redop != x->redop) {
          emu_fail("ncclAllReduce mismatch in a communicator of %d ranks: rank %d reduces %zu elements of type %d, rank "
                   "%d %zu of type %d",
                   x->nranks, x->rank, x->count, x->dtype, r, by_rank[r] ? by_rank[r]->count : 0,
                   by_rank[r] ? by_rank[r]->dtype : -1);
          return -1;
        }
      uint64_t res = heap_alloc(f, x->count * esize(x->dtype));
      if (res == UINT64_MAX) {
        emu_fail("emulated NCCL: the shared heap is full");
        return -1;
      }
      unsigned char *out = heap(f) + res;
      for (size_t e = 0; e < x->count; e++) {
        if (x->dtype == ncclInt32) {
          int32_t s = 0, v;
          for (int r = 0; r < x->nranks; r++) memcpy(&v, heap(f) + by_rank[r]->data + 4 * e, 4), s += v;
          memcpy(out + 4 * e, &s, 4);
          continue;
        }
        float s = 0.0f;
        for (int r = 0; r < x->nranks; r++) s += ld(heap(f) + by_rank[r]->data, x->dtype, e);
        st(out, x->dtype, e, s);
      }
      for (int r = 0; r < x->nranks; r++) by_rank[r]->result = res, by_rank[r]->state = DONE;
    } else if (x->kind == OP_SPLIT) {
      for (int r = 0; r < x->nranks; r++) {
        board_op *y = by_rank[r];
        y->new_rank = -1, y->new_size = 0;
        if (y->color < 0) continue;
        for (int q = 0; q < x->nranks; q++) {
          board_op *z = by_rank[q];
          if (z->color != y->color) continue;
          y->new_size++;
          if (z->key < y->key || (z->key == y->key && q < r)) y->new_rank++;
        }
        y->new_rank++;
        y->new_comm = mix(mix(x->comm, x->seq), (uint64_t)y->color + 1);
      }
      for (int r = 0; r < x->nranks; r++) by_rank[r]->state = DONE;
    } else if (x->kind == OP_SHRINK) { /* the ranks left, renumbered in their order */
      for (int k = 0; k < n; k++)
        if (ops[idx[k]].exclude != x->exclude) {
          emu_fail("ncclCommShrink mismatch: rank %d excludes the ranks %#llx, rank %d the ranks %#llx", x->rank,
                   (unsigned long long)x->exclude, ops[idx[k]].rank, (unsigned long long)ops[idx[k]].exclude);
          return -1;
        }
      uint64_t seq = x->seq; /* the same for all: the least of theirs */
      for (int k = 0; k < n; k++)
        if (ops[idx[k]].seq < seq) seq = ops[idx[k]].seq;
      uint64_t uid = mix(mix(x->comm, seq), 0x5348524bull);
      for (int k = 0; k < n; k++) {
        board_op *y = &ops[idx[k]];
        y->new_rank = __builtin_popcountll(~x->exclude & ((1ull << y->rank) - 1));
        y->new_size = need;
        y->new_comm = uid;
        y->state = DONE;
      }
    } else {
      for (int r = 0; r < x->nranks; r++) by_rank[r]->state = DONE;
    }
  }
  return 0;
}

/* ---- groups: operations queue until the outermost ncclGroupEnd ---------------------------------- */

typedef struct pending {
  ncclComm_t comm;
  const void *stream; /* allreduce, send, recv: the stream it runs in */
  uint64_t seq;       /* ... its place in the communicator, taken at the call (or graph launch) */
  int kind, peer, color, key;
  uint64_t exclude; /* shrink */
  int flags;
  const void *send;
  void *recv;
  size_t count;
  int dtype, redop;
  ncclComm_t *newcomm;
  int slot;
} pending;

static __thread int depth;
static __thread pending *queue;
static __thread int nqueue, capqueue;
static __thread uint64_t group_epoch; /* emu_capture_epoch() at the outermost ncclGroupStart */

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

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Posts call p (its sequence number taken) on the board: its slot, or -1 after emu_fail() (the
 * lock is held). The data of an all-reduce or a send is read now. */
static int board_post(fabric *f, const pending *p) {
  ncclComm_t c = p->comm;
  int slot = -1;
  for (int s = 0; s < MAX_OPS && slot < 0; s++)
    if (f->ops[s].state == FREE) slot = s;
  if (slot < 0) {
    emu_fail("emulated NCCL: more than %d operations in flight", MAX_OPS);
    return -1;
  }
  board_op *x = &f->ops[slot];
  *x = (board_op){.state = POSTED, .kind = p->kind, .comm = c->uid, .seq = p->seq, .rank = c->rank, .nranks = c->nranks,
                  .peer = p->peer, .count = p->count, .dtype = p->dtype, .redop = p->redop, .color = p->color,
                  .key = p->key, .exclude = p->exclude, .pid = getpid()};
  if (p->kind == OP_ALLREDUCE || p->kind == OP_SEND) {
    size_t n = p->count * esize(p->dtype);
    x->data = heap_alloc(f, n);
    if (x->data == UINT64_MAX) {
      x->state = FREE;
      emu_fail("emulated NCCL: the shared heap is full");
      return -1;
    }
    memcpy(heap(f) + x->data, p->send, n);
  }
  return slot;
}

static ncclResult_t flush_streams(void);

/* The group's communicator calls (init, split, shrink) complete here, on the host; its
 * collectives and point-to-point calls become stream work (flush_streams). */
static ncclResult_t flush(void) {
  ncclResult_t rc = flush_streams();
  if (rc != ncclSuccess || !nqueue) {
    nqueue = 0;
    return rc;
  }
  fabric *f = queue[0].comm->fab;
  for (int i = 1; i < nqueue; i++)
    if (queue[i].comm->fab != f) {
      emu_fail("a NCCL group mixes communicators of different worlds (not emulated)");
      nqueue = 0;
      return ncclInvalidUsage;
    }
  fab_lock(f);
  for (int i = 0; i < nqueue; i++) { /* post */
    pending *p = &queue[i];
    p->seq = p->comm->coll_seq++;
    int slot = board_post(f, p);
    if (slot < 0) {
      rc = ncclInternalError;
      goto out;
    }
    p->slot = slot;
    if (p->kind == OP_SHRINK) drop_dead_ops(f); /* after a failure: what the dead posted never completes */
  }
  if (complete(f) != 0) {
    rc = ncclInvalidUsage;
    goto out;
  }
  pthread_cond_broadcast(&f->cv);
  double limit = now() + (double)(getenv("NTP_EMU_NCCL_TIMEOUT") ? atof(getenv("NTP_EMU_NCCL_TIMEOUT")) : 300.0);
  for (int i = 0; i < nqueue; i++) { /* wait */
    pending *p = &queue[i];
    board_op *x = &f->ops[p->slot];
    while (x->state != DONE) {
      if (p->kind != OP_SHRINK && clique_aborted(f, p->comm->uid)) { /* NCCL reports it as a remote error */
        emu_fail("%s on rank %d: a peer aborted the communicator (ncclCommAbort or ncclCommShrink with "
                 "NCCL_SHRINK_ABORT)", OP_NAME[p->kind], p->comm->rank);
        rc = ncclRemoteError;
        goto out;
      }
      int dpid = 0, dr = dead_peer(f, p->comm->uid, p->comm->nranks, p->kind, p->peer, p->exclude, &dpid);
      if (dr >= 0) { /* a peer process is gone: what NCCL reports after its timeout */
        emu_fail("%s on rank %d of a communicator of %d ranks: the process of rank %d (pid %d) has died", OP_NAME[p->kind],
                 p->comm->rank, p->comm->nranks, dr, dpid);
        drop_dead_ops(f);
        rc = ncclRemoteError;
        goto out;
      }
      if (p->comm->all_local || now() > limit) {
        emu_fail("%s on rank %d of a communicator of %d ranks would hang: %s%s", OP_NAME[p->kind], p->comm->rank,
                 p->comm->nranks,
                 p->kind == OP_SEND || p->kind == OP_RECV ? "no matching call of the peer"
                                                          : "not every rank of the communicator makes this call",
                 p->comm->all_local ? " (every rank is in this process and has made its calls)" : " (timed out)");
        rc = ncclInvalidUsage;
        goto out;
      }
      struct timespec t;
      clock_gettime(CLOCK_MONOTONIC, &t);
      t.tv_nsec += 50000000;
      if (t.tv_nsec >= 1000000000) t.tv_sec++, t.tv_nsec -= 1000000000;
      fab_wait(f, &t);
      if (complete(f) != 0) {
        rc = ncclInvalidUsage;
        goto out;
      }
    }
  }
  for (int i = 0; i < nqueue; i++) { /* results back to this process's buffers */
    pending *p = &queue[i];
    board_op *x = &f->ops[p->slot];
    if (p->kind == OP_ALLREDUCE || p->kind == OP_RECV)
      memcpy(p->recv, heap(f) + x->result, p->count * esize(p->dtype));
    if (p->kind == OP_SHRINK && p->flags == NCCL_SHRINK_ABORT) p->comm->shrunk_abort = true;
    if (p->kind == OP_INIT) member_add(f, p->comm->uid, p->comm->rank);
    if (p->kind == OP_SPLIT || p->kind == OP_SHRINK) {
      *p->newcomm = NULL;
      if (x->new_rank >= 0) {
        ncclComm_t c = calloc(1, sizeof *c);
        if (!c) {
          rc = ncclSystemError;
          goto out;
        }
        *c = (struct ncclComm){.magic = COMM_MAGIC, .fab = f, .uid = x->new_comm, .rank = x->new_rank, .nranks = x->new_size,
                               .device = p->comm->device, .all_local = p->comm->all_local};
        __atomic_add_fetch(&f->refs, 1, __ATOMIC_SEQ_CST);
        member_add(f, c->uid, c->rank);
        live_add(c);
        *p->newcomm = c;
      }
    }
    x->state = FREE;
  }
  bool idle = true;
  for (int s = 0; s < MAX_OPS && idle; s++) idle = f->ops[s].state == FREE;
  if (idle) f->heap_used = 0;
out:
  if (rc != ncclSuccess) /* what was posted can never complete now: take it back */
    for (int i = 0; i < nqueue; i++)
      if (queue[i].slot >= 0 && queue[i].slot < MAX_OPS) f->ops[queue[i].slot].state = FREE;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
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
  int n;
  pending ops[];
} comm_work;

static __thread ncclResult_t start_rc; /* why the last start failed */
static bool comm_live(ncclComm_t c, const char *call);

static bool comm_alive(ncclComm_t c) {
  bool found = false;
  pthread_mutex_lock(&live_mu);
  for (ncclComm_t x = live; x && !found; x = x->next) found = x == c;
  pthread_mutex_unlock(&live_mu);
  return found;
}

static int cw_start(void *ctx) {
  comm_work *w = ctx;
  for (int i = 0; i < w->n; i++) {
    pending *p = &w->ops[i];
    p->slot = -1;
    if (!comm_alive(p->comm)) {
      emu_fail("%s: a graph replays a call on a communicator that was destroyed or aborted (the graphs that hold a "
               "communicator are to be dropped with it)", OP_NAME[p->kind]);
      start_rc = ncclInvalidUsage;
      return -1;
    }
    if (!comm_live(p->comm, OP_NAME[p->kind])) {
      start_rc = ncclInvalidArgument;
      return -1;
    }
    fab_lock(w->fab);
    bool aborted = clique_aborted(w->fab, p->comm->uid);
    pthread_mutex_unlock(&w->fab->mu);
    if (aborted) { /* NCCL reports it as a remote error */
      emu_fail("%s on rank %d: a peer aborted the communicator (ncclCommAbort or ncclCommShrink with "
               "NCCL_SHRINK_ABORT)", OP_NAME[p->kind], p->comm->rank);
      start_rc = ncclRemoteError;
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

static int cw_post(void *ctx) {
  comm_work *w = ctx;
  fabric *f = w->fab;
  fab_lock(f);
  for (int i = 0; i < w->n; i++)
    if ((w->ops[i].slot = board_post(f, &w->ops[i])) < 0) goto failed;
  if (complete(f) != 0) goto failed;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  w->limit = now() + (getenv("NTP_EMU_NCCL_TIMEOUT") ? atof(getenv("NTP_EMU_NCCL_TIMEOUT")) : 300.0);
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
  if (complete(f) != 0) goto failed;
  bool all = true;
  for (int i = 0; i < w->n; i++) {
    pending *p = &w->ops[i];
    if (f->ops[p->slot].state == DONE) continue;
    all = false;
    if (clique_aborted(f, p->comm->uid)) {
      emu_fail("%s on rank %d: a peer aborted the communicator (ncclCommAbort or ncclCommShrink with "
               "NCCL_SHRINK_ABORT)", OP_NAME[p->kind], p->comm->rank);
      goto failed;
    }
    int dpid = 0, dr = dead_peer(f, p->comm->uid, p->comm->nranks, p->kind, p->peer, 0, &dpid);
    if (dr >= 0) { /* a peer process is gone: what NCCL reports after its timeout */
      emu_fail("%s on rank %d of a communicator of %d ranks: the process of rank %d (pid %d) has died", OP_NAME[p->kind],
               p->comm->rank, p->comm->nranks, dr, dpid);
      drop_dead_ops(f);
      goto failed;
    }
    if (!p->comm->all_local && now() > w->limit) {
      emu_fail("%s on rank %d of a communicator of %d ranks would hang: %s (timed out)", OP_NAME[p->kind], p->comm->rank,
               p->comm->nranks, p->kind == OP_SEND || p->kind == OP_RECV ? "no matching call of the peer"
                                                                         : "not every rank of the communicator makes this call");
      goto failed;
    }
  }
  if (!all) {
    pthread_mutex_unlock(&f->mu);
    return 0;
  }
  for (int i = 0; i < w->n; i++) { /* results back to this process's buffers */
    pending *p = &w->ops[i];
    if (p->kind == OP_ALLREDUCE || p->kind == OP_RECV)
      memcpy(p->recv, heap(f) + f->ops[p->slot].result, p->count * esize(p->dtype));
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
static const emu_comm_ops comm_work_ops = {cw_start, cw_post, cw_poll, cw_local, cw_hang, cw_idle, cw_uses, cw_copied,
                                           cw_release};

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
  return emu_device_ok(c->device, call);
}
/* ... that can still communicate: not the parent of an NCCL_SHRINK_ABORT shrink */
static bool comm_live(ncclComm_t c, const char *call) {
  if (!comm_ok(c, call)) return false;
  if (!c->shrunk_abort) return true;
  emu_fail("%s on rank %d: ncclCommShrink(NCCL_SHRINK_ABORT) terminated this communicator; it is only to be freed "
           "(ncclCommAbort or ncclCommDestroy)", call, c->rank);
  return false;
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
  *comm = NULL;
  if (strncmp(id.internal, "ntp-emu:", 8) != 0) {
    emu_fail("ncclCommInitRank: not a unique id of the emulated NCCL");
    return ncclInvalidArgument;
  }
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) {
    emu_fail("ncclCommInitRank: rank %d of %d ranks (at most %d emulated)", rank, nranks, MAX_RANKS);
    return ncclInvalidArgument;
  }
  char path[256];
  snprintf(path, sizeof path, "%.*s", (int)(sizeof id.internal - 8), id.internal + 8);
  fabric *f = fabric_map(path, false);
  if (!f) {
    emu_fail("ncclCommInitRank: cannot map %s: %s", path, strerror(errno));
    return ncclSystemError;
  }
  if (!emu_device_ok(emu_current_device(), "ncclCommInitRank")) return ncclInvalidUsage;
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  *c = (struct ncclComm){.magic = COMM_MAGIC, .fab = f, .uid = mix(0x4e54504e43434cull, 1), .rank = rank, .nranks = nranks,
                         .device = emu_current_device(), .all_local = nranks == 1};
  __atomic_add_fetch(&f->refs, 1, __ATOMIC_SEQ_CST);
  ncclResult_t r = submit((pending){.comm = c, .kind = OP_INIT}); /* everyone joins before anyone proceeds */
  if (r != ncclSuccess) {
    free(c);
    return r;
  }
  live_add(c);
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devlist) {
  if (n < 1 || n > MAX_RANKS) return ncclInvalidArgument;
  fabric *f = mmap(NULL, fabric_bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (f == MAP_FAILED) return ncclSystemError;
  fabric_init(f);
  static uint64_t worlds;
  uint64_t uid = mix(0x494e4954414c4cull, ++worlds);
  for (int i = 0; i < n; i++) {
    int dev = devlist ? devlist[i] : i;
    if (dev < 0 || dev >= emu_device_count()) {
      emu_fail("ncclCommInitAll: GPU %d does not exist (%d emulated)", dev, emu_device_count());
      return ncclInvalidArgument;
    }
    if (!emu_device_ok(dev, "ncclCommInitAll")) return ncclInvalidUsage;
    comms[i] = calloc(1, sizeof(struct ncclComm));
    if (!comms[i]) return ncclSystemError;
    *comms[i] = (struct ncclComm){.magic = COMM_MAGIC, .fab = f, .uid = uid, .rank = i, .nranks = n, .device = dev, .all_local = true};
    f->refs++;
    live_add(comms[i]);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  (void)config;
  if (!comm_live(comm, "ncclCommSplit")) return ncclInvalidArgument;
  return submit((pending){.comm = comm, .kind = OP_SPLIT, .color = color < 0 ? -1 : color, .key = key, .newcomm = newcomm});
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int *exclude, int nexclude, ncclComm_t *newcomm, ncclConfig_t *config,
                            int flags) {
  (void)config; /* NULL: the parent's; nothing of it is emulated */
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
  int dev = -1, bad = member_on_failed_gpu(comm, &dev);
  fab_lock(comm->fab);
  bool aborted = clique_aborted(comm->fab, comm->uid);
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
    if (!clique_aborted(comm->fab, comm->uid) && comm->fab->naborted < MAX_ABORTED)
      comm->fab->aborted[comm->fab->naborted++] = comm->uid;
    pthread_cond_broadcast(&comm->fab->cv);
    pthread_mutex_unlock(&comm->fab->mu);
  }
  return submit((pending){.comm = comm, .kind = OP_SHRINK, .exclude = mask, .flags = flags, .newcomm = newcomm});
}

static void comm_free(ncclComm_t comm) {
  fabric *f = comm->fab;
  live_remove(comm);
  comm->magic = 0;
  free(comm);
  if (__atomic_sub_fetch(&f->refs, 1, __ATOMIC_SEQ_CST) == 0 && f->path[0]) unlink(f->path);
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm_ok(comm, "ncclCommDestroy")) return ncclInvalidArgument;
  int dev = -1, r = member_on_failed_gpu(comm, &dev);
  if (r >= 0) /* a hang on a real machine */
    emu_fatal("ncclCommDestroy on rank %d would hang: rank %d of the communicator is on GPU %d, which has failed "
              "(ncclCommAbort frees a communicator without waiting for its peers)", comm->rank, r, dev);
  emu_sync_all(); /* its operations complete first */
  emu_streams_cancel_comm(comm);
  comm_free(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  emu_gpus_fail();
  if (!comm_ok(comm, "ncclCommAbort")) return ncclInvalidArgument;
  fabric *f = comm->fab;
  fab_lock(f); /* the peers' operations on it fail from now on */
  if (!clique_aborted(f, comm->uid) && f->naborted < MAX_ABORTED) f->aborted[f->naborted++] = comm->uid;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  emu_streams_cancel_comm(comm); /* its queued operations never complete */
  comm_free(comm);
  return ncclSuccess;
}
/* ncclRemoteError once a peer aborted the communicator or a member's process died; else success */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async) {
  if (!comm_ok(comm, "ncclCommGetAsyncError")) return ncclInvalidArgument;
  fabric *f = comm->fab;
  fab_lock(f);
  int pid = 0;
  bool bad = clique_aborted(f, comm->uid) || dead_peer(f, comm->uid, comm->nranks, OP_ALLREDUCE, -1, 0, &pid) >= 0;
  pthread_mutex_unlock(&f->mu);
  *async = bad ? ncclRemoteError : ncclSuccess;
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
  size_t bytes = count * esize(dt);
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
  if (!buffer_ok(comm, buf, count * esize(dt), "ncclSend")) return ncclInvalidArgument;
  return submit((pending){.comm = comm, .stream = stream, .kind = OP_SEND, .send = buf, .count = count, .dtype = dt, .peer = peer});
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (!emu_stream_ok(stream, "ncclRecv")) return ncclInvalidArgument;
  if (!comm_live(comm, "ncclRecv") || !type_ok(dt, "ncclRecv")) return ncclInvalidArgument;
  if (peer < 0 || peer >= comm->nranks) {
    emu_fail("ncclRecv: peer %d of a communicator of %d ranks", peer, comm->nranks);
    return ncclInvalidArgument;
  }
  if (!buffer_ok(comm, buf, count * esize(dt), "ncclRecv")) return ncclInvalidArgument;
  return submit((pending){.comm = comm, .stream = stream, .kind = OP_RECV, .recv = buf, .count = count, .dtype = dt, .peer = peer});
}
