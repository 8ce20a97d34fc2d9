/* shard.c — lowers the global IR to the sharded program.
 *
 * Each global value is held as pieces: tensors on ranks, each holding a box of it.
 * Layers of a kind with a `shard` rule (compiler/layers/) are lowered by their kind inside
 * each of their groups (shard_layer.c); every other op "follows" the pieces of its latest
 * operand and computes locally (here). Whenever a rank needs a box of a value that it does not
 * hold, the transfers are scheduled and batched into collectives (shard_steps.c). Matmuls of
 * values with explicit layouts on a mesh take the sharded-matmul rules (shard_layout.c), the
 * loss its vocabulary-parallel form (shard_loss.c), the backward its own pass (shard_grad.c).
 */
#include <stdlib.h>
#include <string.h>

#include "geometry.h"
#include "shard_lowering.h"

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
    for (int32_t r = 0; r < L->W; r++) out[n++] = (rank_box){r, lw_layout_box(L, &L->lay[v], s, r)};
    return n;
  }
  return box_default_split(s, L->W, out);
}

size_t shard_homes(lower *L, int32_t v, rank_box *out) { return L->nhome[v] ? where(L, v, out) : 0; }
size_t shard_home_count(const lower *L, int32_t v) { return L->nhome[v]; }

/* Pieces [i] of `n` with micro-batch mb (all of them when the program is not pipelined), as
 * the op's result: every piece's operands first (one batch of transfers), then the computes. */
static void follow_pieces(lower *L, const ir_op *op, const rank_box *rb, const int32_t *mbs, size_t n, int32_t mb,
                          int32_t (*argv)[NTP_MAX_ARGS], ntp_box *resv) {
  int32_t r = op->result;
  ntp_shape rs = vshape(L, r);
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < n; i++) {
      if (mbs[i] != mb) continue;
      ntp_box box = rb[i].box;
      bool dup = false; /* rb may list a piece twice when a redistribution made copies */
      for (size_t j = 0; j < i; j++) dup |= rb[j].rank == rb[i].rank && box_eq(&rb[j].box, &box);
      if (dup) continue;
      int32_t rank = rb[i].rank, *args = argv[i];
      if (pass == 1) {
        int32_t t = lw_compute(L, rank, op->code, args, op->nargs, op, r, resv[i], vdtype(L, r), L->m->values[r].name);
        shard_add_home(L, r, t);
        continue;
      }
      ntp_box res = geom_result_piece(op->code, box, rs);
      for (int j = 0; j < op->nargs; j++)
        args[j] = shard_ensure(L, op->args[j], rank, geom_operand_need(op->code, j, res, vshape(L, op->args[j])));
      resv[i] = res;
    }
}

void lw_follow(lower *L, const ir_op *op) {
  int32_t r = op->result;
  int32_t a = geom_followed_operand(L->m, op);
  int32_t v = a >= 0 ? a : r;
  rank_box *rb = malloc((L->nhome[v] + (size_t)L->W * 4 + 4) * sizeof *rb);
  size_t n = where(L, v, rb);
  int32_t(*argv)[NTP_MAX_ARGS] = malloc((n + 1) * sizeof *argv);
  ntp_box *resv = malloc((n + 1) * sizeof *resv);
  int32_t *mbs = malloc((n + 1) * sizeof *mbs);
  int32_t top = -1;
  for (size_t i = 0; i < n; i++) { /* a pipelined program follows each micro-batch's pieces apart */
    mbs[i] = L->M && L->nhome[v] ? L->p->tensors[L->home[v][i]].mb : -1;
    top = mbs[i] > top ? mbs[i] : top;
  }
  int32_t saved = L->mb;
  for (int32_t mb = top; mb >= -1; mb--) { /* the last first, as layers are lowered */
    if (L->M) L->mb = mb;
    follow_pieces(L, op, rb, mbs, n, mb, argv, resv);
    if (L->M && top >= 0) lw_flush(L);
  }
  L->mb = saved;
  if (a >= 0 && L->use_layouts) L->lay[r] = L->lay[a];
  free(mbs);
  free(argv);
  free(resv);
  free(rb);
}

/* ---- pipelined programs ---- */

int32_t shard_micro_batches(const lower *L) { return L->M; }
int32_t shard_current_mb(const lower *L) { return L->mb; }
void shard_set_mb(lower *L, int32_t mb) { L->mb = mb; }
void shard_set_phase(lower *L, sh_phase ph) { L->phase = ph; }
void shard_set_at_layer(lower *L, int32_t l) { L->at_layer = l; }
int32_t shard_home_mb(const lower *L, int32_t v, size_t i) {
  return i < L->nhome[v] ? L->p->tensors[L->home[v][i]].mb : -1;
}
void shard_add_seed(lower *L, int32_t part, int32_t grad) {
  VEC_PUSH(L->seeds, L->nseeds, L->cseeds, ((shard_seed){part, grad}));
}
size_t shard_seeds(const lower *L, const shard_seed **seeds) {
  *seeds = L->seeds;
  return L->nseeds;
}

/* ---- entry --------------------------------------------------------------------------- */

/* The program's tables and the lowering's state; false when out of memory (p freed). */
static bool lowering_init(lower *L, sh_program *p, const ir_module *m, int32_t world, const sh_placement *placements,
                          diag_sink *diags) {
  p->global = m;
  p->world = world;
  p->placements = calloc(m->n_layers + 1, sizeof *p->placements);
  if (!p->placements) {
    sh_program_free(p);
    return false;
  }
  memcpy(p->placements, placements, m->n_layers * sizeof *placements);
  size_t nv = m->n_values;
  p->pieces = calloc(nv, sizeof *p->pieces);
  p->npieces = calloc(nv, sizeof *p->npieces);
  p->cap_pieces = calloc(nv, sizeof *p->cap_pieces);
  *L = (lower){.p = p, .m = m, .diags = diags, .W = p->world, .layer = -1, .mesh = -1, .mb = -1, .at_layer = -1};
  L->home = calloc(nv, sizeof *L->home);
  L->nhome = calloc(nv, sizeof *L->nhome);
  L->chome = calloc(nv, sizeof *L->chome);
  L->lay = calloc(nv, sizeof *L->lay);
  lw_init_layouts(L);
  return true;
}

static void lowering_free(lower *L) {
  for (size_t v = 0; v < L->m->n_values; v++) free(L->home[v]);
  free(L->home);
  free(L->nhome);
  free(L->chome);
  free(L->lay);
  free(L->pend);
  free(L->seeds);
}

/* The forward ops in order: a sharded layer whole, else the op by its rule. */
static void lower_forward(lower *L) {
  const ir_module *m = L->m;
  size_t n_forward = m->n_forward_ops ? m->n_forward_ops : m->n_ops; /* training: the backward is derived below */
  for (size_t i = 0; i < n_forward && !L->failed && !L->diags->errors;) {
    const ir_op *op = &m->ops[i];
    L->layer = op->layer;
    L->loc = op->loc;
    if (op->layer >= 0) L->at_layer = op->layer;
    if (op->layer >= 0 && layer_is_sharded(&m->layers[op->layer])) {
      lw_lower_layer(L, op->layer);
      i = (size_t)(m->layers[op->layer].first_op + m->layers[op->layer].nops);
      continue;
    }
    L->why = arena_printf(&L->p->pool, "%s: redistribution", op->layer >= 0 ? m->layers[op->layer].name : "model level");
    if (op->code == IR_MATMUL && L->use_layouts && (L->lay[op->args[0]].mesh >= 0 || L->lay[op->args[1]].mesh >= 0))
      lw_layout_matmul(L, op);
    else if (op->code == IR_CROSS_ENTROPY && shard_lower_loss(L, op))
      ; /* vocabulary-parallel */
    else if (op->code != IR_INPUT && op->code != IR_PARAM && op->code != IR_CONST && op->code != IR_SLICE)
      lw_follow(L, op);
    i++;
  }
}

/* Outputs with a requested layout are brought to it. */
static void lower_output_layouts(lower *L) {
  const ir_module *m = L->m;
  L->layer = -1;
  L->why = "requested output layout";
  for (size_t o = 0; o < m->n_outputs && !L->failed && !L->diags->errors; o++) {
    const ir_output *out = &m->outputs[o];
    if (out->has_layout && L->use_layouts)
      for (int32_t r = 0; r < L->p->world; r++)
        shard_ensure(L, out->value, r, lw_layout_box(L, &out->layout, vshape(L, out->value), r));
  }
}

/* Every piece of an output stays to the end; an input or param returned as is gets one. */
static void keep_outputs(lower *L) {
  const ir_module *m = L->m;
  sh_program *p = L->p;
  for (size_t o = 0; o < m->n_outputs; o++) {
    int32_t v = m->outputs[o].value;
    if (lw_is_source(L, v) && !p->npieces[v]) {
      rank_box rb[1];
      ntp_shape s = vshape(L, v);
      rb[0] = (rank_box){0, box_full(&s)};
      lw_materialize(L, v, 0, rb[0].box);
    }
    for (size_t i = 0; i < p->npieces[v]; i++) p->tensors[p->pieces[v][i]].last_use = (int32_t)p->n_steps;
  }
}

sh_program *shard_lower(const ir_module *m, int32_t world, const sh_placement *placements, const sh_pipe_options *opt,
                        diag_sink *diags) {
  sh_program *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  lower L;
  if (!lowering_init(&L, p, m, world, placements, diags)) return NULL;
  sh_pipe_options none = {0}, eff;
  if (!opt) opt = &none;
  const ir_plan *active = m->active_plan >= 0 ? &m->plans[m->active_plan] : NULL;
  if (active && active->schedule && opt->schedule == SH_SCHED_DEFAULT && !opt->schedule_csv) {
    eff = *opt; /* the plan's 'schedule', where the command line names none */
    eff.schedule = (sh_schedule_kind)ir_schedule_code(active->schedule);
    opt = &eff;
  }
  if (!shard_resolve_pipes(m, world, &p->pipes, diags)) {
    lowering_free(&L);
    sh_program_free(p);
    return NULL;
  }
  /* pipelined: stages or micro-batches. Its steps carry their micro-batch and phase, and the
   * schedule pass orders them (shard_schedule.c); other programs are as they always were. */
  const ir_plan *plan = m->active_plan >= 0 ? &m->plans[m->active_plan] : NULL;
  /* the command line's count (ntpc_set_pipeline), else the plan's 'micro_batches' line */
  int32_t mb = opt->micro_batches > 0 ? opt->micro_batches : plan && plan->micro_batches ? plan->micro_batches : 1;
  p->micro_batches = mb;
  p->pipelined = p->pipes.npipes || p->micro_batches > 1 || opt->schedule != SH_SCHED_DEFAULT || opt->schedule_csv;
  L.M = p->pipelined ? p->micro_batches : 0;
  p->zero = opt->set_optimizer ? opt->zero : plan ? plan->zero : 0;
  p->redundancy = opt->set_optimizer ? opt->redundancy : plan && plan->redundancy ? plan->redundancy : 1;
  p->domain_size = opt->domain_size ? opt->domain_size : plan && plan->domain_size ? plan->domain_size : 1;
  if (opt->gpu_of_rank && opt->n_gpu_of_rank == world && (p->gpu_of_rank = arena_alloc(&p->pool, (size_t)world * sizeof *p->gpu_of_rank)))
    memcpy(p->gpu_of_rank, opt->gpu_of_rank, (size_t)world * sizeof *p->gpu_of_rank);
  lower_forward(&L);
  lower_output_layouts(&L);
  lw_flush(&L);
  if (m->n_forward_ops && !L.failed && !diags->errors && !shard_backward(&L, diags)) L.failed = true;
  keep_outputs(&L);
  if (p->pipelined && !L.failed && !diags->errors && !shard_schedule(p, opt, diags)) L.failed = true;
  lowering_free(&L);
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
  sh_pipes_free(&p->pipes);
  sh_schedule_free(&p->sched);
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
