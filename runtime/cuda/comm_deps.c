/* comm_deps.c — the bytes of every launch and collective, and the compute steps that wait for
 * each collective (comm_deps.h). */
#include "comm_deps.h"

#include <stdlib.h>

bool ntp_step_inits(const ntp_step *st) {
  return st->kind == SH_COMPUTE && (st->op.code == IR_PARAM || st->op.code == IR_INPUT);
}

bool ntp_comm_takes_part(const ntp_program *p, size_t s, int r) {
  const ntp_step *st = &p->steps[s];
  for (int i = 0; i < st->nranks; i++)
    if (st->ranks[i] == r) return true;
  for (size_t x = 0; x < st->nxfers; x++)
    if (p->tensors[st->xfers[x].src].rank == r || p->tensors[st->xfers[x].dst].rank == r) return true;
  return false;
}

bool ntp_step_launches(const ntp_program *p, size_t s) {
  const ntp_step *st = &p->steps[s];
  if (st->kind != SH_COMPUTE || ntp_step_inits(st)) return false;
  cg_step_kind k = p->cuda[st->rank].steps[s].kind;
  return k == CG_KERNEL || k == CG_GEMM || k == CG_ATTENTION_GEMM;
}

typedef struct spans {
  ntp_span *v;
  size_t n, cap;
  bool oom;
} spans;

static void add(const ntp_program *p, spans *b, int32_t t, bool write) {
  if (t < 0 || (size_t)t >= p->n_tensors || b->oom) return;
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 256;
    ntp_span *v = realloc(b->v, cap * sizeof *v);
    if (!v) {
      b->oom = true;
      return;
    }
    b->v = v, b->cap = cap;
  }
  const ntp_tensor *s = &p->tensors[t];
  int64_t bytes = box_volume(&s->box) * (int64_t)dtype_bytes(s->dtype);
  b->v[b->n++] = (ntp_span){s->rank, s->persistent, write, s->offset, s->offset + bytes};
}

/* step s's own op: its operands read, its result written, and a GEMM's other tensors */
static void op_spans(const ntp_program *p, size_t s, spans *b) {
  const ntp_step *st = &p->steps[s];
  const cg_step *g = &p->cuda[st->rank].steps[s];
  for (int a = 0; a < st->op.nargs; a++) add(p, b, st->op.args[a], false);
  add(p, b, st->op.result, true);
  if (g->kind != CG_GEMM) return;
  add(p, b, g->out, true);
  add(p, b, g->bias, g->epilogue != CG_EPI_BIAS && g->epilogue != CG_EPI_GELU_BIAS); /* a bias gradient is written */
  add(p, b, g->aux, false);
  /* a GEMM moved to a later step (an epilogue's: DGELU at its act_grad) reads its matmul's operands */
  if (g->mm >= 0 && (size_t)g->mm != s)
    for (int a = 0; a < p->steps[g->mm].op.nargs; a++) add(p, b, p->steps[g->mm].op.args[a], false);
}

/* ... and those of the steps fused into its launch: the rank's CG_FUSED steps up to its next
 * launch (fusion looks past the initialisation steps, which run before everything: so does this) */
static void launch_spans(const ntp_program *p, size_t s, spans *b) {
  op_spans(p, s, b);
  int32_t r = p->steps[s].rank;
  for (size_t f = s + 1; f < p->n_steps; f++) {
    const ntp_step *st = &p->steps[f];
    if (st->kind != SH_COMPUTE || st->rank != r || ntp_step_inits(st)) continue;
    cg_step_kind k = p->cuda[r].steps[f].kind;
    if (k == CG_KERNEL || k == CG_GEMM || k == CG_ATTENTION_GEMM) break;
    if (k == CG_FUSED) op_spans(p, f, b);
  }
}

int ntp_footprints_build(const ntp_program *p, ntp_footprints *f) {
  spans b = {0};
  f->span = NULL;
  if (!(f->start = calloc(p->n_steps + 1, sizeof *f->start))) return -1;
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    f->start[s] = b.n;
    if (st->kind == SH_COMM)
      for (size_t x = 0; x < st->nxfers; x++) add(p, &b, st->xfers[x].src, false), add(p, &b, st->xfers[x].dst, true);
    else if (ntp_step_launches(p, s))
      launch_spans(p, s, &b);
  }
  f->start[p->n_steps] = b.n;
  f->span = b.v;
  if (b.oom) {
    ntp_footprints_free(f);
    return -1;
  }
  return 0;
}

void ntp_footprints_free(ntp_footprints *f) {
  free(f->start);
  free(f->span);
  f->start = NULL;
  f->span = NULL;
}

static bool overlap(const ntp_span *a, const ntp_span *b) {
  return a->rank == b->rank && a->persistent == b->persistent && a->lo < b->hi && b->lo < a->hi && a->lo < a->hi;
}

/* a span of a and one of b in common, where (writes) one of the two is written */
static bool common(const ntp_footprints *f, size_t a, size_t b, bool writes) {
  for (size_t i = f->start[a]; i < f->start[a + 1]; i++)
    for (size_t j = f->start[b]; j < f->start[b + 1]; j++)
      if ((!writes || f->span[i].write || f->span[j].write) && overlap(&f->span[i], &f->span[j])) return true;
  return false;
}

bool ntp_footprints_touch(const ntp_footprints *f, size_t a, size_t b) { return common(f, a, b, false); }
bool ntp_footprints_conflict(const ntp_footprints *f, size_t a, size_t b) { return common(f, a, b, true); }

int ntp_comm_deps_build(const ntp_program *p, const ntp_footprints *f, const int32_t *order, size_t n,
                        ntp_comm_deps *d) {
  size_t S = p->n_steps;
  int W = p->world;
  if (!order) n = S;
#define AT(k) ((size_t)(order ? order[k] : (int32_t)(k)))
  d->wait = NULL;
  d->start = calloc(S + 1, sizeof *d->start);
  int32_t *first = malloc(((size_t)W * S + 1) * sizeof *first); /* [comm step][rank]: its first toucher, or -1 */
  int32_t *fill = calloc(S + 1, sizeof *fill);
  size_t count = 0;
  if (!d->start || !first || !fill) goto oom;
  for (size_t i = 0; i < (size_t)W * S; i++) first[i] = -1;
  for (size_t k = 0; k < n; k++) {
    size_t s = AT(k);
    if (p->steps[s].kind != SH_COMM) continue;
    for (size_t q = k + 1; q < n; q++) { /* per rank, its first launch enqueued after it that touches it */
      size_t j = AT(q);
      if (!ntp_step_launches(p, j)) continue;
      int32_t r = p->steps[j].rank;
      if (first[s * (size_t)W + (size_t)r] >= 0 || !ntp_footprints_touch(f, j, s)) continue;
      first[s * (size_t)W + (size_t)r] = (int32_t)j;
      count++;
    }
  }
  if (!(d->wait = malloc((count + 1) * sizeof *d->wait))) goto oom;
  for (size_t s = 0; s < S; s++) /* counts per waiting step, then prefix sums */
    for (int r = 0; r < W; r++)
      if (first[s * (size_t)W + (size_t)r] >= 0) d->start[first[s * (size_t)W + (size_t)r] + 1]++;
  for (size_t j = 0; j < S; j++) d->start[j + 1] += d->start[j];
  for (size_t k = 0; k < n; k++) { /* in enqueue order, so each list is in the order of the collectives */
    size_t s = AT(k);
    if (p->steps[s].kind != SH_COMM) continue;
    for (int r = 0; r < W; r++) {
      int32_t j = first[s * (size_t)W + (size_t)r];
      if (j >= 0) d->wait[d->start[j] + fill[j]++] = (int32_t)s;
    }
  }
#undef AT
  free(fill);
  free(first);
  return 0;
oom:
  free(fill);
  free(first);
  ntp_comm_deps_free(d);
  return -1;
}

void ntp_comm_deps_free(ntp_comm_deps *d) {
  free(d->start);
  free(d->wait);
  d->start = NULL;
  d->wait = NULL;
}
