/* program_read.c — the runtime's side of the program format (ntp_program.h): an image read
 * into the runtime's own structs, every count, index and offset checked against what it
 * indexes, so a damaged or mismatched image is a message, never an access outside a table or
 * an arena. The writer is codegen/program_write.c; the two read and write the same fields in
 * the same order. */
#include "ntp_program.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HEADER_BYTES = 8 + 4 + 4 + 8 + 8 };

/* every allocation of a program, freed together */
typedef struct block {
  struct block *next;
  max_align_t data[];
} block;
struct ntp_program_pool {
  block *head;
};

typedef struct reader {
  const unsigned char *p, *end;
  ntp_program_pool *pool;
  char *err;
  size_t cap;
  bool bad;
} reader;

static bool fail(reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(reader *r, const char *fmt, ...) {
  if (!r->bad) {
    int n = snprintf(r->err, r->cap, "program image: ");
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < r->cap) vsnprintf(r->err + n, r->cap - (size_t)n, fmt, ap);
    va_end(ap);
  }
  r->bad = true;
  return false;
}

static void *alloc(reader *r, size_t n, size_t size) {
  if (r->bad) return NULL;
  if (size && n > (SIZE_MAX - sizeof(block)) / size) {
    fail(r, "out of memory");
    return NULL;
  }
  size_t bytes = n * size;
  block *b = calloc(1, sizeof(block) + (bytes ? bytes : 1));
  if (!b) {
    fail(r, "out of memory");
    return NULL;
  }
  b->next = r->pool->head;
  r->pool->head = b;
  return b->data;
}

static uint64_t le(reader *r, int bytes) {
  if (r->bad) return 0;
  if (r->end - r->p < bytes) {
    fail(r, "truncated");
    return 0;
  }
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[i] << (8 * i);
  r->p += bytes;
  return v;
}
static unsigned u8(reader *r) { return (unsigned)le(r, 1); }
static uint32_t u32(reader *r) { return (uint32_t)le(r, 4); }
static int32_t i32(reader *r) { return (int32_t)(uint32_t)le(r, 4); }
static int64_t i64(reader *r) { return (int64_t)le(r, 8); }
static float f32(reader *r) {
  uint32_t u = u32(r);
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static double f64(reader *r) {
  uint64_t u = le(r, 8);
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}
static bool boolean(reader *r) {
  unsigned v = u8(r);
  if (v > 1) fail(r, "a flag is %u", v);
  return v == 1;
}

/* whether an optional section follows: u32 0 or 1 */
static bool section(reader *r) {
  uint32_t v = u32(r);
  if (v > 1) fail(r, "a section flag is %u", v);
  return v == 1;
}

/* A table's count: each entry takes at least `min_bytes` of what is left, so a damaged count
 * cannot ask for more memory than the image could describe. */
static size_t count(reader *r, size_t min_bytes, const char *what) {
  uint32_t n = u32(r);
  if (!r->bad && (size_t)n * min_bytes > (size_t)(r->end - r->p)) fail(r, "%u %s do not fit in the image", n, what);
  return r->bad ? 0 : n;
}

static const char *str(reader *r) {
  uint32_t n = u32(r);
  if (r->bad || n == UINT32_MAX) return NULL;
  if (n > (size_t)(r->end - r->p)) {
    fail(r, "truncated string");
    return NULL;
  }
  char *s = alloc(r, (size_t)n + 1, 1);
  if (!s) return NULL;
  memcpy(s, r->p, n);
  r->p += n;
  if (memchr(s, '\0', n)) fail(r, "a string holds a NUL");
  return s;
}

static int32_t ndim(reader *r) {
  uint32_t n = u32(r);
  if (n > NTP_MAX_RANK) fail(r, "rank %u (at most %d)", n, NTP_MAX_RANK);
  return r->bad ? 0 : (int32_t)n;
}
static ntp_shape shape(reader *r) {
  ntp_shape s = {.ndim = ndim(r)};
  for (int d = 0; d < s.ndim; d++)
    if ((s.dim[d] = i64(r)) < 0) fail(r, "a negative dimension");
  if (!r->bad && shape_numel_checked(&s) < 0) fail(r, "a shape's element count overflows");
  return s;
}
static ntp_box box(reader *r) {
  ntp_box b = {.ndim = ndim(r)};
  for (int d = 0; d < b.ndim; d++) {
    b.lo[d] = i64(r);
    b.hi[d] = i64(r);
    if (b.lo[d] < 0 || b.hi[d] < b.lo[d]) fail(r, "a box [%lld, %lld)", (long long)b.lo[d], (long long)b.hi[d]);
  }
  int64_t v = 1;
  for (int d = 0; d < b.ndim && !r->bad; d++)
    if (__builtin_mul_overflow(v, b.hi[d] - b.lo[d], &v) || v > INT64_MAX / 8) fail(r, "a box's volume overflows");
  return b;
}
static ntp_dtype dtype(reader *r) {
  uint32_t t = u32(r);
  if (t >= NTP_DTYPE_COUNT) fail(r, "dtype %u", t);
  return r->bad ? NTP_FP32 : (ntp_dtype)t;
}
static bool index_ok(reader *r, int64_t i, int64_t lo, size_t n, const char *what) {
  if (i < lo || i >= (int64_t)n) return fail(r, "%s %lld out of range (%zu)", what, (long long)i, n);
  return true;
}

static void attrs(reader *r, ntp_op *o) {
  ntp_op_attr *a = &o->attr;
  switch (o->code) {
  case IR_INPUT: case IR_PARAM:
    a->init.center = f32(r);
    a->init.scale = f32(r);
    a->init.int_range = i32(r);
    break;
  case IR_CONST: a->cst.value = f64(r); break;
  case IR_GATHER: case IR_SCATTER_ADD: a->gather.lo = i64(r); a->gather.hi = i64(r); break;
  case IR_SLICE: case IR_PAD: a->slice.axis = i32(r); a->slice.start = i64(r); a->slice.len = i64(r); break;
  case IR_MATMUL: a->mm.trans_b = boolean(r); a->mm.trans_a = boolean(r); break;
  case IR_LAYERNORM: case IR_RMSNORM: case IR_LAYERNORM_GRAD: case IR_RMSNORM_GRAD: a->norm.eps = f32(r); break;
  case IR_ROPE: a->rope.theta = f32(r); a->rope.pos0 = i64(r); a->rope.inverse = boolean(r); break;
  case IR_CROSS_ENTROPY: case IR_CROSS_ENTROPY_GRAD: case IR_CE_ROWS: case IR_CE_ROWS_GRAD: case IR_CE_COUNT:
    a->ce.ignore = i64(r);
    break;
  case IR_CE_STATS: case IR_CE_STATS_GRAD:
    a->ce.ignore = i64(r);
    a->ce.lo = i64(r);
    break;
  case IR_ACT_GRAD:
    a->grad.of = i32(r);
    if (!r->bad && (a->grad.of < 0 || a->grad.of >= IR_OP_COUNT || !ir_op_is_unary_elementwise((ir_opcode)a->grad.of)))
      fail(r, "act_grad of opcode %d", a->grad.of);
    break;
  case IR_ATTENTION: case IR_ATTENTION_GRAD:
    a->attn.causal = boolean(r);
    a->attn.which = (uint8_t)u8(r);
    if (a->attn.which > 2) fail(r, "attention_grad of operand %u", a->attn.which);
    a->attn.scale = f32(r);
    a->attn.q_off = i64(r);
    a->attn.group = i64(r);
    a->attn.kv_off = i64(r);
    if (!r->bad && (a->attn.group < 1 || a->attn.q_off < 0 || a->attn.kv_off < 0)) fail(r, "attention attributes");
    break;
  default: break;
  }
}

/* An op whose operands and result index a table of n entries. */
static ntp_op op(reader *r, size_t n, const char *what) {
  ntp_op o = {0};
  uint32_t code = u32(r);
  if (code >= IR_OP_COUNT) {
    fail(r, "opcode %u", code);
    return o;
  }
  o.code = (ir_opcode)code;
  o.result = i32(r);
  uint32_t nargs = u32(r);
  if (!r->bad && (int)nargs != ir_op_arity(o.code)) fail(r, "%s takes %d operands, not %u", ir_op_name(o.code), ir_op_arity(o.code), nargs);
  if (r->bad) return o;
  o.nargs = (int32_t)nargs;
  for (int a = 0; a < o.nargs; a++) index_ok(r, o.args[a] = i32(r), 0, n, what);
  index_ok(r, o.result, 0, n, what);
  o.layer = i32(r);
  attrs(r, &o);
  return o;
}

static void module(reader *r, ntp_module *m) {
  m->name = str(r);
  m->dtype = dtype(r);
  m->n_values = count(r, 4 + 4 + 4 + 4, "values");
  m->values = alloc(r, m->n_values, sizeof *m->values);
  for (size_t v = 0; v < m->n_values && !r->bad; v++) {
    m->values[v].shape = shape(r);
    m->values[v].dtype = dtype(r);
    m->values[v].def = i32(r);
    m->values[v].name = str(r);
  }
  m->n_ops = count(r, 4 * 4, "ops");
  m->ops = alloc(r, m->n_ops, sizeof *m->ops);
  for (size_t i = 0; i < m->n_ops && !r->bad; i++) m->ops[i] = op(r, m->n_values, "value");
  m->n_layers = count(r, 4, "layers");
  m->layers = alloc(r, m->n_layers, sizeof *m->layers);
  for (size_t l = 0; l < m->n_layers && !r->bad; l++) m->layers[l] = str(r);
  m->n_outputs = count(r, 8, "outputs");
  m->outputs = alloc(r, m->n_outputs, sizeof *m->outputs);
  for (size_t o = 0; o < m->n_outputs && !r->bad; o++) {
    m->outputs[o].name = str(r);
    index_ok(r, m->outputs[o].value = i32(r), 0, m->n_values, "output value");
  }
  /* every op defines its value, in order; operands come before */
  for (size_t i = 0; i < m->n_ops && !r->bad; i++) {
    const ntp_op *o = &m->ops[i];
    if (m->values[o->result].def != (int32_t)i) fail(r, "op %zu and its value %d disagree", i, o->result);
    for (int a = 0; a < o->nargs; a++)
      if (m->values[o->args[a]].def >= (int32_t)i) fail(r, "op %zu reads a later value", i);
    index_ok(r, o->layer, -1, m->n_layers, "layer");
  }
  for (size_t v = 0; v < m->n_values && !r->bad; v++) index_ok(r, m->values[v].def, 0, m->n_ops, "defining op");
}

static bool is_init_value(const ntp_module *m, int32_t v) {
  ir_opcode c = m->ops[m->values[v].def].code;
  return c == IR_INPUT || c == IR_PARAM;
}

/* Tensor t of the table: its fields, each checked against the world, the global module and the
 * value it is a slice of. */
static void tensor(reader *r, ntp_program *p, size_t t) {
  const ntp_module *m = &p->global;
  ntp_tensor *x = &p->tensors[t];
  index_ok(r, x->rank = i32(r), 0, (size_t)p->world, "rank");
  index_ok(r, x->global = i32(r), -1, m->n_values, "tensor value");
  x->box = box(r);
  x->dtype = dtype(r);
  x->persistent = boolean(r);
  x->name = str(r);
  index_ok(r, x->init_value = i32(r), -1, m->n_values, "init value");
  x->init_box = box(r);
  x->def = i32(r);
  x->offset = i64(r);
  if (x->offset < 0) fail(r, "tensor %zu at a negative offset", t);
  if (!r->bad && x->persistent && (x->init_value < 0 || !is_init_value(m, x->init_value)))
    fail(r, "persistent tensor %zu is not a parameter or input slice", t);
  if (!r->bad && x->global >= 0) {
    ntp_box whole = box_full(&m->values[x->global].shape);
    if (!box_contains(&whole, &x->box)) fail(r, "tensor %zu lies outside its value", t);
  }
  if (!r->bad && x->persistent) {
    ntp_box whole = box_full(&m->values[x->init_value].shape);
    if (!box_contains(&whole, &x->init_box) || box_volume(&x->init_box) != box_volume(&x->box))
      fail(r, "persistent tensor %zu's slice", t);
  }
}

/* The rest of communication step s (after its kind and layer): the collective, its ranks in
 * ascending order, its transfers between tensors of one dtype, each box inside both tensors. */
static void comm_step(reader *r, ntp_program *p, ntp_step *st, size_t s) {
  uint32_t comm = u32(r);
  if (comm >= SH_COMM_COUNT) fail(r, "collective %u", comm);
  st->comm = (sh_comm_kind)comm;
  size_t nr = count(r, 4, "ranks");
  if (nr > (size_t)p->world) fail(r, "a collective over %zu of %d ranks", nr, p->world);
  st->nranks = (int32_t)nr;
  st->ranks = alloc(r, nr, sizeof *st->ranks);
  for (size_t k = 0; k < nr && !r->bad; k++) {
    index_ok(r, st->ranks[k] = i32(r), 0, (size_t)p->world, "rank");
    if (k && st->ranks[k] <= st->ranks[k - 1]) fail(r, "a collective's ranks are not ascending");
  }
  st->nxfers = count(r, 12, "transfers");
  st->xfers = alloc(r, st->nxfers, sizeof *st->xfers);
  for (size_t k = 0; k < st->nxfers && !r->bad; k++) {
    ntp_xfer *x = &st->xfers[k];
    index_ok(r, x->src = i32(r), 0, p->n_tensors, "tensor");
    index_ok(r, x->dst = i32(r), 0, p->n_tensors, "tensor");
    x->box = box(r);
    if (!r->bad && (!box_contains(&p->tensors[x->src].box, &x->box) || !box_contains(&p->tensors[x->dst].box, &x->box)))
      fail(r, "step %zu moves a box outside its tensors", s);
    if (!r->bad && p->tensors[x->src].dtype != p->tensors[x->dst].dtype) fail(r, "step %zu moves between dtypes", s);
  }
  st->elems = i64(r);
}

/* Step s: a rank's op on tensors, or a communication step. */
static void step(reader *r, ntp_program *p, size_t s) {
  ntp_step *st = &p->steps[s];
  uint32_t kind = u32(r);
  if (kind > SH_COMM) fail(r, "step kind %u", kind);
  st->kind = (sh_step_kind)kind;
  index_ok(r, st->layer = i32(r), -1, p->global.n_layers, "layer");
  if (r->bad) return;
  if (st->kind == SH_COMPUTE) {
    index_ok(r, st->rank = i32(r), 0, (size_t)p->world, "rank");
    st->op = op(r, p->n_tensors, "tensor");
    return;
  }
  comm_step(r, p, st, s);
}

/* every tensor inside its rank's arena or parameter block; a step's tensors on its rank */
static void check_placement(reader *r, const ntp_program *p) {
  for (size_t t = 0; t < p->n_tensors && !r->bad; t++) {
    const ntp_tensor *x = &p->tensors[t];
    const ntp_rank_mem *rm = &p->mem[x->rank];
    int64_t limit = x->persistent ? rm->param_bytes + rm->input_bytes : rm->arena_bytes;
    int64_t bytes = box_volume(&x->box) * (int64_t)dtype_bytes(x->dtype);
    if (x->offset > limit || bytes > limit - x->offset) fail(r, "tensor %zu lies outside rank %d's memory", t, x->rank);
    index_ok(r, x->def, -1, p->n_steps, "defining step");
  }
  for (size_t s = 0; s < p->n_steps && !r->bad; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind != SH_COMPUTE) continue;
    bool own = p->tensors[st->op.result].rank == st->rank;
    for (int a = 0; a < st->op.nargs; a++) own &= p->tensors[st->op.args[a]].rank == st->rank;
    if (!own) fail(r, "step %zu reads or writes another rank's tensor", s);
  }
}

static void program(reader *r, ntp_program *p) {
  const ntp_module *m = &p->global;
  p->world = i32(r);
  if (!r->bad && (p->world < 1 || p->world > 4096)) fail(r, "world %d", p->world);
  p->n_tensors = count(r, 40, "tensors");
  p->tensors = alloc(r, p->n_tensors, sizeof *p->tensors);
  for (size_t t = 0; t < p->n_tensors && !r->bad; t++) tensor(r, p, t);
  p->n_steps = count(r, 8, "steps");
  p->steps = alloc(r, p->n_steps, sizeof *p->steps);
  for (size_t s = 0; s < p->n_steps && !r->bad; s++) step(r, p, s);
  p->mem = alloc(r, (size_t)p->world, sizeof *p->mem);
  for (int32_t k = 0; k < p->world && !r->bad; k++) {
    p->mem[k].arena_bytes = i64(r);
    p->mem[k].param_bytes = i64(r);
    p->mem[k].input_bytes = i64(r);
    if (p->mem[k].arena_bytes < 0 || p->mem[k].param_bytes < 0 || p->mem[k].input_bytes < 0 ||
        p->mem[k].param_bytes > INT64_MAX - p->mem[k].input_bytes)
      fail(r, "rank %d's memory sizes", k);
  }
  check_placement(r, p);
  p->pieces = alloc(r, m->n_values, sizeof *p->pieces);
  p->npieces = alloc(r, m->n_values, sizeof *p->npieces);
  for (size_t v = 0; v < m->n_values && !r->bad; v++) {
    p->npieces[v] = count(r, 4, "pieces");
    p->pieces[v] = alloc(r, p->npieces[v], sizeof **p->pieces);
    for (size_t k = 0; k < p->npieces[v] && !r->bad; k++) {
      int32_t t = p->pieces[v][k] = i32(r);
      if (index_ok(r, t, 0, p->n_tensors, "tensor") && p->tensors[t].global != (int32_t)v)
        fail(r, "a piece of value %zu holds another value", v);
    }
  }
}

static void cuda_rank(reader *r, const ntp_program *p, ntp_rank_code *c) {
  uint32_t len = u32(r);
  if (!r->bad && len > (size_t)(r->end - r->p)) fail(r, "truncated CUDA source");
  char *src = alloc(r, (size_t)len + 1, 1);
  if (r->bad) return;
  memcpy(src, r->p, len);
  r->p += len;
  c->source = src;
  c->len = len;
  c->nkernels = count(r, 24, "kernels");
  c->kernels = alloc(r, c->nkernels, sizeof *c->kernels);
  for (size_t k = 0; k < c->nkernels && !r->bad; k++) {
    cg_kernel *x = &c->kernels[k];
    const char *name = str(r);
    if (!r->bad && (!name || strlen(name) >= sizeof x->name)) fail(r, "a kernel name");
    if (r->bad) break;
    memcpy(x->name, name, strlen(name) + 1);
    index_ok(r, x->step = i32(r), 0, p->n_steps, "step");
    x->grid = i64(r);
    x->block = i32(r);
    x->smem = i32(r);
    if (x->grid < 1 || x->block < 1 || x->smem < 0) fail(r, "kernel %s's launch", x->name);
  }
  c->steps = alloc(r, p->n_steps, sizeof *c->steps);
  for (size_t s = 0; s < p->n_steps && !r->bad; s++) {
    cg_step *x = &c->steps[s];
    uint32_t kind = u32(r), epi;
    if (kind > CG_ATTENTION_GEMM) fail(r, "step kind %u", kind);
    x->kind = (cg_step_kind)kind;
    x->kernel = i32(r);
    if ((epi = u32(r)) >= CG_EPI_COUNT) fail(r, "epilogue %u", epi);
    x->epilogue = (cg_epilogue)epi;
    index_ok(r, x->bias = i32(r), -1, p->n_tensors, "tensor");
    index_ok(r, x->aux = i32(r), -1, p->n_tensors, "tensor");
    index_ok(r, x->mm = i32(r), -1, p->n_steps, "step");
    index_ok(r, x->out = i32(r), -1, p->n_tensors, "tensor");
    x->grid = i64(r);
    x->block = i32(r);
    x->smem = i32(r);
    x->arg0 = i32(r);
    x->nargs = i32(r);
    x->pre = i32(r);
    x->pre_grid = i64(r);
    if (!r->bad && (x->kind == CG_KERNEL || x->kind == CG_ATTENTION_GEMM)) {
      index_ok(r, x->kernel, 0, c->nkernels, "kernel");
      if (x->grid < 1 || x->block < 1 || x->smem < 0 || x->nargs < 0 || x->nargs > CG_MAX_ARGS || x->arg0 < 0)
        fail(r, "step %zu's launch", s);
      index_ok(r, x->pre, -1, c->nkernels, "kernel");
      if (x->pre >= 0 && x->pre_grid < 1) fail(r, "step %zu's first pass", s);
    }
    if (!r->bad && x->kind == CG_GEMM && x->out < 0) fail(r, "step %zu's GEMM writes nothing", s);
    if (!r->bad && x->kind == CG_GEMM &&
        (x->mm < 0 || (size_t)x->mm > s || p->steps[x->mm].kind != SH_COMPUTE || p->steps[x->mm].op.code != IR_MATMUL ||
         p->steps[x->mm].rank != p->steps[s].rank))
      fail(r, "step %zu's GEMM computes no matmul of its rank", s);
    bool needs_aux = x->epilogue == CG_EPI_DGELU || x->epilogue == CG_EPI_DGELU_BGRAD;
    bool needs_bias = x->epilogue != CG_EPI_NONE && x->epilogue != CG_EPI_GELU && x->epilogue != CG_EPI_DGELU;
    if (!r->bad && x->kind == CG_GEMM && ((x->aux >= 0) != needs_aux || (x->bias >= 0) != needs_bias))
      fail(r, "step %zu's GEMM epilogue %s without its tensors", s, cg_epilogue_name(x->epilogue));
    for (int k = 0; k < 3 && !r->bad && x->kind == CG_GEMM; k++) { /* the GEMM's own rank's memory */
      int32_t t = k == 0 ? x->out : k == 1 ? x->bias : x->aux;
      if (t >= 0 && p->tensors[t].rank != p->steps[s].rank) fail(r, "step %zu's GEMM uses another rank's tensor", s);
    }
  }
  c->nargs = count(r, 8, "kernel arguments");
  c->args = alloc(r, c->nargs, sizeof *c->args);
  for (size_t a = 0; a < c->nargs && !r->bad; a++) c->args[a] = i64(r);
  c->scratch_bytes = i64(r);
  if (!r->bad && (c->scratch_bytes < 0 || c->scratch_bytes > ((int64_t)1 << 46))) fail(r, "scratch of %lld bytes", (long long)c->scratch_bytes);
  for (size_t s = 0; s < p->n_steps && !r->bad; s++) {
    const cg_step *x = &c->steps[s];
    if ((x->kind == CG_KERNEL || x->kind == CG_ATTENTION_GEMM) && (size_t)x->arg0 + (size_t)x->nargs > c->nargs)
      fail(r, "step %zu's arguments", s);
    if (x->kind == CG_ATTENTION_GEMM && (p->steps[s].kind != SH_COMPUTE || p->steps[s].op.code != IR_ATTENTION))
      fail(r, "step %zu: GEMM attention on another op", s);
  }
}

void ntp_program_free(ntp_program *p) {
  if (!p) return;
  for (block *b = p->pool->head, *next; b; b = next) {
    next = b->next;
    free(b);
  }
  free(p->pool);
  free(p);
}

int ntp_program_read(const void *data, size_t len, ntp_program **out, char *err, size_t cap) {
  *out = NULL;
  ntp_program *p = calloc(1, sizeof *p);
  ntp_program_pool *pool = calloc(1, sizeof *pool);
  if (!p || !pool) {
    free(p);
    free(pool);
    snprintf(err, cap, "program image: out of memory");
    return -1;
  }
  p->pool = pool;
  reader r = {.p = data, .end = (const unsigned char *)data + len, .pool = pool, .err = err, .cap = cap};
  if (len < HEADER_BYTES || memcmp(data, NTP_PROGRAM_MAGIC, sizeof NTP_PROGRAM_MAGIC) != 0) {
    fail(&r, "not an ntp program (no '%s' header)", NTP_PROGRAM_MAGIC);
  } else {
    r.p += sizeof NTP_PROGRAM_MAGIC;
    uint32_t version = u32(&r), flags = u32(&r);
    uint64_t body = (uint64_t)i64(&r), sum = (uint64_t)i64(&r);
    if (version != NTP_PROGRAM_VERSION)
      fail(&r, "format version %u; this runtime reads version %d (compile the model again with this ntpc)", version,
           NTP_PROGRAM_VERSION);
    else if (flags != 0) fail(&r, "unknown flags 0x%x", flags);
    else if (body != len - HEADER_BYTES) fail(&r, "%llu payload bytes announced, %zu present", (unsigned long long)body, len - HEADER_BYTES);
    else if (ntp_fnv1a64(r.p, (size_t)body, NTP_FNV_BASIS) != sum) fail(&r, "checksum mismatch (a damaged image)");
  }
  if (!r.bad) module(&r, &p->global);
  if (!r.bad && section(&r)) program(&r, p);
  if (!r.bad && section(&r)) {
    if (!p->world) fail(&r, "CUDA without a sharded program");
    p->cuda = alloc(&r, (size_t)p->world, sizeof *p->cuda);
    for (int32_t k = 0; k < p->world && !r.bad; k++) cuda_rank(&r, p, &p->cuda[k]);
  }
  if (!r.bad && r.p != r.end) fail(&r, "%zu bytes after the end", (size_t)(r.end - r.p));
  if (r.bad) {
    ntp_program_free(p);
    return -1;
  }
  *out = p;
  return 0;
}
