/* sema_layers.c — layer builtins (embedding, linear, norms, attention, mlp): argument
 * checking from one table, then lowering to primitive ops and named parameters. */
#include <math.h>
#include <string.h>

#include "sema.h"

typedef enum { A_DIM, A_FLOAT, A_BOOL, A_WORD, A_LAYER, A_FLAG } arg_kind;

typedef struct arg_spec {
  const char *key;
  arg_kind kind;
  bool required;
} arg_spec;

typedef struct arg_val {
  bool set;
  int64_t i;
  double f;
  bool b;
  const char *word;
  ntp_loc loc;
} arg_val;

enum { MAX_SPECS = 8 };

/* What a builtin's lowering sees: its input, its checked arguments, where it was called. */
typedef struct layer_call {
  const ast_expr *call;
  const char *name; /* full layer name */
  int32_t x;        /* the positional tensor argument */
  ntp_loc x_loc;
  arg_val arg[MAX_SPECS];
} layer_call;

typedef int32_t (*lower_fn)(sema *s, layer_call *c);

typedef struct builtin {
  const char *name;
  ir_layer_kind kind;
  arg_spec spec[MAX_SPECS];
  lower_fn lower;
} builtin;

static const char *const activations[] = {"gelu", "relu", "silu", "swiglu", "geglu"};
enum { N_ACT = sizeof activations / sizeof activations[0] };

/* ---- helpers -------------------------------------------------------------- */

static ntp_shape shape_of(sema *s, int32_t v) { return s->m->values[v].shape; }
static int64_t last_dim(sema *s, int32_t v) {
  ntp_shape sh = shape_of(s, v);
  return sh.ndim ? sh.dim[sh.ndim - 1] : 1;
}

static ntp_shape shape2(int64_t a, int64_t b) { return (ntp_shape){2, {a, b}}; }
static ntp_shape shape1(int64_t a) { return (ntp_shape){1, {a}}; }

static int32_t reshape(sema *s, int32_t x, ntp_shape shape, ntp_loc loc) {
  if (x < 0) return -1;
  return ir_emit(s->m, IR_RESHAPE, &x, 1, shape, s->m->values[x].dtype, s->cur_layer, loc);
}

static int32_t op1(sema *s, ir_opcode code, int32_t a, ntp_loc loc) {
  return a < 0 ? -1 : sema_op(s, code, &a, 1, loc, NULL);
}

static int32_t op2(sema *s, ir_opcode code, int32_t a, int32_t b, ntp_loc loc) {
  if (a < 0 || b < 0) return -1;
  int32_t args[2] = {a, b};
  return sema_op(s, code, args, 2, loc, NULL);
}

/* x @ w^T with w stored [out, in], as PyTorch stores linear weights */
static int32_t linear_tb(sema *s, int32_t x, int32_t w, ntp_loc loc) {
  if (x < 0 || w < 0) return -1;
  ir_op attrs = {.attr.mm.trans_b = true};
  int32_t args[2] = {x, w};
  return sema_op(s, IR_MATMUL, args, 2, loc, &attrs);
}

static float fan_in_scale(int64_t fan_in) { return (float)(1.0 / sqrt((double)fan_in)); }

/* y = x @ w^T (+ b), with parameters named w_<name> / b_<name> (or w / b when name is "") */
static int32_t dense(sema *s, int32_t x, int64_t out, const char *wname, const char *bname, bool bias, ntp_loc loc) {
  int64_t in = last_dim(s, x);
  int32_t w = sema_param(s, wname, shape2(out, in), 0, fan_in_scale(in), loc);
  int32_t y = linear_tb(s, x, w, loc);
  if (bias) y = op2(s, IR_ADD, y, sema_param(s, bname, shape1(out), 0, 0.1f, loc), loc);
  return y;
}

/* ---- builtins ------------------------------------------------------------- */

/* embedding(tokens, vocab = V, dim = D [, positions = P]) */
static int32_t lower_embedding(sema *s, layer_call *c) {
  int32_t tok = c->x;
  /* copies: creating the parameters below grows the value table and moves it */
  const ntp_dtype tok_dtype = s->m->values[tok].dtype;
  const ntp_shape tok_shape = s->m->values[tok].shape;
  if (tok_dtype != NTP_I32) {
    sema_error(s, c->x_loc, "embedding indices must be i32, got %s", sema_type_str(s, tok));
    return -1;
  }
  int64_t V = c->arg[0].i, D = c->arg[1].i;
  ntp_loc loc = c->call->loc;
  int32_t wte = sema_param(s, "wte", shape2(V, D), 0, 1.0f, loc);
  if (wte < 0) return -1;
  s->m->layers[s->cur_layer].weight = wte;
  ir_op *def = ir_def(s->m, tok);
  /* token ids default to [0, V): the first embedding that reads an input sets its range (the
   * declaration's 1000 is only for inputs no embedding reads), later ones can only narrow it */
  if (def->code == IR_INPUT) {
    int32_t range = (int32_t)(V < INT32_MAX ? V : INT32_MAX);
    const char *key = s->m->values[tok].name;
    if (!strmap_get(&s->narrowed, key, NULL) || def->attr.init.int_range > range) def->attr.init.int_range = range;
    strmap_put(&s->narrowed, key, 1);
  }
  int32_t x = op2(s, IR_GATHER, wte, tok, loc);
  if (c->arg[2].set) {
    int64_t P = c->arg[2].i, S = tok_shape.ndim ? tok_shape.dim[tok_shape.ndim - 1] : 1;
    if (S > P) {
      sema_error(s, c->arg[2].loc, "positions = %lld is shorter than the sequence (%lld tokens)", (long long)P,
                 (long long)S);
      return -1;
    }
    int32_t wpe = sema_param(s, "wpe", shape2(P, D), 0, 0.5f, loc);
    if (P > S && wpe >= 0) {
      ir_op attrs = {.attr.slice = {.axis = 0, .start = 0, .len = S}};
      wpe = sema_op(s, IR_SLICE, &wpe, 1, loc, &attrs);
    }
    x = op2(s, IR_ADD, x, wpe, loc);
  }
  return x;
}

/* linear(x, out = N [, bias = true] [, tied = LAYER]) */
static int32_t lower_linear(sema *s, layer_call *c) {
  ntp_loc loc = c->call->loc;
  int64_t K = last_dim(s, c->x);
  bool bias = c->arg[1].set && c->arg[1].b;
  int32_t w;
  int64_t N;
  if (c->arg[2].set) {
    const char *tied = c->arg[2].word;
    int64_t li = -1;
    const char *local = arena_printf(s->pool, "%s%s", s->prefix, tied);
    if (!strmap_get(&s->layers, local, &li) && !strmap_get(&s->layers, tied, &li)) {
      const char *cands[256];
      size_t n = 0;
      for (size_t l = 0; l < s->m->n_layers && n < 256; l++)
        if (s->m->layers[l].kind == LAYER_EMBEDDING) cands[n++] = s->m->layers[l].name;
      const char *near = nearest_name(tied, cands, n);
      if (near) sema_error(s, c->arg[2].loc, "tied = '%s' names no earlier layer; did you mean '%s'?", tied, near);
      else sema_error(s, c->arg[2].loc, "tied = '%s' names no earlier layer", tied);
      return -1;
    }
    const ir_layer *l = &s->m->layers[li];
    if (l->kind != LAYER_EMBEDDING) {
      sema_error(s, c->arg[2].loc, "tied = '%s' must name an embedding layer; '%s' is a %s", tied, l->name,
                 ir_layer_kind_name(l->kind));
      return -1;
    }
    w = l->weight;
    ntp_shape ws = shape_of(s, w);
    N = c->arg[0].set ? c->arg[0].i : ws.dim[0];
    if (ws.dim[0] != N || ws.dim[1] != K) {
      char a[64];
      sema_error(s, c->arg[2].loc, "tied weight '%s' is %s, but this linear needs [out, in] = [%lld, %lld]",
                 s->m->values[w].name, shape_str(&ws, a, sizeof a), (long long)N, (long long)K);
      return -1;
    }
  } else {
    if (!c->arg[0].set) {
      sema_error(s, c->call->call.callee_loc, "linear needs 'out = N' (or 'tied = LAYER')");
      return -1;
    }
    N = c->arg[0].i;
    w = sema_param(s, "w", shape2(N, K), 0, fan_in_scale(K), loc);
  }
  int32_t y = linear_tb(s, c->x, w, loc);
  if (bias) y = op2(s, IR_ADD, y, sema_param(s, "b", shape1(N), 0, 0.1f, loc), loc);
  return y;
}

static int32_t lower_norm(sema *s, layer_call *c, ir_opcode code) {
  ntp_loc loc = c->call->loc;
  int64_t D = last_dim(s, c->x);
  ir_op attrs = {.attr.norm.eps = c->arg[0].set ? (float)c->arg[0].f : 1e-5f};
  if (attrs.attr.norm.eps <= 0) {
    sema_error(s, c->arg[0].loc, "eps must be positive, got %g", c->arg[0].f);
    return -1;
  }
  int32_t y = sema_op(s, code, &c->x, 1, loc, &attrs);
  y = op2(s, IR_MUL, y, sema_param(s, "g", shape1(D), 1.0f, 0.1f, loc), loc);
  if (code == IR_LAYERNORM) y = op2(s, IR_ADD, y, sema_param(s, "b", shape1(D), 0, 0.1f, loc), loc);
  return y;
}

static int32_t lower_layernorm(sema *s, layer_call *c) { return lower_norm(s, c, IR_LAYERNORM); }
static int32_t lower_rmsnorm(sema *s, layer_call *c) { return lower_norm(s, c, IR_RMSNORM); }

/* attention(x, heads = H [, kv_heads] [, head_dim] [, rope = theta] [, causal] [, bias]) */
static int32_t lower_attention(sema *s, layer_call *c) {
  ntp_loc loc = c->call->loc;
  ntp_shape xs = shape_of(s, c->x);
  if (xs.ndim != 3) {
    sema_error(s, c->x_loc, "attention needs x of shape [B, S, D], got %s", sema_type_str(s, c->x));
    return -1;
  }
  int64_t B = xs.dim[0], S = xs.dim[1], D = xs.dim[2];
  int64_t H = c->arg[0].i, KV = c->arg[1].set ? c->arg[1].i : H;
  if (H % KV) {
    sema_error(s, c->arg[1].loc, "heads = %lld is not a multiple of kv_heads = %lld", (long long)H, (long long)KV);
    return -1;
  }
  int64_t HD;
  if (c->arg[2].set) {
    HD = c->arg[2].i;
  } else if (D % H) {
    sema_error(s, c->arg[0].loc, "model dim %lld does not split into heads = %lld; give head_dim", (long long)D,
               (long long)H);
    return -1;
  } else {
    HD = D / H;
  }
  bool rope = c->arg[3].set;
  if (rope && (c->arg[3].f <= 0)) {
    sema_error(s, c->arg[3].loc, "rope theta must be positive, got %g", c->arg[3].f);
    return -1;
  }
  if (rope && HD % 2) {
    sema_error(s, c->arg[3].loc, "rope needs an even head_dim, got %lld", (long long)HD);
    return -1;
  }
  int64_t width;
  if (__builtin_mul_overflow(H, HD, &width) || width > NTP_MAX_TENSOR_ELEMS) {
    sema_error(s, c->arg[0].loc, "heads = %lld times head_dim = %lld is too large (at most 2^40)", (long long)H,
               (long long)HD);
    return -1;
  }
  bool causal = c->arg[4].set && c->arg[4].b, bias = c->arg[5].set && c->arg[5].b;
  int32_t q = dense(s, c->x, H * HD, "wq", "bq", bias, loc);
  int32_t k = dense(s, c->x, KV * HD, "wk", "bk", bias, loc);
  int32_t v = dense(s, c->x, KV * HD, "wv", "bv", bias, loc);
  q = reshape(s, q, (ntp_shape){4, {B, S, H, HD}}, loc);
  k = reshape(s, k, (ntp_shape){4, {B, S, KV, HD}}, loc);
  v = reshape(s, v, (ntp_shape){4, {B, S, KV, HD}}, loc);
  if (rope) {
    ir_op attrs = {.attr.rope.theta = (float)c->arg[3].f};
    if (q >= 0) q = sema_op(s, IR_ROPE, &q, 1, loc, &attrs);
    if (k >= 0) k = sema_op(s, IR_ROPE, &k, 1, loc, &attrs);
  }
  if (q < 0 || k < 0 || v < 0) return -1;
  ir_op attrs = {.attr.attn = {.causal = causal, .scale = (float)(1.0 / sqrt((double)HD)), .group = H / KV}};
  int32_t args[3] = {q, k, v};
  int32_t o = sema_op(s, IR_ATTENTION, args, 3, loc, &attrs);
  o = reshape(s, o, (ntp_shape){3, {B, S, H * HD}}, loc);
  return o < 0 ? -1 : dense(s, o, D, "wo", "bo", bias, loc);
}

/* mlp(x, hidden = F, act = ... [, bias]) */
static int32_t lower_mlp(sema *s, layer_call *c) {
  ntp_loc loc = c->call->loc;
  int64_t D = last_dim(s, c->x), F = c->arg[0].i;
  const char *act = c->arg[1].word;
  bool bias = c->arg[2].set && c->arg[2].b;
  bool glu = strcmp(act, "swiglu") == 0 || strcmp(act, "geglu") == 0;
  int32_t up = dense(s, c->x, F, "w_up", "b_up", bias, loc);
  int32_t h;
  if (glu) {
    int32_t gate = dense(s, c->x, F, "w_gate", "b_gate", bias, loc);
    h = op2(s, IR_MUL, op1(s, act[0] == 's' ? IR_SILU : IR_GELU, gate, loc), up, loc);
  } else {
    ir_opcode code = strcmp(act, "gelu") == 0 ? IR_GELU : strcmp(act, "relu") == 0 ? IR_RELU : IR_SILU;
    h = op1(s, code, up, loc);
  }
  return h < 0 ? -1 : dense(s, h, D, "w_down", "b_down", bias, loc);
}

static const builtin builtins[] = {
    {"embedding", LAYER_EMBEDDING,
     {{"vocab", A_DIM, true}, {"dim", A_DIM, true}, {"positions", A_DIM, false}}, lower_embedding},
    {"linear", LAYER_LINEAR, {{"out", A_DIM, false}, {"bias", A_BOOL, false}, {"tied", A_LAYER, false}}, lower_linear},
    {"layernorm", LAYER_LAYERNORM, {{"eps", A_FLOAT, false}}, lower_layernorm},
    {"rmsnorm", LAYER_RMSNORM, {{"eps", A_FLOAT, false}}, lower_rmsnorm},
    {"attention", LAYER_ATTENTION,
     {{"heads", A_DIM, true}, {"kv_heads", A_DIM, false}, {"head_dim", A_DIM, false}, {"rope", A_FLOAT, false},
      {"causal", A_FLAG, false}, {"bias", A_BOOL, false}},
     lower_attention},
    {"mlp", LAYER_MLP, {{"hidden", A_DIM, true}, {"act", A_WORD, true}, {"bias", A_BOOL, false}}, lower_mlp},
};
enum { N_BUILTINS = sizeof builtins / sizeof builtins[0] };

const char *const sema_layer_builtins[] = {"embedding", "linear", "layernorm", "rmsnorm", "attention", "mlp"};
const size_t sema_n_layer_builtins = N_BUILTINS;

bool sema_is_layer_builtin(const char *name) {
  for (int i = 0; i < N_BUILTINS; i++)
    if (strcmp(builtins[i].name, name) == 0) return true;
  return false;
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

static bool check_arg(sema *s, const builtin *b, const arg_spec *sp, const ast_expr *e, arg_val *v) {
  v->loc = e->loc;
  const char *w;
  switch (sp->kind) {
  case A_DIM:
    if (!sema_eval_dim(s, e, &v->i)) return false;
    if (v->i < 1) {
      sema_error(s, e->loc, "%s of %s must be positive, got %lld", sp->key, b->name, (long long)v->i);
      return false;
    }
    return true;
  case A_FLOAT: return eval_number(s, e, &v->f);
  case A_FLAG:
  case A_BOOL:
    if (!word_of(s, e, sp->key, &w)) return false;
    if (strcmp(w, "true") && strcmp(w, "false")) {
      sema_error(s, e->loc, "%s takes true or false, got '%s'", sp->key, w);
      return false;
    }
    v->b = w[0] == 't';
    return true;
  case A_WORD:
    if (!word_of(s, e, sp->key, &w)) return false;
    for (int i = 0; i < N_ACT; i++)
      if (strcmp(w, activations[i]) == 0) {
        v->word = w;
        return true;
      }
    {
      const char *near = nearest_name(w, activations, N_ACT);
      if (near) sema_error(s, e->loc, "unknown activation '%s'; did you mean '%s'?", w, near);
      else sema_error(s, e->loc, "unknown activation '%s' (expected gelu, relu, silu, swiglu or geglu)", w);
    }
    return false;
  case A_LAYER: return word_of(s, e, sp->key, &v->word);
  }
  return false;
}

static const arg_spec *find_spec(const builtin *b, const char *key, int *idx) {
  for (int i = 0; i < MAX_SPECS && b->spec[i].key; i++)
    if (strcmp(b->spec[i].key, key) == 0) {
      *idx = i;
      return &b->spec[i];
    }
  return NULL;
}

tval sema_lower_layer(sema *s, const ast_expr *e) {
  const tval bad = {.kind = TV_ERROR, .value = -1};
  const builtin *b = NULL;
  for (int i = 0; i < N_BUILTINS; i++)
    if (strcmp(builtins[i].name, e->call.callee) == 0) b = &builtins[i];
  if (!b) {
    const char *near = nearest_name(e->call.callee, sema_layer_builtins, N_BUILTINS);
    if (near) sema_error(s, e->call.callee_loc, "unknown layer '%s'; did you mean '%s'?", e->call.callee, near);
    else sema_error(s, e->call.callee_loc, "unknown layer '%s' (layers: embedding, linear, layernorm, rmsnorm, "
                    "attention, mlp)", e->call.callee);
    return bad;
  }
  layer_call c = {.call = e, .x = -1};
  bool ok = true;
  int npos = 0;
  for (const ast_arg *a = e->call.args; a; a = a->next) {
    int idx;
    const arg_spec *sp;
    if (!a->key && a->value->kind == AST_NAME && (sp = find_spec(b, a->value->name, &idx)) && sp->kind == A_FLAG) {
      c.arg[idx] = (arg_val){.set = true, .b = true, .loc = a->loc};
      continue;
    }
    if (!a->key && a->value->kind == AST_NAME && !strmap_get(&s->vars, a->value->name, NULL)) {
      const char *flags[MAX_SPECS];
      size_t nf = 0;
      for (int i = 0; i < MAX_SPECS && b->spec[i].key; i++)
        if (b->spec[i].kind == A_FLAG) flags[nf++] = b->spec[i].key;
      const char *near = nearest_name(a->value->name, flags, nf);
      if (near) {
        sema_error(s, a->loc, "%s has no flag '%s'; did you mean '%s'?", b->name, a->value->name, near);
        ok = false;
        continue;
      }
    }
    if (!a->key) {
      if (npos++ > 0) {
        sema_error(s, a->loc, "%s takes one tensor argument; use 'key = value' for the others", b->name);
        ok = false;
        continue;
      }
      tval x = sema_lower_expr(s, a->value);
      if (x.kind == TV_NUMBER) sema_error(s, a->loc, "%s needs a tensor as its first argument, got a number", b->name);
      if (x.kind != TV_TENSOR) ok = false;
      c.x = x.value;
      c.x_loc = a->value->loc;
      continue;
    }
    sp = find_spec(b, a->key, &idx);
    if (!sp) {
      const char *keys[MAX_SPECS];
      size_t n = 0;
      for (; n < MAX_SPECS && b->spec[n].key; n++) keys[n] = b->spec[n].key;
      const char *near = nearest_name(a->key, keys, n);
      if (near) sema_error(s, a->key_loc, "%s has no argument '%s'; did you mean '%s'?", b->name, a->key, near);
      else sema_error(s, a->key_loc, "%s has no argument '%s'", b->name, a->key);
      ok = false;
      continue;
    }
    if (c.arg[idx].set) {
      sema_error(s, a->key_loc, "argument '%s' is given twice", a->key);
      ok = false;
      continue;
    }
    ok = check_arg(s, b, sp, a->value, &c.arg[idx]) && ok;
    c.arg[idx].set = true; /* even when invalid: it was given, so it is not also "missing" */
  }
  if (npos == 0) {
    sema_error(s, e->loc, "%s needs a tensor argument, as in %s(x, ...)", b->name, b->name);
    ok = false;
  }
  for (int i = 0; i < MAX_SPECS && b->spec[i].key; i++)
    if (b->spec[i].required && !c.arg[i].set) {
      sema_error(s, e->call.callee_loc, "%s needs '%s = ...'", b->name, b->spec[i].key);
      ok = false;
    }
  if (!ok) return bad;

  /* the layer itself: a unique hierarchical name, its TP annotation, its ops */
  c.name = arena_printf(s->pool, "%s%s", s->prefix, e->call.label);
  int64_t prev;
  if (strmap_get(&s->layers, c.name, &prev)) {
    sema_error(s, e->call.label_loc, "layer '%s' is defined twice", c.name);
    sema_note(s, s->m->layers[prev].loc, "first defined here");
    return bad;
  }
  ir_layer layer = {.name = c.name, .kind = b->kind, .loc = e->call.label_loc, .first_op = (int32_t)s->m->n_ops,
                    .weight = -1};
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
