/* ir.c — IR tables, op table lookups and construction. */
#include "ir.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>


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
  for (size_t i = 0; i < m->n_plans; i++) {
    free(m->plans[i].rules);
    for (size_t p = 0; p < m->plans[i].npipes; p++) free(m->plans[i].pipes[p].stages);
    free(m->plans[i].pipes);
  }
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
int32_t ir_layer_by_prefix(const ir_module *m, const char *name, bool last) {
  size_t n = strlen(name);
  int32_t found = -1;
  for (size_t l = 0; l < m->n_layers && (last || found < 0); l++) {
    const char *ln = m->layers[l].name;
    if (strncmp(ln, name, n) == 0 && (ln[n] == 0 || ln[n] == '.')) found = (int32_t)l;
  }
  return found;
}

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

int ir_schedule_code(const char *name) {
  static const struct {
    const char *name;
    int code;
  } names[] = {{"gpipe", 1}, {"1f1b", 2}, {"interleaved", 3}, {"zb-h1", 4}, {"zbh1", 4}};
  for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
    if (strcasecmp(name, names[i].name) == 0) return names[i].code;
  return 0;
}
