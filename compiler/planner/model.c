/* model.c — the model read as a chain of sharded layers: where each value lives (its home), the
 * ops that follow a layer, the moves between layers, the parameter reads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner_internal.h"

/* ======================================================================================
 * the model, read as a chain of sharded layers
 * ====================================================================================== */


int32_t plan_model_layers(const plan_model *pm) { return pm->n; }
const ir_layer *plan_model_layer(const plan_model *pm, int32_t i) { return &pm->m->layers[pm->L[i].ir]; }
int32_t plan_model_ir_layer(const plan_model *pm, int32_t i) { return pm->L[i].ir; }
int64_t plan_model_rows(const plan_model *pm) { return pm->samples; }

void plan_model_free(plan_model *pm) {
  if (!pm) return;
  free(pm->L);
  free(pm->fops);
  free(pm->moves);
  free(pm->reads);
  free(pm->fop_off);
  free(pm->fop_ix);
  free(pm->read_off);
  free(pm->read_ix);
  free(pm->umove_off);
  free(pm->umove_ix);
  free(pm->pmove_off);
  free(pm->pmove_ix);
  free(pm);
}

static bool is_source(const ir_module *m, int32_t v) {
  ir_opcode c = m->ops[m->values[v].def].code;
  if (c == IR_INPUT || c == IR_PARAM || c == IR_CONST) return true;
  return c == IR_SLICE && m->ops[m->values[m->ops[m->values[v].def].args[0]].def].code == IR_PARAM;
}

bool pl_model_error(const ir_module *m, ntp_loc loc, diag_sink *diags, const char *msg) {
  diag_emit(diags, NTPC_ERROR, m->file, loc, "%s", msg);
  return false;
}

static bool home_eq(home a, home b) {
  return a.kind == b.kind && (a.kind != H_LAYER || (a.layer == b.layer && a.cols == b.cols && a.seq == b.seq));
}

static bool read_chain_layer(const ir_module *m, int32_t l, chain_layer *c, diag_sink *diags) {
  const ir_layer *ly = &m->layers[l];
  char msg[300];
  *c = (chain_layer){.ir = l, .k = layer_kind_of(ly)};
  c->x = ly->input;
  if (c->x < 0 || ly->core < 0) {
    snprintf(msg, sizeof msg, "layer '%s' has no recognisable core", ly->name);
    return pl_model_error(m, ly->loc, diags, msg);
  }
  c->xs = m->values[c->x].shape;
  c->out = m->values[ly->core].shape;
  c->dt = m->values[ly->core].dtype;
  c->whole = c->xs.ndim < 2; /* no batch dim: one group takes the layer whole (as the sharder) */
  c->rows = c->whole ? 1 : c->xs.dim[0];
  c->T = 1;
  int tlast = c->k->index_input ? c->xs.ndim : c->xs.ndim - 1;
  for (int d = 1; d < tlast; d++) c->T *= c->xs.dim[d];
  layer_describe(m, ly, &c->d);
  c->wdt = c->d.wdt;
  c->wval = c->k->weight_role >= 0 ? ly->role[c->k->weight_role] : -1;
  return true;
}

typedef struct builder {
  plan_model *pm;
  const ir_module *m;
  home *home_of; /* per value */
  int32_t *chain_of;
  diag_sink *diags;
  bool failed;
} builder;

static bool check_pair(builder *B, home src, home at, int32_t op, ntp_loc loc) {
  if (src.kind != H_LAYER || at.kind != H_LAYER) return true;
  int32_t d = src.layer > at.layer ? src.layer - at.layer : at.layer - src.layer;
  if (d <= 1) return true;
  char msg[400];
  snprintf(msg, sizeof msg,
           "the planner plans chains of layers: %s reads an output of layer '%s', %d layers before '%s' (a layer "
           "may read model inputs and the outputs of the layer just before it)",
           op >= 0 ? "this operation" : "this layer", plan_model_layer(B->pm, src.layer < at.layer ? src.layer : at.layer)->name,
           d, plan_model_layer(B->pm, src.layer < at.layer ? at.layer : src.layer)->name);
  pl_model_error(B->m, loc, B->diags, msg);
  B->failed = true;
  return false;
}

static void add_move(builder *B, home src, home at, ntp_shape vs, ntp_shape rs, int8_t xf, ntp_dtype dt, int32_t op,
                     int32_t value, ntp_loc loc) {
  if (!check_pair(B, src, at, op, loc)) return;
  if (home_eq(src, at) && xf == XF_SAME && shape_eq(&vs, &rs)) return; /* already where it is needed */
  move mv = {src, at, vs, rs, xf, dt, op, value, {0}, 0};
  VEC_PUSH(B->pm->moves, B->pm->nmoves, B->pm->cmoves, mv);
}

static void add_read(builder *B, home at, ntp_shape vs, ntp_shape rs, int8_t xf, ntp_dtype dt, int32_t value) {
  if (B->m->ops[B->m->values[value].def].code == IR_CONST) return;
  sread rd = {at, vs, rs, xf, dt, value};
  VEC_PUSH(B->pm->reads, B->pm->nreads, B->pm->creads, rd);
}

/* An op outside a layer's core: computed where its latest same-shape operand is. */
static void follow_op(builder *B, const ir_op *op) {
  const ir_module *m = B->m;
  int32_t r = op->result;
  if (op->code == IR_CROSS_ENTROPY && B->home_of[op->args[0]].kind == H_LAYER) {
    /* vocabulary-parallel (compiler/shard/shard_loss.c): computed where the logits are, on each
     * piece, and only a few floats per row move: priced as a pass over the logits, no move */
    ntp_shape ls = m->values[op->args[0]].shape;
    fop f = {.at = B->home_of[op->args[0]], .code = op->code, .rs = ls, .nargs = 1, .dt = m->values[op->args[0]].dtype};
    f.as[0] = ls;
    VEC_PUSH(B->pm->fops, B->pm->nfops, B->pm->cfops, f);
    B->home_of[r] = (home){.kind = H_DEFAULT};
    return;
  }
  ntp_shape rs = m->values[r].shape;
  int32_t a = geom_followed_operand(m, op); /* the compiler's rule (geometry.h) */
  home at = {.kind = H_DEFAULT};
  if (a >= 0 && B->home_of[a].kind != H_SOURCE) at = B->home_of[a];
  if (geom_whole_rows(op->code)) at.cols = false;
  fop f = {.at = at, .code = op->code, .rs = rs, .nargs = op->nargs, .dt = m->values[r].dtype};
  for (int i = 0; i < op->nargs; i++) {
    int32_t v = op->args[i];
    f.as[i] = m->values[v].shape;
    f.cst[i] = m->ops[m->values[v].def].code == IR_CONST;
    int8_t xf = op->code == IR_MATMUL ? (i == 0 ? XF_MM_A : XF_MM_B) : XF_SAME;
    if (is_source(m, v)) add_read(B, at, m->values[v].shape, rs, xf, m->values[v].dtype, v);
    else
      add_move(B, B->home_of[v], at, m->values[v].shape, rs, xf, m->values[v].dtype, (int32_t)(op - m->ops), v, op->loc);
  }
  VEC_PUSH(B->pm->fops, B->pm->nfops, B->pm->cfops, f);
  B->home_of[r] = at;
}

static int32_t slot_of_home(const plan_model *pm, home h) { return h.kind == H_LAYER ? h.layer : pm->n; }

/* slot of a move: unary for a layer (both ends in that layer or unplaced), the pair slot of
 * the later of two consecutive layers (pair = true), or n when neither end is placed */
static int32_t slot_of_move(const plan_model *pm, const move *mv, bool *pair) {
  *pair = false;
  if (mv->src.kind == H_LAYER && mv->at.kind == H_LAYER && mv->src.layer != mv->at.layer) {
    *pair = true;
    return mv->src.layer > mv->at.layer ? mv->src.layer : mv->at.layer;
  }
  if (mv->src.kind == H_LAYER) return mv->src.layer;
  if (mv->at.kind == H_LAYER) return mv->at.layer;
  return pm->n;
}

static bool csr(int32_t nslots, size_t nitems, const int32_t *slot, int32_t **off_out, int32_t **ix_out) {
  int32_t *off = calloc((size_t)nslots + 2, sizeof *off), *ix = malloc((nitems + 1) * sizeof *ix);
  if (!off || !ix) {
    free(off);
    free(ix);
    return false;
  }
  for (size_t k = 0; k < nitems; k++)
    if (slot[k] >= 0) off[slot[k] + 1]++;
  for (int32_t i = 0; i <= nslots; i++) off[i + 1] += off[i];
  int32_t *fill = calloc((size_t)nslots + 1, sizeof *fill);
  if (!fill) {
    free(off);
    free(ix);
    return false;
  }
  for (size_t k = 0; k < nitems; k++)
    if (slot[k] >= 0) ix[off[slot[k]] + fill[slot[k]]++] = (int32_t)k;
  free(fill);
  *off_out = off;
  *ix_out = ix;
  return true;
}

static bool build_index(plan_model *pm) {
  size_t most = pm->nfops > pm->nreads ? pm->nfops : pm->nreads;
  if (pm->nmoves > most) most = pm->nmoves;
  int32_t *slot = malloc((most + 1) * sizeof *slot), *slot2 = malloc((most + 1) * sizeof *slot2);
  bool ok = slot && slot2;
  for (size_t k = 0; ok && k < pm->nfops; k++) slot[k] = slot_of_home(pm, pm->fops[k].at);
  ok = ok && csr(pm->n + 1, pm->nfops, slot, &pm->fop_off, &pm->fop_ix);
  for (size_t k = 0; ok && k < pm->nreads; k++) slot[k] = slot_of_home(pm, pm->reads[k].at);
  ok = ok && csr(pm->n + 1, pm->nreads, slot, &pm->read_off, &pm->read_ix);
  for (size_t k = 0; ok && k < pm->nmoves; k++) {
    bool pair;
    int32_t sl = slot_of_move(pm, &pm->moves[k], &pair);
    slot[k] = pair ? -1 : sl;
    slot2[k] = pair ? sl : -1;
  }
  ok = ok && csr(pm->n + 1, pm->nmoves, slot, &pm->umove_off, &pm->umove_ix);
  ok = ok && csr(pm->n + 1, pm->nmoves, slot2, &pm->pmove_off, &pm->pmove_ix);
  /* priors: earlier copies of the same value at homes this move's cost already depends on */
  for (size_t k = 0; ok && k < pm->nmoves; k++) {
    move *mv = &pm->moves[k];
    bool pair;
    int32_t sl = slot_of_move(pm, mv, &pair);
    for (size_t j = 0; j < k && mv->nprior < 4; j++) {
      const move *p = &pm->moves[j];
      if (p->value != mv->value) continue;
      bool in = p->at.kind == H_DEFAULT ||
                (p->at.kind == H_LAYER && (p->at.layer == sl || (pair && p->at.layer == sl - 1)));
      if (in) mv->prior[mv->nprior++] = (int32_t)j;
    }
  }
  free(slot);
  free(slot2);
  return ok;
}

/* What the planner can plan: no explicit layouts, no tensor over 1 TiB; false if reported. */
static bool plannable(const ir_module *m, diag_sink *diags) {
  for (size_t v = 0; v < m->n_values; v++)
    if (m->values[v].layout.mesh >= 0) {
      pl_model_error(m, m->ops[m->values[v].def].loc, diags,
                  "explicit layouts are not planned: the planner chooses the TP degrees of layers");
      return false;
    }
  for (size_t o = 0; o < m->n_outputs; o++)
    if (m->outputs[o].has_layout) {
      pl_model_error(m, m->outputs[o].loc, diags, "explicit layouts are not planned: the planner chooses the TP degrees of layers");
      return false;
    }
  /* every box and byte count below stays far from int64 overflow: at most 16 TiB per tensor */
  for (size_t v = 0; v < m->n_values; v++) {
    double bytes = (double)dtype_bytes(m->values[v].dtype);
    for (int d = 0; d < m->values[v].shape.ndim; d++) bytes *= (double)m->values[v].shape.dim[d];
    if (bytes > 17592186044416.0) {
      char msg[200];
      snprintf(msg, sizeof msg, "a tensor of %.3g bytes: the planner plans tensors of at most 16 TiB",
               bytes);
      pl_model_error(m, m->ops[m->values[v].def].loc, diags, msg);
      return false;
    }
  }
  return true;
}

/* The chain: every sharded layer, in order (B->chain_of maps layers to it); none is an error. */
static void read_chain(builder *B) {
  plan_model *pm = B->pm;
  const ir_module *m = B->m;
  for (size_t l = 0; !B->failed && l < m->n_layers; l++) {
    B->chain_of[l] = -1;
    if (!layer_is_sharded(&m->layers[l])) continue;
    if (!read_chain_layer(m, (int32_t)l, &pm->L[pm->n], B->diags)) B->failed = true;
    B->chain_of[l] = pm->n++;
  }
  if (!B->failed && pm->n == 0) {
    char kinds[200] = "";
    for (int32_t k = 0; k < layer_nkinds; k++)
      if (layer_kinds[k]->shard)
        snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s", kinds[0] ? ", " : "", layer_kinds[k]->name);
    diag_emit(B->diags, NTPC_ERROR, m->file, NTP_NOLOC, "model '%s' has no layer with a TP degree (%s): nothing to plan",
              m->name, kinds);
    B->failed = true;
  }
}

/* Chain layer ci: its input read or moved to it, its core's value at its home, the rest of the
 * layer following the core. Returns the op after the layer. */
static size_t walk_layer(builder *B, int32_t ci) {
  plan_model *pm = B->pm;
  const ir_module *m = B->m;
  chain_layer *c = &pm->L[ci];
  const ir_layer *ly = &m->layers[c->ir];
  home at = {.kind = H_LAYER, .layer = ci};
  if (is_source(m, c->x)) add_read(B, at, c->xs, c->xs, XF_SAME, m->values[c->x].dtype, c->x);
  else add_move(B, B->home_of[c->x], at, c->xs, c->xs, XF_SAME, m->values[c->x].dtype, -1, c->x, ly->loc);
  int32_t end = m->values[ly->core].def;
  B->home_of[ly->core] = (home){.kind = H_LAYER, .layer = ci, .cols = !c->k->reduces, .seq = c->k->reduces};
  for (int32_t k = end + 1; k < ly->first_op + ly->nops && !B->failed; k++) {
    const ir_op *f = &m->ops[k];
    if (f->code != IR_PARAM && f->code != IR_SLICE) follow_op(B, f);
  }
  /* values inside the core are the layer's own: nothing outside may read them */
  for (int32_t k = ly->first_op; k < end && !B->failed; k++)
    if (!is_source(m, m->ops[k].result)) B->home_of[m->ops[k].result].kind = -1;
  return (size_t)(ly->first_op + ly->nops);
}

/* Every op in order: a chain layer whole, any other op following its operands. */
static void walk_ops(builder *B) {
  const ir_module *m = B->m;
  for (size_t i = 0; !B->failed && i < m->n_ops;) {
    const ir_op *op = &m->ops[i];
    if (op->layer >= 0 && B->chain_of[op->layer] >= 0) {
      i = walk_layer(B, B->chain_of[op->layer]);
      continue;
    }
    if (op->code != IR_INPUT && op->code != IR_PARAM && op->code != IR_CONST && op->code != IR_SLICE) {
      for (int a = 0; a < op->nargs; a++)
        if (B->home_of[op->args[a]].kind < 0) {
          pl_model_error(m, op->loc, B->diags, "this operation reads a value inside a layer; the planner cannot place it");
          B->failed = true;
        }
      if (!B->failed) follow_op(B, op);
    }
    i++;
  }
}

plan_model *plan_model_new_unguarded(const ir_module *m, diag_sink *diags) {
  plan_model *pm = calloc(1, sizeof *pm);
  if (!pm) {
    diag_out_of_memory(diags);
    return NULL;
  }
  pm->m = m;
  if (!plannable(m, diags)) {
    plan_model_free(pm);
    return NULL;
  }
  builder B = {.pm = pm, .m = m, .diags = diags};
  B.home_of = calloc(m->n_values + 1, sizeof *B.home_of);
  B.chain_of = malloc((m->n_layers + 1) * sizeof *B.chain_of);
  pm->L = calloc(m->n_layers + 1, sizeof *pm->L);
  if (!B.home_of || !B.chain_of || !pm->L) {
    diag_out_of_memory(diags);
    B.failed = true;
  }
  read_chain(&B);
  walk_ops(&B);
  if (!B.failed) {
    const chain_layer *c0 = &pm->L[0];
    pm->samples = c0->rows;
    pm->tokens = c0->rows * c0->T;
    if (!build_index(pm)) {
      diag_out_of_memory(diags);
      B.failed = true;
    }
  }
  free(B.home_of);
  free(B.chain_of);
  if (B.failed) {
    plan_model_free(pm);
    return NULL;
  }
  return pm;
}


double plan_model_tokens(const plan_model *pm) { return (double)pm->tokens; }
