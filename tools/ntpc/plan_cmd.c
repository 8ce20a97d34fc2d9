/* plan_cmd.c — `ntpc plan`: choose every layer's TP placement for a cluster, print the plan
 * with its predicted time, memory and communication, write it as a plan file (checked by
 * compiling the model with it) and as a picture; with --fail, re-plan for the survivors.
 * Exit status: 0 ok, 1 errors in the input (or no plan fits), 2 usage. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "ir.h"
#include "plan_cmd.h"
#include "outfile.h"
#include "ntpc.h"
#include "planner.h"
#include "shard.h"


static const char plan_usage[] =
    "usage: ntpc plan FILE [options]\n"
    "\n"
    "Chooses how the model is split over the GPUs to minimise the predicted step time within each\n"
    "GPU's memory: a forward step, or with --train a training step (forward, backward, gradient\n"
    "sync, optimizer state). Searched together: pipeline stages of GPUs inside a node (uneven layer\n"
    "counts), each layer's placement inside a stage (TP groups, unequal ones included, sequence\n"
    "parallelism, recomputation), replicas of the pipeline, micro-batches, and the ZeRO stage of\n"
    "the distributed optimizer; without stages, every layer's placement over all the GPUs. Prints\n"
    "the plan with its predicted time, MFU, memory and communication, and writes it as a plan file\n"
    "(checked by compiling the model with it) and an SVG picture. Layers with 'tp auto' in --plan\n"
    "(or every layer, without --plan) are chosen; other rules of --plan are kept.\n"
    "\n"
"options:\n"
    "  -D NAME=VALUE      override dim NAME (repeatable)\n"
    "  --model NAME       the model to plan when the file holds several\n"
    "  --plan FILE        a plan whose 'tp auto' rules the planner decides (others are kept)\n"
    "  --plan-name NAME   the plan to read from --plan (default: its first for the model)\n"
    "  --world W          GPUs, 1 to 4096 (default: the --plan's world)\n"
    "  --gpu NAME         built-in device profile: h100, h200, a100, b200 (default h100)\n"
    "  --profile FILE     a device profile file (format: docs/planner.md)\n"
    "  --mem-cap GIB      memory per GPU in GiB (default: the profile's capacity)\n"
    "  --nodes-of N       GPUs per node: links inside a node are intra-node (default 8)\n"
    "  --fail R1,R2,...   re-plan for the GPUs that survive these physical ranks\n"
    "  --train            plan a training step: forward + backward, the gradients' sync over the\n"
    "                     replicas, gradients, fp32 masters and AdamW moments, saved activations\n"
    "  --stages N         pipeline stages: 1 (none: the flat search), N, or auto (default)\n"
    "  --micro-batches M  micro-batches per pipeline replica, or auto (default)\n"
    "  --schedule S       training pipelines: 1f1b, zb-h1 (zero bubble), or auto (default: the\n"
    "                     faster within the memory; the plan says 'schedule zb-h1;' when chosen)\n"
    "  --zero Z           training: the optimizer's ZeRO stage, 0, 1, 2 or auto (default auto:\n"
    "                     chosen with the placements, or the --plan's 'optimizer' statement)\n"
    "  --redundancy K     training with ZeRO: GPUs keeping each optimizer shard, or auto (1 or 2)\n"
    "  --domain-size D    GPUs per failure domain, a node or an NVL domain (default: --nodes-of)\n"
    "  --name PLAN        name of the written plan (default MODEL_wW_GPU, + _failR1_R2)\n"
    "  -o FILE            the plan file (default PLAN.ntp in the current directory; - stdout)\n"
    "  --svg FILE         the picture (default PLAN.svg in the current directory; - stdout)\n"
    "  --layer-times FILE the predicted time of every layer, one 'layer NAME SECONDS' a line\n"
    "                     (bench/cost_model_error.sh compares them with measured layer times)\n"
    "  --quanta N         memory resolution of the search (default 1024 units of the free memory)\n"
    "  --color=WHEN       auto | always | never (diagnostics)\n"
    "\n"
    "exit status: 0 ok, 1 errors in the input or no plan fits, 2 usage\n";

/* printf into a new heap string (NULL when out of memory) */
static char *strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *strf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (p) {
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  return p;
}

static int usage_fail(const char *fmt, const char *arg) { return cli_usage_error("ntpc plan", fmt, arg); }

static bool parse_long(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end || errno || v < lo || v > hi) return false;
  *out = v;
  return true;
}

static bool is_ident(const char *s) {
  if (!*s || !(*s == '_' || (*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z'))) return false;
  for (; *s; s++)
    if (!(*s == '_' || (*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9'))) return false;
  return true;
}



/* A session with the model compiled (and, when plan_file is set, that plan active). */
static ntpc_session *compile_model(const plan_opts *o, const char *plan_file, const char *plan_name, int32_t world,
                                   bool grad, int *rc) {
  ntpc_session *s = ntpc_session_new();
  if (!s) {
    fprintf(stderr, "ntpc plan: error: out of memory\n");
    *rc = 2;
    return NULL;
  }
  for (int i = 0; i < o->ndefines; i++)
    if (ntpc_define_str(s, o->defines[i]) != NTPC_OK) {
      *rc = usage_fail("%s", ntpc_last_error(s));
      ntpc_session_free(s);
      return NULL;
    }
  if (o->model) ntpc_select_model(s, o->model);
  if (plan_file) ntpc_add_plan_file(s, plan_file);
  if (plan_name) ntpc_select_plan(s, plan_name);
  ntpc_set_world(s, world);
  ntpc_want_grad(s, grad);
  ntpc_status st = ntpc_compile_file(s, o->file);
  if (st != NTPC_OK) {
    ntpc_print_diags(s, stderr, cli_color(o->color));
    if (st == NTPC_ERR_USAGE) fprintf(stderr, "ntpc plan: error: %s\n", ntpc_last_error(s));
    *rc = st == NTPC_ERR_USAGE ? 2 : st == NTPC_ERR_INTERNAL ? 3 : 1;
    ntpc_session_free(s);
    return NULL;
  }
  ntpc_print_diags(s, stderr, cli_color(o->color)); /* warnings */
  return s;
}

/* What the planner reported into the session's sink since diagnostic `from`: rendered with the
 * sources (caret, notes); exit 1, or 3 when it ran out of memory. */
static int planner_failed(ntpc_session *s, const plan_opts *o, size_t from) {
  ntpc_print_diags_from(s, from, stderr, cli_color(o->color));
  if (ntpc_diag_sink(s)->out_of_memory) {
    fprintf(stderr, "ntpc plan: error: out of memory\n");
    return 3;
  }
  return 1;
}

/* An output file, or stdout for '-': the plan, the picture or the layer times alone on stdout
 * (the report then goes to stderr: ntpc_plan_command moved it). Files are written to a temporary
 * name and renamed into place. */
static FILE *plan_stdout; /* the real stdout while a '-' output holds it */
typedef struct out_file {
  ntp_outfile f;
  FILE *fp;
} out_file;

static int out_open(out_file *o, const char *path, const char *ext) {
  char err[512];
  if (strcmp(path, "-") == 0) return o->fp = plan_stdout ? plan_stdout : stdout, 0;
  if (ntp_outfile_open(&o->f, path, ext, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc plan: error: %s\n", err);
    return 2;
  }
  o->fp = o->f.f;
  return 0;
}

static int out_commit(out_file *o, const char *path) {
  char err[512];
  if (strcmp(path, "-") == 0) return fflush(o->fp) == 0 && !ferror(o->fp) ? 0 : 2;
  if (ntp_outfile_commit(&o->f, !ferror(o->f.f), err, sizeof err) != 0) {
    fprintf(stderr, "ntpc plan: error: %s\n", err);
    return 2;
  }
  printf("wrote %s\n", path);
  return 0;
}

/* Checks the solution with the compiler in memory (its placements lowered, the memory planned and
 * both verified, as a compile with the written plan would), prints the compiler's own figures,
 * and writes the plan file whole. Returns 0 (written), 2 or 3 (errors; nothing written). The
 * compiler's memory plan exceeding the cap is an internal error: the search reserved an upper
 * bound of every layer's activations (tested), so it means the bound failed. */
static int write_plan_checked(ntpc_session *s, const plan_opts *o, const plan_model *pm, const ir_module *m,
                              const plan_solution *sol, const char *name, const char *header, const char *path) {
  char err[512];
  double shortfall = 0;
  sh_placement *pls = calloc(m->n_layers + 1, sizeof *pls);
  if (!pls) {
    fprintf(stderr, "ntpc plan: error: out of memory\n");
    return 3;
  }
  plan_solution_placements(pm, sol, pls);
  /* training: the program that trains (the forward, its sharded backward and the gradients'
   * sync), from the module with its gradient pass; its layers are the forward's */
  int grc = 0;
  ntpc_session *gs = o->train ? compile_model(o, NULL, NULL, 0, true, &grc) : NULL;
  if (o->train && !gs) {
    free(pls);
    return grc ? grc : 3;
  }
  ntpc_session *cs = gs ? gs : s; /* the session whose module is compiled here */
  size_t seen = ntpc_diag_count(cs);
  /* training: with the distributed optimizer chosen, as the written plan's 'optimizer' line says */
  sh_pipe_options zo = {.set_optimizer = gs && sol->zero > 0, .zero = sol->zero, .redundancy = sol->redundancy,
                        .domain_size = sol->domain_size};
  sh_program *p = shard_lower(gs ? ntpc_module(gs) : m, sol->world, pls, gs ? &zo : NULL, ntpc_diag_sink(cs));
  free(pls);
  if (p) sh_plan_memory(p);
  if (!p || !sh_verify(p, err, sizeof err) || !sh_check_memory(p, err, sizeof err)) {
    ntpc_print_diags_from(cs, seen, stderr, cli_color(o->color));
    fprintf(stderr, "ntpc plan: internal error: the compiler rejects the plan chosen for it%s%s (not written)\n",
            p ? ": " : "", p ? err : "");
    sh_program_free(p);
    ntpc_session_free(gs);
    return 3;
  }
  double prm = 0, act = 0, recv = 0;
  int32_t short_rank = -1;
  int64_t *wts = calloc((size_t)p->world + 1, sizeof *wts); /* the whole slices: gathered with ZeRO */
  if (wts) sh_rank_weights(p, wts);
  for (int32_t r = 0; r < p->world; r++) {
    double need = (double)(p->mem[r].param_bytes + p->mem[r].input_bytes + p->mem[r].arena_bytes);
    if (need - sol->mem_cap > shortfall) shortfall = need - sol->mem_cap, short_rank = r;
    double pr = (double)(p->mem[r].input_bytes + (wts ? wts[r] : p->mem[r].param_bytes));
    if (pr > prm) prm = pr;
    double ar = (double)p->mem[r].arena_bytes - (p->zero && wts ? (double)wts[r] : 0); /* less the weights */
    if (ar > act) act = ar;
    if ((double)p->mem[r].bytes_received > recv) recv = (double)p->mem[r].bytes_received;
  }
  double pprm = 0;
  for (int32_t r = 0; r < sol->world; r++)
    if (sol->rank_params[r] > pprm) pprm = sol->rank_params[r];
  char b1[32], b2[32], b3[32], b4[32], b5[32];
  if (gs)
    printf("compiler check: the training program (forward, backward, gradient sync) compiles for %d ranks; busiest "
           "GPU: parameters %s (predicted %s), activation and gradient arena %s (predicted %s with the saved "
           "activations and the optimizer's state), received %s per step\n",
           p->world, plan_fmt_bytes(prm, b1, sizeof b1), plan_fmt_bytes(pprm, b2, sizeof b2),
           plan_fmt_bytes(act, b3, sizeof b3), plan_fmt_bytes(sol->rank_act[0] + sol->train_bytes, b4, sizeof b4),
           plan_fmt_bytes(recv, b5, sizeof b5));
  else
    printf("compiler check: the plan compiles for %d ranks; busiest GPU: parameters %s (predicted %s), activation "
           "arena %s (reserved %s), received %s per step\n",
           p->world, plan_fmt_bytes(prm, b1, sizeof b1), plan_fmt_bytes(pprm, b2, sizeof b2),
           plan_fmt_bytes(act, b3, sizeof b3), plan_fmt_bytes(sol->rank_act[0], b4, sizeof b4),
           plan_fmt_bytes(recv, b5, sizeof b5));
  free(wts);
  sh_program_free(p);
  ntpc_session_free(gs);
  if (shortfall > 0) {
    fprintf(stderr, "ntpc plan: internal error: the compiler's memory plan needs %s more than the cap on rank %d: the "
            "planner's activation bound failed (not written)\n", plan_fmt_bytes(shortfall, b1, sizeof b1), short_rank);
    return 3;
  }
  out_file out;
  if (out_open(&out, path, ".ntp")) return 2;
  plan_write_plan(out.fp, pm, m, sol, name, header);
  return out_commit(&out, path);
}

/* A pipelined plan: checked by compiling its text, then written whole. */
static int write_pipelined(const plan_opts *o, const plan_model *pm, const ir_module *m, const plan_solution *sol,
                           const ntpc_rows_models *rows, const char *name, const char *header, const char *path) {
  int rc = 0;
  char *text = plan_check_pipelined(o, pm, m, sol, rows, name, header, &rc);
  if (!text) return rc;
  out_file out;
  if (out_open(&out, path, ".ntp")) {
    free(text);
    return 2;
  }
  fputs(text, out.fp);
  free(text);
  return out_commit(&out, path);
}

static int write_svg(const plan_model *pm, const plan_solution *sol, const plan_profile *prof, const char *title,
                     const char *path) {
  out_file out;
  if (out_open(&out, path, NULL)) return 2;
  plan_write_svg(out.fp, pm, sol, prof, title);
  return out_commit(&out, path);
}

/* --layer-times FILE: the predicted seconds of every planned layer ("layer NAME SECONDS": its
 * kernels and the ops that follow it, its reductions and its redistribution), then the
 * model-level work as "layer (model) SECONDS": what bench/cost_model_error.sh compares with the
 * device times NTP_CUDA_PROFILE=layers measures. */
static int write_layer_times(const plan_model *pm, const plan_solution *sol, const char *path) {
  out_file out;
  if (out_open(&out, path, NULL)) return 2;
  for (int32_t i = 0; i < sol->nlayers; i++) {
    const plan_layer_out *l = &sol->layers[i];
    fprintf(out.fp, "layer %s %.9g\n", plan_model_layer(pm, i)->name, l->compute_s + l->comm_s + l->redist_s);
  }
  fprintf(out.fp, "layer (model) %.9g\n", sol->const_s);
  return out_commit(&out, path);
}

/* "3,9" -> ranks; false on a malformed list */
static bool parse_fail(const char *s, int32_t *out, int32_t *n, int32_t cap) {
  *n = 0;
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 0 || v > 1000000 || *n == cap) return false;
    out[(*n)++] = (int32_t)v;
    p = end;
    if (*p == ',') {
      p++;
      if (!*p) return false;
    } else if (*p) {
      return false;
    }
  }
  return *n > 0;
}

static void print_throughput(const char *what, const plan_solution *s, double tokens, double healthy) {
  if (!s->feasible) {
    printf("  %-44s %s\n", what, s->why[0] ? s->why : "no plan fits");
    return;
  }
  double tps = tokens / s->step_s;
  printf("  %-44s step %9.3f ms  %12.0f tokens/s  %6.1f%% of healthy\n", what, s->step_s * 1e3, tps,
         healthy > 0 ? 100 * tps / healthy : 0);
}

/* The options into *o: -1 to go on, else the exit status (--help: 0). */
static int parse_options(int argc, char **argv, plan_opts *po) {
  plan_opts o = {.world = -1, .nodes_of = 8, .quanta = 1024, .zero = PLAN_ZERO_AUTO};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    bool missing = false;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(plan_usage, stdout);
      return 0;
    }
    if (strcmp(a, "-D") == 0 || (strncmp(a, "-D", 2) == 0 && a[2])) {
      const char *d = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
      if (!d) return usage_fail("%s", "-D needs NAME=VALUE");
      if (o.ndefines == 256) return usage_fail("%s", "too many -D options");
      o.defines[o.ndefines++] = d;
    } else if ((v = cli_option_value(argc, argv, &i, "--model", &missing))) o.model = v;
    else if ((v = cli_option_value(argc, argv, &i, "--plan-name", &missing))) o.plan_name = v;
    else if ((v = cli_option_value(argc, argv, &i, "--plan", &missing))) o.plan_file = v;
    else if ((v = cli_option_value(argc, argv, &i, "--world", &missing))) {
      if (!parse_long(v, 1, NTP_MAX_WORLD, &o.world))
        return usage_fail("--world expects a number of GPUs (1 to 4096), got '%s'", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--stages", &missing))) {
      if (strcmp(v, "auto") == 0) o.stages = 0;
      else if (!parse_long(v, 1, 128, &o.stages)) return usage_fail("--stages expects 1 to 128 or auto, got '%s'", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--micro-batches", &missing))) {
      if (strcmp(v, "auto") == 0) o.micro_batches = 0;
      else if (!parse_long(v, 1, NTP_MAX_MICRO_BATCHES, &o.micro_batches))
        return usage_fail("--micro-batches expects 1 to 4096 or auto, got '%s'", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--schedule", &missing))) {
      int code = strcmp(v, "auto") == 0 ? 0 : ir_schedule_code(v);
      if (code != 0 && code != 2 && code != 4)
        return usage_fail("--schedule expects 1f1b, zb-h1 or auto (the search prices those), got '%s'", v);
      o.schedule = code;
    } else if ((v = cli_option_value(argc, argv, &i, "--gpu", &missing))) o.gpu = v;
    else if ((v = cli_option_value(argc, argv, &i, "--profile", &missing))) o.profile = v;
    else if ((v = cli_option_value(argc, argv, &i, "--mem-cap", &missing))) {
      if (!cli_number(v, 0, 1e9, &o.mem_cap_gib) || !(o.mem_cap_gib > 0))
        return usage_fail("--mem-cap expects GiB per GPU (a positive number), got '%s'", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--nodes-of", &missing))) {
      if (!parse_long(v, 1, 1 << 16, &o.nodes_of)) return usage_fail("--nodes-of expects GPUs per node, got '%s'", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--fail", &missing))) o.fail = v;
    else if (strcmp(a, "--train") == 0) o.train = true;
    else if ((v = cli_option_value(argc, argv, &i, "--zero", &missing))) {
      o.zero_given = true;
      if (strcmp(v, "auto") == 0) o.zero = PLAN_ZERO_AUTO;
      else if (!parse_long(v, 0, 2, &o.zero)) return usage_fail("--zero expects 0, 1, 2 or auto, got '%s'", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--redundancy", &missing))) {
      o.redundancy_given = true;
      if (strcmp(v, "auto") == 0) o.redundancy = 0;
      else if (!parse_long(v, 1, 64, &o.redundancy))
        return usage_fail("--redundancy expects GPUs per optimizer shard (1 to 64) or auto, got '%s'", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--domain-size", &missing))) {
      if (!parse_long(v, 1, 1 << 16, &o.domain_size))
        return usage_fail("--domain-size expects GPUs per failure domain, got '%s'", v);
    }
    else if ((v = cli_option_value(argc, argv, &i, "--name", &missing))) o.name = v;
    else if ((v = cli_option_value(argc, argv, &i, "--svg", &missing))) o.svg = v;
    else if ((v = cli_option_value(argc, argv, &i, "--layer-times", &missing))) o.layer_times = v;
    else if ((v = cli_option_value(argc, argv, &i, "--quanta", &missing))) {
      if (!parse_long(v, 16, 1 << 16, &o.quanta)) return usage_fail("--quanta expects 16 to 65536, got '%s'", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--color", &missing))) {
      if (strcmp(v, "auto") && strcmp(v, "always") && strcmp(v, "never"))
        return usage_fail("--color expects auto, always or never, got '%s'", v);
      o.color = v;
    } else if (strcmp(a, "-o") == 0) {
      if (i + 1 >= argc) return usage_fail("%s", "-o needs a file name");
      o.out = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      return usage_fail("unknown option '%s'", a);
    } else if (!o.file) {
      o.file = a;
    } else {
      return usage_fail("more than one model file ('%s')", a);
    }
    if (missing) return usage_fail("option '%s' needs a value", a);
  }
  if (!o.file) return usage_fail("%s", "no model file");
  if (o.gpu && o.profile) return usage_fail("%s", "give --gpu or --profile, not both");
  if (o.name && !is_ident(o.name)) return usage_fail("--name must be an identifier (letters, digits, _), got '%s'", o.name);
  if ((o.zero_given || o.redundancy_given) && !o.train)
    return usage_fail("%s", "--zero and --redundancy price the optimizer of a training step: they need --train");
  if (o.zero_given && o.zero == 0 && o.redundancy > 0)
    return usage_fail("%s", "--redundancy shards the optimizer's state: it needs --zero 1 or 2");
  if (o.out && !*o.out) return usage_fail("%s", "-o needs a file name");
  if (o.svg && !*o.svg) return usage_fail("%s", "--svg needs a file name");
  int dashes = (o.out && strcmp(o.out, "-") == 0) + (o.svg && strcmp(o.svg, "-") == 0) +
               (o.layer_times && strcmp(o.layer_times, "-") == 0);
  if (dashes > 1) return usage_fail("%s", "only one of -o, --svg and --layer-times can be '-' (stdout)");
  *po = o;
  return -1;
}

/* The device profile: --profile FILE, else --gpu (default h100). -1 to go on, else the exit status. */
static int load_profile(const plan_opts *po, plan_profile *prof) {
  const plan_opts o = *po;
  char err[1024] = "";
  if (o.profile) {
    if (!plan_profile_load(o.profile, prof, err, sizeof err)) {
      fprintf(stderr, "ntpc plan: error: %s\n", err);
      return strncmp(err, "cannot ", 7) == 0 ? 2 : 1;
    }
  } else {
    const char *g = o.gpu ? o.gpu : "h100";
    if (!plan_profile_builtin(g, prof)) {
      char names[128] = "";
      for (const char *const *p = plan_profile_names(); *p; p++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "", *p);
      fprintf(stderr, "ntpc plan: error: unknown GPU '%s' (built-in profiles: %s; or give --profile FILE)\n", g, names);
      fprintf(stderr, "Try 'ntpc plan --help'.\n");
      return 2;
    }
  }

  return -1;
}

/* One planning run: the compiled model, the request, the names of what is written. */
typedef struct plan_job {
  ntpc_session *s;
  const plan_opts *o;
  const plan_model *pm;
  const ir_module *m;
  plan_request rq;
  const plan_profile *prof;
  const char *name, *pfile, *sfile;
  size_t seen; /* diagnostics already printed */
  int32_t W;
  double tokens;
  const ntpc_rows_models *rows; /* the model at other batch rows (pipelines), or NULL */
} plan_job;

/* The healthy plan: search, report, check with the compiler, write. The exit status. */
static int plan_healthy(plan_job *j) {
  ntpc_session *s = j->s;
  const plan_opts o = *j->o;
  const plan_model *pm = j->pm;
  const ir_module *m = j->m;
  const plan_profile prof = *j->prof;
  const char *name = j->name, *pfile = j->pfile, *sfile = j->sfile;
  int32_t W = j->W;
  double tokens = j->tokens;
  diag_sink *diags = ntpc_diag_sink(s);
  char b1[32], *header = NULL, *title = NULL;
  int rc = 0;
  plan_solution sol;
  if (!plan_solve_3d(pm, m, &j->rq, &sol, diags)) {
    rc = planner_failed(s, &o, j->seen);
    goto done;
  }
  if (!sol.feasible) {
    fprintf(stderr, "ntpc plan: error: %s\n", sol.why);
    plan_solution_free(&sol);
    rc = 1;
    goto done;
  }
  printf("plan %s: model %s on %d x %s (%s per GPU, %ld GPUs per node)\n\n", name, m->name, W, prof.device,
         plan_fmt_bytes(sol.mem_cap, b1, sizeof b1), o.nodes_of);
  plan_write_report(stdout, pm, &sol, &prof);
  header = strf("written by ntpc plan: %s on %d x %s, %s per GPU\npredicted %s step %.3f ms, %.0f tokens/s",
                m->name, W, prof.device, plan_fmt_bytes(sol.mem_cap, b1, sizeof b1), o.train ? "training" : "forward",
                sol.step_s * 1e3, tokens / sol.step_s);
  title = strf("%s: %s on %d x %s", name, m->name, W, prof.device);
  rc = sol.pp_stages ? write_pipelined(&o, pm, m, &sol, j->rows, name, header ? header : "", pfile)
                     : write_plan_checked(s, &o, pm, m, &sol, name, header ? header : "", pfile);
  if (!rc) rc = write_svg(pm, &sol, &prof, title ? title : name, sfile);
  if (!rc && o.layer_times) rc = write_layer_times(pm, &sol, o.layer_times);
  plan_solution_free(&sol);
done:
  free(header);
  free(title);
  return rc;
}

/* Re-planning for the survivors of failed GPUs: the healthy plan, the survivors' plan and
 * the alternatives, the resharding, the survivors' plan written. The exit status. */
static int plan_after_failure(plan_job *j) {
  ntpc_session *s = j->s;
  const plan_opts o = *j->o;
  const plan_model *pm = j->pm;
  const ir_module *m = j->m;
  const plan_profile prof = *j->prof;
  const char *name = j->name, *pfile = j->pfile, *sfile = j->sfile;
  const int32_t W = j->W, nfailed = j->rq.nfailed, *failed = j->rq.failed;
  double tokens = j->tokens;
  diag_sink *diags = ntpc_diag_sink(s);
  char b1[32], *header = NULL, *title = NULL;
  int rc = 0;
  plan_failover f;
  if (!plan_failover_solve(pm, m, &j->rq, &f, diags)) {
    rc = planner_failed(s, &o, j->seen);
    goto done;
  }
  const plan_solution *h = &f.healthy, *sv = &f.survivors;
  printf("failure re-planning: model %s on %d x %s (%s per GPU, %ld GPUs per node); failed GPUs:", m->name, W,
         prof.device, plan_fmt_bytes(sv->mem_cap, b1, sizeof b1), o.nodes_of);
  for (int32_t k = 0; k < nfailed; k++) printf(" %d", failed[k]);
  printf("; %d survive\n", W - nfailed);
  if (h->feasible)
    printf("healthy plan (%d GPUs): step %.3f ms, %.0f tokens/s\n", W, h->step_s * 1e3, tokens / h->step_s);
  else
    printf("healthy plan (%d GPUs): %s\n", W, h->why);
  printf("replicas of the healthy plan: %d x %d GPUs;", f.nreplicas, f.replica_size);
  for (int32_t d = 0; d < f.ndegraded; d++) {
    int32_t g = f.degraded[d];
    printf(" replica %d (GPUs %d-%d) lost", g, f.replica_start[g], f.replica_start[g + 1] - 1);
    for (int32_t k = 0; k < nfailed; k++)
      if (failed[k] >= f.replica_start[g] && failed[k] < f.replica_start[g + 1]) printf(" %d", failed[k]);
    printf(d + 1 < f.ndegraded ? ";" : "");
  }
  printf("\n");
  if (!sv->feasible) {
    fprintf(stderr, "ntpc plan: error: the survivors: %s\n", sv->why);
    plan_failover_free(&f);
    rc = 1;
    goto done;
  }
  printf("\nplan %s for the %d survivors:\n\n", name, sv->world);
  plan_write_report(stdout, pm, sv, &prof);
  printf("\nrank mapping (new rank: physical GPU):");
  for (int32_t r = 0; r < sv->world; r++) printf("%s %d:%d", r % 16 ? "" : "\n ", r, sv->phys[r]);
  printf("\n\nresharding (new groups as physical GPUs, and the slice each holds):\n");
  plan_write_reshard(stdout, pm, sv, h);
  double ht = h->feasible ? tokens / h->step_s : 0;
  printf("\npredicted throughput:\n");
  char what[160];
  snprintf(what, sizeof what, "healthy, %d GPUs", W);
  print_throughput(what, h, tokens, ht);
  snprintf(what, sizeof what, "re-planned, %d GPUs", sv->world);
  print_throughput(what, sv, tokens, ht);
  for (int32_t d = 0; d <= f.ndegraded; d++) {
    if (d == f.ndegraded && f.ndegraded < 2) break;
    if (d < f.ndegraded) {
      int32_t g = f.degraded[d];
      snprintf(what, sizeof what, "drop replica %d (GPUs %d-%d), %d GPUs", g, f.replica_start[g],
               f.replica_start[g + 1] - 1, f.drop[d].feasible ? f.drop[d].world : 0);
    } else {
      snprintf(what, sizeof what, "drop all %d degraded replicas, %d GPUs", f.ndegraded,
               f.drop[d].feasible ? f.drop[d].world : 0);
    }
    print_throughput(what, &f.drop[d], tokens, ht);
  }
  if (h->feasible)
    printf("re-planning keeps %.1f%% of the healthy throughput (%+.1f%%)\n", 100 * h->step_s / sv->step_s,
           100 * (h->step_s / sv->step_s - 1));
  char *map = malloc((size_t)sv->world * 12 + 1);
  if (map) {
    map[0] = 0;
    size_t len = 0;
    for (int32_t r = 0; r < sv->world; r++) len += (size_t)sprintf(map + len, "%s%d", r ? " " : "", sv->phys[r]);
  }
  header = strf("written by ntpc plan: %s on the %d survivors of %d x %s (failed: %s)\nrank r of this plan is "
                "physical GPU: %s\npredicted %s step %.3f ms, %.0f tokens/s (healthy: %.3f ms)",
                m->name, sv->world, W, prof.device, o.fail, map ? map : "?", o.train ? "training" : "forward",
                sv->step_s * 1e3, tokens / sv->step_s,
                h->feasible ? h->step_s * 1e3 : 0);
  free(map);
  title = strf("%s: %s on %d survivors of %d x %s", name, m->name, sv->world, W, prof.device);
  printf("\n");
  rc = write_plan_checked(s, &o, pm, m, sv, name, header ? header : "", pfile);
  if (!rc) rc = write_svg(pm, sv, &prof, title ? title : name, sfile);
  plan_failover_free(&f);
done:
  free(header);
  free(title);
  return rc;
}

/* The world to plan for: --world, or the --plan's (which must agree). -1, or the exit status. */
static int plan_world(ntpc_session *s, const plan_opts *o, size_t seen, int32_t *W) {
  const ir_module *m = ntpc_module(s);
  const ir_plan *inplan = m->active_plan >= 0 ? &m->plans[m->active_plan] : NULL;
  *W = (int32_t)o->world;
  if (inplan && inplan->world) {
    if (o->world > 0 && o->world != inplan->world) {
      diag_emit(ntpc_diag_sink(s), NTPC_ERROR, inplan->file, inplan->loc, "plan '%s' sets world %lld, but --world is %ld",
                inplan->name, (long long)inplan->world, o->world);
      return planner_failed(s, o, seen);
    }
    *W = (int32_t)inplan->world;
  }
  if (*W < 1) return usage_fail("%s", "how many GPUs? give --world W (or a --plan with a world)");
  if (*W > NTP_MAX_WORLD) return usage_fail("%s", "the planner plans worlds of at most 4096 GPUs");
  return -1;
}

/* The physical ranks --fail lists, each in the world and once, some surviving. -1, or the exit
 * status. */
static int failed_ranks(const plan_opts *o, int32_t W, int32_t *failed, int32_t *nfailed, int32_t cap) {
  *nfailed = 0;
  if (o->fail && !parse_fail(o->fail, failed, nfailed, cap))
    return usage_fail("--fail expects physical ranks separated by commas (e.g. 3,9), got '%s'", o->fail);
  for (int32_t k = 0; k < *nfailed; k++) {
    char what[64];
    snprintf(what, sizeof what, "%d", failed[k]);
    bool twice = false;
    for (int32_t j = 0; j < k; j++) twice |= failed[j] == failed[k];
    if (failed[k] >= W || twice)
      return usage_fail(twice ? "--fail lists GPU %s twice" : "--fail: GPU %s is not in the world", what);
  }
  if (*nfailed >= W) return usage_fail("%s", "--fail lists every GPU: nothing survives to plan for");
  return -1;
}

/* The plan's name: --name, else MODEL_wW_GPU with _failR1_R2 for the failed ranks. */
static void plan_name(const plan_opts *o, const plan_profile *prof, const ir_module *m, int32_t W, const int32_t *failed,
                      int32_t nfailed, char *name, size_t cap) {
  if (o->name) {
    snprintf(name, cap, "%s", o->name);
    return;
  }
  char gname[40];
  snprintf(gname, sizeof gname, "%s", prof->name);
  for (char *p = gname; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9'))) *p = '_';
  snprintf(name, cap, "%s_w%d_%s", m->name, W, gname);
  for (int32_t k = 0; k < nfailed; k++)
    snprintf(name + strlen(name), cap - strlen(name), "%s%d", k ? "_" : "_fail", failed[k]);
}

/* A --plan's 'optimizer zero Z redundancy K;' is kept as its other rules are, unless the command
 * line says otherwise. */
static void optimizer_of_plan(const plan_opts *o, const ir_module *m, plan_request *rq) {
  const ir_plan *pl = m->active_plan >= 0 ? &m->plans[m->active_plan] : NULL;
  if (!pl || !pl->zero_loc.first_line || !o->train) return;
  if (!o->zero_given) rq->zero = pl->zero;
  if (!o->redundancy_given && pl->zero > 0) rq->redundancy = pl->redundancy;
  if (!o->domain_size && pl->domain_size) rq->domain_size = pl->domain_size;
}

int ntpc_plan_parse_options(int argc, char **argv) {
  plan_opts o;
  return parse_options(argc, argv, &o);
}

int ntpc_plan_command(int argc, char **argv) {
  plan_opts o;
  int rc = parse_options(argc, argv, &o);
  if (rc >= 0) return rc;
  plan_profile prof;
  if ((rc = load_profile(&o, &prof)) >= 0) return rc;

  /* the model */
  rc = 0;
  ntpc_session *s = compile_model(&o, o.plan_file, o.plan_name, -1, false, &rc);
  if (!s) return rc;
  if (o.train) { /* a model that cannot train (no loss) is said before any planning */
    ntpc_session *g = compile_model(&o, NULL, NULL, -1, true, &rc);
    if (!g) {
      ntpc_session_free(s);
      return rc;
    }
    ntpc_session_free(g);
  }
  const ir_module *m = ntpc_module(s);
  int32_t W;
  diag_sink *diags = ntpc_diag_sink(s);
  size_t seen = ntpc_diag_count(s); /* printed already */
  int32_t failed[4096], nfailed = 0;
  if ((rc = plan_world(s, &o, seen, &W)) >= 0 || (rc = failed_ranks(&o, W, failed, &nfailed, 4096)) >= 0) {
    ntpc_session_free(s);
    return rc;
  }
  plan_model *pm = plan_model_new(m, diags);
  if (!pm) {
    rc = planner_failed(s, &o, seen);
    ntpc_session_free(s);
    return rc;
  }

  /* the plan's name and files */
  char name[160], *pfile, *sfile;
  plan_name(&o, &prof, m, W, failed, nfailed, name, sizeof name);
  pfile = o.out ? strf("%s", o.out) : strf("%s.ntp", name);
  sfile = o.svg ? strf("%s", o.svg) : strf("%s.svg", name);
  if (!pfile || !sfile) {
    fprintf(stderr, "ntpc plan: error: out of memory\n");
    free(pfile);
    free(sfile);
    plan_model_free(pm);
    ntpc_session_free(s);
    return 2;
  }

  plan_request rq = {.world = W, .prof = &prof, .mem_cap = o.mem_cap_gib * 1073741824.0, .nodes_of = (int32_t)o.nodes_of,
                     .quanta = (int32_t)o.quanta, .failed = nfailed ? failed : NULL, .nfailed = nfailed,
                     .train = o.train, .zero = (int32_t)o.zero, .redundancy = (int32_t)o.redundancy,
                     .domain_size = (int32_t)o.domain_size, .stages = (int32_t)o.stages,
                     .micro_batches = (int32_t)o.micro_batches, .schedule = o.schedule, .progress = stderr};
  optimizer_of_plan(&o, m, &rq);
  /* the 3D search recompiles the model at its micro-batches' rows; without a batch dim it is off */
  const char *why = NULL;
  const char *dim = nfailed || m->active_plan >= 0 ? NULL : ntpc_batch_dim(m, plan_model_rows(pm), &why);
  ntpc_rows_models *rows = dim ? ntpc_rows_models_new(o.file, o.model, o.defines, o.ndefines, dim) : NULL;
  if (dim && !rows) why = "out of memory";
  if (rows) rq.model_at_rows = ntpc_rows_model, rq.rows_ctx = rows;
  else if ((o.stages > 1 || o.micro_batches > 1) && !nfailed) {
    fprintf(stderr, "ntpc plan: error: --stages and --micro-batches need pipelines: %s\n",
            why ? why : "a --plan's rules or --fail keep the flat search");
    free(pfile);
    free(sfile);
    plan_model_free(pm);
    ntpc_session_free(s);
    return 2;
  }
  double tokens = plan_model_tokens(pm);
  plan_job job = {s, &o, pm, m, rq, &prof, name, pfile, sfile, seen, W, tokens, rows};
  bool dash = (o.out && strcmp(o.out, "-") == 0) || (o.svg && strcmp(o.svg, "-") == 0) ||
              (o.layer_times && strcmp(o.layer_times, "-") == 0);
  int keep = -1;
  if (dash) { /* the '-' output alone on stdout; the report on stderr */
    fflush(stdout);
    keep = dup(STDOUT_FILENO);
    plan_stdout = keep >= 0 ? fdopen(keep, "w") : NULL;
    if (plan_stdout) dup2(STDERR_FILENO, STDOUT_FILENO);
  }
  bool staged = m->active_plan >= 0 && (m->plans[m->active_plan].npipes || m->plans[m->active_plan].even_stages);
  rc = nfailed && staged ? plan_fail_staged(&o, pm, m, &rq, pfile) : nfailed ? plan_after_failure(&job) : plan_healthy(&job);
  if (plan_stdout) { /* stdout back, for a caller in the same process */
    fflush(stdout);
    dup2(fileno(plan_stdout), STDOUT_FILENO);
    fclose(plan_stdout);
    plan_stdout = NULL;
  }
  ntpc_rows_models_free(rows);
  free(pfile);
  free(sfile);
  plan_model_free(pm);
  ntpc_session_free(s);
  return rc;
}
