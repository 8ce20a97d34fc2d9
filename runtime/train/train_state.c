/* train_state.c — a trainer's state files (ntp_trainer_save_state, ntp_trainer_load_state): the fp32
 * masters and AdamW's moments, written by slices where the ranks hold them and read back by each
 * slice's own box, so a checkpoint moves between placements. */
#include "train_internal.h"

/* The owned elements of slice s (its state in bufs: host memory) into the file, by runs of
 * elements contiguous in the global layout. */
static bool write_owned(ntp_st_writer *w, const ntp_trainer *t, const tslice *s, float *const bufs[3]) {
  box_walk bw = box_walk_start(&s->box, &t->p[s->param].cur.shape);
  int64_t run_e = 0, run_g = 0, len = 0;
  bool ok = true;
  for (int64_t e = 0; e <= s->n && ok; e++) {
    int64_t gi = e < s->n ? box_walk_next(&bw) : -1;
    if (e < s->n && s->own[e] && len > 0 && gi == run_g + len) {
      len++;
      continue;
    }
    for (int k = 0; k < 3 && len > 0 && ok; k++)
      ok = ntp_st_writer_put(w, 3 * (size_t)s->param + (size_t)k, run_g, bufs[k] + run_e, len) == 0;
    len = 0;
    if (e < s->n && s->own[e]) run_e = e, run_g = gi, len = 1;
  }
  return ok;
}

/* A sharded run's state file: every rank writes the elements it owns of its slices, the ranks in
 * parallel (the simulation's; a CUDA rank's state comes down from its GPU first), and the host
 * the elements no rank holds; nothing is gathered. */
static int save_slices(ntp_trainer *t, const char *path, const ntp_host_tensor *ts, char *err, size_t cap) {
  ntp_st_writer *w;
  if (ntp_st_writer_open(path, ts, 3 * t->np, &w, err, cap) != 0) return -1;
  bool ok = true;
  for (size_t i = 0; i < t->np && ok; i++) {
    const tparam *p = &t->p[i];
    const float *g[3] = {p->master, p->m, p->v};
    for (int64_t j = 0; j < p->nunheld && ok; j++)
      for (int k = 0; k < 3 && ok; k++) ok = ntp_st_writer_put(w, 3 * i + (size_t)k, p->unheld[j], &g[k][p->unheld[j]], 1) == 0;
  }
  float *tmp = ntp_train_slice_buffer(t, err, cap), *tmp2 = ntp_train_slice_buffer(t, err, cap), *tmp3 = ntp_train_slice_buffer(t, err, cap);
  ok &= tmp && tmp2 && tmp3;
  for (size_t i = 0; i < t->nsl && ok; i++) {
    const tslice *s = &t->sl[i];
    float *bufs[3] = {tmp, tmp2, tmp3}, *src[3] = {s->master, s->m, s->v};
    for (int k = 0; k < 3 && ok; k++) ok = EXEC(t, get, s->rank, bufs[k], src[k], (size_t)s->n * sizeof(float), err, cap) == 0;
    ok = ok && write_owned(w, t, s, bufs);
  }
  free(tmp);
  free(tmp2);
  free(tmp3);
  if (!ok && !err[0]) snprintf(err, cap, "cannot write '%s'", path);
  return ntp_st_writer_commit(w, ok, err, cap);
}

/* A sharded run's state from a file: each slice reads its own box (what this placement needs),
 * the host the parameters some element of which no rank holds. */
static int load_slices(ntp_trainer *t, const ntp_safetensors *f, char *err, size_t cap) {
  const char *pre[3] = {"", "adamw.m.", "adamw.v."};
  char name[512];
  for (size_t i = 0; i < t->np; i++) {
    tparam *p = &t->p[i];
    if (!p->nunheld) continue;
    float *bufs[3] = {p->master, p->m, p->v};
    ntp_box full = box_full(&p->cur.shape);
    for (int k = 0; k < 3; k++) {
      snprintf(name, sizeof name, "%s%s", pre[k], p->cur.name);
      if (ntp_safetensors_read_box(f, name, NTP_FP32, &p->cur.shape, &full, bufs[k], err, cap) != 0) return -1;
    }
  }
  float *tmp = ntp_train_slice_buffer(t, err, cap);
  if (!tmp) return -1;
  for (size_t i = 0; i < t->nsl; i++) {
    tslice *s = &t->sl[i];
    const tparam *p = &t->p[s->param];
    float *dst[3] = {s->master, s->m, s->v};
    if (!s->here) continue;
    for (int k = 2; k >= 0; k--) { /* the master last: tmp then holds it */
      snprintf(name, sizeof name, "%s%s", pre[k], p->cur.name);
      if (ntp_safetensors_read_box(f, name, NTP_FP32, &p->cur.shape, &s->box, tmp, err, cap) != 0 ||
          EXEC(t, put, s->rank, dst[k], tmp, (size_t)s->n * sizeof(float), err, cap) != 0) {
        free(tmp);
        return -1;
      }
    }
    if (EXEC(t, tensor_put, s->tensor, tmp, err, cap) != 0) {
      free(tmp);
      return -1;
    }
  }
  free(tmp);
  t->stale = true; /* the global copies are gathered from the slices when asked for */
  return 0;
}

int ntp_trainer_save_state(ntp_trainer *t, const char *path, char *err, size_t cap) {
  bool sharded = t->exec != NULL;
  ntp_host_tensor *ts = calloc(3 * t->np + 1, sizeof *ts);
  char **names = calloc(3 * t->np + 1, sizeof *names);
  int rc = -1;
  if (!ts || !names) {
    snprintf(err, cap, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < t->np; i++) {
    const tparam *p = &t->p[i];
    float *bufs[3] = {p->master, p->m, p->v};
    const char *pre[3] = {"", "adamw.m.", "adamw.v."};
    for (int k = 0; k < 3; k++) {
      size_t n = strlen(pre[k]) + strlen(p->cur.name) + 1;
      if (!(names[3 * i + k] = malloc(n))) {
        snprintf(err, cap, "out of memory");
        goto done;
      }
      snprintf(names[3 * i + k], n, "%s%s", pre[k], p->cur.name);
      ts[3 * i + k] = (ntp_host_tensor){.name = names[3 * i + k], .dtype = NTP_FP32, .shape = p->cur.shape, .f = bufs[k]};
    }
  }
  err[0] = 0;
  if (per_process(t)) /* every process gathers (through NCCL); rank 0's writes the whole file */
    rc = ntp_train_gather(t, err, cap) != 0 ? -1
         : !ntp_trainer_writes(t)       ? 0
                                        : ntp_safetensors_save(path, ts, 3 * t->np, err, cap);
  else
    rc = sharded ? save_slices(t, path, ts, err, cap) : ntp_safetensors_save(path, ts, 3 * t->np, err, cap);
done:
  for (size_t i = 0; names && i < 3 * t->np; i++) free(names[i]);
  free(names);
  free(ts);
  return rc;
}

int ntp_trainer_load_state(ntp_trainer *t, const ntp_safetensors *f, int64_t steps_taken, char *err, size_t cap) {
  if (t->exec) {
    t->step = steps_taken;
    return load_slices(t, f, err, cap);
  }
  for (size_t i = 0; i < t->np; i++) {
    tparam *p = &t->p[i];
    float *bufs[3] = {p->master, p->m, p->v};
    const char *pre[3] = {"", "adamw.m.", "adamw.v."};
    ntp_box full = box_full(&p->cur.shape);
    for (int k = 0; k < 3; k++) {
      char name[512];
      snprintf(name, sizeof name, "%s%s", pre[k], p->cur.name);
      if (ntp_safetensors_read_box(f, name, NTP_FP32, &p->cur.shape, &full, bufs[k], err, cap) != 0) return -1;
    }
    memcpy(p->cur.f, p->master, (size_t)p->n * sizeof *p->cur.f);
    ntp_round_buf(p->cur.f, (size_t)p->n, mode_of(p->cur.dtype));
  }
  t->step = steps_taken;
  return 0;
}
