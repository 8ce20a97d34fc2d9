/* types.c — lookups over the shared tables: dtypes, ops, shapes, collectives. */
#include "ntp_types.h"

#include <stdio.h>
#include <string.h>

static const struct {
  const char *name;
  size_t bytes;
  bool is_float;
} dtypes[] = {
#define X(e, s, b, f) {s, b, f},
    NTP_DTYPES(X)
#undef X
};

const char *dtype_name(ntp_dtype t) { return (unsigned)t < NTP_DTYPE_COUNT ? dtypes[t].name : "?"; }
size_t dtype_bytes(ntp_dtype t) { return (unsigned)t < NTP_DTYPE_COUNT ? dtypes[t].bytes : 0; }
bool dtype_is_float(ntp_dtype t) { return (unsigned)t < NTP_DTYPE_COUNT && dtypes[t].is_float; }

int dtype_lookup(const char *s) {
  for (int i = 0; i < NTP_DTYPE_COUNT; i++)
    if (strcmp(s, dtypes[i].name) == 0) return i;
  return -1;
}

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

static const char *comm_names[] = {
#define X(e, s, key) s,
    SH_COMMS(X)
#undef X
};
static const char *comm_keys[] = {
#define X(e, s, key) key,
    SH_COMMS(X)
#undef X
};
const char *sh_comm_name(sh_comm_kind k) { return (unsigned)k < SH_COMM_COUNT ? comm_names[k] : "?"; }
const char *sh_comm_profile_key(sh_comm_kind k) { return (unsigned)k < SH_COMM_COUNT ? comm_keys[k] : NULL; }
