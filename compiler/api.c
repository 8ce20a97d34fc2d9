/* api.c — the libntpc session: sources in, diagnostics and verified IR out. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ir.h"
#include "sema.h"
#include "shard.h"
#include "autoplan.h"
#include "planner.h"
#include "cuda_gen.h"
#include "program_write.h"
#include "grad.h"

struct ntpc_session {
  arena pool;
  diag_sink diags;
  ast_file ast;
  const ast_model *model;     /* the model chosen from it */
  ir_module *module;
  int32_t world;              /* requested: -1 no sharding, 0 the plan's, else ranks */
  int32_t ranks;              /* resolved by the place pass */
  sh_placement *placements;   /* [module->n_layers] */
  sh_program *sharded;
  sh_pipe_options pipe;       /* micro-batches and the schedule (ntpc_set_pipeline) */
  bool want_cuda;             /* run the codegen pass */
  bool want_grad;             /* run the gradient pass (training) */
  cg_module *cuda;            /* [ranks] */
  program_image image;        /* what the runtime reads (runtime/ntp_program.h) */
  const char *gpu;            /* the device profile (a built-in name or a file): autoplan's, codegen's */
  char *autoplan_notes;       /* what the autoplan pass chose, one line per choice */
  uint64_t dump_after;        /* passes whose result is printed to dump_out */
  FILE *dump_out;
  sema_define *defines;
  size_t ndefines, cap_defines;
  const char **plan_files;
  size_t nplan_files, cap_plan_files;
  const char *model_name, *plan_name;
  source_file *main_src;
  char last_error[512];
};

ntpc_session *ntpc_session_new(void) {
  ntpc_session *s = calloc(1, sizeof *s);
  if (s) {
    s->diags.pool = &s->pool;
    s->diags.error_limit = 20;
    s->world = -1;
  }
  return s;
}

void ntpc_session_free(ntpc_session *s) {
  if (!s) return;
  for (int32_t r = 0; s->cuda && r < s->ranks; r++) cg_module_free(&s->cuda[r]);
  free(s->cuda);
  program_image_free(&s->image);
  free(s->placements);
  sh_program_free(s->sharded);
  ir_module_free(s->module);
  diag_free(&s->diags);
  free(s->defines);
  free(s->plan_files);
  arena_free(&s->pool);
  free(s);
}

static ntpc_status usage_error(ntpc_session *s, const char *fmt, const char *arg) {
  snprintf(s->last_error, sizeof s->last_error, fmt, arg);
  return NTPC_ERR_USAGE;
}

const char *ntpc_last_error(const ntpc_session *s) { return s->last_error; }

ntpc_status ntpc_define(ntpc_session *s, const char *name, int64_t value) {
  for (size_t i = 0; i < s->ndefines; i++)
    if (strcmp(s->defines[i].name, name) == 0) {
      s->defines[i].value = value; /* the last -D wins, as with cc */
      return NTPC_OK;
    }
  sema_define d = {arena_strdup(&s->pool, name), value, false};
  VEC_PUSH(s->defines, s->ndefines, s->cap_defines, d);
  return NTPC_OK;
}

ntpc_status ntpc_define_str(ntpc_session *s, const char *assignment) {
  const char *eq = strchr(assignment, '=');
  if (!eq || eq == assignment) return usage_error(s, "-D expects NAME=VALUE, got '%s'", assignment);
  char *end;
  errno = 0;
  long long v = strtoll(eq + 1, &end, 10);
  if (*end || end == eq + 1 || errno) return usage_error(s, "-D value must be an integer: '%s'", assignment);
  for (const char *p = assignment; p < eq; p++)
    if (!(*p == '_' || (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (p > assignment && *p >= '0' && *p <= '9')))
      return usage_error(s, "-D name is not an identifier: '%s'", assignment);
  return ntpc_define(s, arena_strndup(&s->pool, assignment, (size_t)(eq - assignment)), v);
}

void ntpc_set_world(ntpc_session *s, int32_t world) { s->world = world; }

ntpc_status ntpc_set_optimizer(ntpc_session *s, int32_t zero, int32_t redundancy) {
  const char *bad = zero < 0 || zero > 2             ? "--zero must be 0, 1 or 2, got %d"
                    : redundancy < 1 || redundancy > 64 ? "--redundancy must be in 1..64, got %d"
                    : redundancy > 1 && zero == 0       ? "--redundancy %d needs --zero 1 or 2"
                                                        : NULL;
  if (bad) {
    snprintf(s->last_error, sizeof s->last_error, bad, zero < 0 || zero > 2 ? zero : redundancy);
    return NTPC_ERR_USAGE;
  }
  s->pipe.set_optimizer = true;
  s->pipe.zero = zero;
  s->pipe.redundancy = redundancy;
  return NTPC_OK;
}

ntpc_status ntpc_set_domain_size(ntpc_session *s, int32_t domain_size) {
  if (domain_size < 1 || domain_size > NTP_MAX_WORLD) {
    snprintf(s->last_error, sizeof s->last_error, "--domain-size must be in 1..%d, got %d", NTP_MAX_WORLD, domain_size);
    return NTPC_ERR_USAGE;
  }
  s->pipe.domain_size = domain_size;
  return NTPC_OK;
}

void ntpc_set_rank_gpus(ntpc_session *s, const int32_t *gpus, int32_t n) {
  int32_t *copy = n > 0 ? arena_alloc(&s->pool, (size_t)n * sizeof *copy) : NULL;
  if (copy) memcpy(copy, gpus, (size_t)n * sizeof *copy);
  s->pipe.gpu_of_rank = copy;
  s->pipe.n_gpu_of_rank = copy ? n : 0;
}

ntpc_status ntpc_set_pipeline(ntpc_session *s, int32_t micro_batches, const char *schedule) {
  if (micro_batches < 0 || micro_batches > NTP_MAX_MICRO_BATCHES) {
    snprintf(s->last_error, sizeof s->last_error, "--micro-batches must be in 1..%d, got %d", NTP_MAX_MICRO_BATCHES,
             micro_batches);
    return NTPC_ERR_USAGE;
  }
  size_t n = schedule ? strlen(schedule) : 0;
  const char *schedule_csv = n > 4 && strcmp(schedule + n - 4, ".csv") == 0 ? schedule : NULL;
  if (schedule_csv) { /* a table that cannot be read is the command line's error, as a missing --plan file */
    FILE *f = fopen(schedule_csv, "r");
    if (!f) {
      snprintf(s->last_error, sizeof s->last_error, "cannot open '%s': %s", schedule_csv, strerror(errno));
      return NTPC_ERR_USAGE;
    }
    fclose(f);
  }
  s->pipe.micro_batches = micro_batches;
  s->pipe.schedule_csv = schedule_csv;
  s->pipe.schedule = SH_SCHED_DEFAULT;
  if (!schedule || schedule_csv) return NTPC_OK;
  if ((s->pipe.schedule = (sh_schedule_kind)ir_schedule_code(schedule)) != SH_SCHED_DEFAULT) return NTPC_OK;
  return usage_error(s, "--schedule: no schedule '%s' (gpipe, 1f1b, interleaved, zb-h1, or a .csv table)", schedule);
}
void ntpc_set_error_limit(ntpc_session *s, size_t n) { s->diags.error_limit = n; }
const struct sh_program *ntpc_sharded(const ntpc_session *s) { return s->sharded; }

void ntpc_select_model(ntpc_session *s, const char *name) { s->model_name = name ? arena_strdup(&s->pool, name) : NULL; }
void ntpc_select_plan(ntpc_session *s, const char *name) { s->plan_name = name ? arena_strdup(&s->pool, name) : NULL; }

ntpc_status ntpc_add_plan_file(ntpc_session *s, const char *path) {
  const char *p = arena_strdup(&s->pool, path);
  VEC_PUSH(s->plan_files, s->nplan_files, s->cap_plan_files, p);
  return NTPC_OK;
}

/* Reads a whole source; NULL with last_error set (a usage error), or with *too_big set when the
 * file exceeds NTPC_MAX_SOURCE_BYTES (an input error: /dev/zero or a stray binary must not be
 * read until memory runs out). */
static source_file *read_source(ntpc_session *s, const char *path, bool *too_big) {
  *too_big = false;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(s->last_error, sizeof s->last_error, "cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  size_t n;
  while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (len > NTPC_MAX_SOURCE_BYTES) {
      *too_big = true;
      break;
    }
    if (len + 1 == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) free(buf);
      buf = nb;
    }
  }
  bool err = ferror(f);
  fclose(f);
  if (*too_big) {
    free(buf);
    /* the diagnostic outlives the caller's string: the session keeps its own copy of the name */
    diag_emit(&s->diags, NTPC_ERROR, arena_strdup(&s->pool, path), NTP_NOLOC,
              "the file is larger than %zu MiB, the largest source accepted",
              NTPC_MAX_SOURCE_BYTES >> 20);
    return NULL;
  }
  if (!buf || err) {
    free(buf);
    snprintf(s->last_error, sizeof s->last_error, "cannot read '%s': %s", path, err ? strerror(errno) : "out of memory");
    return NULL;
  }
  source_file *src = arena_alloc(&s->pool, sizeof *src);
  src->name = arena_strdup(&s->pool, path);
  src->text = arena_strndup(&s->pool, buf, len);
  src->len = len;
  free(buf);
  return src;
}

static void parse_into(ntpc_session *s, source_file *src, FILE *token_dump) {
  diag_add_file(&s->diags, src);
  parse_ctx ctx = {.pool = &s->pool, .diags = &s->diags, .src = src, .out = &s->ast, .token_dump = token_dump};
  parse_source(&ctx);
}

static const ast_model *pick_model(ntpc_session *s) {
  const ast_model *found = NULL;
  for (const ast_model *m = s->ast.models; m; m = m->next)
    if (!s->model_name || strcmp(m->name, s->model_name) == 0) {
      found = m;
      break;
    }
  if (!found && s->model_name)
    diag_emit(&s->diags, NTPC_ERROR, "<command line>", NTP_NOLOC, "no model named '%s' in %s", s->model_name,
              s->main_src->name);
  else if (!found)
    diag_emit(&s->diags, NTPC_ERROR, s->main_src->name, NTP_NOLOC, "no model in this file");
  return found;
}

/* Model and plan names are unique across the sources read. */
static void check_unique_names(ntpc_session *s) {
  strmap seen = {0}; /* name -> its first definition (a map: a file may hold thousands) */
  for (const ast_model *m = s->ast.models; m; m = m->next) {
    int64_t first;
    if (!strmap_get(&seen, m->name, &first)) {
      strmap_put(&seen, m->name, (int64_t)(intptr_t)m);
      continue;
    }
    const ast_model *o = (const ast_model *)(intptr_t)first;
    diag_emit(&s->diags, NTPC_ERROR, m->file, m->name_loc, "model '%s' is defined twice", m->name);
    diag_emit(&s->diags, NTPC_NOTE, o->file, o->name_loc, "first defined here");
  }
  strmap_free(&seen);
  seen = (strmap){0};
  for (const ast_plan *p = s->ast.plans; p; p = p->next) {
    int64_t first;
    if (!strmap_get(&seen, p->name, &first)) {
      strmap_put(&seen, p->name, (int64_t)(intptr_t)p);
      continue;
    }
    const ast_plan *o = (const ast_plan *)(intptr_t)first;
    diag_emit(&s->diags, NTPC_ERROR, p->file, p->name_loc, "plan '%s' is defined twice", p->name);
    diag_emit(&s->diags, NTPC_NOTE, o->file, o->name_loc, "first defined here");
  }
  strmap_free(&seen);
}

/* Plans must name a model that exists in the sources read. */
static void check_plan_targets(ntpc_session *s) {
  strmap models = {0}; /* every model, however many the file holds */
  size_t n = 0;
  for (const ast_model *m = s->ast.models; m; m = m->next, n++) strmap_put(&models, m->name, 1);
  const char **names = malloc((n + 1) * sizeof *names);
  n = 0;
  for (const ast_model *m = s->ast.models; names && m; m = m->next) names[n++] = m->name;
  for (const ast_plan *p = s->ast.plans; p; p = p->next) {
    if (strmap_get(&models, p->model, NULL)) continue;
    const char *near = nearest_name(p->model, names, n);
    if (near)
      diag_emit(&s->diags, NTPC_ERROR, p->file, p->model_loc, "plan '%s' is for model '%s', which is not defined; did you mean '%s'?",
                p->name, p->model, near);
    else
      diag_emit(&s->diags, NTPC_ERROR, p->file, p->model_loc, "plan '%s' is for model '%s', which is not defined",
                p->name, p->model);
  }
  free(names);
  strmap_free(&models);
}

/* ---- the pipeline: one row per pass, the verifier after each, --dump-after=PASS --------- */

static ntpc_status internal(ntpc_session *s, const char *what, const char *why) {
  diag_emit(&s->diags, NTPC_ERROR, s->main_src->name, NTP_NOLOC, "internal compiler error: %s: %s", what, why);
  return NTPC_ERR_INTERNAL;
}

static ntpc_status out_of_memory(ntpc_session *s) {
  snprintf(s->last_error, sizeof s->last_error, "out of memory");
  return NTPC_ERR_INTERNAL;
}

static bool sharding(const ntpc_session *s) { return s->world >= 0; }

static ntpc_status run_parse(ntpc_session *s) {
  parse_into(s, s->main_src, NULL);
  for (size_t i = 0; i < s->nplan_files; i++) {
    bool too_big;
    source_file *p = read_source(s, s->plan_files[i], &too_big);
    if (!p) return too_big ? NTPC_ERR_INPUT : NTPC_ERR_USAGE;
    parse_into(s, p, NULL);
  }
  return NTPC_OK;
}

static ntpc_status run_names(ntpc_session *s) {
  check_unique_names(s);
  if (s->diags.errors) return NTPC_ERR_INPUT;
  if (!(s->model = pick_model(s))) return NTPC_ERR_INPUT;
  check_plan_targets(s);
  return NTPC_OK;
}

static ntpc_status run_sema(ntpc_session *s) {
  const char *plan_file = s->nplan_files ? s->plan_files[0] : NULL;
  s->module = sema_run(&s->pool, &s->diags, &s->ast, s->model, s->defines, s->ndefines, plan_file, s->plan_name);
  if (!s->module) return out_of_memory(s);
  if (s->diags.errors) {
    ir_module_free(s->module);
    s->module = NULL;
    return NTPC_ERR_INPUT;
  }
  return NTPC_OK;
}

static ntpc_status run_grad(ntpc_session *s) {
  if (!s->want_grad) return NTPC_OK;
  return ir_grad(s->module, &s->pool, s->model->name_loc, &s->diags) ? NTPC_OK
         : s->diags.out_of_memory                                    ? out_of_memory(s)
                                                                     : NTPC_ERR_INPUT;
}

static ntpc_status run_place(ntpc_session *s) {
  if (!sharding(s)) return NTPC_OK;
  s->placements = calloc(s->module->n_layers + 1, sizeof *s->placements);
  if (!s->placements) return out_of_memory(s);
  return shard_place(s->module, s->world > 0 ? s->world : 0, &s->ranks, s->placements, &s->diags) ? NTPC_OK
                                                                                                    : NTPC_ERR_INPUT;
}

static ntpc_status run_autoplan(ntpc_session *s) {
  if (!sharding(s)) return NTPC_OK;
  char *notes = NULL;
  bool ok = autoplan_resolve(s->module, s->ranks, s->placements, s->gpu, &s->diags, &notes);
  if (notes) {
    s->autoplan_notes = arena_strdup(&s->pool, notes);
    free(notes);
  }
  return ok ? NTPC_OK : s->diags.errors ? NTPC_ERR_INPUT : out_of_memory(s);
}

static ntpc_status run_shard(ntpc_session *s) {
  if (!sharding(s)) return NTPC_OK;
  s->sharded = shard_lower(s->module, s->ranks, s->placements, &s->pipe, &s->diags);
  if (!s->sharded) return s->diags.errors ? NTPC_ERR_INPUT : out_of_memory(s);
  return NTPC_OK;
}

static ntpc_status run_memplan(ntpc_session *s) {
  if (s->sharded) sh_plan_memory(s->sharded);
  return NTPC_OK;
}

static ntpc_status run_codegen(ntpc_session *s) {
  if (!s->sharded || !s->want_cuda) return NTPC_OK;
  s->cuda = calloc((size_t)s->ranks, sizeof *s->cuda);
  if (!s->cuda) return out_of_memory(s);
  char err[512];
  /* what the session's device profile (--gpu) says of the GPU, the same profile the autoplan
   * pass plans for; without one, the codegen's defaults (not h100's: a built-in measures nothing) */
  cg_options opts = {0};
  if (s->gpu) {
    plan_profile prof;
    if (!plan_profile_find(s->gpu, &prof, err, sizeof err)) {
      diag_emit(&s->diags, NTPC_ERROR, s->main_src->name, NTP_NOLOC, "%s", err);
      return NTPC_ERR_INPUT;
    }
    opts.attn_gemm_from = prof.attn_gemm_from;
  }
  for (int32_t r = 0; r < s->ranks; r++) {
    int rc = cg_generate_with(s->sharded, r, &opts, &s->cuda[r], err, sizeof err);
    if (rc == -2) { /* the user's setting, not the compiler's fault */
      diag_emit(&s->diags, NTPC_ERROR, s->main_src->name, NTP_NOLOC, "%s", err);
      return NTPC_ERR_INPUT;
    }
    if (rc != 0) return strcmp(err, "out of memory") == 0 ? out_of_memory(s) : internal(s, "codegen", err);
  }
  return NTPC_OK;
}

static ntpc_status run_image(ntpc_session *s) {
  program_write(s->module, s->sharded, s->cuda, &s->image);
  return NTPC_OK;
}

static bool verify_ir(const ntpc_session *s, char *why, size_t cap) { return ir_verify(s->module, why, cap); }
static bool verify_place(const ntpc_session *s, char *why, size_t cap) {
  if (!s->placements) return true;
  if (!sh_verify_placements(s->module, s->ranks, s->placements, why, cap)) return false;
  return true;
}
static bool verify_planned(const ntpc_session *s, char *why, size_t cap) {
  if (!s->placements) return true;
  for (size_t l = 0; l < s->module->n_layers; l++)
    if (s->placements[l].is_auto) return ir_fail(why, cap, "layer '%s' is still 'tp auto'", s->module->layers[l].name);
  return verify_place(s, why, cap);
}
static bool verify_sharded(const ntpc_session *s, char *why, size_t cap) {
  return !s->sharded || sh_verify(s->sharded, why, cap);
}
static bool verify_memory(const ntpc_session *s, char *why, size_t cap) {
  return !s->sharded || sh_check_memory(s->sharded, why, cap);
}

static void dump_ast(ntpc_session *s, FILE *out) { ast_print(&s->ast, out); }
static void dump_ir(ntpc_session *s, FILE *out) { ir_print(s->module, out); }
static void dump_place(ntpc_session *s, FILE *out) {
  if (!s->placements) return;
  fprintf(out, "world %d\n", s->ranks);
  for (size_t l = 0; l < s->module->n_layers; l++) {
    const sh_placement *pl = &s->placements[l];
    fprintf(out, "%s: groups (", s->module->layers[l].name);
    for (int g = 0; g < pl->ngroups; g++) fprintf(out, "%s%d", g ? ", " : "", sh_group_size(pl, g));
    fputs(") batch (", out);
    for (int g = 0; g < pl->ngroups; g++) fprintf(out, "%s%lld", g ? ", " : "", (long long)pl->share[g]);
    fprintf(out, ")%s%s%s\n", pl->seq_parallel ? ", sequence parallel" : "", pl->recompute ? ", recompute" : "",
            pl->is_auto ? ", tp auto" : "");
  }
  if (s->autoplan_notes) fputs(s->autoplan_notes, out);
}
static void dump_sharded(ntpc_session *s, FILE *out) {
  if (s->sharded) sh_print(s->sharded, out);
}
static void dump_memory(ntpc_session *s, FILE *out) {
  if (s->sharded) sh_print_report(s->sharded, out);
}
static void dump_image(ntpc_session *s, FILE *out) {
  fprintf(out, "program image: %zu bytes, format version %d (%s%s%s)\n", s->image.len, NTP_PROGRAM_VERSION,
          "module", s->sharded ? ", sharded program" : "", s->cuda ? ", CUDA per rank" : "");
}
static void dump_cuda(ntpc_session *s, FILE *out) {
  for (int32_t r = 0; s->cuda && r < s->ranks; r++) {
    fprintf(out, "// ---- rank %d ----\n", r);
    fwrite(s->cuda[r].source, 1, s->cuda[r].len, out);
  }
}

typedef struct ntpc_pass {
  const char *name, *what;
  ntpc_status (*run)(ntpc_session *s);
  bool (*verify)(const ntpc_session *s, char *why, size_t cap); /* what the pass produced */
  void (*dump)(ntpc_session *s, FILE *out);                    /* --dump-after=name */
} ntpc_pass;

static const ntpc_pass pipeline[] = {
    {"parse", "the sources (model, plan files) to a syntax tree", run_parse, NULL, dump_ast},
    {"names", "model and plan names unique; the model chosen; plans name models", run_names, NULL, NULL},
    {"sema", "names, dims, types, layers (by their kinds): the global IR", run_sema, verify_ir, dump_ir},
    {"grad", "the backward ops of the loss and every parameter's gradient (when training)", run_grad, verify_ir, dump_ir},
    {"place", "the world and every layer's placement (inline @tp, the active plan)", run_place, verify_place,
     dump_place},
    {"autoplan", "'tp auto' placements chosen by the planner", run_autoplan, verify_planned, dump_place},
    {"shard", "the sharded program: every rank's ops and the collectives between them", run_shard, verify_sharded,
     dump_sharded},
    {"memplan", "every rank's activation arena", run_memplan, verify_memory, dump_memory},
    {"codegen", "CUDA C++ for every rank (when the target needs it)", run_codegen, NULL, dump_cuda},
    {"image", "the program image the runtime reads (runtime/ntp_program.h)", run_image, NULL, dump_image},
};
enum { NPASSES = sizeof pipeline / sizeof pipeline[0] };

size_t ntpc_pass_count(void) { return NPASSES; }
const char *ntpc_pass_name(size_t i, const char **what) {
  if (i >= NPASSES) return NULL;
  if (what) *what = pipeline[i].what;
  return pipeline[i].name;
}

ntpc_status ntpc_dump_after(ntpc_session *s, const char *passes, FILE *out) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", passes);
  for (char *save = NULL, *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
    size_t i = 0;
    while (i < NPASSES && strcmp(pipeline[i].name, p) != 0) i++;
    if (i == NPASSES || !pipeline[i].dump) {
      char names[256] = "";
      for (size_t k = 0; k < NPASSES; k++)
        if (pipeline[k].dump) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "", pipeline[k].name);
      snprintf(s->last_error, sizeof s->last_error, "--dump-after: no pass '%.64s' with a dump (passes: %s)", p, names);
      return NTPC_ERR_USAGE;
    }
    s->dump_after |= UINT64_C(1) << i;
  }
  s->dump_out = out;
  return NTPC_OK;
}

static ntpc_status run_pipeline(ntpc_session *s) {
  for (size_t i = 0; i < NPASSES; i++) {
    const ntpc_pass *ps = &pipeline[i];
    ntpc_status st = ps->run(s);
    if (st == NTPC_OK && s->diags.errors) st = NTPC_ERR_INPUT;
    if (st != NTPC_OK) return st;
    char why[512];
    if (ps->verify && !ps->verify(s, why, sizeof why)) {
      char what[64];
      snprintf(what, sizeof what, "verifier after pass '%s'", ps->name);
      return internal(s, what, why);
    }
    if (s->dump_after & (UINT64_C(1) << i) && s->dump_out) {
      fprintf(s->dump_out, "# ---- after %s ----\n", ps->name);
      ps->dump(s, s->dump_out);
    }
  }
  return NTPC_OK;
}

static ntpc_status compile(ntpc_session *s, source_file *src) {
  s->main_src = src;
  NTP_OOM_GUARDED(run_pipeline(s), out_of_memory(s));
}

void ntpc_set_gpu(ntpc_session *s, const char *gpu) { s->gpu = gpu ? arena_strdup(&s->pool, gpu) : NULL; }
void ntpc_want_cuda(ntpc_session *s, bool on) { s->want_cuda = on; }
void ntpc_want_grad(ntpc_session *s, bool on) { s->want_grad = on; }
const struct cg_module *ntpc_cuda_modules(const ntpc_session *s) { return s->cuda; }
ntpc_status ntpc_program_image(const ntpc_session *s, const void **data, size_t *len) {
  *data = s->image.data;
  *len = s->image.len;
  return s->image.len ? NTPC_OK : NTPC_ERR_USAGE;
}
const char *ntpc_autoplan_notes(const ntpc_session *s) { return s->autoplan_notes; }

ntpc_status ntpc_compile_file(ntpc_session *s, const char *path) {
  bool too_big;
  source_file *src = read_source(s, path, &too_big);
  return src ? compile(s, src) : too_big ? NTPC_ERR_INPUT : NTPC_ERR_USAGE;
}

ntpc_status ntpc_compile_string(ntpc_session *s, const char *name, const char *source) {
  source_file *src = arena_alloc(&s->pool, sizeof *src);
  src->name = arena_strdup(&s->pool, name ? name : "<string>");
  src->len = strlen(source);
  if (src->len > NTPC_MAX_SOURCE_BYTES) {
    diag_emit(&s->diags, NTPC_ERROR, src->name, NTP_NOLOC, "the source is larger than %zu MiB, the largest accepted",
              NTPC_MAX_SOURCE_BYTES >> 20);
    return NTPC_ERR_INPUT;
  }
  src->text = arena_strndup(&s->pool, source, src->len);
  return compile(s, src);
}

size_t ntpc_diag_count(const ntpc_session *s) { return s->diags.len; }
const ntpc_diag *ntpc_diag_at(const ntpc_session *s, size_t i) { return i < s->diags.len ? &s->diags.items[i] : NULL; }
size_t ntpc_error_count(const ntpc_session *s) { return s->diags.errors; }
void ntpc_print_diags(const ntpc_session *s, FILE *out, int color) { diag_render(&s->diags, out, color); }
void ntpc_print_diags_from(const ntpc_session *s, size_t first, FILE *out, int color) {
  diag_render_from(&s->diags, first, out, color);
}
struct diag_sink *ntpc_diag_sink(ntpc_session *s) { return &s->diags; }
const struct ir_module *ntpc_module(const ntpc_session *s) { return s->module; }

ntpc_status ntpc_emit(ntpc_session *s, const char *kind, FILE *out) {
  if (strcmp(kind, "ir") == 0) {
    if (!s->module) return usage_error(s, "no IR: compile first%s", "");
    ir_print(s->module, out);
    return NTPC_OK;
  }
  if (strcmp(kind, "ast") == 0) {
    ast_print(&s->ast, out);
    return NTPC_OK;
  }
  if (strcmp(kind, "tokens") == 0) {
    if (!s->main_src) return usage_error(s, "no source: compile first%s", "");
    /* re-scan into a scratch tree: the dump is all that is wanted */
    ast_file scratch = {0};
    diag_sink quiet = {.pool = &s->pool};
    parse_ctx ctx = {.pool = &s->pool, .diags = &quiet, .src = s->main_src, .out = &scratch, .token_dump = out};
    parse_source(&ctx);
    diag_free(&quiet);
    return NTPC_OK;
  }
  if (strcmp(kind, "cuda") == 0 || strncmp(kind, "cuda:", 5) == 0) {
    if (!s->sharded) return usage_error(s, "--emit=%s needs a sharded program", kind);
    if (!s->cuda) return usage_error(s, "--emit=%s needs the codegen pass (ntpc_want_cuda)", kind);
    long r = 0;
    if (kind[4] == ':') {
      char *end;
      r = strtol(kind + 5, &end, 10);
      if (*end || end == kind + 5 || r < 0 || r >= s->sharded->world) return usage_error(s, "--emit=%s: no such rank", kind);
    }
    fwrite(s->cuda[r].source, 1, s->cuda[r].len, out);
    return NTPC_OK;
  }
  if (strcmp(kind, "sharded-ir") == 0 || strcmp(kind, "report") == 0 || strncmp(kind, "rank:", 5) == 0) {
    if (!s->sharded) return usage_error(s, "--emit=%s needs a sharded program: give --world or --plan", kind);
    if (kind[0] == 's') sh_print(s->sharded, out);
    else if (kind[0] == 'r' && kind[1] == 'e') sh_print_report(s->sharded, out);
    else {
      char *end;
      long r = strtol(kind + 5, &end, 10);
      if (*end || end == kind + 5 || r < 0 || r >= s->sharded->world)
        return usage_error(s, "--emit=%s: no such rank", kind);
      sh_print_rank(s->sharded, (int32_t)r, out);
    }
    return NTPC_OK;
  }
  if (strcmp(kind, "image") == 0) { /* the program image, as bytes: what a model library embeds */
    if (!s->image.len) return usage_error(s, "no program image: compile first%s", "");
    fwrite(s->image.data, 1, s->image.len, out);
    return NTPC_OK;
  }
  return usage_error(s, "unknown --emit kind '%s' (expected tokens, ast, ir, sharded-ir, rank:N, report, cuda, cuda:N or image)", kind);
}
