/* emu_nccl_grow.c — the emulated NCCL's grow (NCCL 2.29): a communicator made from an existing one
 * plus new ranks, as a repaired GPU rejoins. As the NCCL documentation has it: a coordinator gets
 * a unique id from the parent (ncclCommGetUniqueId) and hands it to the new ranks out of band;
 * every existing rank calls ncclCommGrow(parent, n, id or NULL, -1, ...) and keeps its number
 * (the coordinator passes the id, the others NULL), every new rank ncclCommGrow(NULL, n, id, r,
 * ...) with r from the parent's size up; the id serves one grow; the parent has no operation
 * outstanding (queued in the group or on a stream: the grow could deadlock). Anything else is an error here
 * (where NCCL's behaviour would be undefined or a hang). The new communicator is made as
 * ncclCommInitRank would make it on that id (emu_nccl_join): every rank joins before anyone goes
 * on, in a group when one thread calls for several. */
#include <stdlib.h>
#include <string.h>

#include "emu.h"
#include "emu_nccl.h"

/* the grows asked for in this process: the parent, its id, and how far they went */
typedef struct grow_id {
  uint64_t parent;   /* the parent's uid (ncclComm.uid) */
  int parent_size;
  ncclUniqueId id;
  int joined, nranks; /* ranks that called ncclCommGrow with it, and the size they asked for */
} grow_id;
static grow_id grows[64];
static int ngrows;

static grow_id *by_parent(uint64_t uid) {
  for (int i = ngrows - 1; i >= 0; i--)
    if (grows[i].parent == uid) return &grows[i];
  return NULL;
}
static grow_id *by_id(const ncclUniqueId *id) {
  for (int i = ngrows - 1; i >= 0; i--)
    if (!memcmp(&grows[i].id, id, sizeof *id)) return &grows[i];
  return NULL;
}

ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *id) {
  if (!emu_nccl_comm_live(comm, "ncclCommGetUniqueId")) return ncclInvalidArgument;
  if (ngrows == (int)(sizeof grows / sizeof *grows)) {
    emu_fail("ncclCommGetUniqueId: more than %d grows in one process (emulator limit)", ngrows);
    return ncclInternalError;
  }
  ncclResult_t r = ncclGetUniqueId(id);
  if (r == ncclSuccess)
    grows[ngrows++] = (grow_id){.parent = comm->uid, .parent_size = comm->nranks, .id = *id};
  return r;
}

/* the grow's record after this rank's checks, or NULL (emu_fail said why) */
static grow_id *grow_checks(ncclComm_t comm, int nranks, const ncclUniqueId *id, int rank) {
  grow_id *g = comm ? by_parent(comm->uid) : id ? by_id(id) : NULL;
  if (comm && rank != -1) return emu_fail("ncclCommGrow on rank %d: an existing rank passes rank -1 (it keeps its "
                                          "number), not %d", comm->rank, rank), NULL;
  if (!comm && !id) return emu_fail("ncclCommGrow: a new rank (no parent) passes the grow's unique id"), NULL;
  if (!g) return emu_fail("ncclCommGrow: %s", comm ? "no ncclCommGetUniqueId on the parent before its grow"
                                                    : "not a unique id from ncclCommGetUniqueId"), NULL;
  if (comm && id && memcmp(id, &g->id, sizeof *id))
    return emu_fail("ncclCommGrow on rank %d: not the id ncclCommGetUniqueId gave for this parent", comm->rank), NULL;
  if (g->nranks && g->joined >= g->nranks)
    return emu_fail("ncclCommGrow: the grow's unique id was used already (an id serves one grow)"), NULL;
  if (nranks <= g->parent_size || nranks > MAX_RANKS || (g->nranks && nranks != g->nranks))
    return emu_fail("ncclCommGrow: %d ranks, from a parent of %d (a grow adds ranks; every rank asks for the same "
                    "size, at most %d emulated)", nranks, g->parent_size, MAX_RANKS), NULL;
  if (!comm && (rank < g->parent_size || rank >= nranks))
    return emu_fail("ncclCommGrow: new rank %d; the new ranks are numbered from the parent's size (%d) to %d",
                    rank, g->parent_size, nranks - 1), NULL;
  return g;
}

ncclResult_t ncclCommGrow(ncclComm_t comm, int nranks, const ncclUniqueId *id, int rank, ncclComm_t *newcomm,
                          ncclConfig_t *config) {
  (void)config;
  if (!newcomm) {
    emu_fail("ncclCommGrow: newcomm is NULL");
    return ncclInvalidArgument;
  }
  *newcomm = NULL;
  if (comm && !emu_nccl_comm_live(comm, "ncclCommGrow")) return ncclInvalidArgument;
  if (comm && !emu_nccl_comm_idle(comm)) { /* NCCL's guide: none may be outstanding, or the grow may deadlock */
    emu_fail("ncclCommGrow on rank %d: the parent has operations outstanding (NCCL: complete them before a grow)",
             comm->rank);
    return ncclInvalidUsage;
  }
  if (comm && emu_current_device() != comm->device) {
    emu_fail("ncclCommGrow on rank %d: the current GPU is %d, the parent's rank is on GPU %d (cudaSetDevice first)",
             comm->rank, emu_current_device(), comm->device);
    return ncclInvalidUsage;
  }
  grow_id *g = grow_checks(comm, nranks, id, rank);
  if (!g) return ncclInvalidArgument;
  g->nranks = nranks, g->joined++;
  return emu_nccl_join(newcomm, nranks, g->id, comm ? comm->rank : rank, "ncclCommGrow");
}
