/* shard_grad.c — the sharded backward: the forward sharded program differentiated step by step.
 *
 * The forward steps are a program of primitive ops on every rank's local tensors and of
 * transfers between them; its backward is derived from it, not from the global IR, so every
 * plan the forward lowering accepts trains, and the result is the gradient of the very program
 * that runs (exact by the chain rule, whatever the degrees, groups, splits and shares):
 *  - a compute step's backward is its op's rule (compiler/grad/grad_rules.c, the same rules as
 *    the global gradient pass) on the same rank, with the step's local attributes (a
 *    vocabulary shard's rows, a head shard's offsets);
 *  - a comm step is linear (each transfer copies a box, or adds it into a sum), and its adjoint
 *    sends every destination's gradient back to its source, summed there: the backward of an
 *    all-reduce is an all-reduce, of an all-gather a reduce-scatter, of a send a receive;
 *  - a tensor read by several steps (a replicated activation, a residual stream) sums the
 *    gradients they send back, so replicas' partial gradients meet where the copies were made;
 *  - every parameter slice a rank holds gets the sum of the gradients of all the slices of that
 *    parameter held anywhere, over the common refinement of their boxes (one reduction step:
 *    replicas at different degrees hold different ranges of the same weight). Those sums are the
 *    pieces of the module's grad.NAME outputs.
 * The loss is seeded on the one rank whose piece of it the output reads.
 *
 * Recomputation (`recompute` in a plan rule): just before its backward, a layer's forward steps
 * (computes and transfers) run again on clones of its tensors, and its backward reads the
 * clones: the forward's activations of the layer are then dead after its forward (the memory
 * plan frees them), at the cost of the layer's forward once more. The clones compute the same
 * ops on the same operands: the gradients are bit for bit those without recomputation. */
#include <stdlib.h>
#include <string.h>

#include "grad.h"
#include "shard_internal.h"

typedef struct bwd {
  shard_lowering *L;
  sh_program *p;
  const ir_module *m;
  size_t nt; /* tensors of the forward program */
  int32_t *grad;
  bool *needs;
  int32_t *remap;   /* [nt]: the clone a recomputed layer's backward reads instead, or -1 */
  bool *recomputed; /* [layers] */
  int32_t rank, layer;
  ntp_loc loc;
  sh_zero zero; /* the distributed optimizer's shards (shard_zero.c) */
} bwd;

static sh_tensor *T(bwd *B, int32_t t) { return &B->p->tensors[t]; }

static int32_t b_emit(void *ctx, ir_opcode code, const int32_t *args, int32_t nargs, ntp_shape shape, ntp_dtype dt,
                      const ntp_op_attr *attr) {
  bwd *B = ctx;
  int32_t a[NTP_MAX_ARGS];
  for (int i = 0; i < nargs; i++) /* a recomputed layer's activations: their clones */
    a[i] = args[i] >= 0 && (size_t)args[i] < B->nt && B->remap[args[i]] >= 0 ? B->remap[args[i]] : args[i];
  return shard_backward_compute(B->L, B->rank, code, a, nargs, attr, box_full(&shape), dt, B->layer, B->loc);
}

static int32_t cloned(const bwd *B, int32_t t) { return (size_t)t < B->nt && B->remap[t] >= 0 ? B->remap[t] : t; }

/* Does a transfer step move data between two chunks (pipeline stages)? */
static bool crosses_chunks(const sh_program *p, const sh_step *st) {
  if (!p->pipes.npipes) return false;
  for (size_t x = 0; x < st->nxfers; x++)
    if (sh_rank_chunk(p, p->tensors[st->xfers[x].src].rank, st->at_layer) !=
        sh_rank_chunk(p, p->tensors[st->xfers[x].dst].rank, st->at_layer))
      return true;
  return false;
}

/* Layer l's forward steps (of micro-batch mb) up to `last` once more, in order, on clones of
 * the tensors they make. */
static void recompute_layer(bwd *B, int32_t l, int32_t mb, size_t last) {
  for (size_t s = 0; s <= last; s++) {
    sh_step st = B->p->steps[s]; /* a copy: the step table grows */
    if (st.layer != l || st.mb != mb) continue;
    if (st.kind == SH_COMPUTE) {
      if (st.op.code == IR_PARAM || st.op.code == IR_INPUT) continue; /* persistent slices stay */
      int32_t args[NTP_MAX_ARGS];
      for (int a = 0; a < st.op.nargs; a++) args[a] = cloned(B, st.op.args[a]);
      const sh_tensor *r = T(B, st.op.result);
      ntp_box box = r->box;
      ntp_dtype dt = r->dtype;
      int32_t c = shard_backward_compute(B->L, st.rank, st.op.code, args, st.op.nargs, &st.op.attr, box, dt, l, st.loc);
      B->remap[st.op.result] = c;
      continue;
    }
    if (crosses_chunks(B->p, &st)) continue; /* a stage's input is kept, not fetched again from the stage before */
    sh_xfer *xf = malloc((st.nxfers + 1) * sizeof *xf);
    if (!xf) ntp_out_of_memory();
    const sh_xfer *orig = B->p->steps[s].xfers;
    for (size_t i = 0; i < st.nxfers; i++) {
      int32_t d = orig[i].dst;
      if ((size_t)d < B->nt && B->remap[d] < 0) { /* the destination's clone, made once */
        const sh_tensor *o = T(B, d);
        sh_tensor t = {.rank = o->rank, .global = -1, .box = o->box, .dtype = o->dtype, .init_value = -1, .def = -1,
                       .last_use = -1};
        VEC_PUSH(B->p->tensors, B->p->n_tensors, B->p->cap_tensors, t);
        B->remap[d] = (int32_t)B->p->n_tensors - 1;
      }
      xf[i] = (sh_xfer){.src = cloned(B, orig[i].src), .dst = cloned(B, d), .box = orig[i].box};
    }
    const char *why = arena_printf(&B->p->pool, "recompute: %s", st.why ? st.why : sh_comm_name(st.comm));
    shard_backward_comm(B->L, st.comm, xf, st.nxfers, why);
    free(xf);
  }
}
static ntp_shape b_shape(void *ctx, int32_t t) { return box_shape(&T(ctx, t)->box); }
static ntp_dtype b_dtype(void *ctx, int32_t t) { return T(ctx, t)->dtype; }
static bool b_needs(void *ctx, int32_t t) {
  bwd *B = ctx;
  return t >= 0 && (size_t)t < B->nt && B->needs[t];
}

/* g, a gradient of t's shape, as a tensor in t's coordinates (a transfer addresses both ends by
 * the box of the value they hold): g itself when its box is t's, else a copy so boxed. */
static int32_t in_coords_of(bwd *B, int32_t t, int32_t g) {
  if (box_eq(&T(B, g)->box, &T(B, t)->box)) return g;
  ntp_box box = T(B, t)->box;
  return shard_backward_compute(B->L, T(B, g)->rank, IR_RESHAPE, &g, 1, NULL, box, T(B, g)->dtype, B->layer, B->loc);
}

static bool is_param_slice(const bwd *B, const sh_tensor *t) {
  return t->persistent && t->init_value >= 0 && B->m->ops[B->m->values[t->init_value].def].code == IR_PARAM;
}

static void b_add(void *ctx, int32_t t, int32_t g) {
  bwd *B = ctx;
  g = in_coords_of(B, t, g);
  if (!is_param_slice(B, T(B, t))) T(B, g)->act_grad = true;
  if (B->grad[t] < 0) {
    B->grad[t] = g;
    return;
  }
  int32_t args[2] = {B->grad[t], g};
  ntp_box box = T(B, t)->box;
  /* a weight's gradient summed over micro-batches (and layers sharing it): of no micro-batch, so
   * the schedule runs it once both parts are there, whatever their order */
  int32_t mb = shard_current_mb(B->L);
  if (is_param_slice(B, T(B, t))) shard_set_mb(B->L, -1);
  B->grad[t] = shard_backward_compute(B->L, T(B, t)->rank, IR_ADD, args, 2, NULL, box, T(B, t)->dtype, B->layer, B->loc);
  shard_set_mb(B->L, mb);
  if (!is_param_slice(B, T(B, t))) T(B, B->grad[t])->act_grad = true;
}

/* The adjoint of a comm step: each transfer's destination gradient goes back to its source,
 * summed there with what the step's other transfers send it. A sum (all-reduce) stays a sum; a
 * gather becomes a reduce-scatter; every other pattern is a sum of returning boxes. */
static sh_comm_kind adjoint_kind(sh_comm_kind k) { return k == COMM_ALL_REDUCE ? COMM_ALL_REDUCE : COMM_REDUCE_SCATTER; }

static void comm_backward(bwd *B, const sh_step *st_in, size_t si) {
  sh_step st = *st_in; /* a copy: the step table grows */
  size_t n = 0;
  sh_xfer *xf = malloc((st.nxfers + 1) * sizeof *xf);
  int32_t *acc = malloc((st.nxfers + 1) * sizeof *acc), *srcs = malloc((st.nxfers + 1) * sizeof *srcs);
  size_t ns = 0;
  if (!xf || !acc || !srcs) ntp_out_of_memory();
  B->layer = st.layer;
  B->loc = st.loc;
  for (size_t i = 0; i < st.nxfers; i++) {
    const sh_xfer *x = &B->p->steps[si].xfers[i];
    if (!b_needs(B, x->src) || B->grad[x->dst] < 0) continue;
    size_t k = 0;
    while (k < ns && srcs[k] != x->src) k++;
    if (k == ns) srcs[ns++] = x->src; /* the source's share of this step's adjoint: a sum made below */
    xf[n++] = (sh_xfer){.src = B->grad[x->dst], .dst = k, .box = x->box}; /* dst: an index into acc for now */
  }
  for (size_t k = 0; k < ns; k++) { /* the sums' tensors: empty, filled by the comm step */
    const sh_tensor *s = T(B, srcs[k]);
    sh_tensor t = {.rank = s->rank, .global = -1, .box = s->box, .dtype = s->dtype, .init_value = -1, .def = -1,
                   .last_use = -1};
    VEC_PUSH(B->p->tensors, B->p->n_tensors, B->p->cap_tensors, t);
    acc[k] = (int32_t)B->p->n_tensors - 1;
  }
  for (size_t i = 0; i < n; i++) xf[i].dst = acc[xf[i].dst];
  const char *why = arena_printf(&B->p->pool, "backward of %s", st.why ? st.why : sh_comm_name(st.comm));
  shard_backward_comm(B->L, adjoint_kind(st.comm), xf, n, why);
  for (size_t k = 0; k < ns; k++) b_add(B, srcs[k], acc[k]);
  free(xf);
  free(acc);
  free(srcs);
}


/* The bytes an all-reduce among each cell's holders moves (ring: 2(n-1)/n of the cell sent and
 * received by each of its n holders), added per rank: what the sync costs as a collective
 * library runs it, rather than the direct exchange the step's transfers describe. */
static void ring_bytes(bwd *B, const int32_t *hold, const ntp_box *boxes, size_t nh, ntp_box whole, ntp_dtype dt,
                       int64_t *per_rank) {
  box_grid grid;
  if (!box_grid_init(&grid, &whole, boxes, nh)) ntp_out_of_memory();
  ntp_box cell;
  while (box_grid_next(&grid, &cell)) {
    int n = 0;
    for (size_t k = 0; k < nh; k++) n += box_contains(&boxes[k], &cell);
    if (n < 2) continue;
    int64_t b = box_volume(&cell) * (int64_t)dtype_bytes(dt) * 2 * (n - 1) / n;
    for (size_t k = 0; k < nh; k++)
      if (box_contains(&boxes[k], &cell)) per_rank[T(B, hold[k] >= 0 ? hold[k] : -1 - hold[k])->rank] += b;
  }
  box_grid_free(&grid);
}

static void param_sync(bwd *B, int32_t v, int32_t gv, sh_xfer **xf, size_t *n, size_t *cap, int64_t *ring) {
  size_t nh = 0;
  int32_t *hold = malloc((B->nt + 1) * sizeof *hold), *contrib = malloc((B->nt + 1) * sizeof *contrib);
  ntp_box *boxes = malloc((B->nt + 1) * sizeof *boxes);
  if (!hold || !contrib || !boxes) ntp_out_of_memory();
  bool any = false;
  for (size_t t = 0; t < B->nt; t++) {
    const sh_tensor *s = T(B, (int32_t)t);
    if (!is_param_slice(B, s) || s->init_value != v) continue;
    bool dup = false; /* one sum per (rank, box) */
    for (size_t k = 0; k < nh; k++) dup |= T(B, hold[k])->rank == s->rank && box_eq(&boxes[k], &s->init_box);
    contrib[nh] = B->grad[t];
    if (contrib[nh] >= 0 && !box_eq(&s->box, &s->init_box)) { /* a slice of a slice: to the parameter's coordinates */
      int32_t g = contrib[nh];
      contrib[nh] = shard_backward_compute(B->L, s->rank, IR_RESHAPE, &g, 1, NULL, s->init_box, s->dtype, -1, B->loc);
      s = T(B, (int32_t)t);
    }
    any |= contrib[nh] >= 0;
    boxes[nh] = s->init_box;
    hold[nh] = dup ? -1 - (int32_t)t : (int32_t)t; /* a duplicate contributes but gets no sum of its own */
    nh++;
  }
  if (!any) goto done;
  ntp_shape ps = B->m->values[v].shape;
  ntp_box whole = box_full(&ps);
  /* covered? every cell of the parameter cut by the slices lies in one */
  box_grid grid;
  bool covered = true;
  if (!box_grid_init(&grid, &whole, boxes, nh)) ntp_out_of_memory();
  ntp_box cell;
  while (covered && box_grid_next(&grid, &cell)) {
    bool in = false;
    for (size_t k = 0; k < nh && !in; k++) in = box_contains(&boxes[k], &cell);
    covered = in;
  }
  box_grid_free(&grid);
  size_t ndst = 0, nz = 0, z0 = B->zero.n;
  int32_t *dst_rank = malloc((nh + 2) * sizeof *dst_rank);
  ntp_box *dst_box = malloc((nh + 2) * sizeof *dst_box);
  if (!dst_rank || !dst_box) ntp_out_of_memory();
  for (size_t k = 0; k < nh; k++)
    if (hold[k] >= 0) dst_rank[ndst] = T(B, hold[k])->rank, dst_box[ndst++] = boxes[k];
  ntp_dtype dt = B->m->values[v].dtype;
  if (B->p->zero) { /* the sums go to each part's owners only (a reduce-scatter) */
    nz = shard_zero_parts(B->p, v, dst_rank, dst_box, ndst, whole, dt, ring, &B->zero);
    ndst = 0;
    dst_rank = realloc(dst_rank, (nz + 2) * sizeof *dst_rank);
    dst_box = realloc(dst_box, (nz + 2) * sizeof *dst_box);
    if (!dst_rank || !dst_box) ntp_out_of_memory();
    for (size_t i = 0; i < nz; i++) dst_rank[ndst] = B->zero.s[z0 + i].rank, dst_box[ndst++] = B->zero.s[z0 + i].box;
  } else
    ring_bytes(B, hold, boxes, nh, whole, dt, ring);
  if (!covered) dst_rank[ndst] = dst_rank[0], dst_box[ndst++] = whole;
  for (size_t d = 0; d < ndst; d++) {
    sh_tensor st = {.rank = dst_rank[d], .global = gv, .box = dst_box[d], .dtype = dt, .init_value = -1, .def = -1,
                    .last_use = -1};
    VEC_PUSH(B->p->tensors, B->p->n_tensors, B->p->cap_tensors, st);
    int32_t s = (int32_t)B->p->n_tensors - 1;
    shard_backward_piece(B->L, gv, s);
    bool partial = d < nz && B->zero.s[z0 + d].partial, first = true;
    for (size_t k = 0; k < nh; k++) {
      ntp_box cut;
      if (contrib[k] < 0 || !box_intersect(&boxes[k], &dst_box[d], &cut)) continue;
      if (partial && !first) continue; /* NTP_FAILPOINT=zero-two-owners: one holder's part of the sum */
      first = false;
      if (*n == *cap) vec_grow((void **)xf, cap, sizeof **xf);
      (*xf)[(*n)++] = (sh_xfer){.src = contrib[k], .dst = s, .box = cut};
    }
  }
  free(dst_rank);
  free(dst_box);
done:
  free(hold);
  free(contrib);
  free(boxes);
}

/* One sync step over the transfers, counted as the collectives a library runs for it (ring[rank]:
 * the bytes each rank sends and receives), which then start again from zero. */
static void sync_step(shard_lowering *L, sh_xfer *xf, size_t n, int64_t *ring, const char *why) {
  sh_program *p = shard_lowering_program(L);
  shard_backward_comm(L, p->zero ? COMM_REDUCE_SCATTER : COMM_ALL_REDUCE, xf, n, why);
  sh_step *st = &p->steps[p->n_steps - 1];
  for (int k = 0; k < st->nranks; k++) st->bytes_out[k] = st->bytes_in[k] = ring[st->ranks[k]];
  memset(ring, 0, (size_t)p->world * sizeof *ring);
}

/* Every parameter's slices summed over everyone who holds them: one reduction step (ZeRO: a
 * reduce-scatter to the owners; ZeRO-2: one per parameter, moved to follow its gradient). */
static void sync_gradients(bwd *B) {
  shard_lowering *L = B->L;
  sh_program *p = B->p;
  const ir_module *m = B->m;
  if (shard_micro_batches(L)) shard_set_mb(L, -1);
  sh_xfer *xf = NULL;
  size_t n = 0, cap = 0, nsync = 0;
  int64_t *ring = calloc((size_t)p->world + 1, sizeof *ring);
  int32_t *syncs = malloc((m->n_forward_ops + 1) * sizeof *syncs);
  if (!ring || !syncs) ntp_out_of_memory();
  for (size_t i = 0; i < m->n_forward_ops; i++) {
    if (m->ops[i].code != IR_PARAM) continue;
    int32_t gv = ir_grad_output(m, m->ops[i].result);
    if (gv >= 0) param_sync(B, m->ops[i].result, gv, &xf, &n, &cap, ring);
    if (p->zero == 2 && n) {
      sync_step(L, xf, n, ring, "gradient sync (ZeRO-2): the parameter's parts summed onto their owners");
      syncs[nsync++] = (int32_t)p->n_steps - 1;
      n = 0;
    }
  }
  if (n)
    sync_step(L, xf, n, ring, p->zero ? "gradient sync (ZeRO-1): every parameter's parts summed onto their owners"
                                      : "gradient sync: every parameter slice, summed over its holders");
  if (p->zero) shard_zero_rewrite(L, &B->zero, syncs, nsync);
  free(syncs);
  free(ring);
  free(xf);
}

bool shard_backward(shard_lowering *L, diag_sink *diags) {
  sh_program *p = shard_lowering_program(L);
  const ir_module *m = p->global;
  bwd B = {.L = L, .p = p, .m = m, .nt = p->n_tensors, .layer = -1};
  int32_t lo = ir_loss_output(m, NULL, NTP_NOLOC);
  if (lo < 0 || !p->npieces[m->outputs[lo].value]) {
    diag_emit(diags, NTPC_ERROR, m->file, NTP_NOLOC, "internal compiler error while sharding: no piece of the loss");
    return false;
  }
  size_t nsteps = p->n_steps;
  B.grad = malloc((B.nt + 1) * sizeof *B.grad);
  B.needs = calloc(B.nt + 1, 1);
  B.remap = malloc((B.nt + 1) * sizeof *B.remap);
  B.recomputed = calloc((m->n_layers + 1) * (size_t)(shard_micro_batches(L) + 1), sizeof *B.recomputed);
  if (!B.grad || !B.needs || !B.remap || !B.recomputed) ntp_out_of_memory();
  for (size_t t = 0; t < B.nt; t++) {
    B.grad[t] = -1;
    B.remap[t] = -1;
    B.needs[t] = is_param_slice(&B, &p->tensors[t]);
  }
  for (size_t s = 0; s < nsteps; s++) { /* which tensors depend on a parameter */
    const sh_step *st = &p->steps[s];
    if (st->kind == SH_COMPUTE) {
      bool n = B.needs[st->op.result];
      for (int a = 0; a < st->op.nargs; a++) n |= B.needs[st->op.args[a]];
      B.needs[st->op.result] = n;
    } else {
      for (size_t x = 0; x < st->nxfers; x++) B.needs[st->xfers[x].dst] |= B.needs[st->xfers[x].src];
    }
  }
  int32_t lt = p->pieces[m->outputs[lo].value][0];
  bool ok = true;
  const shard_seed *seeds;
  size_t nseeds = shard_seeds(L, &seeds);
  int32_t M = shard_micro_batches(L); /* pipelined: the steps made are tagged B of their micro-batch */
  shard_set_phase(L, SH_PHASE_B);
  bool any = false;
  for (size_t k = 0; k < nseeds; k++) /* micro-batches: the loss's gradient on each row block's part */
    if (B.needs[seeds[k].part]) B.grad[seeds[k].part] = seeds[k].grad, any = true;
  if (!nseeds && B.needs[lt]) {
    ntp_op_attr one = {.cst.value = 1.0};
    B.loc = m->ops[m->values[m->outputs[lo].value].def].loc;
    B.grad[lt] = shard_backward_compute(L, p->tensors[lt].rank, IR_CONST, NULL, 0, &one, p->tensors[lt].box,
                                        p->tensors[lt].dtype, -1, B.loc);
    any = true;
  }
  if (any) {
    grad_emitter E = {&B, b_emit, b_shape, b_dtype, b_needs, b_add};
    for (size_t s = nsteps; s-- > 0 && ok;) {
      const sh_step *st = &p->steps[s];
      int32_t l = st->layer, mb = st->mb;
      if (M) shard_set_mb(L, mb);
      shard_set_at_layer(L, st->at_layer);
      size_t key = l >= 0 ? (size_t)l * (size_t)(M + 1) + (size_t)(mb + 1) : 0;
      if (l >= 0 && p->placements[l].recompute && !B.recomputed[key]) { /* its last forward step: run it again */
        B.recomputed[key] = true;
        recompute_layer(&B, l, mb, s);
        st = &p->steps[s];
      }
      if (st->kind == SH_COMM) {
        comm_backward(&B, st, s);
        continue;
      }
      ir_op op = st->op; /* a copy: the tables grow */
      if (!b_needs(&B, op.result) || B.grad[op.result] < 0) continue;
      B.rank = st->rank;
      B.layer = st->layer;
      B.loc = st->loc;
      if (!(ok = grad_rule(&E, &op, B.grad[op.result])))
        diag_emit(diags, NTPC_ERROR, m->file, op.loc, "no gradient rule for op '%s'", ir_op_name(op.code));
    }
  }
  if (ok) sync_gradients(&B);
  shard_zero_free(&B.zero);
  free(B.grad);
  free(B.needs);
  free(B.remap);
  free(B.recomputed);
  return ok;
}
