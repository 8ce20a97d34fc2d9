/* ir.c — IR tables, op table lookups and construction. */
#include "ir.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static const struct {
  const char *name;
  int arity;
} op_table[] = {
#define X(e, s, n) {s, n},
    IR_OPS(X)
#undef X
};

const char *ir_op_name(ir_opcode op) { return (unsigned)op < IR_OP_COUNT ? op_table[op].name : "?"; }
int ir_op_arity(ir_opcode op) { return (unsigned)op < IR_OP_COUNT ? op_table[op].arity : -1; }

bool ir_op_is_unary_elementwise(ir_opcode op) {
  switch (op) {
  case IR_NEG: case IR_GELU: case IR_RELU: case IR_SILU: case IR_SIGMOID: case IR_TANH: case IR_EXP:
    return true;
  default:
    return false;
  }
}

bool ir_op_is_binary_elementwise(ir_opcode op) {
  return op == IR_ADD || op == IR_SUB || op == IR_MUL || op == IR_DIV;
}

int64_t shape_numel(const ntp_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->dim[i];
  return n;
}

int64_t shape_numel_checked(const ntp_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++)
    if (s->dim[i] < 0 || __builtin_mul_overflow(n, s->dim[i], &n)) return -1;
  return n;
}

bool shape_eq(const ntp_shape *a, const ntp_shape *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->dim[i] != b->dim[i]) return false;
  return true;
}

const char *shape_str(const ntp_shape *s, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < s->ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)s->dim[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}

ir_module *ir_module_new(void) {
  ir_module *m = calloc(1, sizeof *m);
  if (m) {
    m->active_plan = -1;
    m->dtype = NTP_FP32;
  }
  return m;
}

void ir_module_free(ir_module *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n_plans; i++) free(m->plans[i].rules);
  free(m->dims);
  free(m->meshes);
  free(m->values);
  free(m->ops);
  free(m->layers);
  free(m->outputs);
  free(m->plans);
  free(m);
}

int32_t ir_emit(ir_module *m, ir_opcode code, const int32_t *args, int32_t nargs, ntp_shape shape, ntp_dtype dt,
                int32_t layer, ntp_loc loc) {
  ir_op op = {.code = code, .result = (int32_t)m->n_values, .nargs = nargs, .layer = layer, .loc = loc};
  for (int i = 0; i < nargs && i < NTP_MAX_ARGS; i++) op.args[i] = args[i];
  ir_value v = {.shape = shape, .dtype = dt, .def = (int32_t)m->n_ops, .layout = {.mesh = -1}};
  VEC_PUSH(m->ops, m->n_ops, m->cap_ops, op);
  VEC_PUSH(m->values, m->n_values, m->cap_values, v);
  return op.result;
}

/* "{A..B}" at p: the range and what follows it. */
static bool range_at(const char *p, long *lo, long *hi, const char **after) {
  char *e;
  if (*p != '{' || !isdigit((unsigned char)p[1])) return false;
  *lo = strtol(p + 1, &e, 10);
  if (e[0] != '.' || e[1] != '.' || !isdigit((unsigned char)e[2])) return false;
  *hi = strtol(e + 2, &e, 10);
  if (*e != '}') return false;
  *after = e + 1;
  return true;
}

/* '*' matches any run of characters, dots included; "{A..B}" matches a number from A to B. */
bool ir_glob_match(const char *p, const char *s) {
  while (*p) {
    if (*p == '*') {
      for (p++;; s++) { /* patterns hold few stars: trying every suffix is cheap */
        if (ir_glob_match(p, s)) return true;
        if (!*s) return false;
      }
    }
    long lo, hi;
    const char *after;
    if (range_at(p, &lo, &hi, &after)) {
      if (!isdigit((unsigned char)*s)) return false;
      char *end;
      long v = strtol(s, &end, 10);
      if (v < lo || v > hi) return false;
      p = after;
      s = end;
      continue;
    }
    if (*p != *s) return false;
    p++;
    s++;
  }
  return *s == 0;
}

int ir_pattern_specificity(const char *p) {
  int n = 0;
  while (*p) {
    long lo, hi;
    const char *after;
    if (range_at(p, &lo, &hi, &after)) { /* a range is more than '*', less than any one number */
      n += 1;
      p = after;
      continue;
    }
    n += *p++ != '*';
  }
  return n;
}

bool ir_fail(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return false;
}
