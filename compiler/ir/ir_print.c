/* ir_print.c — the stable text form of the IR (--emit=ir), used by golden tests.
 * One line per op; layer headers group a layer's ops; locations are line:col. */
#include <stdio.h>

#include "layer_kind.h"
#include "ir.h"

static void print_type(const ir_module *m, const ir_value *v, FILE *out) {
  fprintf(out, "%s[", dtype_name(v->dtype));
  for (int i = 0; i < v->shape.ndim; i++) {
    fprintf(out, "%s%lld", i ? ", " : "", (long long)v->shape.dim[i]);
    if (v->layout.mesh >= 0 && v->layout.axes[i]) {
      const ir_mesh *mesh = &m->meshes[v->layout.mesh];
      fputc('{', out);
      for (int a = 0, first = 1; a < mesh->ndims; a++)
        if (v->layout.axes[i] & (1u << a)) {
          fprintf(out, "%s%s", first ? "" : ", ", mesh->axis[a]);
          first = 0;
        }
      fputc('}', out);
    }
  }
  fputc(']', out);
  if (v->layout.diagonal) fputs(" diagonal", out);
}

void ir_print_tp(const ir_tp *tp, FILE *out) {
  if (tp->kind == TP_AUTO) fputs("tp auto", out);
  if (tp->kind != TP_DEGREES) return;
  if (tp->n == 1) {
    fprintf(out, "tp %lld", (long long)tp->groups[0]);
    return;
  }
  fputs("tp (", out);
  for (int i = 0; i < tp->n; i++) fprintf(out, "%s%lld", i ? ", " : "", (long long)tp->groups[i]);
  fputc(')', out);
}

void ir_print_attrs(const ir_op *op, FILE *out) {
  switch (op->code) {
  case IR_PARAM: fprintf(out, "  init %g%+g*u", op->attr.init.center, op->attr.init.scale); break;
  case IR_INPUT:
    if (op->attr.init.int_range) fprintf(out, "  init [0, %d)", op->attr.init.int_range);
    break;
  case IR_CONST: fprintf(out, "  %.9g", op->attr.cst.value); break;
  case IR_MATMUL:
    if (op->attr.mm.trans_a) fputs("  trans_a", out);
    if (op->attr.mm.trans_b) fputs("  trans_b", out);
    break;
  case IR_LAYERNORM: case IR_RMSNORM: case IR_LAYERNORM_GRAD: case IR_RMSNORM_GRAD:
    fprintf(out, "  eps=%g", op->attr.norm.eps);
    break;
  case IR_ROPE:
    fprintf(out, "  theta=%g", op->attr.rope.theta);
    if (op->attr.rope.pos0) fprintf(out, " pos0=%lld", (long long)op->attr.rope.pos0);
    if (op->attr.rope.inverse) fputs(" inverse", out);
    break;
  case IR_CROSS_ENTROPY: case IR_CROSS_ENTROPY_GRAD: case IR_CE_ROWS: case IR_CE_ROWS_GRAD: case IR_CE_COUNT:
    fprintf(out, "  ignore=%lld", (long long)op->attr.ce.ignore);
    break;
  case IR_CE_STATS: case IR_CE_STATS_GRAD:
    fprintf(out, "  ignore=%lld vocab from %lld", (long long)op->attr.ce.ignore, (long long)op->attr.ce.lo);
    break;
  case IR_ACT_GRAD: fprintf(out, "  of=%s", ir_op_name((ir_opcode)op->attr.grad.of)); break;
  case IR_ATTENTION: case IR_ATTENTION_GRAD:
    if (op->code == IR_ATTENTION_GRAD) fprintf(out, "  d%c", "qkv"[op->attr.attn.which % 3]);
    fprintf(out, "  scale=%.6g%s", op->attr.attn.scale, op->attr.attn.causal ? " causal" : "");
    if (op->attr.attn.q_off || op->attr.attn.kv_off)
      fprintf(out, " q_off=%lld kv_off=%lld group=%lld", (long long)op->attr.attn.q_off,
              (long long)op->attr.attn.kv_off, (long long)op->attr.attn.group);
    break;
  case IR_GATHER: case IR_SCATTER_ADD:
    if (op->attr.gather.hi)
      fprintf(out, "  rows [%lld, %lld)", (long long)op->attr.gather.lo, (long long)op->attr.gather.hi);
    break;
  case IR_SLICE: case IR_PAD:
    fprintf(out, "  axis=%d [%lld, %lld)", op->attr.slice.axis, (long long)op->attr.slice.start,
            (long long)(op->attr.slice.start + op->attr.slice.len));
    break;
  default: break;
  }
}

void ir_print(const ir_module *m, FILE *out) {
  fprintf(out, "model %s  # dtype %s\n", m->name, dtype_name(m->dtype));
  for (size_t i = 0; i < m->n_dims; i++)
    fprintf(out, "dim %s = %lld%s\n", m->dims[i].name, (long long)m->dims[i].value,
            m->dims[i].overridden ? "  # -D" : "");
  for (size_t i = 0; i < m->n_meshes; i++) {
    const ir_mesh *mesh = &m->meshes[i];
    fprintf(out, "mesh %s = ", mesh->name);
    for (int d = 0; d < mesh->ndims; d++) fprintf(out, "%s%lld", d ? " x " : "", (long long)mesh->size[d]);
    fputs(" (", out);
    for (int d = 0; d < mesh->ndims; d++) fprintf(out, "%s%s", d ? ", " : "", mesh->axis[d]);
    fputs(")\n", out);
  }
  int32_t layer = -2;
  for (size_t i = 0; i < m->n_ops; i++) {
    const ir_op *op = &m->ops[i];
    if (op->layer != layer) {
      layer = op->layer;
      if (layer >= 0) {
        const ir_layer *l = &m->layers[layer];
        fprintf(out, "layer %s = %s", l->name, layer_kind_of(l)->name);
        if (l->tp.kind == TP_AUTO) fputs(" @tp(auto)", out);
        for (int g = 0; l->tp.kind == TP_DEGREES && g < l->tp.n; g++)
          fprintf(out, "%s%lld%s", g ? ", " : " @tp(", (long long)l->tp.groups[g], g == l->tp.n - 1 ? ")" : "");
        fprintf(out, "  # %d:%d\n", l->loc.first_line, l->loc.first_column);
      } else {
        fputs("model-level\n", out);
      }
    }
    const ir_value *v = &m->values[op->result];
    fprintf(out, "  %%%d = %s", op->result, ir_op_name(op->code));
    if ((op->code == IR_INPUT || op->code == IR_PARAM) && v->name) fprintf(out, " %s", v->name);
    for (int a = 0; a < op->nargs; a++) fprintf(out, "%s%%%d", a ? ", " : " ", op->args[a]);
    fputs(" : ", out);
    print_type(m, v, out);
    ir_print_attrs(op, out);
    if (op->code != IR_INPUT && op->code != IR_PARAM && v->name) fprintf(out, "  # %s", v->name);
    fputc('\n', out);
  }
  for (size_t i = 0; i < m->n_outputs; i++) {
    const ir_output *o = &m->outputs[i];
    fprintf(out, "output %s = %%%d : ", o->name, o->value);
    print_type(m, &m->values[o->value], out);
    if (o->has_layout) {
      ir_value want = m->values[o->value];
      want.layout = o->layout;
      fputs(" -> ", out);
      print_type(m, &want, out);
    }
    fputc('\n', out);
  }
  for (size_t p = 0; p < m->n_plans; p++) {
    const ir_plan *pl = &m->plans[p];
    fprintf(out, "plan %s for %s%s", pl->name, pl->model, (int32_t)p == m->active_plan ? "  # active" : "");
    fputc('\n', out);
    if (pl->world) fprintf(out, "  world %lld\n", (long long)pl->world);
    if (pl->even_stages) fprintf(out, "  stages %lld\n", (long long)pl->even_stages);
    if (pl->zero_loc.first_line)
      fprintf(out, "  optimizer zero %d redundancy %d domain %d\n", pl->zero, pl->redundancy,
              pl->domain_size ? pl->domain_size : 1);
    for (size_t q = 0; q < pl->npipes; q++) {
      const ir_pipeline *pp = &pl->pipes[q];
      fprintf(out, "  pipeline");
      if (pp->share) fprintf(out, " batch %lld", (long long)pp->share);
      fputs(" {\n", out);
      for (size_t k = 0; k < pp->nstages; k++)
        fprintf(out, "    stage %s .. %s ranks %lld..%lld\n", pp->stages[k].first, pp->stages[k].last,
                (long long)pp->stages[k].rank_lo, (long long)pp->stages[k].rank_hi);
      fputs("  }\n", out);
    }
    for (size_t r = 0; r < pl->nrules; r++) {
      const ir_rule *rule = &pl->rules[r];
      fprintf(out, "  %s ", rule->pattern);
      ir_print_tp(&rule->tp, out);
      if (rule->seq_parallel) fputs(", sequence_parallel", out);
      if (rule->recompute) fputs(", recompute", out);
      if (rule->pipe >= 0) fprintf(out, " (pipeline %d)", rule->pipe);
      if (rule->nbatch) {
        fputs(", batch (", out);
        for (int b = 0; b < rule->nbatch; b++) fprintf(out, "%s%lld", b ? ", " : "", (long long)rule->batch[b]);
        fputc(')', out);
      }
      fputc('\n', out);
    }
  }
}
