/* shard.c — lowers the global IR to the sharded program.
 *
 * Each global value is held as pieces: tensors on ranks, each holding a box of it.
 * Layers of a kind with a `shard` rule (compiler/layers/) are lowered by their kind inside
 * each of their groups, Megatron style, with the kit in shard_lower.h; every other op "follows" the pieces of its latest operand and
 * computes locally. Whenever a rank needs a box of a value that it does not hold,
 * `ensure` finds it by slice intersection with the pieces that exist and schedules the
 * transfers; consecutive needs are flushed as one communication step per connected set
 * of ranks, named after the collective its pattern matches.
 */
#include <stdlib.h>
#include <string.h>

#include "shard.h"
#include "shard_internal.h"
#include "geometry.h"
#include "shard_lower.h"

struct shard_lowering {
  sh_program *p;
  const ir_module *m;
  diag_sink *diags;
  int32_t W;
  int32_t **home; /* per global value: the pieces it was computed as (what followers follow) */
  size_t *nhome, *chome;
  sh_xfer *pend; /* transfers waiting for the next flush */
  size_t npend, cpend;
  int32_t layer;
  ntp_loc loc;
  const char *why;
  ntp_layout *lay; /* explicit layout of each value, where layouts apply */
  bool use_layouts;
  int32_t mesh; /* the mesh layouts live on */
  bool failed;
};
typedef struct shard_lowering lower;


static void internal_error(lower *L, const char *msg, const char *arg) {
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
                 .def = -1, .last_use = -1};
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
static ntp_shape vshape(lower *L, int32_t v) { return L->m->values[v].shape; }
static ntp_dtype vdtype(lower *L, int32_t v) { return L->m->values[v].dtype; }
static const ir_op *vdef(lower *L, int32_t v) { return &L->m->ops[L->m->values[v].def]; }

/* ---- steps ----------------------------------------------------------------- */

static int32_t push_step(lower *L, sh_step st) {
  sh_program *p = L->p;
  st.layer = L->layer;
  st.loc = L->loc;
  VEC_PUSH(p->steps, p->n_steps, p->cap_steps, st);
  return (int32_t)p->n_steps - 1;
}

static void use(lower *L, int32_t t, int32_t step) {
  if (L->p->tensors[t].last_use < step) L->p->tensors[t].last_use = step;
}

static void flush(lower *L);

static int32_t compute(lower *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs, const ir_op *attrs,
                       int32_t global, ntp_box box, ntp_dtype dt, const char *name) {
  /* queued transfers wait (and batch into bigger collectives) until an operand needs them */
  for (int i = 0; i < nargs; i++)
    if (L->p->tensors[args[i]].def < 0) flush(L);
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
  return compute(L, rank, code, args, nargs, attrs, -1, temp_box(shape), dt, NULL);
}

/* Inputs, params and constants are never moved: any rank reads the slice it needs. */
static bool is_source(lower *L, int32_t v) {
  ir_opcode c = vdef(L, v)->code;
  if (c == IR_INPUT || c == IR_PARAM || c == IR_CONST) return true;
  return c == IR_SLICE && vdef(L, vdef(L, v)->args[0])->code == IR_PARAM;
}

static int32_t materialize(lower *L, int32_t v, int32_t rank, ntp_box box) {
  const ir_op *op = vdef(L, v);
  int32_t src = v;
  ntp_box sbox = box;
  if (op->code == IR_SLICE) { /* a slice of a parameter is that parameter's box, shifted */
    src = op->args[0];
    sbox.lo[op->attr.slice.axis] += op->attr.slice.start;
    sbox.hi[op->attr.slice.axis] += op->attr.slice.start;
    op = vdef(L, src);
  }
  int32_t t = compute(L, rank, op->code, NULL, 0, op, v, box, vdtype(L, v), L->m->values[src].name);
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
    internal_error(L, "no rank holds %s of a value", box_str(cell, buf, sizeof buf));
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
  if (is_source(L, v)) return materialize(L, v, rank, need);
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
  if (!srcs || !tensor || !geom_serve(srcs, ns, rank, &need, serve_cell, &c)) internal_error(L, "out of memory%s", "");
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
  return compute(L, rank, code, args, nargs, &a, -1, box, dt, NULL);
}

void shard_backward_comm(shard_lowering *L, sh_comm_kind kind, sh_xfer *xf, size_t n, const char *why) {
  if (!n) return;
  flush(L);
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
static void flush(lower *L) {
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
static void reduce(lower *L, const int32_t *parts, int n, const ntp_box *out_boxes, int32_t global, int32_t *outs,
                   const char *why) {
  flush(L);
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

/* ---- explicit layouts on a mesh --------------------------------------------------- */

static void mesh_coords(const ir_mesh *mesh, int32_t rank, int64_t *c) {
  for (int k = mesh->ndims - 1; k >= 0; k--) {
    c[k] = rank % mesh->size[k];
    rank /= (int32_t)mesh->size[k];
  }
}

static ntp_box layout_box(lower *L, const ntp_layout *lay, ntp_shape shape, int32_t rank) {
  ntp_box b = box_full(&shape);
  if (lay->mesh < 0) return b;
  const ir_mesh *mesh = &L->m->meshes[lay->mesh];
  int64_t c[NTP_MAX_MESH_DIMS];
  mesh_coords(mesh, rank, c);
  int64_t part[NTP_MAX_RANK], parts[NTP_MAX_RANK];
  for (int d = 0; d < shape.ndim; d++) {
    part[d] = 0;
    parts[d] = 1;
    for (int k = 0; k < mesh->ndims; k++)
      if (lay->axes[d] & (1u << k)) {
        part[d] = part[d] * mesh->size[k] + c[k];
        parts[d] *= mesh->size[k];
      }
  }
  if (lay->diagonal && shape.ndim == 2) part[1] = ((part[1] - part[0]) % parts[1] + parts[1]) % parts[1];
  for (int d = 0; d < shape.ndim; d++) split_range(shape.dim[d], parts[d], part[d], &b.lo[d], &b.hi[d]);
  return b;
}

/* ---- following: an op computed where its latest operand lives ------------------------ */

/* Where a value is, or would be: its home pieces; its layout; else rows split over all ranks. */
static size_t where(lower *L, int32_t v, rank_box *out) {
  size_t n = 0;
  for (size_t i = 0; i < L->nhome[v]; i++) {
    const sh_tensor *t = &L->p->tensors[L->home[v][i]];
    out[n++] = (rank_box){t->rank, t->box};
  }
  if (n) return n;
  ntp_shape s = vshape(L, v);
  if (L->use_layouts && L->lay[v].mesh >= 0) {
    for (int32_t r = 0; r < L->W; r++) out[n++] = (rank_box){r, layout_box(L, &L->lay[v], s, r)};
    return n;
  }
  return box_default_split(s, L->W, out);
}

size_t shard_homes(lower *L, int32_t v, rank_box *out) { return L->nhome[v] ? where(L, v, out) : 0; }

int32_t shard_new_temp(lower *L, int32_t rank, ntp_box box, ntp_dtype dt) { return new_tensor(L, rank, -1, box, dt, NULL); }

int32_t shard_temp_box(lower *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs, const ir_op *attrs,
                       ntp_box box, ntp_dtype dt) {
  return compute(L, rank, code, args, nargs, attrs, -1, box, dt, NULL);
}

static void follow(lower *L, const ir_op *op) {
  int32_t r = op->result;
  ntp_shape rs = vshape(L, r);
  int32_t a = geom_followed_operand(L->m, op);
  rank_box *rb = malloc((size_t)(L->W * 4 + 4) * sizeof *rb);
  size_t n = where(L, a >= 0 ? a : r, rb);
  /* two passes: every piece's operands first (one batch of transfers), then the computes */
  int32_t(*argv)[NTP_MAX_ARGS] = malloc((n + 1) * sizeof *argv);
  ntp_box *resv = malloc((n + 1) * sizeof *resv);
  for (int pass = 0; pass < 2; pass++)
  for (size_t i = 0; i < n; i++) {
    ntp_box box = rb[i].box;
    bool dup = false; /* rb may list a piece twice when a redistribution made copies */
    for (size_t j = 0; j < i; j++) dup |= rb[j].rank == rb[i].rank && box_eq(&rb[j].box, &box);
    if (dup) continue;
    int32_t rank = rb[i].rank, *args = argv[i];
    if (pass == 1) {
      int32_t t = compute(L, rank, op->code, args, op->nargs, op, r, resv[i], vdtype(L, r), L->m->values[r].name);
      shard_add_home(L, r, t);
      continue;
    }
    ntp_box res = geom_result_piece(op->code, box, rs);
    for (int j = 0; j < op->nargs; j++)
      args[j] = shard_ensure(L, op->args[j], rank, geom_operand_need(op->code, j, res, vshape(L, op->args[j])));
    resv[i] = res;
  }
  if (a >= 0 && L->use_layouts) L->lay[r] = L->lay[a];
  free(argv);
  free(resv);
  free(rb);
}

/* ---- explicit-layout matmul: the sharded-matmul rules ----------------------------------- */

static void note(lower *L, const char *fmt, const char *a, const char *b) {
  char buf[512];
  snprintf(buf, sizeof buf, fmt, a, b);
  char *s = arena_printf(&L->p->pool, "%d:%d: %s", L->loc.first_line, L->loc.first_column, buf);
  VEC_PUSH(L->p->notes, L->p->n_notes, L->p->cap_notes, s);
}

static const char *axes_str(lower *L, uint8_t mask) {
  const ir_mesh *mesh = &L->m->meshes[L->mesh];
  char buf[64] = "";
  for (int k = 0; k < mesh->ndims; k++)
    if (mask & (1u << k)) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", buf[0] ? "," : "", mesh->axis[k]);
  return arena_strdup(&L->p->pool, buf);
}

static void layout_matmul(lower *L, const ir_op *op) {
  int32_t av = op->args[0], bv = op->args[1], r = op->result;
  ntp_shape as = vshape(L, av), bs = vshape(L, bv), rs = vshape(L, r);
  ntp_layout la = L->lay[av], lb = L->lay[bv];
  if (la.mesh < 0) la = (ntp_layout){.mesh = L->mesh};
  if (lb.mesh < 0 || bs.ndim != 2) lb = (ntp_layout){.mesh = L->mesh}; /* batched right operands: whole */
  la.diagonal = lb.diagonal = false; /* skewed blocks are first moved to plain blocks */
  int ka = as.ndim - 1, ma = as.ndim - 2;
  uint8_t kA = la.axes[ka], kB = lb.axes[0], mA = ma >= 0 ? la.axes[ma] : 0, nB = lb.axes[1];
  const char *rule;
  if (kA && kB && kA == kB && !((mA | nB) & kA)) {
    rule = "contracting dim sharded over %s on both sides: local partial sums, all-reduce over %s";
  } else {
    if (kA && kB) rule = "contracting dims sharded over different axes (%s, %s): gather both";
    else if (kA) rule = "contracting dim of the left operand sharded over %s%s: gather it";
    else if (kB) rule = "contracting dim of the right operand sharded over %s%s: gather it";
    else rule = "no contracting dim sharded%s%s: local, no communication";
    la.axes[ka] = lb.axes[0] = 0;
    kA = kB = 0;
  }
  if (mA & nB) { /* both output dims on one axis: each rank would hold a diagonal block only */
    lb.axes[1] = nB = 0;
    note(L, "M and N both sharded over %s%s: gather the right operand's N", axes_str(L, mA & L->lay[bv].axes[1]), "");
  }
  if (kA) note(L, rule, axes_str(L, kA), axes_str(L, kA));
  else if (L->lay[av].axes[ka] && L->lay[bv].axes[0]) note(L, rule, axes_str(L, L->lay[av].axes[ka]), axes_str(L, L->lay[bv].axes[0]));
  else if (L->lay[av].axes[ka]) note(L, rule, axes_str(L, L->lay[av].axes[ka]), "");
  else if (bs.ndim == 2 && L->lay[bv].axes[0]) note(L, rule, axes_str(L, L->lay[bv].axes[0]), "");
  else note(L, rule, "", "");

  ntp_layout lr = la;
  lr.axes[rs.ndim - 1] = nB;
  int32_t parts[1024], outs[1024];
  ntp_box out_boxes[1024];
  int np = 0;
  for (int32_t rank = 0; rank < L->W; rank++) {
    ntp_box ab = layout_box(L, &la, as, rank), bb = layout_box(L, &lb, bs, rank);
    int32_t args[2] = {shard_ensure(L, av, rank, ab), shard_ensure(L, bv, rank, bb)};
    ntp_box res = ab;
    res.lo[rs.ndim - 1] = bb.lo[bb.ndim - 1];
    res.hi[rs.ndim - 1] = bb.hi[bb.ndim - 1];
    if (!kA) {
      shard_add_home(L, r, compute(L, rank, IR_MATMUL, args, 2, op, r, res, vdtype(L, r), L->m->values[r].name));
    } else if (np < 1024) {
      parts[np] = shard_temp(L, rank, IR_MATMUL, args, 2, op, box_shape(&res), vdtype(L, r));
      L->p->tensors[parts[np]].box = res; /* a partial sum of this box */
      out_boxes[np++] = res;
    }
  }
  if (kA) {
    /* ranks that differ only in the contracting axes hold summands of the same block */
    const ir_mesh *mesh = &L->m->meshes[L->mesh];
    bool *done = calloc((size_t)np, 1);
    for (int i = 0; i < np; i++) {
      if (done[i]) continue;
      int32_t gp[1024], gi[1024];
      ntp_box gb[1024];
      int n = 0;
      int64_t ci[NTP_MAX_MESH_DIMS], cj[NTP_MAX_MESH_DIMS];
      mesh_coords(mesh, L->p->tensors[parts[i]].rank, ci);
      for (int j = i; j < np; j++) {
        mesh_coords(mesh, L->p->tensors[parts[j]].rank, cj);
        bool same = true;
        for (int k = 0; k < mesh->ndims; k++) same &= (kA & (1u << k)) || ci[k] == cj[k];
        if (same && !done[j]) {
          done[j] = 1;
          gi[n] = j;
          gp[n] = parts[j];
          gb[n++] = out_boxes[j];
        }
      }
      reduce(L, gp, n, gb, r, outs, "explicit matmul: partial sums");
      for (int j = 0; j < n; j++) shard_add_home(L, r, outs[j]);
      (void)gi;
    }
    free(done);
  }
  L->lay[r] = lr;
  L->lay[r].diagonal = false;
}

/* ---- layers: the kit their kinds shard with (shard_lower.h), then one layer --------------- */

const ir_module *shard_module(const shard_lowering *L) { return L->m; }

ntp_box shard_rows_box(const shard_lowering *L, int32_t v, const shard_group *g) {
  return geom_group_piece(L->m->values[v].shape, g->b0, g->b1, g->whole, g->t, 0, false, false);
}

ntp_box shard_weight_box(const shard_lowering *L, int32_t w, int dim, int64_t lo, int64_t hi) {
  ntp_box b = box_full(&L->m->values[w].shape);
  b.lo[dim] = lo;
  b.hi[dim] = hi;
  return b;
}

ntp_box shard_tensor_box(const shard_lowering *L, int32_t t) { return L->p->tensors[t].box; }

static ntp_shape with_last(ntp_shape s, int64_t last) {
  s.dim[s.ndim - 1] = last;
  return s;
}

int32_t shard_compute(shard_lowering *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs,
                      const ir_op *attrs, int32_t global, ntp_box gbox, ntp_dtype dt) {
  return compute(L, rank, code, args, nargs, attrs, global, gbox, dt, L->m->values[global].name);
}

int32_t shard_col_linear(lower *L, int32_t rank, int32_t xt, int32_t w, int32_t b, int64_t lo, int64_t hi,
                         int32_t global, ntp_box gbox) {
  ir_op mm = {.attr.mm.trans_b = true};
  int32_t args[2] = {xt, shard_ensure(L, w, rank, shard_weight_box(L, w, 0, lo, hi))};
  ntp_shape s = with_last(box_shape(&L->p->tensors[xt].box), hi - lo);
  ntp_dtype dt = L->p->tensors[args[1]].dtype;
  int32_t y = global >= 0 && b < 0 ? compute(L, rank, IR_MATMUL, args, 2, &mm, global, gbox, dt, L->m->values[global].name)
                                   : shard_temp(L, rank, IR_MATMUL, args, 2, &mm, s, dt);
  if (b >= 0) {
    ntp_box bb = {.ndim = 1, .lo = {lo}, .hi = {hi}};
    int32_t a2[2] = {y, shard_ensure(L, b, rank, bb)};
    y = shard_temp(L, rank, IR_ADD, a2, 2, NULL, s, dt);
  }
  return y;
}

/* Row-parallel end of a layer: partial sums of the group's rows of g->core reduced inside the
 * group; with sequence parallelism each rank keeps a slice of the sequence (dim 1). */
void shard_group_reduce(lower *L, const shard_group *g, const int32_t *parts, const char *why) {
  int32_t value = g->core;
  ntp_box full = shard_rows_box(L, value, g);
  ntp_box boxes[NTP_MAX_GROUPS * 8];
  int32_t outs[NTP_MAX_GROUPS * 8];
  if (g->t == 1) {
    sh_tensor *t = &L->p->tensors[parts[0]];
    t->global = value;
    t->box = full;
    t->name = L->m->values[value].name;
    shard_add_home(L, value, parts[0]);
    return;
  }
  for (int i = 0; i < g->t; i++) {
    L->p->tensors[parts[i]].box = full; /* partial sums of this box of the value */
    boxes[i] = geom_group_piece(L->m->values[value].shape, g->b0, g->b1, g->whole, g->t, i, g->pl->seq_parallel, false);
  }
  reduce(L, parts, g->t, boxes, value, outs, why);
  for (int i = 0; i < g->t; i++) shard_add_home(L, value, outs[i]);
}

/* A layer's group size must leave every rank at least one unit of work. */
static bool check_degree(lower *L, const ir_layer *ly, const layer_dims *d, int t) {
  if (t <= d->units) return true;
  diag_emit(L->diags, NTPC_ERROR, L->m->file, ly->loc, "layer '%s' has %lld %s; it cannot be split over %d ranks",
            ly->name, (long long)d->units, layer_kind_of(ly)->unit_name, t);
  L->failed = true;
  return false;
}

static void lower_layer(lower *L, int32_t l) {
  const ir_layer *ly = &L->m->layers[l];
  const layer_kind *kind = layer_kind_of(ly);
  sh_placement *pl = &L->p->placements[l];
  int32_t x = ly->input, core = ly->core;
  if (x < 0 || core < 0) {
    internal_error(L, "layer '%s' has no recorded input or core", ly->name);
    return;
  }
  int32_t end = L->m->values[core].def;
  layer_dims d;
  layer_describe(L->m, ly, &d);
  ntp_shape xs = vshape(L, x);
  /* batch rows over the groups; a vector input has none (one group takes it, the others idle) */
  shard_split_rows(xs.ndim >= 2 ? xs.dim[0] : 1, pl->share, pl->ngroups, pl->row_start);
  L->why = arena_printf(&L->p->pool, "%s: input redistribution", ly->name);
  /* every group's input first, so the redistribution is one collective per set of ranks */
  for (int g = 0; g < pl->ngroups; g++) {
    shard_group gc = {.b0 = pl->row_start[g], .b1 = pl->row_start[g + 1], .whole = xs.ndim < 2};
    if (gc.b1 > gc.b0)
      for (int32_t r = pl->group_start[g]; r < pl->group_start[g + 1]; r++) shard_ensure(L, x, r, shard_rows_box(L, x, &gc));
  }
  for (int g = 0; g < pl->ngroups; g++) {
    shard_group gc = {ly, pl, g, pl->group_start[g], pl->group_start[g + 1] - pl->group_start[g], pl->row_start[g],
                      pl->row_start[g + 1], xs.ndim < 2, x, core, &d};
    if (gc.b1 == gc.b0) continue; /* a group without batch rows idles in this layer */
    if (!check_degree(L, ly, &d, gc.t)) return;
    if (pl->seq_parallel && gc.t > 1 && (xs.ndim < 2 || xs.dim[1] < gc.t)) {
      diag_emit(L->diags, NTPC_ERROR, L->m->file, ly->loc,
                "layer '%s': sequence parallelism over %d ranks needs at least %d sequence positions", ly->name, gc.t,
                gc.t);
      L->failed = true;
      return;
    }
    kind->shard(L, &gc);
    if (L->failed) return;
  }
  /* the rest of the layer (bias adds, position embeddings) follows the core's pieces */
  L->why = arena_printf(&L->p->pool, "%s: redistribution", ly->name);
  for (int32_t i = end + 1; i < ly->first_op + ly->nops; i++) {
    const ir_op *op = &L->m->ops[i];
    L->loc = op->loc;
    if (op->code != IR_PARAM && op->code != IR_SLICE) follow(L, op);
  }
}

/* ---- entry --------------------------------------------------------------------------- */

sh_program *shard_lower(const ir_module *m, int32_t world, const sh_placement *placements, diag_sink *diags) {
  sh_program *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->global = m;
  p->world = world;
  p->placements = calloc(m->n_layers + 1, sizeof *p->placements);
  if (!p->placements) {
    sh_program_free(p);
    return NULL;
  }
  memcpy(p->placements, placements, m->n_layers * sizeof *placements);
  size_t nv = m->n_values;
  p->pieces = calloc(nv, sizeof *p->pieces);
  p->npieces = calloc(nv, sizeof *p->npieces);
  p->cap_pieces = calloc(nv, sizeof *p->cap_pieces);
  lower L = {.p = p, .m = m, .diags = diags, .W = p->world, .layer = -1, .mesh = -1};
  L.home = calloc(nv, sizeof *L.home);
  L.nhome = calloc(nv, sizeof *L.nhome);
  L.chome = calloc(nv, sizeof *L.chome);
  L.lay = calloc(nv, sizeof *L.lay);
  for (size_t v = 0; v < nv; v++) L.lay[v] = m->values[v].layout;
  /* layouts apply when the world is the mesh (with one rank everything is whole) */
  for (size_t v = 0; v < nv; v++)
    if (m->values[v].layout.mesh >= 0) L.mesh = m->values[v].layout.mesh;
  for (size_t o = 0; o < m->n_outputs; o++)
    if (m->outputs[o].has_layout) L.mesh = m->outputs[o].layout.mesh;
  if (L.mesh >= 0 && p->world > 1) {
    const ir_mesh *mesh = &m->meshes[L.mesh];
    int64_t size = 1;
    for (int k = 0; k < mesh->ndims; k++) size *= mesh->size[k];
    if (size != p->world)
      diag_emit(diags, NTPC_ERROR, m->file, mesh->loc, "mesh '%s' has %lld ranks, but the world has %d; run it with --world %lld",
                mesh->name, (long long)size, p->world, (long long)size);
    else
      L.use_layouts = true;
  }
  if (!L.use_layouts)
    for (size_t v = 0; v < nv; v++) L.lay[v] = (ntp_layout){.mesh = -1};
  for (size_t v = 0; v < nv && L.use_layouts; v++) {
    const ir_value *val = &m->values[v];
    if (val->layout.mesh < 0) continue;
    const ir_mesh *mesh = &m->meshes[val->layout.mesh];
    for (int d = 0; d < val->shape.ndim; d++) {
      int64_t parts = 1;
      for (int k = 0; k < mesh->ndims; k++)
        if (val->layout.axes[d] & (1u << k)) parts *= mesh->size[k];
      if (val->shape.dim[d] < parts)
        diag_emit(diags, NTPC_ERROR, m->file, m->ops[val->def].loc,
                  "'%s': dim %d has %lld elements but is split over %lld ranks", val->name ? val->name : "value", d,
                  (long long)val->shape.dim[d], (long long)parts);
    }
  }

  size_t n_forward = m->n_forward_ops ? m->n_forward_ops : m->n_ops; /* training: the backward is derived below */
  for (size_t i = 0; i < n_forward && !L.failed && !diags->errors;) {
    const ir_op *op = &m->ops[i];
    L.layer = op->layer;
    L.loc = op->loc;
    if (op->layer >= 0 && layer_is_sharded(&m->layers[op->layer])) {
      lower_layer(&L, op->layer);
      i = (size_t)(m->layers[op->layer].first_op + m->layers[op->layer].nops);
      continue;
    }
    L.why = arena_printf(&p->pool, "%s: redistribution", op->layer >= 0 ? m->layers[op->layer].name : "model level");
    if (op->code == IR_MATMUL && L.use_layouts && (L.lay[op->args[0]].mesh >= 0 || L.lay[op->args[1]].mesh >= 0))
      layout_matmul(&L, op);
    else if (op->code == IR_CROSS_ENTROPY && shard_lower_loss(&L, op))
      ; /* vocabulary-parallel */
    else if (op->code != IR_INPUT && op->code != IR_PARAM && op->code != IR_CONST && op->code != IR_SLICE)
      follow(&L, op);
    i++;
  }
  /* outputs: requested layouts are produced; every piece of an output stays to the end */
  L.layer = -1;
  L.why = "requested output layout";
  for (size_t o = 0; o < m->n_outputs && !L.failed && !diags->errors; o++) {
    const ir_output *out = &m->outputs[o];
    if (out->has_layout && L.use_layouts)
      for (int32_t r = 0; r < p->world; r++) shard_ensure(&L, out->value, r, layout_box(&L, &out->layout, vshape(&L, out->value), r));
  }
  flush(&L);
  if (m->n_forward_ops && !L.failed && !diags->errors && !shard_backward(&L, diags)) L.failed = true;
  for (size_t o = 0; o < m->n_outputs; o++) {
    int32_t v = m->outputs[o].value;
    if (is_source(&L, v) && !p->npieces[v]) { /* an input or param returned as is */
      rank_box rb[1];
      ntp_shape s = vshape(&L, v);
      rb[0] = (rank_box){0, box_full(&s)};
      materialize(&L, v, 0, rb[0].box);
    }
    for (size_t i = 0; i < p->npieces[v]; i++) p->tensors[p->pieces[v][i]].last_use = (int32_t)p->n_steps;
  }
  for (size_t v = 0; v < nv; v++) free(L.home[v]);
  free(L.home);
  free(L.nhome);
  free(L.chome);
  free(L.lay);
  free(L.pend);
  if (L.failed || diags->errors) {
    sh_program_free(p);
    return NULL;
  }
  return p;
}

void sh_program_free(sh_program *p) {
  if (!p) return;
  if (p->pieces)
    for (size_t v = 0; v < p->global->n_values; v++) free(p->pieces[v]);
  free(p->pieces);
  free(p->npieces);
  free(p->cap_pieces);
  free(p->placements);
  free(p->tensors);
  free(p->steps);
  free(p->mem);
  free(p->notes);
  arena_free(&p->pool);
  free(p);
}

/* Every compute step obeys the op's shape rule on its local shapes; every transfer lies
 * inside both tensors. Run after lowering (the sharded program's verifier). */
bool sh_verify(const sh_program *p, char *err, size_t cap) {
  ir_module scratch = {0};
  ir_value vals[NTP_MAX_ARGS + 1];
  ir_op ops[NTP_MAX_ARGS + 1];
  scratch.values = vals;
  scratch.ops = ops;
  for (size_t s = 0; s < p->n_steps; s++) {
    const sh_step *st = &p->steps[s];
    if (st->kind == SH_COMM) {
      for (size_t x = 0; x < st->nxfers; x++) {
        const sh_xfer *xf = &st->xfers[x];
        if (!box_contains(&p->tensors[xf->src].box, &xf->box) || !box_contains(&p->tensors[xf->dst].box, &xf->box)) {
          snprintf(err, cap, "step %zu (%s): a transfer reaches outside its tensors", s, sh_comm_name(st->comm));
          return false;
        }
      }
      continue;
    }
    const ir_op *op = &st->op;
    if (op->code == IR_INPUT || op->code == IR_PARAM || op->code == IR_CONST) continue;
    const sh_tensor *out = &p->tensors[op->result];
    ir_op probe = *op;
    for (int a = 0; a < op->nargs; a++) {
      const sh_tensor *t = &p->tensors[op->args[a]];
      vals[a] = (ir_value){.shape = box_shape(&t->box), .dtype = t->dtype};
      probe.args[a] = a;
    }
    vals[op->nargs] = (ir_value){.shape = box_shape(&out->box), .dtype = out->dtype};
    probe.result = op->nargs;
    ntp_shape shape;
    ntp_dtype dt;
    char why[256];
    if (!ir_infer(&scratch, &probe, &shape, &dt, why, sizeof why)) {
      snprintf(err, cap, "step %zu (%s on rank %d): %s", s, ir_op_name(op->code), st->rank, why);
      return false;
    }
    ntp_shape want = box_shape(&out->box);
    if (!shape_eq(&shape, &want) || dt != out->dtype) {
      char a[96], b[96];
      snprintf(err, cap, "step %zu (%s on rank %d): result %s, rule gives %s", s, ir_op_name(op->code), st->rank,
               shape_str(&want, a, sizeof a), shape_str(&shape, b, sizeof b));
      return false;
    }
  }
  return true;
}
