/* failover.c — after a failure: a lost peer seen through NCCL, the survivors' communicators
 * (ncclCommShrink, or a new world), and what a failed GPU held abandoned on purpose. */
#include "cuda_internal.h"

bool ntp_cuda_peer_lost(ntp_cuda *c) {
  if (cu_nccl_last == ncclRemoteError || cu_nccl_last == ncclSystemError) return true;
  char why[512]; /* every communicator of this process: the stalled operation may be on any of them */
  return cu_comms_state(c, why, sizeof why) < 0 && (cu_nccl_last == ncclRemoteError || cu_nccl_last == ncclSystemError);
}

/* ---- after a failure: the survivors' communicators (ntp_cuda_lose) ---------------------------- */

#ifndef NCCL_SHRINK_ABORT
#define NCCL_SHRINK_ABORT 0x01
#endif

/* Is GPU d one of a failed rank's? (NCCL: a GPU per rank) */
bool cu_on_dead_gpu(const ntp_cuda *c, int d) {
  for (int r = c->rank_lo; c->dead && r < c->rank_hi; r++)
    if (c->dead[r] && c->dev[r] == d) return true;
  return false;
}

/* What both ways of losing ranks start with: the failed ranks marked (c->dead) and listed for
 * ncclCommShrink (*excl, *nexcl), the survivors' arrays allocated, and whether the world is to be
 * shrunk (the loaded NCCL has ncclCommShrink and NTP_NCCL_NO_SHRINK is not 1). */
static int lose_begin(ntp_cuda *c, const bool *dead, ntp_cuda_survivors *s, int **excl, int *nexcl, char *err,
                      size_t cap) {
  int W = c->p->world;
  *nexcl = 0;
  *excl = calloc((size_t)W, sizeof **excl);
  c->dead = calloc((size_t)W, sizeof *c->dead);
  s->devices = calloc((size_t)W, sizeof *s->devices);
  s->world = calloc((size_t)W, sizeof *s->world);
  if (!*excl || !c->dead || !s->devices || !s->world) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  for (int r = 0; r < W; r++) {
    c->dead[r] = dead[r];
    if (dead[r]) (*excl)[(*nexcl)++] = r;
  }
  const char *no = getenv("NTP_NCCL_NO_SHRINK");
  s->shrunk = cu_api.ncclCommShrink && !(no && !strcmp(no, "1"));
  return 0;
}

/* ntp_cuda_lose with one rank per process: this process's rank survives; every communicator of
 * it is aborted, and the world shrunk with the other survivors' processes (or made again from a
 * unique id through $NTP_NCCL_ID_FILE.wN). */
static int lose_one(ntp_cuda *c, const bool *dead, ntp_cuda_survivors *s, char *err, size_t cap) {
  int W = c->p->world, me = c->rank_lo, nexcl;
  int *excl = NULL;
  if (lose_begin(c, dead, s, &excl, &nexcl, err, cap) != 0) goto fail;
  if (dead[me]) {
    snprintf(err, cap, "internal: rank %d, run by this process, is among the failed", me);
    goto fail;
  }
  for (int r = 0; r < W; r++)
    if (!dead[r]) s->local += r < me, s->n++;
  for (int i = 0; i < s->n; i++) s->devices[i] = c->dev[me]; /* only this process's is known here */
  CU(cu_api.cudaSetDevice(c->dev[me]));
  NC(cu_api.ncclGroupStart()); /* every group, freed together: a peer may wait in any of them */
  for (int k = 0; k < c->nsets; k++)
    if (c->group[me][k]) {
      NC(cu_api.ncclCommAbort(c->group[me][k]));
      c->group[me][k] = NULL;
      s->aborted++;
    }
  NC(cu_api.ncclGroupEnd());
  s->how = s->shrunk ? "ncclCommShrink across the processes"
           : cu_api.ncclCommShrink ? "ncclCommInitRank from a new unique id: NTP_NCCL_NO_SHRINK=1"
                               : "ncclCommInitRank from a new unique id: libnccl has no ncclCommShrink";
  CU(cu_api.cudaSetDevice(c->dev[me]));
  c->settling = (ncclComm_t *)&s->world[s->local]; /* non-blocking as its parent: settled alone */
  if (s->shrunk) NC(cu_api.ncclCommShrink(c->world[me], excl, nexcl, (ncclComm_t *)&s->world[s->local], NULL, NCCL_SHRINK_ABORT));
  c->settling = NULL;
  NC(cu_api.ncclCommAbort(c->world[me]));
  c->world[me] = NULL;
  s->aborted++;
  if (!s->shrunk) {
    const char *path = getenv("NTP_NCCL_ID_FILE");
    if (!path) {
      snprintf(err, cap, "the survivors' world needs NTP_NCCL_ID_FILE (where the first survivor writes the new id)");
      goto fail;
    }
    char p2[4200];
    snprintf(p2, sizeof p2, "%s.w%d", path, s->n);
    ncclUniqueId id;
    if (cu_share_id(p2, s->local == 0, &id, err, cap) != 0) goto fail;
    NC(cu_api.ncclCommInitRank((ncclComm_t *)&s->world[s->local], s->n, id, s->local));
  }
  free(excl);
  return 0;
fail:
  c->settling = NULL;
  free(excl);
  ntp_cuda_survivors_free(s);
  return -1;
}

int ntp_cuda_lose(ntp_cuda *c, const bool *dead, ntp_cuda_survivors *s, char *err, size_t cap) {
  memset(s, 0, sizeof *s);
  s->local = -1;
  /* the graphs hold the communicators about to be aborted: dropped first (a failed rank's are left
   * on its GPU), and not captured again; what this backend still does is hand the state over */
  for (int r = c->rank_lo; r < c->rank_hi; r++)
    if (dead[r] && c->graph[r]) cu_abandon(c->graph[r]), c->graph[r] = NULL;
  cu_drop_graphs(c);
  c->graphs = false;
  int W = c->p->world, nexcl;
  if (c->nccl && c->own_world && c->rank_hi - c->rank_lo == 1 && W > 1) {
    s->local = 0;
    return lose_one(c, dead, s, err, cap);
  }
  if (!c->nccl || c->rank_lo != 0 || c->rank_hi != W || !c->own_world) {
    snprintf(err, cap, "losing ranks needs every rank in this process, on a GPU each, or one rank per process, with "
             "its own communicators");
    return -1;
  }
  int *excl = NULL;
  if (lose_begin(c, dead, s, &excl, &nexcl, err, cap) != 0) goto fail;
  for (int r = 0; r < W; r++)
    if (!dead[r]) s->devices[s->n++] = c->dev[r];
  if (!s->n) {
    snprintf(err, cap, "no rank survives");
    goto fail;
  }
  /* the groups with a dead member: aborted on their survivors (the dead ranks' own handles are
   * the failed GPU's: left alone) */
  NC(cu_api.ncclGroupStart()); /* one thread frees several GPUs' communicators: in one group (NCCL's guide) */
  for (int k = 0; k < c->nsets; k++) {
    bool hit = false;
    for (int i = 0; i < c->set_len[k]; i++) hit |= dead[c->sets[k][i]];
    for (int r = 0; hit && r < W; r++) {
      if (!c->group[r][k]) continue;
      if (!dead[r]) {
        CU(cu_api.cudaSetDevice(c->dev[r]));
        NC(cu_api.ncclCommAbort(c->group[r][k]));
        s->aborted++;
      }
      c->group[r][k] = NULL;
    }
  }
  NC(cu_api.ncclGroupEnd());
  /* the world over the survivors: shrunk from the old one (its operations terminated first:
   * NCCL_SHRINK_ABORT), which is then aborted; or aborted and created again */
  s->how = s->shrunk ? "ncclCommShrink" : cu_api.ncclCommShrink ? "ncclCommInitAll: NTP_NCCL_NO_SHRINK=1"
                                                             : "ncclCommInitAll: libnccl has no ncclCommShrink";
  if (s->shrunk) {
    NC(cu_api.ncclGroupStart());
    for (int r = 0, i = 0; r < W; r++) {
      if (dead[r]) continue;
      CU(cu_api.cudaSetDevice(c->dev[r]));
      NC(cu_api.ncclCommShrink(c->world[r], excl, nexcl, (ncclComm_t *)&s->world[i++], NULL, NCCL_SHRINK_ABORT));
    }
    NC(cu_api.ncclGroupEnd());
  }
  NC(cu_api.ncclGroupStart());
  for (int r = 0; r < W; r++) {
    if (!dead[r] && c->world[r]) {
      CU(cu_api.cudaSetDevice(c->dev[r]));
      NC(cu_api.ncclCommAbort(c->world[r]));
      s->aborted++;
    }
    c->world[r] = NULL;
  }
  NC(cu_api.ncclGroupEnd());
  if (!s->shrunk) NC(cu_api.ncclCommInitAll((ncclComm_t *)s->world, s->n, s->devices));
  free(excl);
  return 0;
fail:
  free(excl);
  ntp_cuda_survivors_free(s);
  return -1;
}

int ntp_cuda_survivors_order(ntp_cuda *c, ntp_cuda_survivors *s, int world, const int32_t *from, char *err, size_t cap) {
  int n = s->n, idle = 0;
  int *key = malloc((size_t)n * sizeof *key), *dev = calloc((size_t)world + 1, sizeof *dev);
  void **nw = calloc((size_t)world + 1, sizeof *nw), **none = calloc((size_t)n, sizeof *none); /* the idle's */
  if (!key || !dev || !nw || !none) {
    snprintf(err, cap, "out of memory");
    goto fail;
  }
  for (int i = 0; i < n; i++) key[i] = -1;
  for (int r = 0; r < world; r++) key[from[r]] = r, dev[r] = s->devices[from[r]];
  if (s->local >= 0) { /* this process's survivor alone; the others split theirs in their processes */
    int me = s->local, k = key[me];
    CU(cu_api.cudaSetDevice(s->devices[me]));
    ncclComm_t got = NULL;
    c->settling = &got; /* non-blocking as its parent: settled alone */
    NC(cu_api.ncclCommSplit((ncclComm_t)s->world[me], k >= 0 ? 0 : NCCL_SPLIT_NOCOLOR, k >= 0 ? k : 0, &got, NULL));
    c->settling = NULL;
    if (k >= 0) nw[k] = got;
    for (int r = 0; r < world; r++) dev[r] = s->devices[me];
    idle = k < 0;
    s->local = k;
  } else {
    NC(cu_api.ncclGroupStart()); /* every survivor's GPU from this thread: one group */
    for (int i = 0; i < n; i++) {
      CU(cu_api.cudaSetDevice(s->devices[i]));
      ncclComm_t *out = (ncclComm_t *)(key[i] >= 0 ? &nw[key[i]] : &none[i]);
      NC(cu_api.ncclCommSplit((ncclComm_t)s->world[i], key[i] >= 0 ? 0 : NCCL_SPLIT_NOCOLOR, key[i] >= 0 ? key[i] : 0,
                              out, NULL));
    }
    NC(cu_api.ncclGroupEnd());
  }
  NC(cu_api.ncclGroupStart()); /* the shrunk world let go */
  for (int i = 0; i < n; i++)
    if (s->world[i]) {
      CU(cu_api.cudaSetDevice(s->devices[i]));
      NC(cu_api.ncclCommDestroy((ncclComm_t)s->world[i]));
      s->world[i] = NULL;
    }
  NC(cu_api.ncclGroupEnd());
  free(s->world), free(s->devices), free(key), free(none);
  s->world = nw, s->devices = dev, s->n = world;
  return idle;
fail:
  c->settling = NULL;
  free(key), free(dev), free(nw), free(none);
  return -1;
}

void ntp_cuda_survivors_free(ntp_cuda_survivors *s) {
  if (s->world && cu_api.nccl) cu_api.ncclGroupStart(); /* several GPUs' communicators from one thread: one group */
  for (int i = 0; s->world && i < s->n; i++)
    if (s->world[i]) cu_api.ncclCommDestroy((ncclComm_t)s->world[i]);
  if (s->world && cu_api.nccl) cu_api.ncclGroupEnd();
  free(s->devices);
  free(s->world);
  memset(s, 0, sizeof *s);
}

/* A failed GPU's streams, handles, modules and communicators are never released: any call would
 * touch the dead device (on real hardware it may hang). They stay here, reachable for the
 * process's life, abandoned on purpose (a leak checker sees them as such, not as lost). */
static pthread_mutex_t abandoned_lock = PTHREAD_MUTEX_INITIALIZER;
static void **abandoned;
static size_t n_abandoned, abandoned_cap;

void cu_abandon(void *handle) {
  if (!handle) return;
  pthread_mutex_lock(&abandoned_lock);
  if (n_abandoned == abandoned_cap) {
    size_t cap = abandoned_cap ? 2 * abandoned_cap : 64;
    void **a = realloc(abandoned, cap * sizeof *a);
    if (a) abandoned = a, abandoned_cap = cap;
  }
  if (n_abandoned < abandoned_cap) abandoned[n_abandoned++] = handle;
  pthread_mutex_unlock(&abandoned_lock);
}
