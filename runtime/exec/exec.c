/* exec.c — the table of backends (exec.h) and the one place that picks one by name: a new backend
 * is a row here. Also what every caller may ask of an executor without knowing which it is. */
#include "exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ntp_exec_backend *const backends[] = {&ntp_exec_sim_backend, &ntp_exec_cuda_backend};
enum { N_BACKENDS = sizeof backends / sizeof backends[0] };

const ntp_exec_backend *ntp_exec_backend_find(const char *name, char *err, size_t cap) {
  if (!name) name = "cpu";
  for (int i = 0; i < N_BACKENDS; i++)
    if (strcmp(backends[i]->name, name) == 0) return backends[i];
  /* "expected cpu or cuda": the names as a list, from the table */
  int n = snprintf(err, cap, "unknown backend '%s' (expected ", name);
  for (int i = 0; i < N_BACKENDS && n >= 0 && (size_t)n < cap; i++)
    n += snprintf(err + n, cap - (size_t)n, "%s%s", backends[i]->name,
                  i + 2 < N_BACKENDS ? ", " : i + 2 == N_BACKENDS ? " or " : ")");
  return NULL;
}

const ntp_exec_backend *ntp_exec_backend_at(size_t i) { return i < N_BACKENDS ? backends[i] : NULL; }

int ntp_exec_new(const ntp_program *p, const ntp_exec_options *o, ntp_exec **out, char *err, size_t cap) {
  static const ntp_exec_options defaults = {0};
  *out = NULL;
  if (!o) o = &defaults;
  const ntp_exec_backend *b = ntp_exec_backend_find(o->backend, err, cap);
  if (!b) return -1;
  if (p->world < 1 && !b->runs_unsharded) return 0; /* the CPU reference runs it */
  ntp_exec *e = calloc(1, sizeof *e);
  if (!e) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  e->ops = b->ops;
  if (b->create(p, o, &e->be, err, cap) != 0) {
    free(e);
    return -1;
  }
  *out = e;
  return 0;
}

void ntp_exec_free(ntp_exec *e) {
  if (!e) return;
  e->ops->free(e->be);
  free(e);
}

/* The survivors are counted here for every backend; the reference (no executor: a failure needs a
 * sharded run, which the callers ask for first) has nothing else to let go. */
int ntp_exec_lose(ntp_exec *e, const bool *lost, int32_t world, ntp_exec_survivors *s, char *err, size_t cap) {
  *s = (ntp_exec_survivors){.local = -1};
  for (int32_t r = 0; r < world; r++) s->n += !lost[r];
  return e ? e->ops->lose(e->be, lost, s, err, cap) : 0;
}

int ntp_exec_survivors_order(ntp_exec *e, ntp_exec_survivors *s, int32_t world, const int32_t *from, char *err,
                             size_t cap) {
  bool same = world == s->n;
  for (int32_t r = 0; r < world; r++) {
    if (from[r] < 0 || from[r] >= s->n) return snprintf(err, cap, "internal: rank %d from survivor %d of %d", r, from[r], s->n), -1;
    same &= from[r] == r;
  }
  int rc = same || !e || !e->ops->order ? 0 : e->ops->order(e->be, s, world, from, err, cap);
  if (rc == 0) s->n = world;
  return rc;
}

int ntp_exec_grow(ntp_exec *e, int32_t world, const int32_t *from, const int *devices, ntp_exec_survivors *s,
                  char *err, size_t cap) {
  *s = (ntp_exec_survivors){.local = -1, .n = world};
  if (!e || !e->ops->grow) return 1; /* nothing to grow: the next executor makes its ranks */
  return e->ops->grow(e->be, world, from, devices, s, err, cap);
}

void ntp_exec_survivors_free(ntp_exec_survivors *s) {
  if (s->release) s->release(s);
  s->release = NULL;
  s->held = NULL;
}

bool ntp_exec_peer_lost(ntp_exec *e) { return e && e->ops->peer_lost(e->be); }

void ntp_exec_describe(ntp_exec *e, char *buf, size_t cap) {
  if (cap) buf[0] = 0;
  if (e) e->ops->describe(e->be, buf, cap);
}

const char *ntp_exec_name(const ntp_exec *e) { return e ? e->ops->name : "cpu"; }

int ntp_launcher_rank(int *rank, int *device) {
  static const char *ranks[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"};
  static const char *locals[] = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"};
  for (int i = 0; i < 3; i++) {
    const char *r = getenv(ranks[i]);
    if (!r) continue;
    *rank = atoi(r);
    const char *l = getenv(locals[i]);
    *device = l ? atoi(l) : 0;
    return 0;
  }
  return -1;
}
