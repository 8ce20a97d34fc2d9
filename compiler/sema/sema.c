/* sema.c — names, dims, types, expressions and repeat unrolling: AST -> global IR (plans: sema_plans.c). */
#include "layer_kind.h"
#include "sema.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void sema_error(sema *s, ntp_loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vemit(s->diags, NTPC_ERROR, s->file, loc, fmt, ap);
  va_end(ap);
}

void sema_note(sema *s, ntp_loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vemit(s->diags, NTPC_NOTE, s->file, loc, fmt, ap);
  va_end(ap);
}

const char *sema_type_str(sema *s, int32_t value) {
  const ir_value *v = &s->m->values[value];
  char buf[128];
  return arena_printf(s->pool, "%s%s", dtype_name(v->dtype), shape_str(&v->shape, buf, sizeof buf));
}

/* Names in a strmap, for "did you mean" suggestions. */
static const char *suggest(sema *s, const strmap *map, const char *name) {
  const char **cands = malloc((map->len + 1) * sizeof *cands);
  if (!cands) return NULL;
  size_t n = 0;
  for (size_t i = 0; i < map->cap; i++)
    if (map->keys[i]) cands[n++] = map->keys[i];
  const char *best = nearest_name(name, cands, n);
  free(cands);
  (void)s;
  return best;
}

/* ---- dims ------------------------------------------------------------------ */

bool sema_eval_dim(sema *s, const ast_expr *e, int64_t *out) {
  int64_t a, b;
  switch (e->kind) {
  case AST_INT:
    *out = e->ival;
    return true;
  case AST_FLOAT:
    sema_error(s, e->loc, "expected an integer dim expression, found the number %g", e->fval);
    return false;
  case AST_NAME: {
    int64_t idx;
    if (strmap_get(&s->dims, e->name, &idx)) {
      *out = s->m->dims[idx].value;
      return true;
    }
    if (strmap_get(&s->vars, e->name, NULL)) {
      sema_error(s, e->loc, "'%s' is a tensor, but a dim expression is needed here", e->name);
      return false;
    }
    const char *near = suggest(s, &s->dims, e->name);
    if (near) sema_error(s, e->loc, "unknown dim '%s'; did you mean '%s'?", e->name, near);
    else sema_error(s, e->loc, "unknown dim '%s'", e->name);
    return false;
  }
  case AST_NEG:
    if (!sema_eval_dim(s, e->operand, &a)) return false;
    if (a == INT64_MIN) { /* -INT64_MIN does not fit */
      sema_error(s, e->loc, "dim arithmetic overflows");
      return false;
    }
    *out = -a;
    return true;
  case AST_BINOP: {
    bool ok = sema_eval_dim(s, e->bin.lhs, &a);
    ok = sema_eval_dim(s, e->bin.rhs, &b) && ok;
    if (!ok) return false;
    switch (e->bin.op) {
    case '+': return !__builtin_add_overflow(a, b, out) || (sema_error(s, e->loc, "dim arithmetic overflows"), false);
    case '-': return !__builtin_sub_overflow(a, b, out) || (sema_error(s, e->loc, "dim arithmetic overflows"), false);
    case '*': return !__builtin_mul_overflow(a, b, out) || (sema_error(s, e->loc, "dim arithmetic overflows"), false);
    case '/':
      if (b == 0) {
        sema_error(s, e->loc, "division by zero in dim expression");
        return false;
      }
      if (a == INT64_MIN && b == -1) { /* the one quotient (and remainder) that traps */
        sema_error(s, e->loc, "dim arithmetic overflows");
        return false;
      }
      if (a % b) {
        sema_error(s, e->loc, "%lld / %lld is not an integer: dims must divide exactly", (long long)a,
                   (long long)b);
        return false;
      }
      *out = a / b;
      return true;
    default:
      sema_error(s, e->loc, "'@' is not defined on dims");
      return false;
    }
  }
  case AST_CALL:
    sema_error(s, e->loc, "a call is not a dim expression");
    return false;
  }
  return false;
}

static bool eval_positive(sema *s, const ast_expr *e, const char *what, int64_t *out) {
  if (!sema_eval_dim(s, e, out)) return false;
  if (*out < 1) {
    sema_error(s, e->loc, "%s must be positive, got %lld", what, (long long)*out);
    return false;
  }
  return true;
}

/* A positive dim expression no larger than max (a world, a repeat count: sizes that later
 * passes multiply or loop over). */
bool sema_eval_bounded(sema *s, const ast_expr *e, const char *what, int64_t max, int64_t *out) {
  if (!eval_positive(s, e, what, out)) return false;
  if (*out > max) {
    sema_error(s, e->loc, "%s must be at most %lld, got %lld", what, (long long)max, (long long)*out);
    return false;
  }
  return true;
}

/* A dim expression in [lo, max] (a rank number may be 0). */
bool sema_eval_bounded_from(sema *s, const ast_expr *e, const char *what, int64_t lo, int64_t max, int64_t *out) {
  if (!sema_eval_dim(s, e, out)) return false;
  if (*out < lo || *out > max) {
    sema_error(s, e->loc, "%s must be in %lld..%lld, got %lld", what, (long long)lo, (long long)max, (long long)*out);
    return false;
  }
  return true;
}

/* ---- ops ------------------------------------------------------------------- */

/* Not for IR_RESHAPE, whose shape is not inferred: see sema_reshape. */
int32_t sema_op(sema *s, ir_opcode code, const int32_t *args, int32_t nargs, ntp_loc loc, const ir_op *attrs) {
  ir_op probe = attrs ? *attrs : (ir_op){0};
  probe.code = code;
  probe.nargs = nargs;
  for (int i = 0; i < nargs; i++) probe.args[i] = args[i];
  probe.result = -1;
  ntp_shape shape = {0};
  ntp_dtype dt = NTP_FP32;
  char err[512];
  if (!ir_infer(s->m, &probe, &shape, &dt, err, sizeof err)) {
    sema_error(s, loc, "%s", err);
    return -1;
  }
  int32_t v = ir_emit(s->m, code, args, nargs, shape, dt, s->cur_layer, loc);
  if (attrs) s->m->ops[s->m->values[v].def].attr = attrs->attr;
  return v;
}

int32_t sema_param(sema *s, const char *name, ntp_shape shape, float center, float scale, ntp_loc loc) {
  const char *full = arena_printf(s->pool, "%s%s", s->prefix, name);
  if (s->cur_layer >= 0) full = arena_printf(s->pool, "%s.%s", s->m->layers[s->cur_layer].name, name);
  int64_t prev;
  if (strmap_get(&s->tensors, full, &prev)) {
    sema_error(s, loc, "a tensor named '%s' already exists", full);
    sema_note(s, s->m->ops[s->m->values[prev].def].loc, "'%s' was declared here", full);
    return -1;
  }
  int32_t v = ir_emit(s->m, IR_PARAM, NULL, 0, shape, s->m->dtype, s->cur_layer, loc);
  s->m->values[v].name = full;
  ir_op *op = ir_def(s->m, v);
  op->attr.init.center = center;
  op->attr.init.scale = scale;
  strmap_put(&s->tensors, full, v);
  s->dtype_locked = true;
  return v;
}

/* ---- expressions ----------------------------------------------------------- */

static const struct {
  const char *name;
  ir_opcode op;
} elementwise_fns[] = {
    {"gelu", IR_GELU}, {"relu", IR_RELU}, {"silu", IR_SILU}, {"sigmoid", IR_SIGMOID},
    {"tanh", IR_TANH}, {"exp", IR_EXP},   {"softmax", IR_SOFTMAX},
};
enum { N_ELEMENTWISE = sizeof elementwise_fns / sizeof elementwise_fns[0] };

static tval err_val(void) { return (tval){.kind = TV_ERROR, .value = -1}; }
static tval tensor_val(int32_t v) { return v < 0 ? err_val() : (tval){.kind = TV_TENSOR, .value = v}; }

/* A number used beside a tensor becomes a scalar constant of the tensor's dtype. */
static int32_t scalar_const(sema *s, double num, ntp_dtype dt, ntp_loc loc) {
  int32_t v = ir_emit(s->m, IR_CONST, NULL, 0, (ntp_shape){0}, dt, s->cur_layer, loc);
  ir_def(s->m, v)->attr.cst.value = num;
  return v;
}

/* cross_entropy(logits, targets [, ignore = N]): the mean over tokens of -log softmax(logits)[target],
 * targets equal to `ignore` (default -1) skipped. The targets' default range becomes the
 * vocabulary (the logits' last dim), as an embedding sets its tokens'. */
static tval lower_cross_entropy(sema *s, const ast_expr *e) {
  const ast_arg *pos[2] = {0};
  int np = 0;
  ir_op attrs = {.attr.ce.ignore = -1};
  for (const ast_arg *a = e->call.args; a; a = a->next) {
    if (!a->key) {
      if (np < 2) pos[np] = a;
      np++;
      continue;
    }
    if (strcmp(a->key, "ignore") != 0) {
      sema_error(s, a->key_loc, "cross_entropy has no argument '%s' (it takes logits, targets and ignore = N)", a->key);
      return err_val();
    }
    tval v = sema_lower_expr(s, a->value);
    if (v.kind == TV_ERROR) return v;
    if (v.kind != TV_NUMBER || !v.is_int) {
      sema_error(s, a->value->loc, "ignore = needs an integer (the target id to skip)");
      return err_val();
    }
    attrs.attr.ce.ignore = (int64_t)v.num;
  }
  if (np != 2) {
    sema_error(s, e->loc, "cross_entropy takes two tensors, logits and targets (got %d)", np);
    return err_val();
  }
  tval l = sema_lower_expr(s, pos[0]->value), t = sema_lower_expr(s, pos[1]->value);
  if (l.kind == TV_ERROR || t.kind == TV_ERROR) return err_val();
  if (l.kind != TV_TENSOR || t.kind != TV_TENSOR) {
    sema_error(s, (l.kind != TV_TENSOR ? pos[0] : pos[1])->value->loc, "cross_entropy needs a tensor, got a number");
    return err_val();
  }
  int32_t args[2] = {l.value, t.value};
  int32_t v = sema_op(s, IR_CROSS_ENTROPY, args, 2, e->loc, &attrs);
  if (v < 0) return err_val();
  ir_op *def = ir_def(s->m, t.value);
  const ntp_shape *ls = &s->m->values[l.value].shape;
  int64_t V = ls->dim[ls->ndim - 1];
  if (def->code == IR_INPUT && !strmap_get(&s->narrowed, s->m->values[t.value].name, NULL)) {
    def->attr.init.int_range = (int32_t)(V < INT32_MAX ? V : INT32_MAX);
    strmap_put(&s->narrowed, s->m->values[t.value].name, 1);
  }
  return tensor_val(v);
}

static tval lower_call(sema *s, const ast_expr *e) {
  if (e->call.label) return sema_lower_layer(s, e);
  if (strcmp(e->call.callee, "cross_entropy") == 0) return lower_cross_entropy(s, e);
  for (int i = 0; i < N_ELEMENTWISE; i++) {
    if (strcmp(e->call.callee, elementwise_fns[i].name) != 0) continue;
    const ast_arg *a = e->call.args;
    if (!a || a->next || a->key) {
      sema_error(s, e->loc, "%s takes exactly one tensor argument", e->call.callee);
      return err_val();
    }
    tval x = sema_lower_expr(s, a->value);
    if (x.kind == TV_ERROR) return x;
    if (x.kind == TV_NUMBER) {
      sema_error(s, a->value->loc, "%s needs a tensor, got a number", e->call.callee);
      return err_val();
    }
    return tensor_val(sema_op(s, elementwise_fns[i].op, &x.value, 1, e->loc, NULL));
  }
  if (layer_kind_named(e->call.callee, NULL)) {
    sema_error(s, e->call.callee_loc, "layer '%s' needs a name, as in 'name: %s(...)'; parameters and plans refer to it",
               e->call.callee, e->call.callee);
    return err_val();
  }
  const char *cands[N_ELEMENTWISE + 65];
  size_t n = 0;
  cands[n++] = "cross_entropy";
  for (int i = 0; i < N_ELEMENTWISE; i++) cands[n++] = elementwise_fns[i].name;
  for (int32_t k = 0; k < layer_nkinds && k < 64; k++) cands[n++] = layer_kinds[k]->name;
  const char *near = nearest_name(e->call.callee, cands, n);
  if (near) sema_error(s, e->call.callee_loc, "unknown function '%s'; did you mean '%s'?", e->call.callee, near);
  else sema_error(s, e->call.callee_loc, "unknown function '%s'", e->call.callee);
  return err_val();
}

static ir_opcode binop_code(int op) {
  switch (op) {
  case '+': return IR_ADD;
  case '-': return IR_SUB;
  case '*': return IR_MUL;
  case '/': return IR_DIV;
  default: return IR_MATMUL;
  }
}

static tval lower_binop(sema *s, const ast_expr *e) {
  tval a = sema_lower_expr(s, e->bin.lhs);
  tval b = sema_lower_expr(s, e->bin.rhs);
  if (a.kind == TV_ERROR || b.kind == TV_ERROR) return err_val();
  int op = e->bin.op;
  if (a.kind == TV_NUMBER && b.kind == TV_NUMBER) {
    tval r = {.kind = TV_NUMBER, .is_int = a.is_int && b.is_int};
    switch (op) {
    case '+': r.num = a.num + b.num; break;
    case '-': r.num = a.num - b.num; break;
    case '*': r.num = a.num * b.num; break;
    case '/':
      if (b.num == 0) {
        sema_error(s, e->loc, "division by zero");
        return err_val();
      }
      r.num = a.num / b.num;
      r.is_int = r.is_int && fmod(a.num, b.num) == 0;
      break;
    default:
      sema_error(s, e->loc, "'@' needs two tensors");
      return err_val();
    }
    return r;
  }
  if (op == '@') {
    if (a.kind != TV_TENSOR || b.kind != TV_TENSOR) {
      sema_error(s, e->loc, "'@' needs two tensors, got a number");
      return err_val();
    }
    int32_t args[2] = {a.value, b.value};
    return tensor_val(sema_op(s, IR_MATMUL, args, 2, e->loc, NULL));
  }
  if (a.kind == TV_NUMBER) a.value = scalar_const(s, a.num, s->m->values[b.value].dtype, e->bin.lhs->loc);
  if (b.kind == TV_NUMBER) b.value = scalar_const(s, b.num, s->m->values[a.value].dtype, e->bin.rhs->loc);
  int32_t args[2] = {a.value, b.value};
  return tensor_val(sema_op(s, binop_code(op), args, 2, e->loc, NULL));
}

tval sema_lower_expr(sema *s, const ast_expr *e) {
  switch (e->kind) {
  case AST_INT: return (tval){.kind = TV_NUMBER, .num = (double)e->ival, .is_int = true};
  case AST_FLOAT: return (tval){.kind = TV_NUMBER, .num = e->fval};
  case AST_NAME: {
    int64_t v;
    if (strmap_get(&s->vars, e->name, &v)) return tensor_val((int32_t)v); /* -1: its definition failed, already reported */
    if (strmap_get(&s->dims, e->name, &v))
      return (tval){.kind = TV_NUMBER, .num = (double)s->m->dims[v].value, .is_int = true};
    const char *near = suggest(s, &s->vars, e->name);
    if (!near) near = suggest(s, &s->dims, e->name);
    if (near) sema_error(s, e->loc, "unknown name '%s'; did you mean '%s'?", e->name, near);
    else sema_error(s, e->loc, "unknown name '%s'", e->name);
    return err_val();
  }
  case AST_NEG: {
    tval x = sema_lower_expr(s, e->operand);
    if (x.kind == TV_NUMBER) x.num = -x.num;
    if (x.kind != TV_TENSOR) return x;
    return tensor_val(sema_op(s, IR_NEG, &x.value, 1, e->loc, NULL));
  }
  case AST_BINOP: return lower_binop(s, e);
  case AST_CALL: return lower_call(s, e);
  }
  return err_val();
}

/* ---- types and layouts ----------------------------------------------------- */

/* Fills shape and layout from a type's dims; false if reported. */
static bool lower_layout(sema *s, const ast_type *t, ntp_shape *shape, ntp_layout *layout) {
  *layout = (ntp_layout){.mesh = -1};
  shape->ndim = 0;
  bool ok = true;
  for (const ast_tdim *d = t->dims; d; d = d->next) {
    if (shape->ndim == NTP_MAX_RANK) {
      sema_error(s, d->loc, "at most %d dims are supported", NTP_MAX_RANK);
      return false;
    }
    int i = shape->ndim++;
    int64_t size = 1;
    if (!eval_positive(s, d->size, "a tensor dim", &size)) ok = false;
    shape->dim[i] = size;
    layout->axes[i] = 0;
    for (const ast_ident *ax = d->axes; ax; ax = ax->next) {
      int mesh = -1, axis = -1;
      for (size_t m = 0; m < s->m->n_meshes && mesh < 0; m++)
        for (int k = 0; k < s->m->meshes[m].ndims; k++)
          if (strcmp(s->m->meshes[m].axis[k], ax->name) == 0) {
            mesh = (int)m;
            axis = k;
            break;
          }
      if (mesh < 0) {
        const char *cands[64];
        size_t n = 0;
        for (size_t m = 0; m < s->m->n_meshes; m++)
          for (int k = 0; k < s->m->meshes[m].ndims && n < 64; k++) cands[n++] = s->m->meshes[m].axis[k];
        const char *near = nearest_name(ax->name, cands, n);
        if (!s->m->n_meshes)
          sema_error(s, ax->loc, "layout names mesh axis '%s', but the model declares no mesh", ax->name);
        else if (near)
          sema_error(s, ax->loc, "unknown mesh axis '%s'; did you mean '%s'?", ax->name, near);
        else
          sema_error(s, ax->loc, "unknown mesh axis '%s'", ax->name);
        ok = false;
        continue;
      }
      if (layout->mesh >= 0 && layout->mesh != mesh) {
        sema_error(s, ax->loc, "axis '%s' belongs to mesh '%s', but this tensor is laid out on mesh '%s'", ax->name,
                   s->m->meshes[mesh].name, s->m->meshes[layout->mesh].name);
        ok = false;
        continue;
      }
      for (int j = 0; j <= i; j++)
        if (layout->axes[j] & (1u << axis)) {
          sema_error(s, ax->loc, "mesh axis '%s' shards more than one dim of this tensor", ax->name);
          ok = false;
        }
      layout->mesh = mesh;
      layout->axes[i] |= (uint8_t)(1u << axis);
    }
  }
  if (t->diagonal) {
    bool two = shape->ndim == 2 && layout->axes[0] && layout->axes[1];
    if (!two) {
      sema_error(s, t->loc, "'diagonal' needs a 2-D tensor with both dims sharded, as in [N{r}, N{c}] diagonal");
      ok = false;
    }
    layout->diagonal = true;
  }
  return ok;
}

static bool declare_tensor_name(sema *s, const ast_stmt *st, const char *full) {
  int64_t prev;
  if (strmap_get(&s->tensors, full, &prev)) {
    sema_error(s, st->name_loc, "a tensor named '%s' already exists", full);
    sema_note(s, s->m->ops[s->m->values[prev].def].loc, "'%s' was declared here", full);
    return false;
  }
  return true;
}

static void lower_decl(sema *s, const ast_stmt *st) {
  bool is_input = st->kind == ST_INPUT;
  const char *full = arena_printf(s->pool, "%s%s", s->prefix, st->name);
  if (!declare_tensor_name(s, st, full)) return;
  ntp_shape shape;
  ntp_layout layout;
  ntp_dtype dt = (ntp_dtype)st->type->dtype;
  bool ok = lower_layout(s, st->type, &shape, &layout);
  if (ok && !is_input && !dtype_is_float(dt)) {
    sema_error(s, st->type->dtype_loc, "parameters must have a float dtype, got %s", dtype_name(dt));
    ok = false;
  }
  if (!ok) {
    strmap_put(&s->vars, st->name, -1); /* uses of it are not errors of their own */
    return;
  }
  int32_t v = ir_emit(s->m, is_input ? IR_INPUT : IR_PARAM, NULL, 0, shape, dt, -1, st->loc);
  s->m->values[v].name = full;
  s->m->values[v].layout = layout;
  ir_op *op = ir_def(s->m, v);
  op->attr.init.center = 0;
  op->attr.init.scale = (!is_input && shape.ndim >= 2) ? (float)(1.0 / sqrt((double)shape.dim[0])) : 1.0f;
  if (is_input && dt == NTP_I32) op->attr.init.int_range = 1000; /* narrowed by the embedding that reads it */
  strmap_put(&s->tensors, full, v);
  strmap_put(&s->vars, st->name, v);
  s->dtype_locked = true;
}

static void add_output(sema *s, const char *name, ntp_loc name_loc, int32_t v, const ast_type *layout_req) {
  int64_t prev;
  if (strmap_get(&s->outputs, name, &prev)) {
    sema_error(s, name_loc, "output '%s' is declared twice", name);
    sema_note(s, s->m->outputs[prev].loc, "first declared here");
    return;
  }
  ir_output o = {.name = name, .value = v, .loc = name_loc};
  if (layout_req) {
    ntp_shape shape;
    if (!lower_layout(s, layout_req, &shape, &o.layout)) return;
    const ir_value *val = &s->m->values[v];
    if (!shape_eq(&shape, &val->shape)) {
      char a[96], b[96];
      sema_error(s, layout_req->loc, "requested layout has shape %s, but '%s' is %s", shape_str(&shape, a, 96), name,
                 shape_str(&val->shape, b, 96));
      return;
    }
    o.has_layout = true;
  }
  strmap_put(&s->outputs, name, (int64_t)s->m->n_outputs);
  VEC_PUSH(s->m->outputs, s->m->n_outputs, s->m->cap_outputs, o);
}

/* ---- statements ------------------------------------------------------------ */

static void lower_stmts(sema *s, const ast_stmt *st, bool top);

static void lower_dim(sema *s, const ast_stmt *st) {
  int64_t prev;
  if (strmap_get(&s->dims, st->name, &prev)) {
    sema_error(s, st->name_loc, "dim '%s' is defined twice", st->name);
    sema_note(s, s->m->dims[prev].loc, "first defined here");
    return;
  }
  ir_dim d = {.name = st->name, .loc = st->name_loc};
  sema_define *def = NULL;
  for (size_t i = 0; i < s->ndefines; i++)
    if (strcmp(s->defines[i].name, st->name) == 0) def = &s->defines[i];
  if (def) {
    def->used = true;
    d.value = def->value;
    d.overridden = true;
    if (d.value < 1) {
      sema_error(s, st->name_loc, "-D %s=%lld: dims must be positive", st->name, (long long)d.value);
      d.value = 1;
    }
  } else if (!eval_positive(s, st->expr, arena_printf(s->pool, "dim '%s'", st->name), &d.value)) {
    d.value = 1; /* keep going: later uses report their own errors only */
  }
  strmap_put(&s->dims, st->name, (int64_t)s->m->n_dims);
  VEC_PUSH(s->m->dims, s->m->n_dims, s->m->cap_dims, d);
}

static void lower_mesh(sema *s, const ast_stmt *st) {
  ir_mesh mesh = {.name = st->name, .loc = st->loc};
  for (size_t i = 0; i < s->m->n_meshes; i++)
    if (strcmp(s->m->meshes[i].name, st->name) == 0) {
      sema_error(s, st->name_loc, "mesh '%s' is declared twice", st->name);
      return;
    }
  int nd = 0, na = 0;
  for (const ast_expr *e = st->expr; e; e = e->next, nd++)
    if (nd < NTP_MAX_MESH_DIMS && !sema_eval_bounded(s, e, "a mesh dim", NTP_MAX_WORLD, &mesh.size[nd])) return;
  for (const ast_ident *a = st->axes; a; a = a->next, na++) {
    if (na < NTP_MAX_MESH_DIMS) mesh.axis[na] = a->name;
    for (int j = 0; j < na && j < NTP_MAX_MESH_DIMS; j++)
      if (strcmp(mesh.axis[j], a->name) == 0) {
        sema_error(s, a->loc, "mesh axis '%s' is named twice", a->name);
        return;
      }
  }
  if (nd > NTP_MAX_MESH_DIMS) {
    sema_error(s, st->loc, "a mesh has at most %d dims", NTP_MAX_MESH_DIMS);
    return;
  }
  if (nd != na) {
    sema_error(s, st->loc, "mesh '%s' has %d dims but %d axis names", st->name, nd, na);
    return;
  }
  mesh.ndims = nd;
  VEC_PUSH(s->m->meshes, s->m->n_meshes, s->m->cap_meshes, mesh);
}

static void lower_assign(sema *s, const ast_stmt *st) {
  size_t ops_before = s->m->n_ops;
  tval v = sema_lower_expr(s, st->expr);
  if (v.kind == TV_ERROR) {
    strmap_put(&s->vars, st->name, -1); /* uses of it are not errors of their own */
    return;
  }
  if (v.kind == TV_NUMBER) {
    sema_error(s, st->expr->loc, "'%s' would be a plain number; declare numbers with 'dim'", st->name);
    strmap_put(&s->vars, st->name, -1);
    return;
  }
  /* name the value after the variable it is first bound to, for readable IR */
  ir_value *val = &s->m->values[v.value];
  if (!val->name && (size_t)val->def >= ops_before) val->name = arena_printf(s->pool, "%s%s", s->prefix, st->name);
  strmap_put(&s->vars, st->name, v.value);
  if (st->is_output) add_output(s, st->name, st->name_loc, v.value, st->type);
  else if (st->type) sema_error(s, st->type->loc, "a requested layout '->' is only allowed on an output");
}

static void lower_repeat(sema *s, const ast_stmt *st) {
  int64_t n;
  if (!sema_eval_bounded(s, st->expr, "the repeat count", NTP_MAX_REPEAT, &n)) return;
  const char *outer = s->prefix;
  for (int64_t i = 0; i < n; i++) {
    size_t errors = s->diags->errors;
    s->prefix = arena_printf(s->pool, "%s%s.%lld.", outer, st->name, (long long)i);
    lower_stmts(s, st->body, false);
    if (s->diags->errors != errors) break; /* the same mistake would repeat n times */
    if (s->m->n_ops > NTP_MAX_OPS) { /* nested repeats multiply: bound the work, not just each count */
      sema_error(s, st->loc, "the unrolled model has more than %d ops (at iteration %lld of this 'repeat')",
                 NTP_MAX_OPS, (long long)i);
      break;
    }
  }
  s->prefix = outer;
}

static void lower_stmts(sema *s, const ast_stmt *st, bool top) {
  for (; st && !s->diags->stopped; st = st->next) {
    if (!top && (st->kind == ST_DIM || st->kind == ST_DTYPE || st->kind == ST_MESH || st->kind == ST_INPUT)) {
      static const char *what[] = {"dim", "dtype", "mesh", "input"};
      sema_error(s, st->loc, "'%s' is only allowed at model level, not inside 'repeat'", what[st->kind]);
      continue;
    }
    switch (st->kind) {
    case ST_DIM: lower_dim(s, st); break;
    case ST_DTYPE:
      if (s->dtype_locked) sema_error(s, st->loc, "'dtype' must come before any input, param or layer");
      else if (!dtype_is_float((ntp_dtype)st->dtype))
        sema_error(s, st->loc, "the storage dtype must be bf16, fp16 or fp32, not %s", dtype_name((ntp_dtype)st->dtype));
      else s->m->dtype = (ntp_dtype)st->dtype;
      break;
    case ST_MESH: lower_mesh(s, st); break;
    case ST_INPUT:
    case ST_PARAM: lower_decl(s, st); break;
    case ST_ASSIGN: lower_assign(s, st); break;
    case ST_OUTPUT_NAME: {
      int64_t v;
      if (strmap_get(&s->vars, st->name, &v) && v < 0) break;
      if (!strmap_get(&s->vars, st->name, &v)) {
        const char *near = suggest(s, &s->vars, st->name);
        if (near) sema_error(s, st->name_loc, "output names unknown value '%s'; did you mean '%s'?", st->name, near);
        else sema_error(s, st->name_loc, "output names unknown value '%s'", st->name);
        break;
      }
      add_output(s, st->name, st->name_loc, (int32_t)v, NULL);
      break;
    }
    case ST_REPEAT: lower_repeat(s, st); break;
    }
  }
}

/* ---- sizes ------------------------------------------------------------------ */

static bool too_big(int64_t n) { return n < 0 || n > NTP_MAX_TENSOR_ELEMS; }

/* Every tensor within NTP_MAX_TENSOR_ELEMS and the model within NTP_MAX_MODEL_ELEMS, so that
 * later byte counts (per tensor, per rank, over all ranks) fit in 64 bits. One report per
 * oversized tensor the user wrote, not for each value computed from it. */
static void check_sizes(sema *s, ntp_loc model_loc) {
  ir_module *m = s->m;
  bool *big = calloc(m->n_values ? m->n_values : 1, sizeof *big);
  if (!big) return;
  int64_t total = 0;
  for (size_t v = 0; v < m->n_values; v++) {
    const ir_value *val = &m->values[v];
    const ir_op *op = &m->ops[val->def];
    int64_t n = shape_numel_checked(&val->shape);
    big[v] = too_big(n);
    if (!big[v] && __builtin_add_overflow(total, n, &total)) total = INT64_MAX;
    bool from_big = false;
    for (int a = 0; a < op->nargs; a++) from_big |= op->args[a] >= 0 && big[op->args[a]];
    if (!big[v] || from_big) continue;
    char shp[160];
    shape_str(&val->shape, shp, sizeof shp);
    const char *what = val->name ? arena_printf(s->pool, "tensor '%s'", val->name)
                       : op->layer >= 0 ? arena_printf(s->pool, "the %s in layer '%s'", ir_op_name(op->code), m->layers[op->layer].name)
                                        : arena_printf(s->pool, "the result of %s", ir_op_name(op->code));
    double elems = 1;
    for (int d = 0; d < val->shape.ndim; d++) elems *= (double)val->shape.dim[d];
    sema_error(s, op->loc, "%s %s%s has %.4g elements (%.4g bytes); a tensor may have at most 2^40 elements", what,
               dtype_name(val->dtype), shp, elems, elems * dtype_bytes(val->dtype));
  }
  free(big);
  if (total > NTP_MAX_MODEL_ELEMS)
    sema_error(s, model_loc, "the model's tensors hold %lld elements together; at most 2^52 are supported",
               (long long)total);
}

/* ---- entry ------------------------------------------------------------------ */

ir_module *sema_run(arena *pool, diag_sink *diags, const ast_file *file, const ast_model *model,
                    sema_define *defines, size_t ndefines, const char *active_plan_file, const char *active_plan_name) {
  sema s = {.pool = pool, .diags = diags, .file = model->file, .prefix = "", .cur_layer = -1,
            .defines = defines, .ndefines = ndefines};
  s.m = ir_module_new();
  if (!s.m) return NULL;
  s.m->name = model->name;
  s.m->file = model->file;
  size_t errors = diags->errors;
  lower_stmts(&s, model->stmts, true);
  if (diags->errors == errors) check_sizes(&s, model->name_loc);

  for (size_t i = 0; i < ndefines; i++) {
    if (defines[i].used) continue;
    const char **cands = malloc((s.m->n_dims + 1) * sizeof *cands);
    for (size_t d = 0; cands && d < s.m->n_dims; d++) cands[d] = s.m->dims[d].name;
    const char *near = cands ? nearest_name(defines[i].name, cands, s.m->n_dims) : NULL;
    free(cands);
    if (near)
      diag_emit(diags, NTPC_ERROR, "<command line>", NTP_NOLOC, "-D %s: model '%s' has no dim '%s'; did you mean '%s'?",
                defines[i].name, model->name, defines[i].name, near);
    else
      diag_emit(diags, NTPC_ERROR, "<command line>", NTP_NOLOC, "-D %s: model '%s' has no dim '%s'", defines[i].name,
                model->name, defines[i].name);
  }
  if (diags->errors == errors && s.m->n_outputs == 0)
    sema_error(&s, model->name_loc, "model '%s' has no outputs; mark one with 'output'", model->name);

  if (diags->errors == errors) {
    bool any_active = false;
    for (const ast_plan *p = file->plans; p; p = p->next) {
      if (strcmp(p->model, model->name) != 0) continue;
      bool active = (active_plan_name && strcmp(p->name, active_plan_name) == 0) ||
                    (!active_plan_name && active_plan_file && strcmp(p->file, active_plan_file) == 0 && !any_active);
      any_active |= active;
      sema_lower_plan(&s, p, active);
    }
    if (active_plan_name && !any_active)
      diag_emit(diags, NTPC_ERROR, "<command line>", NTP_NOLOC, "no plan named '%s' for model '%s'", active_plan_name,
                model->name);
  }
  strmap_free(&s.dims);
  strmap_free(&s.vars);
  strmap_free(&s.layers);
  strmap_free(&s.tensors);
  strmap_free(&s.outputs);
  strmap_free(&s.narrowed);
  return s.m;
}
