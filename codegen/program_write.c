/* program_write.c — the compiler's side of the program format: the global IR, the sharded
 * program and every rank's CUDA written field by field, in the order and widths
 * runtime/ntp_program.h documents (the reader is runtime/io/program_read.c). Only what the
 * runtime runs is written: source locations, plans, placements and the planner's byte counts
 * stay in the compiler. */
#include "program_write.h"

#include <stdlib.h>
#include <string.h>

static void put(program_image *b, const void *p, size_t n) {
  while (b->len + n > b->cap) vec_grow((void **)&b->data, &b->cap, 1);
  memcpy(b->data + b->len, p, n);
  b->len += n;
}
/* little-endian whatever the host */
static void put_le(program_image *b, uint64_t v, int bytes) {
  unsigned char c[8];
  for (int i = 0; i < bytes; i++) c[i] = (unsigned char)(v >> (8 * i));
  put(b, c, (size_t)bytes);
}
static void u8(program_image *b, unsigned v) { put_le(b, v, 1); }
static void u32(program_image *b, uint32_t v) { put_le(b, v, 4); }
static void i32(program_image *b, int32_t v) { put_le(b, (uint32_t)v, 4); }
static void i64(program_image *b, int64_t v) { put_le(b, (uint64_t)v, 8); }
static void f32(program_image *b, float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  u32(b, u);
}
static void f64(program_image *b, double v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  put_le(b, u, 8);
}
static void count(program_image *b, size_t n) { u32(b, (uint32_t)n); }
static void str(program_image *b, const char *s) {
  if (!s) {
    u32(b, UINT32_MAX);
    return;
  }
  size_t n = strlen(s);
  u32(b, (uint32_t)n);
  put(b, s, n);
}
static void shape(program_image *b, const ntp_shape *s) {
  u32(b, (uint32_t)s->ndim);
  for (int d = 0; d < s->ndim; d++) i64(b, s->dim[d]);
}
static void box(program_image *b, const ntp_box *x) {
  u32(b, (uint32_t)x->ndim);
  for (int d = 0; d < x->ndim; d++) {
    i64(b, x->lo[d]);
    i64(b, x->hi[d]);
  }
}

/* The attributes an opcode has, in a fixed order (program_read.c reads the same switch). */
static void attrs(program_image *b, const ir_op *o) {
  const ntp_op_attr *a = &o->attr;
  switch (o->code) {
  case IR_INPUT: case IR_PARAM: f32(b, a->init.center); f32(b, a->init.scale); i32(b, a->init.int_range); break;
  case IR_CONST: f64(b, a->cst.value); break;
  case IR_GATHER: i64(b, a->gather.lo); i64(b, a->gather.hi); break;
  case IR_SLICE: i32(b, a->slice.axis); i64(b, a->slice.start); i64(b, a->slice.len); break;
  case IR_MATMUL: u8(b, a->mm.trans_b); u8(b, a->mm.trans_a); break;
  case IR_LAYERNORM: case IR_RMSNORM: case IR_LAYERNORM_GRAD: case IR_RMSNORM_GRAD: f32(b, a->norm.eps); break;
  case IR_ROPE: f32(b, a->rope.theta); i64(b, a->rope.pos0); u8(b, a->rope.inverse); break;
  case IR_ATTENTION: case IR_ATTENTION_GRAD:
    u8(b, a->attn.causal); u8(b, a->attn.which); f32(b, a->attn.scale); i64(b, a->attn.q_off); i64(b, a->attn.group);
    i64(b, a->attn.kv_off);
    break;
  case IR_SCATTER_ADD: i64(b, a->gather.lo); i64(b, a->gather.hi); break;
  case IR_PAD: i32(b, a->slice.axis); i64(b, a->slice.start); i64(b, a->slice.len); break;
  case IR_CROSS_ENTROPY: case IR_CROSS_ENTROPY_GRAD: case IR_CE_ROWS: case IR_CE_ROWS_GRAD: case IR_CE_COUNT:
    i64(b, a->ce.ignore);
    break;
  case IR_CE_STATS: case IR_CE_STATS_GRAD: i64(b, a->ce.ignore); i64(b, a->ce.lo); break;
  case IR_ACT_GRAD: i32(b, a->grad.of); break;
  default: break; /* elementwise, softmax, reshape: none */
  }
}

static void op(program_image *b, const ir_op *o) {
  u32(b, (uint32_t)o->code);
  i32(b, o->result);
  u32(b, (uint32_t)o->nargs);
  for (int a = 0; a < o->nargs; a++) i32(b, o->args[a]);
  i32(b, o->layer);
  attrs(b, o);
}

static void module(program_image *b, const ir_module *m) {
  str(b, m->name);
  u32(b, (uint32_t)m->dtype);
  count(b, m->n_values);
  for (size_t v = 0; v < m->n_values; v++) {
    const ir_value *x = &m->values[v];
    shape(b, &x->shape);
    u32(b, (uint32_t)x->dtype);
    i32(b, x->def);
    str(b, x->name);
  }
  count(b, m->n_ops);
  for (size_t i = 0; i < m->n_ops; i++) op(b, &m->ops[i]);
  count(b, m->n_layers);
  for (size_t l = 0; l < m->n_layers; l++) str(b, m->layers[l].name);
  count(b, m->n_outputs);
  for (size_t o = 0; o < m->n_outputs; o++) {
    str(b, m->outputs[o].name);
    i32(b, m->outputs[o].value);
  }
}

static void program(program_image *b, const sh_program *p) {
  i32(b, p->world);
  count(b, p->n_tensors);
  for (size_t t = 0; t < p->n_tensors; t++) {
    const sh_tensor *x = &p->tensors[t];
    i32(b, x->rank);
    i32(b, x->global);
    box(b, &x->box);
    u32(b, (uint32_t)x->dtype);
    u8(b, x->persistent);
    str(b, x->name);
    i32(b, x->init_value);
    box(b, &x->init_box);
    i32(b, x->def);
    i64(b, x->offset);
  }
  count(b, p->n_steps);
  for (size_t s = 0; s < p->n_steps; s++) {
    const sh_step *st = &p->steps[s];
    u32(b, (uint32_t)st->kind);
    i32(b, st->layer);
    if (st->kind == SH_COMPUTE) {
      i32(b, st->rank);
      op(b, &st->op);
      continue;
    }
    u32(b, (uint32_t)st->comm);
    count(b, (size_t)st->nranks);
    for (int32_t r = 0; r < st->nranks; r++) i32(b, st->ranks[r]);
    count(b, st->nxfers);
    for (size_t x = 0; x < st->nxfers; x++) {
      i32(b, st->xfers[x].src);
      i32(b, st->xfers[x].dst);
      box(b, &st->xfers[x].box);
    }
    i64(b, st->elems);
  }
  for (int32_t r = 0; r < p->world; r++) {
    i64(b, p->mem[r].arena_bytes);
    i64(b, p->mem[r].param_bytes);
    i64(b, p->mem[r].input_bytes);
  }
  for (size_t v = 0; v < p->global->n_values; v++) {
    count(b, p->npieces[v]);
    for (size_t k = 0; k < p->npieces[v]; k++) i32(b, p->pieces[v][k]);
  }
}

static void cuda_rank(program_image *b, const sh_program *p, const cg_module *c) {
  u32(b, (uint32_t)c->len);
  put(b, c->source, c->len);
  count(b, c->nkernels);
  for (size_t k = 0; k < c->nkernels; k++) {
    const cg_kernel *x = &c->kernels[k];
    str(b, x->name);
    i32(b, x->step);
    i64(b, x->grid);
    i32(b, x->block);
    i32(b, x->smem);
  }
  for (size_t s = 0; s < p->n_steps; s++) {
    const cg_step *x = &c->steps[s];
    u32(b, (uint32_t)x->kind);
    i32(b, x->kernel);
    u32(b, (uint32_t)x->epilogue);
    i32(b, x->bias);
    i32(b, x->aux);
    i32(b, x->mm);
    i32(b, x->out);
    i64(b, x->grid);
    i32(b, x->block);
    i32(b, x->smem);
    i32(b, x->arg0);
    i32(b, x->nargs);
    i32(b, x->pre);
    i64(b, x->pre_grid);
  }
  count(b, c->nargs);
  for (size_t a = 0; a < c->nargs; a++) i64(b, c->args[a]);
  i64(b, c->scratch_bytes);
}

void program_write(const ir_module *m, const sh_program *p, const cg_module *cuda, program_image *out) {
  program_image body = {0};
  module(&body, m);
  u32(&body, p != NULL);
  if (p) program(&body, p);
  u32(&body, p && cuda);
  if (p && cuda)
    for (int32_t r = 0; r < p->world; r++) cuda_rank(&body, p, &cuda[r]);
  out->len = 0;
  put(out, NTP_PROGRAM_MAGIC, sizeof NTP_PROGRAM_MAGIC); /* with its NUL: 8 bytes */
  u32(out, NTP_PROGRAM_VERSION);
  u32(out, 0);
  i64(out, (int64_t)body.len);
  put_le(out, ntp_fnv1a64(body.data, body.len, NTP_FNV_BASIS), 8);
  put(out, body.data, body.len);
  program_image_free(&body);
}

void program_image_free(program_image *img) {
  free(img->data);
  *img = (program_image){0};
}
