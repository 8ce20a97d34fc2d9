/* grow.c — after a repair: the world communicator grown by the repaired GPUs' ranks (NCCL 2.29's
 * ncclCommGrow) rather than made again, the state staying where it is (ntp_cuda_grow,
 * cuda_backend.h). */
#include "cuda_internal.h"

/* Why the world cannot grow here (NULL: it can): the library, the setting, the layout. */
static const char *cannot_grow(const ntp_cuda *c, int world, const int *from) {
  const char *no = getenv("NTP_NCCL_NO_GROW");
  if (!c->nccl) return "no NCCL world (loopback)";
  if (!cu_api.ncclCommGrow || !cu_api.ncclCommGetUniqueId) return "libnccl has no ncclCommGrow (NCCL 2.29)";
  if (no && !strcmp(no, "1")) return "NTP_NCCL_NO_GROW=1";
  if (c->rank_lo != 0 || c->rank_hi != c->p->world) return "one rank per process";
  int W = c->p->world, kept = 0;
  for (int r = 0; r < world; r++) kept += from[r] >= 0 && from[r] < W;
  return kept == W && world > W ? NULL : "the next world does not keep every rank";
}

int ntp_cuda_grow(ntp_cuda *c, int world, const int *from, const int *devices, ntp_cuda_survivors *s, char *err,
                  size_t cap) {
  memset(s, 0, sizeof *s);
  s->local = -1;
  if ((s->how = cannot_grow(c, world, from))) return 1;
  int W = c->p->world, nn = 0;
  ncclComm_t *grown = calloc((size_t)world, sizeof *grown);
  int *key = calloc((size_t)world, sizeof *key), *gdev = calloc((size_t)world, sizeof *gdev);
  s->devices = calloc((size_t)world, sizeof *s->devices);
  s->world = calloc((size_t)world, sizeof *s->world);
  if (!grown || !key || !gdev || !s->devices || !s->world) {
    snprintf(err, cap, "out of memory");
    goto fail;
  }
  /* grown rank g: c's rank g (g < W), then the newcomers in the next program's order */
  for (int r = 0; r < world; r++) {
    int g = from[r] >= 0 ? from[r] : W + nn++;
    key[g] = r, gdev[g] = devices[r], s->devices[r] = devices[r];
    /* the replacement GPU inspected before anything runs on it: the compiled kernels are c's */
    if (from[r] < 0) {
      int arch = cu_compute_capability(devices[r], err, cap);
      if (arch < 0) goto fail;
      if (arch != c->arch) {
        snprintf(err, cap, "the repaired GPU %d is sm_%d, the others sm_%d", devices[r], arch, c->arch);
        goto fail;
      }
    }
  }
  /* NCCL: the parent has no operation outstanding when it grows (else the grow may deadlock) */
  if (cu_wait_streams(c, err, cap) != 0) goto fail;
  ncclUniqueId id;
  CU(cu_api.cudaSetDevice(c->dev[0]));
  NC(cu_api.ncclCommGetUniqueId(c->world[0], &id));
  NC(cu_api.ncclGroupStart()); /* one thread, every rank: one group (NCCL's guide) */
  for (int g = 0; g < world; g++) {
    CU(cu_api.cudaSetDevice(gdev[g]));
    if (g < W) NC(cu_api.ncclCommGrow(c->world[g], world, g ? NULL : &id, -1, &grown[g], NULL));
    else NC(cu_api.ncclCommGrow(NULL, world, &id, g, &grown[g], NULL));
  }
  NC(cu_api.ncclGroupEnd());
  bool ordered = true;
  for (int g = 0; g < world; g++) ordered &= key[g] == g;
  if (ordered) { /* the newcomers are the last ranks: the grown world is the next program's */
    for (int g = 0; g < world; g++) s->world[g] = grown[g], grown[g] = NULL;
  } else { /* into the next program's rank order, then the grown one let go */
    NC(cu_api.ncclGroupStart());
    for (int g = 0; g < world; g++) {
      CU(cu_api.cudaSetDevice(gdev[g]));
      NC(cu_api.ncclCommSplit(grown[g], 0, key[g], (ncclComm_t *)&s->world[key[g]], NULL));
    }
    NC(cu_api.ncclGroupEnd());
    NC(cu_api.ncclGroupStart());
    for (int g = 0; g < world; g++) {
      CU(cu_api.cudaSetDevice(gdev[g]));
      NC(cu_api.ncclCommDestroy(grown[g]));
      grown[g] = NULL;
    }
    NC(cu_api.ncclGroupEnd());
  }
  s->n = world, s->how = ordered ? "ncclCommGrow" : "ncclCommGrow, then ncclCommSplit into the plan's rank order";
  free(grown), free(key), free(gdev);
  return 0;
fail: /* what was made before the failing call is let go (aborted: it may be half made) */
  for (int g = 0; grown && gdev && g < world; g++)
    if (grown[g]) cu_api.cudaSetDevice(gdev[g]), cu_api.ncclCommAbort(grown[g]);
  for (int r = 0; s->world && s->devices && r < world; r++)
    if (s->world[r]) cu_api.cudaSetDevice(s->devices[r]), cu_api.ncclCommAbort((ncclComm_t)s->world[r]), s->world[r] = NULL;
  free(grown), free(key), free(gdev);
  ntp_cuda_survivors_free(s);
  return -1;
}
