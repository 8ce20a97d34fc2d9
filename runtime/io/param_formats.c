/* param_formats.c — the name maps of checkpoint layouts (param_formats.h). A parameter's place
 * follows from its name in the model, LAYER.ROLE: the role says what it is (wte, g, wq, w_up,
 * ...), the layer's block is the first number in its path (blk.3.attn: block 3), and a norm is
 * the block's first or second by program order (the one outside every block: the final norm). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "param_formats.h"

const char *const *ntp_param_format_names(void) {
  static const char *const names[] = {"ntp", "hf-gpt2", "hf-llama", NULL};
  return names;
}

bool ntp_param_format_known(const char *format) {
  for (const char *const *p = ntp_param_format_names(); *p; p++)
    if (strcmp(*p, format) == 0) return true;
  return false;
}

typedef struct param {
  const char *name;
  char layer[128];
  const char *role;
  int block; /* -1: outside every block */
  int norm;  /* a norm's index in its block (program order), else -1 */
  const ntp_value *val;
} param;

static int block_of(const char *layer) {
  for (const char *p = layer; *p;) {
    const char *q = strchr(p, '.');
    size_t n = q ? (size_t)(q - p) : strlen(p);
    bool digits = n > 0;
    for (size_t i = 0; i < n; i++) digits = digits && p[i] >= '0' && p[i] <= '9';
    if (digits) return atoi(p);
    p += n + (q != NULL);
    if (!q) break;
  }
  return -1;
}

static bool layer_has(const param *ps, size_t n, const char *layer, const char *role) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(ps[i].layer, layer) == 0 && strcmp(ps[i].role, role) == 0) return true;
  return false;
}

static const param *find_role(const param *ps, size_t n, const char *layer, const char *role) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(ps[i].layer, layer) == 0 && strcmp(ps[i].role, role) == 0) return &ps[i];
  return NULL;
}

static char *strf(const char *fmt, const char *pre, int block, const char *what) {
  char buf[256];
  snprintf(buf, sizeof buf, fmt, pre, block, what);
  return strdup(buf);
}

/* one parameter's place in the layout; false (with a message) when it has none */
static bool place_gpt2(const param *ps, size_t n, const param *p, const char *pre, ntp_st_name *e, char *err,
                       size_t cap) {
  const char *r = p->role;
  int b = p->block;
  char nm[256];
  bool bias = r[0] == 'b' && r[1] != 0 && strcmp(r, "b") != 0; /* bq, b_up, ...: not a norm's b */
  if (!strcmp(r, "wte") || !strcmp(r, "wpe")) {
    snprintf(nm, sizeof nm, "%s%s.weight", pre, r);
    e->source = strdup(nm);
    e->longer_ok = r[1] == 'p'; /* wpe: the first positions of a longer table */
    return true;
  }
  if (p->norm >= 0 || (b < 0 && layer_has(ps, n, p->layer, "g"))) {
    const char *w = !strcmp(r, "g") ? "weight" : "bias";
    if (b >= 0 && p->norm > 1) {
      snprintf(err, cap, "parameter '%s': a third norm in block %d has no place in the hf-gpt2 layout", p->name, b);
      return false;
    }
    if (b >= 0) snprintf(nm, sizeof nm, "%sh.%d.ln_%d.%s", pre, b, p->norm + 1, w);
    else snprintf(nm, sizeof nm, "%sln_f.%s", pre, w);
    e->source = strdup(nm);
    return true;
  }
  if (!strcmp(r, "wq") || !strcmp(r, "wk") || !strcmp(r, "wv") || !strcmp(r, "bq") || !strcmp(r, "bk") ||
      !strcmp(r, "bv")) {
    /* c_attn: q, k and v side by side (Conv1D: [D, 3D], input-major) */
    const param *q = find_role(ps, n, p->layer, bias ? "bq" : "wq"), *k = find_role(ps, n, p->layer, bias ? "bk" : "wk");
    if (!q || !k || !find_role(ps, n, p->layer, bias ? "bv" : "wv")) { /* c_attn holds all three, in this order */
      snprintf(err, cap, "parameter '%s': the hf-gpt2 layout's c_attn needs %s of layer '%s' together", p->name,
               bias ? "bq, bk and bv" : "wq, wk and wv", p->layer);
      return false;
    }
    if (q->val->shape.ndim < 1 || k->val->shape.ndim < 1) {
      snprintf(err, cap, "parameter '%s': a scalar has no place in the hf-gpt2 layout's c_attn", p->name);
      return false;
    }
    int64_t off = r[1] == 'q' ? 0 : r[1] == 'k' ? q->val->shape.dim[0] : q->val->shape.dim[0] + k->val->shape.dim[0];
    e->source = strf(bias ? "%sh.%d.attn.c_attn.%s" : "%sh.%d.attn.c_attn.%s", pre, b, bias ? "bias" : "weight");
    e->transpose = !bias, e->offset = off;
    return b >= 0;
  }
  if (!strcmp(r, "wo") || !strcmp(r, "bo")) {
    e->source = strf("%sh.%d.attn.c_proj.%s", pre, b, bias ? "bias" : "weight");
    e->transpose = !bias;
    return b >= 0;
  }
  if (!strcmp(r, "w_up") || !strcmp(r, "b_up") || !strcmp(r, "w_down") || !strcmp(r, "b_down")) {
    e->source = strf(r[2] == 'u' ? "%sh.%d.mlp.c_fc.%s" : "%sh.%d.mlp.c_proj.%s", pre, b, bias ? "bias" : "weight");
    e->transpose = !bias;
    return b >= 0;
  }
  if (b < 0 && (!strcmp(r, "w") || !strcmp(r, "b"))) { /* an untied head: nn.Linear, [out, in] */
    e->source = strdup(!strcmp(r, "w") ? "lm_head.weight" : "lm_head.bias");
    return true;
  }
  snprintf(err, cap, "parameter '%s' has no place in the hf-gpt2 layout (role '%s'%s)", p->name, r,
           !strcmp(r, "w_gate") ? ": GPT-2's MLP has no gate" : "");
  return false;
}

static bool place_llama(const param *ps, size_t n, const param *p, bool (*has)(void *, const char *), void *ctx,
                        ntp_st_name *e, char *err, size_t cap) {
  const char *r = p->role;
  int b = p->block;
  char nm[256];
  static const struct { const char *role, *hf; } proj[] = {
      {"wq", "self_attn.q_proj.weight"}, {"wk", "self_attn.k_proj.weight"}, {"wv", "self_attn.v_proj.weight"},
      {"wo", "self_attn.o_proj.weight"}, {"bq", "self_attn.q_proj.bias"},   {"bk", "self_attn.k_proj.bias"},
      {"bv", "self_attn.v_proj.bias"},   {"bo", "self_attn.o_proj.bias"},   {"w_gate", "mlp.gate_proj.weight"},
      {"w_up", "mlp.up_proj.weight"},    {"w_down", "mlp.down_proj.weight"}, {"b_gate", "mlp.gate_proj.bias"},
      {"b_up", "mlp.up_proj.bias"},      {"b_down", "mlp.down_proj.bias"}};
  if (!strcmp(r, "wte")) {
    e->source = strdup("model.embed_tokens.weight");
    return true;
  }
  if (p->norm >= 0 || (b < 0 && layer_has(ps, n, p->layer, "g"))) {
    if (strcmp(r, "g") != 0 || (b >= 0 && p->norm > 1)) {
      snprintf(err, cap, "parameter '%s' has no place in the hf-llama layout (%s)", p->name,
               strcmp(r, "g") ? "Llama's norms have no bias" : "a third norm in a block");
      return false;
    }
    if (b >= 0)
      snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", b, p->norm == 0 ? "input_layernorm" : "post_attention_layernorm");
    else snprintf(nm, sizeof nm, "model.norm.weight");
    e->source = strdup(nm);
    return true;
  }
  for (size_t i = 0; b >= 0 && i < sizeof proj / sizeof proj[0]; i++)
    if (!strcmp(r, proj[i].role)) {
      snprintf(nm, sizeof nm, "model.layers.%d.%s", b, proj[i].hf);
      e->source = strdup(nm);
      return true;
    }
  if (b < 0 && !strcmp(r, "w")) { /* the head; a checkpoint with tied embeddings has none */
    bool tied = has && !has(ctx, "lm_head.weight") && has(ctx, "model.embed_tokens.weight");
    e->source = strdup(tied ? "model.embed_tokens.weight" : "lm_head.weight");
    e->shared = tied;
    return true;
  }
  snprintf(err, cap, "parameter '%s' has no place in the hf-llama layout (role '%s')", p->name, r);
  return false;
}

/* The parts of one file tensor must fit together: the same orientation and inner dims, rows that do
 * not overlap (two blocks mapped to one h.0.* would keep one block's weights in a saved file, or
 * load one block's weights into both), unless one reads what the other does (a tied head). Then
 * every part learns the file tensor's extent, which a file must match exactly. */
static int check_parts(ntp_st_names *map, const param *ps, const char *format, char *err, size_t cap) {
  for (size_t a = 0; a < map->n; a++) {
    ntp_st_name *x = &map->e[a];
    const ntp_shape *xs = &ps[a].val->shape;
    if (xs->ndim < 1 || (x->transpose && xs->ndim != 2)) {
      snprintf(err, cap, "parameter '%s': a %d-dim tensor has no place at %s in the %s layout", x->model, xs->ndim,
               x->source, format);
      return -1;
    }
    x->extent = x->offset + xs->dim[0];
    for (size_t b = 0; b < map->n; b++) {
      const ntp_st_name *y = &map->e[b];
      const ntp_shape *ys = &ps[b].val->shape;
      if (a == b || strcmp(x->source, y->source) != 0) continue;
      if (y->offset + ys->dim[0] > x->extent) x->extent = y->offset + ys->dim[0];
      if (b < a) continue; /* each pair once */
      bool inner = x->transpose == y->transpose && xs->ndim == ys->ndim;
      for (int d = 1; inner && d < xs->ndim; d++) inner = xs->dim[d] == ys->dim[d];
      bool same = x->offset == y->offset && xs->dim[0] == ys->dim[0];
      bool apart = x->offset + xs->dim[0] <= y->offset || y->offset + ys->dim[0] <= x->offset;
      if (!inner) {
        snprintf(err, cap, "parameters '%s' and '%s' map to one tensor %s of the %s layout with different inner dims",
                 x->model, y->model, x->source, format);
        return -1;
      }
      if (!apart && !(same && (x->shared || y->shared))) {
        snprintf(err, cap,
                 "parameters '%s' and '%s' both map to %s in the %s layout (the file could hold only one of them; "
                 "are two blocks numbered alike?)",
                 x->model, y->model, x->source, format);
        return -1;
      }
    }
  }
  return 0;
}

int ntp_st_names_build(const char *format, const ntp_module *m, bool (*has)(void *ctx, const char *name), void *ctx,
                       ntp_st_names **out, char *err, size_t cap) {
  *out = NULL;
  if (cap) err[0] = 0;
  if (!strcmp(format, "ntp")) return 0;
  if (!ntp_param_format_known(format)) {
    snprintf(err, cap, "unknown parameter layout '%s' (ntp, hf-gpt2, hf-llama)", format);
    return -1;
  }
  size_t n = 0;
  for (size_t i = 0; i < m->n_ops; i++) n += m->ops[i].code == IR_PARAM;
  param *ps = calloc(n ? n : 1, sizeof *ps);
  ntp_st_names *map = calloc(1, sizeof *map);
  if (map) map->e = calloc(n ? n : 1, sizeof *map->e);
  if (!ps || !map || !map->e) {
    free(ps);
    ntp_st_names_free(map);
    snprintf(err, cap, "out of memory");
    return -1;
  }
  size_t k = 0;
  for (size_t i = 0; i < m->n_ops; i++) {
    if (m->ops[i].code != IR_PARAM) continue;
    param *p = &ps[k++];
    p->val = &m->values[m->ops[i].result];
    p->name = p->val->name ? p->val->name : "";
    const char *dot = strrchr(p->name, '.');
    size_t ln = dot ? (size_t)(dot - p->name) : 0;
    if (ln >= sizeof p->layer) ln = sizeof p->layer - 1;
    memcpy(p->layer, p->name, ln);
    p->layer[ln] = 0;
    p->role = dot ? dot + 1 : p->name;
    p->block = block_of(p->layer);
    p->norm = -1;
  }
  /* a norm (a layer with a g) is its block's 0th, 1st, ... in program order */
  for (size_t i = 0; i < n; i++) {
    if (ps[i].block < 0 || !layer_has(ps, n, ps[i].layer, "g")) continue;
    int idx = 0;
    char seen[8][128];
    int ns = 0;
    for (size_t j = 0; j < n && strcmp(ps[j].layer, ps[i].layer) != 0; j++)
      if (ps[j].block == ps[i].block && layer_has(ps, n, ps[j].layer, "g")) {
        bool dup = false;
        for (int s = 0; s < ns; s++) dup = dup || !strcmp(seen[s], ps[j].layer);
        if (!dup && ns < 8) snprintf(seen[ns++], sizeof seen[0], "%s", ps[j].layer), idx++;
      }
    ps[i].norm = idx;
  }
  /* GPT-2 files are saved with or without the "transformer." prefix */
  const char *pre = has && has(ctx, "transformer.wte.weight") ? "transformer." : "";
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    ntp_st_name *e = &map->e[map->n++];
    e->model = ps[i].name;
    bool ok = !strcmp(format, "hf-gpt2") ? place_gpt2(ps, n, &ps[i], pre, e, err, cap)
                                          : place_llama(ps, n, &ps[i], has, ctx, e, err, cap);
    if (ok && !e->source) {
      snprintf(err, cap, "out of memory");
      ok = false;
    } else if (!ok && !err[0]) {
      snprintf(err, cap, "parameter '%s' has no place in the %s layout (outside every numbered block)", ps[i].name,
               format);
    }
    if (!ok) rc = -1;
  }
  if (!rc) rc = check_parts(map, ps, format, err, cap);
  free(ps);
  if (rc) {
    ntp_st_names_free(map);
    return -1;
  }
  *out = map;
  return 0;
}

const ntp_st_name *ntp_st_names_find(const ntp_st_names *map, const char *model) {
  for (size_t i = 0; map && i < map->n; i++)
    if (!strcmp(map->e[i].model, model)) return &map->e[i];
  return NULL;
}

void ntp_st_names_free(ntp_st_names *map) {
  if (!map) return;
  for (size_t i = 0; i < map->n; i++) free(map->e[i].source);
  free(map->e);
  free(map);
}
