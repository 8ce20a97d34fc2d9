/* world.c — the NCCL world: its unique id shared through a file (a process per rank) or one
 * ncclCommInitAll (every rank in this process), non-blocking communicators, and one communicator
 * per distinct rank set of the program's reductions (ncclCommSplit). */
#include "cuda_internal.h"

/* A unique id through a file: the first rank creates it and writes it to `path` (a temporary file
 * renamed into place); the others wait for it, up to two minutes. */
int cu_share_id(const char *path, bool first, ncclUniqueId *id, char *err, size_t cap) {
  ntp_cuda *c = NULL; /* no communicator for NC to settle: ncclGetUniqueId is not a communicator's call */
  if (first) {
    NC(cu_api.ncclGetUniqueId(id));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      snprintf(err, cap, "cannot write the NCCL id to %s", path);
      return -1;
    }
    return 0;
  }
  bool got = false;
  for (int tries = 0; tries < 1200 && !got; tries++) { /* up to 2 minutes for the first rank */
    FILE *f = fopen(path, "rb");
    got = f && fread(id, sizeof *id, 1, f) == 1;
    if (f) fclose(f);
    if (!got) nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
  if (!got) {
    snprintf(err, cap, "no NCCL id appeared in %s", path);
    return -1;
  }
  return 0;
fail:
  return -1;
}

/* The world communicator: given, created for all ranks of this process, or (one rank per
 * process) joined through a unique id that rank 0 writes to $NTP_NCCL_ID_FILE. */
int cu_nccl_world(ntp_cuda *c, const ntp_cuda_options *o, char *err, size_t cap) {
  int W = c->p->world;
  if (o->nccl_comm) {
    c->world[c->rank_lo] = (ncclComm_t)o->nccl_comm;
    return 0;
  }
  c->own_world = true;
  if (o->nccl_world) return 0; /* taken in ntp_cuda_create */
  if (c->rank_lo == 0 && c->rank_hi == W) {
    NC(cu_api.ncclCommInitAll(c->world, W, c->dev));
    return 0;
  }
  const char *path = getenv("NTP_NCCL_ID_FILE");
  if (!path || c->rank_hi - c->rank_lo != 1) {
    snprintf(err, cap, "one rank per process needs NTP_NCCL_ID_FILE (a path every process can read) or a communicator");
    return -1;
  }
  ncclUniqueId id;
  int r = c->rank_lo;
  if (cu_share_id(path, r == 0, &id, err, cap) != 0) return -1;
  CU(cu_api.cudaSetDevice(c->dev[r]));
  if (c->nonblocking) { /* its calls return at once; settle() polls them to their end */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NC(cu_api.ncclCommInitRankConfig(&c->world[r], W, id, r, &config));
  } else {
    NC(cu_api.ncclCommInitRank(&c->world[r], W, id, r));
  }
  return 0;
fail:
  return -1;
}

/* One communicator per distinct set of ranks that reduces together (ncclCommSplit). */
int cu_nccl_groups(ntp_cuda *c, char *err, size_t cap) {
  const ntp_program *p = c->p;
  c->step_set = calloc(p->n_steps + 1, sizeof *c->step_set);
  c->sets = calloc(p->n_steps + 1, sizeof *c->sets);
  c->set_len = calloc(p->n_steps + 1, sizeof *c->set_len);
  c->group = calloc((size_t)p->world, sizeof *c->group);
  if (!c->step_set || !c->sets || !c->set_len || !c->group) return -1;
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind != SH_COMM || (st->comm != COMM_ALL_REDUCE && st->comm != COMM_REDUCE_SCATTER)) continue;
    if (!cu_symmetric_reduction(p, st)) { /* summed by send/recv: no communicator of its own */
      c->step_set[s] = -1;
      continue;
    }
    int k = 0;
    for (; k < c->nsets; k++)
      if (c->set_len[k] == st->nranks && !memcmp(c->sets[k], st->ranks, (size_t)st->nranks * sizeof(int32_t))) break;
    if (k == c->nsets) {
      c->sets[k] = st->ranks;
      c->set_len[k] = st->nranks;
      c->nsets++;
    }
    c->step_set[s] = k;
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++) c->group[r] = calloc((size_t)c->nsets + 1, sizeof(ncclComm_t));
  for (int k = 0; k < c->nsets; k++) {
    NC(cu_api.ncclGroupStart());
    for (int r = c->rank_lo; r < c->rank_hi; r++) {
      bool member = false;
      for (int i = 0; i < c->set_len[k]; i++) member |= c->sets[k][i] == r;
      CU(cu_api.cudaSetDevice(c->dev[r]));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = c->nonblocking ? 0 : 1;
      NC(cu_api.ncclCommSplit(c->world[r], member ? k : NCCL_SPLIT_NOCOLOR, r, &c->group[r][k], &config));
    }
    NC(cu_api.ncclGroupEnd());
  }
  return 0;
fail:
  return -1;
}
