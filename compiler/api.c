/* api.c — the libntpc session: sources in, diagnostics and verified IR out. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "sema.h"
#include "shard.h"
#include "cuda_gen.h"

struct ntpc_session {
  arena pool;
  diag_sink diags;
  ast_file ast;
  ir_module *module;
  sh_program *sharded;
  int32_t world;
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
    diag_emit(&s->diags, NTPC_ERROR, path, NTP_NOLOC, "the file is larger than %zu MiB, the largest source accepted",
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

static ntpc_status compile(ntpc_session *s, source_file *src) {
  s->main_src = src;
  parse_into(s, src, NULL);
  for (size_t i = 0; i < s->nplan_files; i++) {
    bool too_big;
    source_file *p = read_source(s, s->plan_files[i], &too_big);
    if (!p) return too_big ? NTPC_ERR_INPUT : NTPC_ERR_USAGE;
    parse_into(s, p, NULL);
  }
  if (s->diags.errors) return NTPC_ERR_INPUT;
  check_unique_names(s);
  if (s->diags.errors) return NTPC_ERR_INPUT;
  const ast_model *model = pick_model(s);
  if (!model) return NTPC_ERR_INPUT;
  check_plan_targets(s);
  const char *plan_file = s->nplan_files ? s->plan_files[0] : NULL;
  s->module = sema_run(&s->pool, &s->diags, &s->ast, model, s->defines, s->ndefines, plan_file, s->plan_name);
  if (!s->module) {
    snprintf(s->last_error, sizeof s->last_error, "out of memory");
    return NTPC_ERR_INTERNAL;
  }
  if (s->diags.errors) {
    ir_module_free(s->module);
    s->module = NULL;
    return NTPC_ERR_INPUT;
  }
  char why[512];
  if (!ir_verify(s->module, why, sizeof why)) {
    diag_emit(&s->diags, NTPC_ERROR, src->name, NTP_NOLOC, "internal compiler error: IR verifier: %s", why);
    ir_module_free(s->module);
    s->module = NULL;
    return NTPC_ERR_INTERNAL;
  }
  if (s->world >= 0) {
    shard_options opt = {.world = s->world > 0 ? s->world : 0};
    s->sharded = shard_program(s->module, &opt, &s->diags);
    if (!s->sharded) return s->diags.errors ? NTPC_ERR_INPUT : NTPC_ERR_INTERNAL;
    if (!sh_verify(s->sharded, why, sizeof why)) {
      diag_emit(&s->diags, NTPC_ERROR, src->name, NTP_NOLOC, "internal compiler error: sharded program: %s", why);
      return NTPC_ERR_INTERNAL;
    }
    if (!sh_check_memory(s->sharded, why, sizeof why)) {
      diag_emit(&s->diags, NTPC_ERROR, src->name, NTP_NOLOC, "internal compiler error: memory plan: %s", why);
      return NTPC_ERR_INTERNAL;
    }
  }
  return NTPC_OK;
}

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
    long r = 0;
    if (kind[4] == ':') {
      char *end;
      r = strtol(kind + 5, &end, 10);
      if (*end || end == kind + 5 || r < 0 || r >= s->sharded->world) return usage_error(s, "--emit=%s: no such rank", kind);
    }
    cg_module cm;
    char err[256];
    if (cg_generate(s->sharded, (int32_t)r, &cm, err, sizeof err) != 0) return usage_error(s, "%s", err);
    fwrite(cm.source, 1, cm.len, out);
    cg_module_free(&cm);
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
  return usage_error(s, "unknown --emit kind '%s' (expected tokens, ast, ir, sharded-ir, rank:N, report, cuda or cuda:N)", kind);
}
