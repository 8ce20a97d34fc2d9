/* comm_deps.c — the compute steps that wait for each collective (comm_deps.h). */
#include "comm_deps.h"

#include <stdlib.h>

/* bytes [lo, hi) of one rank's arena or parameter block */
typedef struct span {
  int32_t rank;
  bool persistent;
  int64_t lo, hi;
} span;

static span tensor_span(const ntp_program *p, int32_t t) {
  const ntp_tensor *s = &p->tensors[t];
  int64_t bytes = box_volume(&s->box) * (int64_t)dtype_bytes(s->dtype);
  return (span){s->rank, s->persistent, s->offset, s->offset + bytes};
}

static bool overlap(span a, span b) {
  return a.rank == b.rank && a.persistent == b.persistent && a.lo < b.hi && b.lo < a.hi && a.lo < a.hi;
}

static bool launches(const ntp_program *p, size_t s) {
  const ntp_step *st = &p->steps[s];
  if (st->kind != SH_COMPUTE || st->op.code == IR_PARAM || st->op.code == IR_INPUT) return false;
  cg_step_kind k = p->cuda[st->rank].steps[s].kind;
  return k == CG_KERNEL || k == CG_GEMM || k == CG_ATTENTION_GEMM;
}

/* does step s's own op touch any of the collective's spans? */
static bool op_touches(const ntp_program *p, size_t s, const span *cs, size_t n) {
  const ntp_step *st = &p->steps[s];
  const cg_step *g = &p->cuda[st->rank].steps[s];
  int32_t ts[2 * NTP_MAX_ARGS + 4];
  int nt = 0;
  for (int a = 0; a < st->op.nargs; a++) ts[nt++] = st->op.args[a];
  ts[nt++] = st->op.result;
  if (g->kind == CG_GEMM) {
    ts[nt++] = g->out, ts[nt++] = g->bias, ts[nt++] = g->aux;
    /* a GEMM moved to a later step (an epilogue's: DGELU at its act_grad) reads its matmul's operands */
    if (g->mm >= 0 && (size_t)g->mm != s)
      for (int a = 0; a < p->steps[g->mm].op.nargs; a++) ts[nt++] = p->steps[g->mm].op.args[a];
  }
  for (int i = 0; i < nt; i++) {
    if (ts[i] < 0 || (size_t)ts[i] >= p->n_tensors) continue;
    span t = tensor_span(p, ts[i]);
    for (size_t k = 0; k < n; k++)
      if (overlap(t, cs[k])) return true;
  }
  return false;
}

/* ... or of the steps fused into its launch */
static bool launch_touches(const ntp_program *p, size_t s, const span *cs, size_t n) {
  if (op_touches(p, s, cs, n)) return true;
  int32_t r = p->steps[s].rank;
  for (size_t f = s + 1; f < p->n_steps; f++) {
    const ntp_step *st = &p->steps[f];
    if (st->kind != SH_COMPUTE || st->rank != r) continue;
    cg_step_kind k = p->cuda[r].steps[f].kind;
    if (k == CG_KERNEL || k == CG_GEMM || k == CG_ATTENTION_GEMM) break;
    if (k == CG_FUSED && op_touches(p, f, cs, n)) return true;
  }
  return false;
}

int ntp_comm_deps_build(const ntp_program *p, ntp_comm_deps *d) {
  size_t S = p->n_steps;
  int W = p->world;
  d->start = calloc(S + 1, sizeof *d->start);
  int32_t *first = malloc(((size_t)W * S + 1) * sizeof *first); /* [comm step][rank]: its first toucher, or -1 */
  span *cs = NULL;
  size_t count = 0;
  if (!d->start || !first) goto oom;
  for (size_t s = 0; s < S; s++) {
    for (int r = 0; r < W; r++) first[s * (size_t)W + (size_t)r] = -1;
    const ntp_step *st = &p->steps[s];
    if (st->kind != SH_COMM) continue;
    free(cs);
    if (!(cs = malloc((2 * st->nxfers + 1) * sizeof *cs))) goto oom;
    size_t n = 0;
    for (size_t x = 0; x < st->nxfers; x++) {
      cs[n++] = tensor_span(p, st->xfers[x].src);
      cs[n++] = tensor_span(p, st->xfers[x].dst);
    }
    for (size_t j = s + 1; j < S; j++) { /* per rank, its first launch that touches them */
      if (!launches(p, j)) continue;
      int32_t r = p->steps[j].rank;
      if (first[s * (size_t)W + (size_t)r] >= 0 || !launch_touches(p, j, cs, n)) continue;
      first[s * (size_t)W + (size_t)r] = (int32_t)j;
      count++;
    }
  }
  if (!(d->wait = malloc((count + 1) * sizeof *d->wait))) goto oom;
  for (size_t s = 0; s < S; s++) /* counts per waiting step, then prefix sums */
    for (int r = 0; r < W; r++)
      if (first[s * (size_t)W + (size_t)r] >= 0) d->start[first[s * (size_t)W + (size_t)r] + 1]++;
  for (size_t j = 0; j < S; j++) d->start[j + 1] += d->start[j];
  int32_t *fill = calloc(S + 1, sizeof *fill);
  if (!fill) goto oom;
  for (size_t s = 0; s < S; s++) /* in step order, so each list is ascending */
    for (int r = 0; r < W; r++) {
      int32_t j = first[s * (size_t)W + (size_t)r];
      if (j >= 0) d->wait[d->start[j] + fill[j]++] = (int32_t)s;
    }
  free(fill);
  free(first);
  free(cs);
  return 0;
oom:
  free(first);
  free(cs);
  ntp_comm_deps_free(d);
  return -1;
}

void ntp_comm_deps_free(ntp_comm_deps *d) {
  free(d->start);
  free(d->wait);
  d->start = NULL;
  d->wait = NULL;
}
