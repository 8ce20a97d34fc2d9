/* emu_nccl.h — the emulated NCCL's shared-memory fabric: the board of posted operations, the
 * processes that hold each rank, the communicators alive in this process (emu_nccl_fabric.c), and
 * the communicator a handle points to. Private to emu_nccl.c and emu_nccl_fabric.c. */
#ifndef NTP_EMU_NCCL_H
#define NTP_EMU_NCCL_H

#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "emu.h"

/* internal to libntp_emu.so: none of these names is exported */
#pragma GCC visibility push(hidden)

enum { MAX_OPS = 4096, MAX_RANKS = 64, HEAP_BYTES = 1 << 30 };
enum { FREE, POSTED, DONE };
enum { OP_INIT, OP_ALLREDUCE, OP_SEND, OP_RECV, OP_SPLIT, OP_SHRINK, OP_DESTROY, OP_ABORT };
extern const char *const OP_NAME[];
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
  int gen;        /* its device's generation (a repaired GPU is a new device: emu_object_ok) */
  bool all_local; /* every rank in this process: a wait that cannot complete is a hang */
  bool shrunk_abort; /* the parent of an NCCL_SHRINK_ABORT shrink: only to be freed now */
  uint64_t coll_seq;
  uint64_t send_seq[MAX_RANKS], recv_seq[MAX_RANKS];
  bool nonblocking;    /* ncclConfig_t.blocking = 0: calls may return ncclInProgress */
  bool in_progress;    /* ... one did: ncclCommGetAsyncError settles it before the next use */
  bool connected;      /* its first collective or point-to-point call was made (a non-blocking one
                        * returns ncclInProgress: NCCL connects the peers then) */
  bool split_child;    /* made by ncclCommSplit: a group's communicator (NTP_EMU_NCCL_KILL) */
  ncclResult_t async;  /* what ncclCommGetAsyncError reports: sticky once an error */
  struct ncclComm *next; /* the communicators alive in this process */
};
enum { COMM_MAGIC = 0x4e43434c };

/* a call queued until the outermost ncclGroupEnd (emu_nccl.c) */
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
  int blocking; /* split, shrink: the new communicator's ncclConfig_t.blocking (-1: the parent's) */
  int slot;
} pending;

/* emu_nccl_host.c */
double fab_now(void);
int fab_post(fabric *f, const pending *p);
ncclResult_t fab_host_calls(pending *q, int n, bool *async);

/* emu_nccl_fabric.c */
unsigned char *fab_heap(fabric *f);
size_t fabric_bytes(void);
void fabric_init(fabric *f);
fabric *fabric_map(const char *path, bool create);
void fab_lock(fabric *f);
void fab_wait(fabric *f, const struct timespec *until);
bool fab_pid_dead(int pid);
void fab_member_add(fabric *f, uint64_t uid, int rank);
int fab_member_pid(fabric *f, uint64_t uid, int rank);
int fab_dead_peer(fabric *f, uint64_t uid, int nranks, int kind, int peer, uint64_t exclude, int *pid);
void fab_drop_dead(fabric *f);
void fab_live_add(ncclComm_t c);
void fab_live_remove(ncclComm_t c);
int fab_member_on_failed_gpu(ncclComm_t c, int *device);
bool fab_comm_alive(ncclComm_t c);
int fab_local_ranks(ncclComm_t c);
bool fab_aborted(fabric *f, uint64_t uid);
uint64_t fab_alloc(fabric *f, size_t n);
size_t fab_esize(int dt);
emu_format fab_format(int dt);
float fab_ld(const unsigned char *p, int dt, size_t i);
void fab_st(unsigned char *p, int dt, size_t i, float v);
uint64_t fab_mix(uint64_t a, uint64_t b);
int fab_complete(fabric *f);
bool fab_stuck(fabric *f, uint64_t uid, int rank, int nranks, int kind, int peer, char *why, size_t cap);

#pragma GCC visibility pop

/* A rank joins the communicator of nranks that meets on id (ncclCommInitRank's body; `call`
 * names the API call in errors): emu_nccl.c */
ncclResult_t emu_nccl_join(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, const char *call);
bool emu_nccl_comm_live(ncclComm_t c, const char *call);
bool emu_nccl_comm_idle(ncclComm_t c); /* nothing of it queued in this thread's group or on a stream */

#endif
