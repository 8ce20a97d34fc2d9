/* ntp_native.c — the C side of the Python package (docs/python.md): one shared library holding
 * the compiler and the runtime, so that Python compiles a model and runs it in process. A
 * compiled unit keeps its session (diagnostics, the module) and an in-memory artifact — what a
 * model library (`ntpc -o model.so`) carries — which the runtime's model ABI
 * (ntprt_model_create, ..._forward, ..._train_step, all exported from here) runs. Nothing here
 * prints: diagnostics come back as data and as text rendered with their source lines. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "artifact.h"
#include "ntp_artifact.h"
#include "ntpc.h"
#include "exec.h"
#include "ntp_train.h"
#include "ntprt.h"
#include "planner.h"
#include "shard.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct ntp_py_unit {
  ntpc_session *s;
  ntp_artifact art;
  ntp_model_tensor_info *tensors; /* inputs, outputs, params */
  int64_t *shapes;
  char *sharding, *diag_text;
} ntp_py_unit;

static __thread char last_error[1024];

EXPORT const char *ntp_py_last_error(void) { return last_error; }

/* Backend `name` as ntp_exec_backend_find takes it (exec.h's table): 0 with *kernels (it runs the
 * codegen pass's per-rank CUDA: compile with it), or -1 with "unknown backend 'x' (expected cpu
 * or cuda)" in ntp_py_last_error. */
EXPORT int ntp_py_backend(const char *name, int *kernels) {
  const ntp_exec_backend *b = ntp_exec_backend_find(name, last_error, sizeof last_error);
  if (!b) return -1;
  *kernels = b->kernels;
  return 0;
}

/* The trainer's option `name` ("lr", "beta1", ...) checked against the one table that ntpc train
 * and the model ABI use (runtime/train/adamw_options.c): 0, or -1 with what it expects in
 * ntp_py_last_error. */
EXPORT int ntp_py_adamw_check(const char *name, double v) {
  ntp_adamw o;
  ntp_adamw_defaults(&o);
  return ntp_adamw_set_number(&o, name, v, last_error, sizeof last_error);
}

static DLDataType dl_type(ntp_dtype dt) {
  switch (dt) {
  case NTP_BF16: return (DLDataType){kDLBfloat, 16, 1};
  case NTP_FP16: return (DLDataType){kDLFloat, 16, 1};
  case NTP_FP32: return (DLDataType){kDLFloat, 32, 1};
  default: return (DLDataType){kDLInt, 32, 1};
  }
}

/* the artifact's info from the sharded program, as artifact.c writes it for a library */
static int build_info(ntp_py_unit *u, const void *image, size_t image_len) {
  const sh_program *p = ntpc_sharded(u->s);
  const ir_module *m = p->global;
  size_t cap = m->n_ops + m->n_outputs + 1;
  int32_t *vals = malloc(cap * sizeof *vals);
  const char **names = malloc(cap * sizeof *names);
  u->tensors = calloc(3 * cap, sizeof *u->tensors);
  u->shapes = calloc(3 * cap * NTP_MAX_RANK, sizeof *u->shapes);
  size_t line_cap = 512, text_cap = (m->n_layers + 1) * line_cap;
  u->sharding = calloc(text_cap, 1);
  if (!vals || !names || !u->tensors || !u->shapes || !u->sharding) {
    free(vals), free(names);
    snprintf(last_error, sizeof last_error, "out of memory");
    return -1;
  }
  size_t at = 0, count[3];
  for (int k = 0; k < 3; k++) {
    count[k] = artifact_tensors(m, (artifact_kind)k, vals, names);
    for (size_t i = 0; i < count[k]; i++) {
      const ir_value *v = &m->values[vals[i]];
      ntp_model_tensor_info *t = &u->tensors[at + i];
      int64_t *sh = &u->shapes[(at + i) * NTP_MAX_RANK];
      for (int d = 0; d < v->shape.ndim; d++) sh[d] = v->shape.dim[d];
      *t = (ntp_model_tensor_info){names[i], dl_type(v->dtype), v->shape.ndim, sh};
    }
    at += cap;
  }
  free(vals), free(names);
  size_t len = 0;
  for (size_t l = 0; l < m->n_layers; l++) {
    artifact_sharding_line(p, l, u->sharding + len, line_cap);
    len += strlen(u->sharding + len);
  }
  u->art = (ntp_artifact){.abi_version = NTP_MODEL_ABI_VERSION, .image = image, .image_len = image_len,
                          .info = {NTP_MODEL_ABI_VERSION, m->name, p->world, u->sharding, (int32_t)count[0],
                                   (int32_t)count[1], (int32_t)count[2], u->tensors, u->tensors + cap,
                                   u->tensors + 2 * cap}};
  return 0;
}

static void render_diags(ntp_py_unit *u) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return;
  ntpc_print_diags(u->s, f, 0);
  fclose(f);
  free(u->diag_text);
  u->diag_text = buf;
}

EXPORT void ntp_py_free(ntp_py_unit *u) {
  if (!u) return;
  ntpc_session_free(u->s);
  free(u->tensors), free(u->shapes), free(u->sharding), free(u->diag_text);
  free(u);
}

/* Compiles `path`, or `source` (named `name` in messages) when path is NULL. Returns the status
 * (NTPC_OK; NTPC_ERR_INPUT: the diagnostics say why; NTPC_ERR_USAGE / _INTERNAL: the last
 * error) and, unless out of memory, the unit in *out — with its diagnostics even on errors. */
EXPORT int ntp_py_compile(const char *path, const char *source, const char *name, const char *const *defines,
                          int ndefines, const char *plan_file, const char *plan_name, const char *model, int world,
                          int train, int cuda, const char *gpu, int micro_batches, const char *schedule,
                          int zero, int redundancy, int domain_size, ntp_py_unit **out) {
  *out = NULL;
  last_error[0] = 0;
  ntp_py_unit *u = calloc(1, sizeof *u);
  if (!u || !(u->s = ntpc_session_new())) {
    free(u);
    snprintf(last_error, sizeof last_error, "out of memory");
    return NTPC_ERR_INTERNAL;
  }
  *out = u;
  for (int i = 0; i < ndefines; i++)
    if (ntpc_define_str(u->s, defines[i]) != NTPC_OK) {
      snprintf(last_error, sizeof last_error, "%s", ntpc_last_error(u->s));
      return NTPC_ERR_USAGE;
    }
  if (model) ntpc_select_model(u->s, model);
  if (plan_file && ntpc_add_plan_file(u->s, plan_file) != NTPC_OK) {
    snprintf(last_error, sizeof last_error, "%s", ntpc_last_error(u->s));
    render_diags(u);
    return NTPC_ERR_USAGE;
  }
  if (plan_name) ntpc_select_plan(u->s, plan_name);
  if (gpu) ntpc_set_gpu(u->s, gpu);
  ntpc_set_world(u->s, world > 0 ? world : 0); /* 0: the plan's world, else one rank */
  ntpc_want_grad(u->s, train != 0);
  ntpc_want_cuda(u->s, cuda != 0);
  if (micro_batches >= 1 || schedule) { /* a name, or a table (FILE.csv); 0: the plan's count */
    if (ntpc_set_pipeline(u->s, micro_batches, schedule) != NTPC_OK) {
      snprintf(last_error, sizeof last_error, "%s", ntpc_last_error(u->s));
      return NTPC_ERR_USAGE;
    }
  }
  /* the distributed optimizer over the plan's line (-1: unset; redundancy alone: with zero 1) */
  if (((zero >= 0 || redundancy >= 0) &&
       ntpc_set_optimizer(u->s, zero >= 0 ? zero : 1, redundancy >= 0 ? redundancy : 1) != NTPC_OK) ||
      (domain_size >= 0 && ntpc_set_domain_size(u->s, domain_size) != NTPC_OK)) {
    snprintf(last_error, sizeof last_error, "%s", ntpc_last_error(u->s));
    return NTPC_ERR_USAGE;
  }
  ntpc_status st = path ? ntpc_compile_file(u->s, path) : ntpc_compile_string(u->s, name ? name : "<string>", source);
  render_diags(u);
  if (st != NTPC_OK) {
    if (st != NTPC_ERR_INPUT) snprintf(last_error, sizeof last_error, "%s", ntpc_last_error(u->s));
    return st;
  }
  const void *image;
  size_t image_len;
  if (ntpc_program_image(u->s, &image, &image_len) != NTPC_OK) {
    snprintf(last_error, sizeof last_error, "no program image: %s", ntpc_last_error(u->s));
    return NTPC_ERR_INTERNAL;
  }
  return build_info(u, image, image_len) == 0 ? NTPC_OK : NTPC_ERR_INTERNAL;
}

EXPORT const ntp_artifact *ntp_py_artifact(const ntp_py_unit *u) { return &u->art; }
EXPORT const char *ntp_py_diagnostics(const ntp_py_unit *u) { return u->diag_text ? u->diag_text : ""; }
EXPORT size_t ntp_py_diag_count(const ntp_py_unit *u) { return ntpc_diag_count(u->s); }
EXPORT const ntpc_diag *ntp_py_diag(const ntp_py_unit *u, size_t i) { return ntpc_diag_at(u->s, i); }

/* ---- the planner: a solution as JSON (the Python side makes objects of it) ---- */

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

/* The planner's best placement of every layer of the unit's model for `world` GPUs of profile
 * `gpu` (NULL: h100); mem_cap_gib 0: the profile's; nodes_of 0: 8. A JSON object in *json
 * (free with ntp_py_free_string), or NULL with the last error / the unit's diagnostics. */
EXPORT int ntp_py_plan(ntp_py_unit *u, int world, const char *gpu, int train, double mem_cap_gib, int nodes_of,
                       char **json) {
  *json = NULL;
  plan_profile prof;
  if (!plan_profile_builtin(gpu ? gpu : "h100", &prof)) {
    snprintf(last_error, sizeof last_error, "unknown GPU profile '%s' (h100, h200, a100, b200)", gpu);
    return NTPC_ERR_USAGE;
  }
  const ir_module *m = ntpc_module(u->s);
  size_t seen = ntpc_diag_count(u->s);
  plan_model *pm = m ? plan_model_new(m, ntpc_diag_sink(u->s)) : NULL;
  plan_request rq = {.world = world, .prof = &prof, .mem_cap = mem_cap_gib * 1073741824.0, .nodes_of = nodes_of,
                     .train = train != 0};
  plan_solution sol;
  bool ok = pm && plan_solve(pm, m, &rq, &sol, ntpc_diag_sink(u->s));
  if (!ok) {
    render_diags(u);
    plan_model_free(pm);
    snprintf(last_error, sizeof last_error, "%s", ntpc_diag_count(u->s) > seen ? "the planner reports errors"
                                                                              : "the model cannot be planned");
    return NTPC_ERR_INPUT;
  }
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) {
    plan_solution_free(&sol);
    plan_model_free(pm);
    snprintf(last_error, sizeof last_error, "out of memory");
    return NTPC_ERR_INTERNAL;
  }
  fprintf(f, "{\"model\": ");
  json_str(f, m->name);
  fprintf(f, ", \"world\": %d, \"device\": ", world);
  json_str(f, prof.device);
  fprintf(f, ", \"train\": %s, \"feasible\": %s", train ? "true" : "false", sol.feasible ? "true" : "false");
  if (!sol.feasible) {
    fprintf(f, ", \"why\": ");
    json_str(f, sol.why);
  } else {
    fprintf(f, ", \"step_s\": %.9g, \"compute_s\": %.9g, \"comm_s\": %.9g, \"tokens_per_s\": %.9g, \"mem_cap\": %.9g, "
               "\"mem_peak\": %.9g, \"exact\": %s, \"layers\": [", sol.step_s, sol.compute_s, sol.comm_s,
            plan_model_tokens(pm) / sol.step_s, sol.mem_cap, sol.mem_peak, sol.exact ? "true" : "false");
    for (int32_t i = 0; i < sol.nlayers; i++) {
      const plan_layer_out *l = &sol.layers[i];
      char place[256];
      plan_place_str(&l->place, place, sizeof place);
      fprintf(f, "%s{\"name\": ", i ? ", " : "");
      json_str(f, plan_model_layer(pm, i)->name);
      fprintf(f, ", \"placement\": ");
      json_str(f, place);
      fprintf(f, ", \"groups\": [");
      for (int g = 0; g < l->place.ngroups; g++) fprintf(f, "%s%d", g ? ", " : "", l->place.size[g]);
      fprintf(f, "], \"sequence_parallel\": %s, \"recompute\": %s, \"pinned\": %s, \"compute_s\": %.9g, "
                 "\"comm_s\": %.9g, \"redist_s\": %.9g, \"param_bytes\": %.9g, \"act_bytes\": %.9g}",
              l->place.sp ? "true" : "false", l->place.rc ? "true" : "false", l->pinned ? "true" : "false", l->compute_s,
              l->comm_s, l->redist_s, l->param_bytes, l->act_bytes);
    }
    fprintf(f, "]");
  }
  fprintf(f, "}");
  fclose(f);
  plan_solution_free(&sol);
  plan_model_free(pm);
  *json = buf;
  return NTPC_OK;
}

EXPORT void ntp_py_free_string(char *s) { free(s); }

/* The runtime's model ABI, which the Python side calls by these names: referenced here so that
 * the linker takes runtime/abi/model_abi.c from the static runtime into this library. */
__attribute__((used)) static const void *const model_abi[] = {
    (const void *)ntprt_model_create,      (const void *)ntprt_model_load_format, (const void *)ntprt_model_save_format,
    (const void *)ntprt_model_set_param,   (const void *)ntprt_model_get_param,   (const void *)ntprt_model_forward,
    (const void *)ntprt_model_train_step,  (const void *)ntprt_model_last_error,  (const void *)ntprt_model_destroy,
    (const void *)ntprt_model_init,
};
