/* sema_layers.c — a layer call: its arguments checked against its kind's table
 * (compiler/layers/), the layer recorded, the kind's lowering run; and the kit those lowerings
 * build with (parameters by role, dense products, reshapes). */
#include <math.h>
#include <string.h>

#include "layer_kind.h"
#include "sema.h"

/* ---- the lowering kit ------------------------------------------------------ */

static ir_layer *cur(sema *s) { return &s->m->layers[s->cur_layer]; }

int32_t layer_param(sema *s, int role, ntp_shape shape, float center, float scale, ntp_loc loc) {
  const char *name = layer_kind_of(cur(s))->roles[role];
  int32_t v = sema_param(s, name, shape, center, scale, loc);
  if (v >= 0) cur(s)->role[role] = v;
  return v;
}

void layer_mark(sema *s, int role, int32_t v) { cur(s)->role[role] = v; }
void layer_set_core(sema *s, int32_t v) { cur(s)->core = v; }

int64_t layer_last_dim(sema *s, int32_t v) {
  ntp_shape sh = s->m->values[v].shape;
  return sh.ndim ? sh.dim[sh.ndim - 1] : 1;
}

int32_t layer_reshape(sema *s, int32_t x, ntp_shape shape, ntp_loc loc) {
  if (x < 0) return -1;
  return ir_emit(s->m, IR_RESHAPE, &x, 1, shape, s->m->values[x].dtype, s->cur_layer, loc);
}

int32_t layer_op1(sema *s, ir_opcode code, int32_t a, ntp_loc loc) {
  return a < 0 ? -1 : sema_op(s, code, &a, 1, loc, NULL);
}

int32_t layer_op2(sema *s, ir_opcode code, int32_t a, int32_t b, ntp_loc loc) {
  if (a < 0 || b < 0) return -1;
  int32_t args[2] = {a, b};
  return sema_op(s, code, args, 2, loc, NULL);
}

int32_t layer_matmul_tb(sema *s, int32_t x, int32_t w, ntp_loc loc) {
  if (x < 0 || w < 0) return -1;
  ir_op attrs = {.attr.mm.trans_b = true};
  int32_t args[2] = {x, w};
  return sema_op(s, IR_MATMUL, args, 2, loc, &attrs);
}

float layer_fan_in_scale(int64_t fan_in) { return (float)(1.0 / sqrt((double)fan_in)); }

int32_t layer_dense(sema *s, int32_t x, int64_t out, int wrole, int brole, bool bias, ntp_loc loc, int32_t *mm) {
  int64_t in = layer_last_dim(s, x);
  int32_t w = layer_param(s, wrole, layer_shape2(out, in), 0, layer_fan_in_scale(in), loc);
  int32_t y = layer_matmul_tb(s, x, w, loc);
  if (mm) *mm = y;
  if (bias) y = layer_op2(s, IR_ADD, y, layer_param(s, brole, layer_shape1(out), 0, 0.1f, loc), loc);
  return y;
}

/* ---- argument checking ------------------------------------------------------ */

/* A number argument: a literal, a dim, or arithmetic on them. */
static bool eval_number(sema *s, const ast_expr *e, double *out) {
  switch (e->kind) {
  case AST_FLOAT: *out = e->fval; return true;
  case AST_NEG:
    if (!eval_number(s, e->operand, out)) return false;
    *out = -*out;
    return true;
  default: {
    int64_t v;
    if (!sema_eval_dim(s, e, &v)) return false;
    *out = (double)v;
    return true;
  }
  }
}

static bool word_of(sema *s, const ast_expr *e, const char *key, const char **out) {
  if (e->kind != AST_NAME) {
    sema_error(s, e->loc, "'%s' takes a name here", key);
    return false;
  }
  *out = e->name;
  return true;
}

static bool check_arg(sema *s, const layer_kind *b, const layer_arg *sp, const ast_expr *e, layer_arg_val *v) {
  v->loc = e->loc;
  const char *w;
  switch (sp->kind) {
  case LA_DIM:
    if (!sema_eval_dim(s, e, &v->i)) return false;
    if (v->i < 1) {
      sema_error(s, e->loc, "%s of %s must be positive, got %lld", sp->key, b->name, (long long)v->i);
      return false;
    }
    return true;
  case LA_FLOAT: return eval_number(s, e, &v->f);
  case LA_FLAG:
  case LA_BOOL:
    if (!word_of(s, e, sp->key, &w)) return false;
    if (strcmp(w, "true") && strcmp(w, "false")) {
      sema_error(s, e->loc, "%s takes true or false, got '%s'", sp->key, w);
      return false;
    }
    v->b = w[0] == 't';
    return true;
  case LA_WORD: {
    if (!word_of(s, e, sp->key, &w)) return false;
    size_t n = 0;
    for (; sp->words[n]; n++)
      if (strcmp(w, sp->words[n]) == 0) {
        v->word = w;
        return true;
      }
    const char *near = nearest_name(w, sp->words, n);
    if (near) {
      sema_error(s, e->loc, "unknown %s '%s'; did you mean '%s'?", sp->what, w, near);
    } else {
      char list[256] = "";
      for (size_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i == 0 ? "" : i + 1 == n ? " or " : ", ",
                 sp->words[i]);
      sema_error(s, e->loc, "unknown %s '%s' (expected %s)", sp->what, w, list);
    }
    return false;
  }
  case LA_LAYER: return word_of(s, e, sp->key, &v->word);
  }
  return false;
}

static const layer_arg *find_spec(const layer_kind *b, const char *key, int *idx) {
  for (int i = 0; i < LAYER_MAX_ARGS && b->args[i].key; i++)
    if (strcmp(b->args[i].key, key) == 0) {
      *idx = i;
      return &b->args[i];
    }
  return NULL;
}

static void unknown_layer(sema *s, const ast_expr *e) {
  const char *names[64], *near;
  char list[512] = "";
  size_t n = 0;
  for (int32_t k = 0; k < layer_nkinds && n < 64; k++) {
    names[n++] = layer_kinds[k]->name;
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", layer_kinds[k]->name);
  }
  if ((near = nearest_name(e->call.callee, names, n)))
    sema_error(s, e->call.callee_loc, "unknown layer '%s'; did you mean '%s'?", e->call.callee, near);
  else
    sema_error(s, e->call.callee_loc, "unknown layer '%s' (layers: %s)", e->call.callee, list);
}

/* A name that is not a variable but close to one of the kind's flags: reported. */
static bool misspelt_flag(sema *s, const layer_kind *b, const ast_arg *a) {
  if (a->key || a->value->kind != AST_NAME || strmap_get(&s->vars, a->value->name, NULL)) return false;
  const char *flags[LAYER_MAX_ARGS];
  size_t nf = 0;
  for (int i = 0; i < LAYER_MAX_ARGS && b->args[i].key; i++)
    if (b->args[i].kind == LA_FLAG) flags[nf++] = b->args[i].key;
  const char *near = nearest_name(a->value->name, flags, nf);
  if (!near) return false;
  sema_error(s, a->loc, "%s has no flag '%s'; did you mean '%s'?", b->name, a->value->name, near);
  return true;
}

/* the positional argument: the layer's input tensor, lowered (npos counts them) */
static bool input_arg(sema *s, const layer_kind *b, const ast_arg *a, layer_call *c, int *npos) {
  if ((*npos)++ > 0) {
    sema_error(s, a->loc, "%s takes one tensor argument; use 'key = value' for the others", b->name);
    return false;
  }
  tval x = sema_lower_expr(s, a->value);
  if (x.kind == TV_NUMBER) sema_error(s, a->loc, "%s needs a tensor as its first argument, got a number", b->name);
  c->x = x.value;
  c->x_loc = a->value->loc;
  return x.kind == TV_TENSOR;
}

/* a 'key = value' argument: a key of the kind's table, given once, its value checked */
static bool keyed_arg(sema *s, const layer_kind *b, const ast_arg *a, layer_call *c) {
  int idx;
  const layer_arg *sp = find_spec(b, a->key, &idx);
  if (!sp) {
    const char *keys[LAYER_MAX_ARGS];
    size_t n = 0;
    for (; n < LAYER_MAX_ARGS && b->args[n].key; n++) keys[n] = b->args[n].key;
    const char *near = nearest_name(a->key, keys, n);
    if (near) sema_error(s, a->key_loc, "%s has no argument '%s'; did you mean '%s'?", b->name, a->key, near);
    else sema_error(s, a->key_loc, "%s has no argument '%s'", b->name, a->key);
    return false;
  }
  if (c->arg[idx].set) {
    sema_error(s, a->key_loc, "argument '%s' is given twice", a->key);
    return false;
  }
  bool ok = check_arg(s, b, sp, a->value, &c->arg[idx]);
  c->arg[idx].set = true; /* even when invalid: it was given, so it is not also "missing" */
  return ok;
}

/* One argument of the call into c: a flag, the input, or a keyed one; false if reported. */
static bool call_arg(sema *s, const layer_kind *b, const ast_arg *a, layer_call *c, int *npos) {
  int idx;
  const layer_arg *sp;
  if (!a->key && a->value->kind == AST_NAME && (sp = find_spec(b, a->value->name, &idx)) && sp->kind == LA_FLAG) {
    c->arg[idx] = (layer_arg_val){.set = true, .b = true, .loc = a->loc};
    return true;
  }
  if (misspelt_flag(s, b, a)) return false;
  if (!a->key) return input_arg(s, b, a, c, npos);
  return keyed_arg(s, b, a, c);
}

/* The call's arguments against the kind's table into c: one input tensor, known keys once
 * each, every required one; false if reported (every argument is checked). */
static bool check_call(sema *s, const ast_expr *e, const layer_kind *b, layer_call *c) {
  bool ok = true;
  int npos = 0;
  for (const ast_arg *a = e->call.args; a; a = a->next) ok = call_arg(s, b, a, c, &npos) && ok;
  if (npos == 0) {
    sema_error(s, e->loc, "%s needs a tensor argument, as in %s(x, ...)", b->name, b->name);
    ok = false;
  }
  for (int i = 0; i < LAYER_MAX_ARGS && b->args[i].key; i++)
    if (b->args[i].required && !c->arg[i].set) {
      sema_error(s, e->call.callee_loc, "%s needs '%s = ...'", b->name, b->args[i].key);
      ok = false;
    }
  return ok;
}

tval sema_lower_layer(sema *s, const ast_expr *e) {
  const tval bad = {.kind = TV_ERROR, .value = -1};
  int32_t kind;
  const layer_kind *b = layer_kind_named(e->call.callee, &kind);
  if (!b) {
    unknown_layer(s, e);
    return bad;
  }
  layer_call c = {.call = e, .x = -1};
  if (!check_call(s, e, b, &c)) return bad;

  /* the layer itself: a unique hierarchical name, its TP annotation, its ops */
  c.name = arena_printf(s->pool, "%s%s", s->prefix, e->call.label);
  int64_t prev;
  if (strmap_get(&s->layers, c.name, &prev)) {
    sema_error(s, e->call.label_loc, "layer '%s' is defined twice", c.name);
    sema_note(s, s->m->layers[prev].loc, "first defined here");
    return bad;
  }
  ir_layer layer = {.name = c.name, .kind = kind, .loc = e->call.label_loc, .first_op = (int32_t)s->m->n_ops,
                    .weight = -1, .input = c.x, .core = -1};
  for (int r = 0; r < NTP_LAYER_ROLES; r++) layer.role[r] = -1;
  if (e->call.tp && !sema_lower_tp(s, e->call.tp, &layer.tp)) return bad;
  int32_t idx = (int32_t)s->m->n_layers;
  VEC_PUSH(s->m->layers, s->m->n_layers, s->m->cap_layers, layer);
  strmap_put(&s->layers, c.name, idx);
  int32_t outer = s->cur_layer;
  s->cur_layer = idx;
  int32_t y = b->lower(s, &c);
  s->cur_layer = outer;
  s->m->layers[idx].nops = (int32_t)s->m->n_ops - s->m->layers[idx].first_op;
  s->dtype_locked = true;
  return y < 0 ? bad : (tval){.kind = TV_TENSOR, .value = y};
}
