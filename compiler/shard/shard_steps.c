/* shard_steps.c — the sharded program's steps as the lowering emits them: tensors and the
 * pieces of global values they hold, compute steps, and transfers. Whenever a rank needs a box
 * of a value that it does not hold, `ensure` finds it by slice intersection with the pieces that
 * exist and queues the transfers; consecutive needs are flushed as one communication step per
 * connected set of ranks, named after the collective its pattern matches. */
#include <stdlib.h>
#include <string.h>

#include "geometry.h"
#include "shard_lowering.h"

void lw_error(lower *L, const char *msg, const char *arg) {
  if (!L->failed) {
    char buf[256];
    snprintf(buf, sizeof buf, msg, arg);
    diag_emit(L->diags, NTPC_ERROR, L->m->file, L->loc, "internal compiler error while sharding: %s", buf);
  }
  L->failed = true;
}

/* ---- tensors and pieces ---------------------------------------------------- */

static int32_t new_tensor(lower *L, int32_t rank, int32_t global, ntp_box box, ntp_dtype dt, const char *name) {
  sh_program *p = L->p;
  sh_tensor t = {.rank = rank, .global = global, .box = box, .dtype = dt, .name = name, .init_value = -1,
                 .def = -1, .last_use = -1, .mb = L->mb};
  VEC_PUSH(p->tensors, p->n_tensors, p->cap_tensors, t);
  return (int32_t)p->n_tensors - 1;
}

static void add_piece(lower *L, int32_t v, int32_t t) {
  sh_program *p = L->p;
  VEC_PUSH(p->pieces[v], p->npieces[v], p->cap_pieces[v], t);
}

void shard_add_home(lower *L, int32_t v, int32_t t) {
  VEC_PUSH(L->home[v], L->nhome[v], L->chome[v], t);
  add_piece(L, v, t);
}

static int32_t find_piece(lower *L, int32_t v, int32_t rank, const ntp_box *box) {
  sh_program *p = L->p;
  for (size_t i = 0; i < p->npieces[v]; i++) {
    const sh_tensor *t = &p->tensors[p->pieces[v][i]];
    if (t->rank == rank && box_eq(&t->box, box)) return p->pieces[v][i];
  }
  return -1;
}

static ntp_box temp_box(ntp_shape s) { return box_full(&s); }

/* ---- steps ----------------------------------------------------------------- */

static int32_t push_step(lower *L, sh_step st) {
  sh_program *p = L->p;
  st.layer = L->layer;
  st.loc = L->loc;
  st.mb = L->mb;
  st.phase = L->phase;
  st.at_layer = L->at_layer;
  VEC_PUSH(p->steps, p->n_steps, p->cap_steps, st);
  return (int32_t)p->n_steps - 1;
}

static void use(lower *L, int32_t t, int32_t step) {
  if (L->p->tensors[t].last_use < step) L->p->tensors[t].last_use = step;
}

int32_t lw_compute(lower *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs, const ir_op *attrs,
                   int32_t global, ntp_box box, ntp_dtype dt, const char *name) {
  /* queued transfers wait (and batch into bigger collectives) until an operand needs them */
  for (int i = 0; i < nargs; i++)
    if (L->p->tensors[args[i]].def < 0) lw_flush(L);
  int32_t t = new_tensor(L, rank, global, box, dt, name);
  sh_step st = {.kind = SH_COMPUTE, .rank = rank};
  if (attrs) st.op.attr = attrs->attr;
  st.op.code = code;
  st.op.nargs = nargs;
  for (int i = 0; i < nargs; i++) st.op.args[i] = args[i];
  st.op.result = t;
  st.op.layer = L->layer;
  st.op.loc = L->loc;
  int32_t s = push_step(L, st);
  L->p->tensors[t].def = s;
  for (int i = 0; i < nargs; i++) use(L, args[i], s);
  return t;
}

/* A temporary inside a layer: no global value, its box is its own shape. */
int32_t shard_temp(lower *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs, const ir_op *attrs,
                    ntp_shape shape, ntp_dtype dt) {
  return lw_compute(L, rank, code, args, nargs, attrs, -1, temp_box(shape), dt, NULL);
}

/* For the loss (shard_internal.h): an empty temporary, and a temporary with a given box. */
int32_t shard_new_temp(lower *L, int32_t rank, ntp_box box, ntp_dtype dt) { return new_tensor(L, rank, -1, box, dt, NULL); }

int32_t shard_temp_box(lower *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs, const ir_op *attrs,
                       ntp_box box, ntp_dtype dt) {
  return lw_compute(L, rank, code, args, nargs, attrs, -1, box, dt, NULL);
}

/* Inputs, params and constants are never moved: any rank reads the slice it needs. */
bool lw_is_source(lower *L, int32_t v) {
  ir_opcode c = vdef(L, v)->code;
  if (c == IR_INPUT || c == IR_PARAM || c == IR_CONST) return true;
  return c == IR_SLICE && vdef(L, vdef(L, v)->args[0])->code == IR_PARAM;
}

int32_t lw_materialize(lower *L, int32_t v, int32_t rank, ntp_box box) {
  const ir_op *op = vdef(L, v);
  int32_t src = v;
  ntp_box sbox = box;
  if (op->code == IR_SLICE) { /* a slice of a parameter is that parameter's box, shifted */
    src = op->args[0];
    sbox.lo[op->attr.slice.axis] += op->attr.slice.start;
    sbox.hi[op->attr.slice.axis] += op->attr.slice.start;
    op = vdef(L, src);
  }
  int32_t mb = L->mb;
  L->mb = -1; /* read once, whatever micro-batch asks first */
  int32_t t = lw_compute(L, rank, op->code, NULL, 0, op, v, box, vdtype(L, v), L->m->values[src].name);
  L->mb = mb;
  sh_tensor *ts = &L->p->tensors[t];
  ts->persistent = op->code != IR_CONST;
  ts->init_value = src;
  ts->init_box = sbox;
  add_piece(L, v, t);
  return t;
}

/* What ensure's cells are served from: the ready pieces as rank boxes, their tensors beside. */
typedef struct serve_ctx {
  lower *L;
  const int32_t *tensor; /* [k]: the tensor of source k */
  int32_t dst;
  bool failed;
} serve_ctx;

static void serve_cell(void *vc, int k, const ntp_box *cell) {
  serve_ctx *c = vc;
  lower *L = c->L;
  if (c->failed) return;
  if (k < 0) {
    char buf[128];
    lw_error(L, "no rank holds %s of a value", box_str(cell, buf, sizeof buf));
    c->failed = true;
    return;
  }
  int32_t src = c->tensor[k];
  int nd = cell->ndim;
  /* merge with the previous transfer when it continues it along the last dim */
  sh_xfer *prev = L->npend ? &L->pend[L->npend - 1] : NULL;
  bool merged = false;
  if (prev && prev->src == src && prev->dst == c->dst && nd > 0 && prev->box.hi[nd - 1] == cell->lo[nd - 1]) {
    merged = true;
    for (int d = 0; d < nd - 1; d++) merged &= prev->box.lo[d] == cell->lo[d] && prev->box.hi[d] == cell->hi[d];
    if (merged) prev->box.hi[nd - 1] = cell->hi[nd - 1];
  }
  if (!merged) {
    sh_xfer x = {src, c->dst, *cell};
    VEC_PUSH(L->pend, L->npend, L->cpend, x);
  }
}

/* A tensor on `rank` holding box `need` of v: one that exists, a slice of a source, or a new one
 * whose cells the geometry's rule serves (geom_serve: the rank itself first, then the nearest);
 * the transfers are queued for the next flush. */
int32_t shard_ensure(lower *L, int32_t v, int32_t rank, ntp_box need) {
  int32_t have = find_piece(L, v, rank, &need);
  if (have >= 0) return have;
  if (lw_is_source(L, v)) return lw_materialize(L, v, rank, need);
  sh_program *p = L->p;
  int32_t dst = new_tensor(L, rank, v, need, vdtype(L, v), L->m->values[v].name);
  /* the ready pieces (those queued in this same batch are not sources yet) */
  rank_box *srcs = malloc((p->npieces[v] + 1) * sizeof *srcs);
  int32_t *tensor = malloc((p->npieces[v] + 1) * sizeof *tensor);
  int ns = 0;
  for (size_t i = 0; srcs && tensor && i < p->npieces[v]; i++) {
    const sh_tensor *t = &p->tensors[p->pieces[v][i]];
    if (t->def < 0) continue;
    srcs[ns] = (rank_box){t->rank, t->box};
    tensor[ns++] = p->pieces[v][i];
  }
  serve_ctx c = {L, tensor, dst, false};
  if (!srcs || !tensor || !geom_serve(srcs, ns, rank, &need, serve_cell, &c)) lw_error(L, "out of memory%s", "");
  free(srcs);
  free(tensor);
  if (c.failed) return dst;
  add_piece(L, v, dst);
  return dst;
}

/* ---- communication steps ----------------------------------------------------- */

static int cmp_i32(const void *a, const void *b) { return (*(const int32_t *)a > *(const int32_t *)b) - (*(const int32_t *)a < *(const int32_t *)b); }

/* A comm step over the given transfers; ranks = every rank that sends or receives. */
static void emit_comm(lower *L, sh_comm_kind kind, sh_xfer *xf, size_t n, int64_t elems, const char *why) {
  sh_program *p = L->p;
  sh_step st = {.kind = SH_COMM, .comm = kind, .elems = elems, .why = why};
  int32_t *ranks = arena_alloc(&p->pool, 2 * n * sizeof *ranks + sizeof *ranks);
  int nr = 0;
  for (size_t i = 0; i < n; i++) {
    ranks[nr++] = p->tensors[xf[i].src].rank;
    ranks[nr++] = p->tensors[xf[i].dst].rank;
  }
  qsort(ranks, (size_t)nr, sizeof *ranks, cmp_i32);
  int u = 0;
  for (int i = 0; i < nr; i++)
    if (u == 0 || ranks[i] != ranks[u - 1]) ranks[u++] = ranks[i];
  st.ranks = ranks;
  st.nranks = u;
  st.xfers = arena_alloc(&p->pool, n * sizeof *st.xfers + 1);
  memcpy(st.xfers, xf, n * sizeof *xf);
  st.nxfers = n;
  st.bytes_out = arena_alloc(&p->pool, (size_t)u * sizeof(int64_t));
  st.bytes_in = arena_alloc(&p->pool, (size_t)u * sizeof(int64_t));
  int32_t s = push_step(L, st);
  for (size_t i = 0; i < n; i++) {
    use(L, xf[i].src, s);
    p->tensors[xf[i].dst].def = s;
  }
}

/* ---- for the sharded backward (shard_grad.c) ----------------------------------------- */

sh_program *shard_lowering_program(shard_lowering *L) { return L->p; }

int32_t shard_backward_compute(shard_lowering *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs,
                               const ntp_op_attr *attr, ntp_box box, ntp_dtype dt, int32_t layer, ntp_loc loc) {
  ir_op a = {0};
  if (attr) a.attr = *attr;
  L->layer = layer;
  L->loc = loc;
  return lw_compute(L, rank, code, args, nargs, &a, -1, box, dt, NULL);
}

void shard_backward_comm(shard_lowering *L, sh_comm_kind kind, sh_xfer *xf, size_t n, const char *why) {
  if (!n) return;
  lw_flush(L);
  emit_comm(L, kind, xf, n, 0, why);
  sh_step *st = &L->p->steps[L->p->n_steps - 1];
  for (size_t i = 0; i < n; i++) { /* what crosses between ranks */
    const sh_tensor *s = &L->p->tensors[xf[i].src], *d = &L->p->tensors[xf[i].dst];
    int64_t v = box_volume(&xf[i].box);
    st->elems += v;
    if (s->rank == d->rank) continue;
    for (int k = 0; k < st->nranks; k++) {
      if (st->ranks[k] == s->rank) st->bytes_out[k] += v * (int64_t)dtype_bytes(s->dtype);
      if (st->ranks[k] == d->rank) st->bytes_in[k] += v * (int64_t)dtype_bytes(s->dtype);
    }
  }
}

void shard_backward_piece(shard_lowering *L, int32_t v, int32_t t) { add_piece(L, v, t); }

static int rank_slot(const sh_step *st, int32_t rank) {
  for (int i = 0; i < st->nranks; i++)
    if (st->ranks[i] == rank) return i;
  return -1;
}

/* Names a batch of transfers after the collective it amounts to, and counts bytes. */
static void classify_copies(lower *L, sh_step *st) {
  sh_program *p = L->p;
  bool cross = false;
  for (size_t i = 0; i < st->nxfers; i++) {
    const sh_tensor *s = &p->tensors[st->xfers[i].src], *d = &p->tensors[st->xfers[i].dst];
    if (s->rank == d->rank) continue;
    cross = true;
    int64_t b = box_volume(&st->xfers[i].box) * (int64_t)dtype_bytes(s->dtype);
    st->bytes_out[rank_slot(st, s->rank)] += b;
    st->bytes_in[rank_slot(st, d->rank)] += b;
  }
  if (!cross) {
    st->comm = COMM_LOCAL_COPY;
    return;
  }
  /* all-gather: every member ends with the same box, assembled from every other member */
  bool same_box = true, everyone = true;
  const sh_tensor *first = NULL;
  int n = st->nranks;
  bool *pair = calloc((size_t)n * (size_t)n, 1);
  for (size_t i = 0; i < st->nxfers; i++) {
    const sh_tensor *s = &p->tensors[st->xfers[i].src], *d = &p->tensors[st->xfers[i].dst];
    if (!first) first = d;
    same_box &= box_eq(&d->box, &first->box) && d->global == first->global;
    if (pair && s->rank != d->rank) pair[rank_slot(st, s->rank) * n + rank_slot(st, d->rank)] = 1;
  }
  for (int a = 0; pair && a < n; a++)
    for (int b = 0; b < n; b++)
      if (a != b && !pair[a * n + b]) everyone = false;
  free(pair);
  if (same_box && everyone) {
    st->comm = COMM_ALL_GATHER;
    st->elems = box_volume(&first->box);
  } else if (everyone && n > 2) {
    st->comm = COMM_ALL_TO_ALL;
  } else {
    st->comm = COMM_SEND_RECV;
  }
  if (st->comm != COMM_ALL_GATHER) {
    st->elems = 0;
    for (size_t i = 0; i < st->nxfers; i++)
      if (p->tensors[st->xfers[i].src].rank != p->tensors[st->xfers[i].dst].rank) st->elems += box_volume(&st->xfers[i].box);
  }
}

/* One step per connected set of ranks, so that independent groups read as separate collectives. */
void lw_flush(lower *L) {
  if (!L->npend) return;
  sh_program *p = L->p;
  size_t n = L->npend;
  sh_xfer *xf = L->pend;
  L->pend = NULL;
  L->npend = L->cpend = 0;
  int32_t W = L->W, *parent = malloc((size_t)W * sizeof *parent);
  for (int32_t r = 0; r < W; r++) parent[r] = r;
#define FIND(x) ({ int32_t r_ = (x); while (parent[r_] != r_) r_ = parent[r_] = parent[parent[r_]]; r_; })
  for (size_t i = 0; i < n; i++) {
    int32_t a = FIND(p->tensors[xf[i].src].rank), b = FIND(p->tensors[xf[i].dst].rank);
    if (a != b) parent[a] = b;
  }
  bool *done = calloc(n, 1);
  sh_xfer *part = malloc(n * sizeof *part);
  for (size_t i = 0; i < n; i++) {
    if (done[i]) continue;
    int32_t root = FIND(p->tensors[xf[i].dst].rank);
    size_t k = 0;
    for (size_t j = i; j < n; j++)
      if (!done[j] && FIND(p->tensors[xf[j].dst].rank) == root) {
        part[k++] = xf[j];
        done[j] = 1;
      }
    emit_comm(L, COMM_SEND_RECV, part, k, 0, L->why);
    classify_copies(L, &p->steps[p->n_steps - 1]);
  }
#undef FIND
  free(done);
  free(part);
  free(parent);
  free(xf);
}

/* Sums the partial tensors parts[0..n) (one box, one per rank) and leaves out_boxes[i] of
 * the sum on the rank of parts[i], as pieces of `global` (or temporaries when -1). */
void lw_reduce(lower *L, const int32_t *parts, int n, const ntp_box *out_boxes, int32_t global, int32_t *outs,
               const char *why) {
  lw_flush(L);
  sh_program *p = L->p;
  /* copies: new_tensor below may move the tensor table */
  const ntp_box in_box = p->tensors[parts[0]].box;
  const ntp_dtype dt = p->tensors[parts[0]].dtype;
  bool scatter = false;
  for (int i = 0; i < n; i++) scatter |= !box_eq(&out_boxes[i], &in_box);
  sh_xfer *xf = malloc((size_t)n * (size_t)n * sizeof *xf);
  size_t k = 0;
  for (int i = 0; i < n; i++) {
    outs[i] = new_tensor(L, p->tensors[parts[i]].rank, global, out_boxes[i], dt,
                         global >= 0 ? L->m->values[global].name : NULL);
    for (int j = 0; j < n; j++) xf[k++] = (sh_xfer){parts[j], outs[i], out_boxes[i]};
  }
  int64_t elems = box_volume(&in_box);
  emit_comm(L, scatter ? COMM_REDUCE_SCATTER : COMM_ALL_REDUCE, xf, k, elems, why);
  free(xf);
  sh_step *st = &p->steps[p->n_steps - 1];
  /* ring algorithms: all-reduce moves 2(n-1)/n of the tensor per rank, reduce-scatter (n-1)/n */
  int64_t bytes = elems * (int64_t)dtype_bytes(dt) * (n - 1) / n * (scatter ? 1 : 2);
  for (int i = 0; i < st->nranks; i++) st->bytes_out[i] = st->bytes_in[i] = bytes;
}
