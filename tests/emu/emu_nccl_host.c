/* emu_nccl_host.c — the emulated NCCL's communicator calls (init, split, shrink): posted on the
 * fabric's board at the outermost ncclGroupEnd, waited for there on the host until every rank's
 * call is matched, and their new communicators made. A mismatch, or a wait that cannot end, is an
 * error (at once when every rank is in this process; after NTP_EMU_NCCL_TIMEOUT seconds across
 * processes). */
#define _GNU_SOURCE
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emu_nccl.h"

double fab_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Posts call p (its sequence number taken) on the board: its slot, or -1 after emu_fail() (the
 * lock is held). The data of an all-reduce or a send is read now. */
int fab_post(fabric *f, const pending *p) {
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
    size_t n = p->count * fab_esize(p->dtype);
    x->data = fab_alloc(f, n);
    if (x->data == UINT64_MAX) {
      x->state = FREE;
      emu_fail("emulated NCCL: the shared heap is full");
      return -1;
    }
    memcpy(fab_heap(f) + x->data, p->send, n);
  }
  return slot;
}

/* Posts the group's communicator calls q[0..n) and waits for them; *async when one made a
 * non-blocking communicator (its call is in progress: ncclCommGetAsyncError settles it). */
ncclResult_t fab_host_calls(pending *q, int n, bool *async) {
  ncclResult_t rc = ncclSuccess;
  fabric *f = q[0].comm->fab;
  for (int i = 1; i < n; i++)
    if (q[i].comm->fab != f) {
      emu_fail("a NCCL group mixes communicators of different worlds (not emulated)");
      return ncclInvalidUsage;
    }
  fab_lock(f);
  for (int i = 0; i < n; i++) { /* post */
    pending *p = &q[i];
    p->seq = p->comm->coll_seq++;
    int slot = fab_post(f, p);
    if (slot < 0) {
      rc = ncclInternalError;
      goto out;
    }
    p->slot = slot;
    if (p->kind == OP_SHRINK) fab_drop_dead(f); /* after a failure: what the dead posted never completes */
  }
  if (fab_complete(f) != 0) {
    rc = ncclInvalidUsage;
    goto out;
  }
  pthread_cond_broadcast(&f->cv);
  double limit = fab_now() + (double)(getenv("NTP_EMU_NCCL_TIMEOUT") ? atof(getenv("NTP_EMU_NCCL_TIMEOUT")) : 300.0);
  for (int i = 0; i < n; i++) { /* wait */
    pending *p = &q[i];
    board_op *x = &f->ops[p->slot];
    while (x->state != DONE) {
      if (p->kind != OP_SHRINK && fab_aborted(f, p->comm->uid)) { /* NCCL reports it as a remote error */
        emu_fail("%s on rank %d: a peer aborted the communicator (ncclCommAbort or ncclCommShrink with "
                 "NCCL_SHRINK_ABORT)", OP_NAME[p->kind], p->comm->rank);
        rc = ncclRemoteError;
        goto out;
      }
      int dpid = 0, dr = fab_dead_peer(f, p->comm->uid, p->comm->nranks, p->kind, p->peer, p->exclude, &dpid);
      if (dr >= 0) { /* a peer process is gone: what NCCL reports after its timeout */
        emu_fail("%s on rank %d of a communicator of %d ranks: the process of rank %d (pid %d) has died", OP_NAME[p->kind],
                 p->comm->rank, p->comm->nranks, dr, dpid);
        fab_drop_dead(f);
        rc = ncclRemoteError;
        goto out;
      }
      if (p->comm->all_local || fab_now() > limit) {
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
      if (fab_complete(f) != 0) {
        rc = ncclInvalidUsage;
        goto out;
      }
    }
  }
  for (int i = 0; i < n; i++) { /* results back to this process's buffers */
    pending *p = &q[i];
    board_op *x = &f->ops[p->slot];
    if (p->kind == OP_ALLREDUCE || p->kind == OP_RECV)
      memcpy(p->recv, fab_heap(f) + x->result, p->count * fab_esize(p->dtype));
    if (p->kind == OP_SHRINK && p->flags == NCCL_SHRINK_ABORT) p->comm->shrunk_abort = true;
    if (p->kind == OP_INIT) fab_member_add(f, p->comm->uid, p->comm->rank);
    if (p->kind == OP_SPLIT || p->kind == OP_SHRINK) {
      *p->newcomm = NULL;
      if (x->new_rank >= 0) {
        ncclComm_t c = calloc(1, sizeof *c);
        if (!c) {
          rc = ncclSystemError;
          goto out;
        }
        bool nb = p->blocking == 0 || (p->blocking < 0 && p->comm->nonblocking);
        *c = (struct ncclComm){.magic = COMM_MAGIC, .fab = f, .uid = x->new_comm, .rank = x->new_rank, .nranks = x->new_size,
                               .device = p->comm->device, .gen = p->comm->gen, .all_local = p->comm->all_local, .nonblocking = nb,
                               .in_progress = nb, .split_child = p->kind == OP_SPLIT};
        *async |= nb;
        __atomic_add_fetch(&f->refs, 1, __ATOMIC_SEQ_CST);
        fab_member_add(f, c->uid, c->rank);
        fab_live_add(c);
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
    for (int i = 0; i < n; i++)
      if (q[i].slot >= 0 && q[i].slot < MAX_OPS) f->ops[q[i].slot].state = FREE;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return rc;
}
