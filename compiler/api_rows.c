/* api_rows.c — the model compiled again at other batch rows, for the planner's 3D search (its
 * micro-batches: plan_request.model_at_rows): `ntpc plan`, bench_planner and the planner's tests
 * share it (ntpc.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "ntpc.h"
#include "planner.h"

typedef struct rows_model {
  int64_t rows;
  ntpc_session *s;
  plan_model *pm;
} rows_model;

struct ntpc_rows_models {
  const char *file, *model, *dim;
  const char *const *defines;
  int ndefines;
  rows_model *made;
  int n;
};

const char *ntpc_batch_dim(const struct ir_module *m, int64_t rows, const char **why) {
  const char *dim = NULL;
  int found = 0;
  for (size_t i = 0; i < m->n_dims; i++)
    if (m->dims[i].value == rows) {
      found++;
      if (!dim || strcmp(m->dims[i].name, "B") == 0) dim = m->dims[i].name;
    }
  if (!found) *why = "no dim of the model is its batch rows";
  else if (found > 1 && strcmp(dim, "B") != 0) *why = "several dims equal the batch rows and none is named B";
  return !found || (found > 1 && strcmp(dim, "B") != 0) ? NULL : dim;
}

ntpc_rows_models *ntpc_rows_models_new(const char *file, const char *model, const char *const *defines, int ndefines,
                                       const char *dim) {
  ntpc_rows_models *r = calloc(1, sizeof *r);
  if (r) *r = (ntpc_rows_models){.file = file, .model = model, .dim = dim, .defines = defines, .ndefines = ndefines};
  return r;
}

/* the file compiled with the batch dim at `rows` (no plan, no sharding: the planner's input) */
static ntpc_session *compile_at(const ntpc_rows_models *c, int64_t rows) {
  ntpc_session *s = ntpc_session_new();
  if (!s) return NULL;
  size_t dl = strlen(c->dim);
  for (int i = 0; i < c->ndefines; i++) /* the other dims as given, then ours */
    if (strncmp(c->defines[i], c->dim, dl) != 0 || c->defines[i][dl] != '=') ntpc_define_str(s, c->defines[i]);
  char def[96];
  snprintf(def, sizeof def, "%s=%lld", c->dim, (long long)rows);
  ntpc_define_str(s, def);
  if (c->model) ntpc_select_model(s, c->model);
  ntpc_set_world(s, -1);
  if (ntpc_compile_file(s, c->file) != NTPC_OK) {
    ntpc_session_free(s);
    return NULL;
  }
  return s;
}

const struct plan_model *ntpc_rows_model(void *ctx, int64_t rows) {
  ntpc_rows_models *c = ctx;
  for (int i = 0; i < c->n; i++)
    if (c->made[i].rows == rows) return c->made[i].pm;
  rows_model *nm = realloc(c->made, (size_t)(c->n + 1) * sizeof *nm);
  if (!nm) return NULL;
  c->made = nm;
  rows_model *r = &c->made[c->n];
  *r = (rows_model){.rows = rows, .s = compile_at(c, rows)};
  if (!r->s) return NULL;
  diag_sink quiet = {0};
  r->pm = plan_model_new(ntpc_module(r->s), &quiet);
  diag_free(&quiet);
  if (!r->pm) {
    ntpc_session_free(r->s);
    return NULL;
  }
  c->n++;
  return r->pm;
}

const char *ntpc_rows_dim(const ntpc_rows_models *r) { return r->dim; }

void ntpc_rows_models_free(ntpc_rows_models *r) {
  if (!r) return;
  for (int i = 0; i < r->n; i++) {
    plan_model_free(r->made[i].pm);
    ntpc_session_free(r->made[i].s);
  }
  free(r->made);
  free(r);
}
