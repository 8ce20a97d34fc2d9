/* emu_nccl_fabric.c — the emulated NCCL's fabric (emu_nccl.h): the shared memory that every rank
 * of a world maps, its robust lock, the board on which operations are posted and matched (an
 * all-reduce summed in fp32 in rank order and rounded once, a send with its receive, a split or
 * shrink of every rank), and who holds each rank: its process, alive or not. */
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

const char *const OP_NAME[] = {"ncclCommInitRank", "ncclAllReduce", "ncclSend", "ncclRecv", "ncclCommSplit",
                               "ncclCommShrink", "ncclCommDestroy", "ncclCommAbort"};

unsigned char *fab_heap(fabric *f) { return (unsigned char *)f + ((sizeof *f + 4095) & ~(size_t)4095); }
size_t fabric_bytes(void) { return ((sizeof(fabric) + 4095) & ~(size_t)4095) + HEAP_BYTES; }

void fabric_init(fabric *f) {
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

fabric *fabric_map(const char *path, bool create) {
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
void fab_lock(fabric *f) {
  if (pthread_mutex_lock(&f->mu) == EOWNERDEAD) pthread_mutex_consistent(&f->mu);
}
void fab_wait(fabric *f, const struct timespec *until) {
  if (pthread_cond_timedwait(&f->cv, &f->mu, until) == EOWNERDEAD) pthread_mutex_consistent(&f->mu);
}

/* ---- processes: who holds each rank, and whether it is still alive ----------------------------- */

/* gone: no such process, or a zombie (killed, not yet reaped by its parent) */
bool fab_pid_dead(int pid) {
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
void fab_member_add(fabric *f, uint64_t uid, int rank) {
  if (f->nmembers < MAX_MEMBERS) f->members[f->nmembers++] = (member){uid, rank, getpid()};
}
int fab_member_pid(fabric *f, uint64_t uid, int rank) {
  for (int i = f->nmembers - 1; i >= 0; i--)
    if (f->members[i].uid == uid && f->members[i].rank == rank) return f->members[i].pid;
  return 0;
}
/* A rank of comm c (every rank; a send's or receive's peer only; a shrink's ranks not excluded)
 * whose process has died: its rank, its pid in *pid; else -1. The lock is held. */
int fab_dead_peer(fabric *f, uint64_t uid, int nranks, int kind, int peer, uint64_t exclude, int *pid) {
  for (int r = 0; r < nranks; r++) {
    if ((kind == OP_SEND || kind == OP_RECV) && r != peer) continue;
    if (kind == OP_SHRINK && (exclude >> r & 1)) continue;
    int p = fab_member_pid(f, uid, r);
    if (p && fab_pid_dead(p)) {
      *pid = p;
      return r;
    }
  }
  return -1;
}
/* what dead processes posted can never complete: off the board (the lock is held) */
void fab_drop_dead(fabric *f) {
  for (int s = 0; s < MAX_OPS; s++)
    if (f->ops[s].state != FREE && f->ops[s].pid != getpid() && fab_pid_dead(f->ops[s].pid)) f->ops[s].state = FREE;
}

/* ---- the communicators alive in this process (a destroy looks for members on failed GPUs) ---- */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *live;
void fab_live_add(ncclComm_t c) {
  pthread_mutex_lock(&live_mu);
  c->next = live;
  live = c;
  pthread_mutex_unlock(&live_mu);
}
void fab_live_remove(ncclComm_t c) {
  pthread_mutex_lock(&live_mu);
  for (ncclComm_t *p = &live; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  pthread_mutex_unlock(&live_mu);
}
/* c is a communicator of this process not yet destroyed or aborted */
bool fab_comm_alive(ncclComm_t c) {
  bool found = false;
  pthread_mutex_lock(&live_mu);
  for (ncclComm_t x = live; x && !found; x = x->next) found = x == c;
  pthread_mutex_unlock(&live_mu);
  return found;
}
/* how many ranks of c's communicator this process holds, c's included */
int fab_local_ranks(ncclComm_t c) {
  int n = 0;
  pthread_mutex_lock(&live_mu);
  for (ncclComm_t x = live; x; x = x->next) n += x->fab == c->fab && x->uid == c->uid;
  pthread_mutex_unlock(&live_mu);
  return n;
}
/* a member of c's clique in this process on a failed GPU: its rank, or -1 */
int fab_member_on_failed_gpu(ncclComm_t c, int *device) {
  int r = -1;
  pthread_mutex_lock(&live_mu);
  for (ncclComm_t x = live; x && r < 0; x = x->next)
    if (x->fab == c->fab && x->uid == c->uid && x != c && emu_device_failed(x->device)) r = x->rank, *device = x->device;
  pthread_mutex_unlock(&live_mu);
  return r;
}
bool fab_aborted(fabric *f, uint64_t uid) {
  for (int i = 0; i < f->naborted && i < MAX_ABORTED; i++)
    if (f->aborted[i] == uid) return true;
  return false;
}

/* ---- the board ------------------------------------------------------------------------------ */

uint64_t fab_alloc(fabric *f, size_t n) {
  uint64_t at = f->heap_used;
  f->heap_used += (n + 255) / 256 * 256;
  return f->heap_used > HEAP_BYTES ? UINT64_MAX : at;
}

size_t fab_esize(int dt) { return dt == ncclFloat32 || dt == ncclInt32 || dt == ncclUint32 ? 4 : 2; }
emu_format fab_format(int dt) { return dt == ncclFloat32 ? EMU_F32 : dt == ncclBfloat16 ? EMU_BF16 : EMU_F16; }
float fab_ld(const unsigned char *p, int dt, size_t i) { return emu_load(p, fab_format(dt), i); }
void fab_st(unsigned char *p, int dt, size_t i, float v) { emu_store(p, fab_format(dt), i, v); }

uint64_t fab_mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  return z ^ (z >> 31);
}

/* Completes what can be completed (the lock is held). Returns -1 on a mismatch. */
int fab_complete(fabric *f) {
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
      uint64_t res = fab_alloc(f, x->count * fab_esize(x->dtype));
      if (res == UINT64_MAX) {
        emu_fail("emulated NCCL: the shared heap is full");
        return -1;
      }
      unsigned char *out = fab_heap(f) + res;
      for (size_t e = 0; e < x->count; e++) {
        if (x->dtype == ncclInt32) {
          int32_t s = 0, v;
          for (int r = 0; r < x->nranks; r++) memcpy(&v, fab_heap(f) + by_rank[r]->data + 4 * e, 4), s += v;
          memcpy(out + 4 * e, &s, 4);
          continue;
        }
        float s = 0.0f;
        for (int r = 0; r < x->nranks; r++) s += fab_ld(fab_heap(f) + by_rank[r]->data, x->dtype, e);
        fab_st(out, x->dtype, e, s);
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
        y->new_comm = fab_mix(fab_mix(x->comm, x->seq), (uint64_t)y->color + 1);
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
      uint64_t uid = fab_mix(fab_mix(x->comm, seq), 0x5348524bull);
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


/* An operation of rank `rank` of communicator `uid` that can never complete: a peer aborted the
 * communicator, or a peer's process died (for a send or receive, that peer's). NCCL's guide: such
 * an operation "will usually not progress and never complete"; only ncclCommGetAsyncError tells.
 * Says why in `why`. The lock is held. */
bool fab_stuck(fabric *f, uint64_t uid, int rank, int nranks, int kind, int peer, char *why, size_t cap) {
  if (fab_aborted(f, uid)) {
    snprintf(why, cap, "%s on rank %d: a peer aborted the communicator (ncclCommAbort, or ncclCommShrink with "
             "NCCL_SHRINK_ABORT)", OP_NAME[kind], rank);
    return true;
  }
  int pid = 0, r = fab_dead_peer(f, uid, nranks, kind, peer, 0, &pid);
  if (r < 0) return false;
  snprintf(why, cap, "%s on rank %d of a communicator of %d ranks: the process of rank %d (pid %d) has died",
           OP_NAME[kind], rank, nranks, r, pid);
  return true;
}
