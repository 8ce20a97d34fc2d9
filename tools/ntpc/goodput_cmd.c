/* goodput_cmd.c — `ntpc goodput`: what GPU failures and stragglers cost a cluster-scale training
 * run under six policies (docs/goodput.md). The planner prices one pipeline stage of the model
 * (the FILE) at every TP group size a failure can leave, per layer and uniform, and how many of
 * its layers each group's memory holds; the simulation (compiler/planner/goodput.c,
 * goodput_run.c) turns those into throughput against the failed fraction and a run of weeks of
 * failures, repairs and slowdowns; goodput_report.c prints them. Exit status: 0 ok, 1 errors in
 * the input or no plan fits the healthy group, 2 usage, 3 internal errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "goodput_cmd.h"
#include "ntpc.h"
#include "outfile.h"
#include "planner.h"

static const char goodput_usage[] =
    "usage: ntpc goodput FILE [options]\n"
    "\n"
    "Simulates a training run on a cluster whose GPUs fail, are repaired and slow down, and\n"
    "compares six answers: drop the data-parallel replicas a failure touches (dp-drop), restart at\n"
    "the best uniform TP degree (uniform), restart with the degraded groups at one lower degree\n"
    "(two-degree, Megatron's non-uniform TP), re-plan each degraded group live at uniform TP\n"
    "(ntp-uni) or per layer (ntp, the NTP paper's), or per layer and also move layers between the\n"
    "replica's stages and re-split groups around stragglers (ntp-3d, what ntpc train does).\n"
    "FILE is one pipeline stage (with its loss); the planner prices it at every group size.\n"
    "Prints the plans' step times, the throughput lost and the spare domains needed against the\n"
    "failed fraction, and a run's throughput, goodput and spares per policy; draws both (SVG).\n"
    "\n"
    "cluster:\n"
    "  -D NAME=VALUE      override dim NAME of the model (repeatable); --model NAME\n"
    "  --gpus N           GPUs in the cluster (default 32768)\n"
    "  --domain D         GPUs per scale-up (NVLink) domain (default 32)\n"
    "  --tp T             healthy TP degree, divides D (default D)\n"
    "  --pp P             pipeline stages per replica (default 4)\n"
    "  --micro M          micro-batches per replica per step, each taken whole by one replica\n"
    "                     (default 0: the batch divides in any proportion, the limit of many)\n"
    "  --gpu NAME         built-in device profile (default b200); --profile FILE; --mem-cap GIB\n"
    "  --forward          price the forward pass only (the model needs no loss)\n"
    "  --max-lost K       a group that lost more GPUs is dropped by every policy (default 4)\n"
    "  --stage-layers N   layers of a stage that ntp-3d moves whole (default: the model's repeated\n"
    "                     blocks; 0 or 1: none move)\n"
    "failures (defaults: Llama 3's 54-day report on 16,384 H100s, docs/goodput.md):\n"
    "  --mtbf-h H         hours between failures of one GPU (default 50710: 419 in 54 days)\n"
    "  --failed-frac F    instead: the failure rate whose long-run failed fraction is F\n"
    "  --hw-frac X        hardware share of the failures (default 0.78)\n"
    "  --hw-repair-days A-B  hardware repair time, uniform (default 3-5)\n"
    "  --sw-repair-h H    software repair time (default 3)\n"
    "  --stragglers R     slowdowns per GPU-day (default 0: none)\n"
    "  --slow-factor A-B  a slowdown's factor, uniform (default 1.2-3)\n"
    "  --slow-h A-B       its duration in hours, log-uniform (default 0.1-10)\n"
    "costs of a failure:\n"
    "  --restart-min X    a restart (re-launch, re-initialise, load the checkpoint; default 10)\n"
    "  --ckpt-min X       checkpoint interval: a restart redoes half of it (default 10)\n"
    "  --detect-s X       ntp: time to notice a failed GPU (default 30)\n"
    "  --replan-s X       ntp: time to re-plan a group (default 1; the planner's own time is printed)\n"
    "the simulation:\n"
    "  --days N           days measured (default 28), after a burn-in of the longest repair\n"
    "  --seed S           random seed (default 1)\n"
    "  --fractions LIST   failed fractions of the loss curve (default 0,0.0005,0.001,0.002,0.004,0.008)\n"
    "  --samples N        random failure sets per fraction (default 40)\n"
    "  --svg FILE         the curves (default goodput.svg; '-' for none)\n"
    "\n"
    "exit status: 0 ok, 1 errors in the input or no plan fits the healthy group, 2 usage\n";

static int usage_fail(const char *fmt, const char *arg) { return cli_usage_error("ntpc goodput", fmt, arg); }

/* strtod below reads a decimal prefix; these characters keep it from reading hex, inf or nan */
static bool decimal_chars(const char *s, const char *also) {
  for (; *s; s++)
    if (!strchr("0123456789.eE+", *s) && !strchr(also, *s)) return false;
  return true;
}

static bool parse_list(const char *s, double *out, int *n, int cap) {
  *n = 0;
  if (!decimal_chars(s, ",-")) return false;
  while (*s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0 && v < 0.5) || *n == cap) return false;
    out[(*n)++] = v;
    s = end;
    if (*s == ',' && s[1]) s++;
    else if (*s) return false;
  }
  return *n > 0;
}

/* "X" or "A-B" with A <= B: into lo, hi */
static bool parse_range(const char *v, double *lo, double *hi) {
  char *end = (char *)v;
  *lo = decimal_chars(v, "-") ? strtod(v, &end) : 0, *hi = *lo;
  if (end != v && *end == '-') *hi = strtod(end + 1, &end);
  return end != v && !*end && *hi >= *lo;
}

/* --hw-repair-days, --slow-factor, --slow-h: -1 when argv[*i] is none of them, else 0 or the
 * usage error's status */
static int range_option(int argc, char **argv, int *i, gp_opts *o, bool *missing) {
  const char *v;
  double lo, hi;
  if ((v = cli_option_value(argc, argv, i, "--hw-repair-days", missing))) {
    if (!parse_range(v, &lo, &hi) || !(lo > 0) || hi > 1e4)
      return usage_fail("--hw-repair-days expects days or a range A-B, got '%s'", v);
    o->f.hw_min_h = lo * 24, o->f.hw_max_h = hi * 24;
  } else if ((v = cli_option_value(argc, argv, i, "--slow-factor", missing))) {
    if (!parse_range(v, &o->f.slow_min, &o->f.slow_max) || o->f.slow_min < 1 || o->f.slow_max > 100)
      return usage_fail("--slow-factor expects a factor or a range A-B from 1 to 100, got '%s'", v);
  } else if ((v = cli_option_value(argc, argv, i, "--slow-h", missing))) {
    if (!parse_range(v, &o->f.slow_min_h, &o->f.slow_max_h) || !(o->f.slow_min_h > 0) || o->f.slow_max_h > 1e4)
      return usage_fail("--slow-h expects hours or a range A-B, got '%s'", v);
  } else {
    return -1;
  }
  return 0;
}

static int parse(int argc, char **argv, gp_opts *o) {
  *o = (gp_opts){.gpus = 32768, .domain = 32, .tp = 0, .pp = 4, .micro = 0, .max_lost = 4, .mtbf_h = 0,
                 .failed_frac = -1, .replan_s = 1, .days = 28, .seed = 1, .samples = 40,
                 .stage_layers = -1,
                 .f = {.hw_frac = 0.78, .hw_min_h = 72, .hw_max_h = 120, .sw_h = 3, .slow_min = 1.2, .slow_max = 3,
                       .slow_min_h = 0.1, .slow_max_h = 10},
                 .k = {.restart_s = 10, .ckpt_s = 10, .detect_s = 30}}; /* minutes, minutes, seconds */
  /* Llama 3 (Dubey et al. 2024, section 3.3.4): 419 unexpected interruptions in a 54-day
   * snapshot of pre-training on 16,384 H100 GPUs */
  o->mtbf_h = 16384.0 * 54 * 24 / 419;
  static const double fr[] = {0, 0.0005, 0.001, 0.002, 0.004, 0.008};
  memcpy(o->fractions, fr, sizeof fr);
  o->nfractions = 6;
  struct {
    const char *name;
    double *v, lo, hi;
    const char *what;
  } nums[] = {
      {"--gpus", &o->gpus, 1, 1 << 24, "a number of GPUs"},
      {"--domain", &o->domain, 1, GP_MAX_DOMAIN, "GPUs per domain (1 to 1024)"},
      {"--tp", &o->tp, 1, GP_MAX_DOMAIN, "a TP degree"},
      {"--pp", &o->pp, 1, 1024, "pipeline stages (1 to 1024)"},
      {"--micro", &o->micro, 0, 1 << 20, "micro-batches per replica (0: the batch divides freely)"},
      {"--max-lost", &o->max_lost, 0, GP_MAX_DOMAIN, "GPUs a group may lose"},
      {"--stage-layers", &o->stage_layers, 0, 1 << 20, "layers of a stage"},
      {"--stragglers", &o->slow_per_day, 0, 1e3, "slowdowns per GPU-day (0 to 1000)"},
      {"--mem-cap", &o->mem_cap_gib, 1e-3, 1e9, "GiB per GPU"},
      {"--mtbf-h", &o->mtbf_h, 1e-3, 1e12, "hours between failures of a GPU"},
      {"--failed-frac", &o->failed_frac, 0, 0.5, "a failed fraction (0 to 0.5)"},
      {"--hw-frac", &o->f.hw_frac, 0, 1, "a fraction (0 to 1)"},
      {"--sw-repair-h", &o->f.sw_h, 0, 1e6, "hours"},
      {"--restart-min", &o->k.restart_s, 0, 1e6, "minutes"},
      {"--ckpt-min", &o->k.ckpt_s, 0, 1e6, "minutes"},
      {"--detect-s", &o->k.detect_s, 0, 1e6, "seconds"},
      {"--replan-s", &o->replan_s, 0, 1e6, "seconds"},
      {"--days", &o->days, 0.01, 3650, "days (up to 3650)"},
      {"--seed", &o->seed, 0, 1e15, "a seed (a whole number)"},
      {"--samples", &o->samples, 1, 100000, "draws per fraction (1 to 100000)"},
  };
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    bool missing = false, done = false;
    int rc;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(goodput_usage, stdout);
      return 0;
    }
    for (size_t n = 0; n < sizeof nums / sizeof nums[0] && !done; n++) {
      if (!(v = cli_option_value(argc, argv, &i, nums[n].name, &missing))) continue;
      if (!cli_number(v, nums[n].lo, nums[n].hi, nums[n].v)) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s expects %s, got '%%s'", nums[n].name, nums[n].what);
        return usage_fail(msg, v);
      }
      done = true;
    }
    if (done) continue;
    if (missing) return usage_fail("option '%s' needs a value", a);
    if (strcmp(a, "-D") == 0 || (strncmp(a, "-D", 2) == 0 && a[2])) {
      const char *d = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
      if (!d) return usage_fail("%s", "-D needs NAME=VALUE");
      if (o->ndefines == 256) return usage_fail("%s", "too many -D options");
      o->defines[o->ndefines++] = d;
    } else if ((v = cli_option_value(argc, argv, &i, "--model", &missing))) o->model = v;
    else if ((v = cli_option_value(argc, argv, &i, "--gpu", &missing))) o->gpu = v;
    else if ((v = cli_option_value(argc, argv, &i, "--profile", &missing))) o->profile = v;
    else if ((v = cli_option_value(argc, argv, &i, "--svg", &missing))) o->svg = v;
    else if ((v = cli_option_value(argc, argv, &i, "--color", &missing))) o->color = v;
    else if ((rc = range_option(argc, argv, &i, o, &missing)) >= 0) {
      if (rc) return rc;
    } else if ((v = cli_option_value(argc, argv, &i, "--fractions", &missing))) {
      if (!parse_list(v, o->fractions, &o->nfractions, 32))
        return usage_fail("--fractions expects up to 32 comma-separated fractions below 0.5, got '%s'", v);
    } else if (strcmp(a, "--forward") == 0) {
      o->forward = true;
    } else if (missing) {
      return usage_fail("option '%s' needs a value", a);
    } else if (a[0] == '-' && a[1]) {
      return usage_fail("unknown option '%s'", a);
    } else if (!o->file) {
      o->file = a;
    } else {
      return usage_fail("more than one model file ('%s')", a);
    }
    if (missing) return usage_fail("option '%s' needs a value", a);
  }
  if (!o->file) return usage_fail("%s", "no model file");
  if (o->gpu && o->profile) return usage_fail("%s", "give --gpu or --profile, not both");
  if (o->tp == 0) o->tp = o->domain;
  o->k.restart_s *= 60, o->k.ckpt_s *= 60;
  const double whole[] = {o->gpus, o->domain, o->tp, o->pp, o->micro, o->max_lost, o->stage_layers};
  for (size_t n = 0; n < sizeof whole / sizeof whole[0]; n++)
    if (whole[n] != floor(whole[n]))
      return usage_fail("%s", "--gpus, --domain, --tp, --pp, --micro, --max-lost and --stage-layers take whole numbers");
  if (o->seed != floor(o->seed) || o->samples != floor(o->samples))
    return usage_fail("%s", "--seed and --samples take whole numbers");
  return -1;
}

/* ntp-3d moves whole layers between a replica's stages: what a healthy group takes to hold k more
 * of the stage's L alike layers, priced as the planner's plan of the stage in L / (L + k) of the
 * memory, stretched by (L + k) / L (the stage's other weights counted as if they grew too: a
 * bound from above). false: out of memory. */
static bool more_layers(const plan_model *pm, const ir_module *m, plan_request *rq, double cap, gp_config *c,
                        diag_sink *diags) {
  int32_t L = c->stage_layers;
  if (L < 2 || c->pp < 2 || !(cap > 0)) return true;
  rq->world = c->tp, rq->max_groups = 0;
  for (int32_t k = 1; k <= GP_MORE_LAYERS; k++) {
    rq->mem_cap = cap * L / (L + k);
    plan_solution sol;
    diag_sink quiet = {.pool = diags->pool};
    bool solved = plan_solve(pm, m, rq, &sol, &quiet);
    bool oom = quiet.out_of_memory;
    diag_free(&quiet);
    if (oom) return diag_out_of_memory(diags), false;
    c->tau_more[k] = solved && sol.feasible ? sol.step_s * (L + k) / L : 0;
    if (solved) plan_solution_free(&sol);
    if (!(c->tau_more[k] > 0)) break;
  }
  return true;
}

/* the healthy degree's and the degraded degrees' plans into the config's tables */
static bool price(const plan_model *pm, const ir_module *m, const plan_profile *prof, const gp_opts *o, gp_config *c,
                  gp_priced *pr, ntpc_session *s) {
  int32_t T = c->tp, D = c->domain, lo = T - c->max_lost;
  plan_request rq = {.prof = prof, .mem_cap = o->mem_cap_gib * 1073741824.0, .nodes_of = D, .train = !o->forward};
  diag_sink *diags = ntpc_diag_sink(s);
  double cap = 0;
  /* the healthy group first: its errors are the model's (printed); then the degrees a failure
   * can leave, per layer and uniform, and for the table the divisors of the domain below them
   * (what uniform TP at a lower degree would give; no policy falls back to one). A degree with
   * no placement for some layer (heads that do not split that way) has no plan: its errors go
   * to a scratch sink. */
  for (int32_t pass = 0; pass < 2; pass++)
    for (int32_t t = pass ? 1 : T; t <= T; t++) {
      bool near = t >= lo, divisor = D % t == 0;
      if (pass && (t == T || (!near && !divisor))) continue;
      for (int uni = 0; uni < 2; uni++) {
        if (!near && !uni) continue;
        rq.world = t;
        rq.max_groups = uni ? 1 : 0;
        plan_solution sol;
        diag_sink quiet = {.pool = diags->pool};
        bool solved = plan_solve(pm, m, &rq, &sol, t == T && !uni ? diags : &quiet);
        bool oom = quiet.out_of_memory;
        diag_free(&quiet);
        if (oom) diag_out_of_memory(diags);
        if (!solved && (oom || (t == T && !uni))) return false;
        double tau = solved && sol.feasible ? sol.step_s : 0;
        (uni ? c->tau_uni : c->tau_ntp)[t] = tau;
        if (!uni && t == T && solved) cap = sol.mem_cap;
        if (!uni && t == T && tau > 0) pr->state_bytes = sol.mem_peak - sol.act_reserve;
        if (!uni && t == T - 1 && solved) pr->search_ms = sol.search_ms + sol.tables_ms;
        if (solved) plan_solution_free(&sol);
      }
    }
  /* ntp runs any plan, the uniform one too: the search over every placement can end a little
   * above the one restricted to uniform (its memory quantisation and pruned peaks differ) */
  for (int32_t t = lo > 1 ? lo : 1; t <= T; t++)
    if (c->tau_uni[t] > 0 && (!(c->tau_ntp[t] > 0) || c->tau_uni[t] < c->tau_ntp[t]))
      c->tau_ntp[t] = c->tau_uni[t];
  /* and a group may leave GPUs idle: where fewer run faster (128 heads over 63 GPUs put as many
   * on the busiest as over 61), it uses fewer; the healthy group too (a failure is never a gain) */
  for (int32_t t = (lo > 1 ? lo : 1) + 1; t <= T; t++)
    if (c->tau_ntp[t - 1] > 0 && (!(c->tau_ntp[t] > 0) || c->tau_ntp[t - 1] < c->tau_ntp[t]))
      c->tau_ntp[t] = c->tau_ntp[t - 1];
  return more_layers(pm, m, &rq, cap, c, diags);
}

/* The layers of a stage that ntp-3d moves whole: the model's repeated blocks (`repeat L as blk`
 * names them blk.0 .. blk.L-1), 0 where it repeats none. */
static int32_t repeated_blocks(const ir_module *m) {
  int32_t most = -1;
  for (size_t i = 0; i < m->n_layers; i++) {
    const char *dot = strchr(m->layers[i].name, '.');
    char *end;
    long k = dot && dot[1] >= '0' && dot[1] <= '9' ? strtol(dot + 1, &end, 10) : -1;
    if (k >= 0 && *end == '.' && k > most) most = (int32_t)k;
  }
  return most + 1;
}

/* The device profile of --profile or --gpu: -1, or the exit status. */
static int load_profile(const gp_opts *o, plan_profile *prof) {
  char err[1024] = "";
  if (o->profile ? !plan_profile_load(o->profile, prof, err, sizeof err)
                 : !plan_profile_builtin(o->gpu ? o->gpu : "b200", prof)) {
    if (o->profile) fprintf(stderr, "ntpc goodput: error: %s\n", err);
    else fprintf(stderr, "ntpc goodput: error: unknown GPU '%s' (see 'ntpc plan --help')\n", o->gpu);
    return o->profile ? 1 : 2;
  }
  return -1;
}

/* The cluster of the options, checked before anything is priced (NULL: the exit status in *rc). */
static gp_config *new_config(const gp_opts *o, int *rc) {
  gp_config *c = calloc(1, sizeof *c);
  if (!c) {
    *rc = 3;
    return NULL;
  }
  *c = (gp_config){.gpus = (int32_t)o->gpus, .domain = (int32_t)o->domain, .tp = (int32_t)o->tp,
                   .pp = (int32_t)o->pp, .micro = (int32_t)o->micro, .max_lost = (int32_t)o->max_lost};
  if (c->max_lost >= c->tp) c->max_lost = c->tp - 1;
  c->tau_ntp[c->tp] = 1; /* checked before pricing; priced below */
  const char *why = gp_config_check(c);
  if (why) {
    free(c);
    *rc = usage_fail("%s", why);
    return NULL;
  }
  c->tau_ntp[c->tp] = 0;
  return c;
}

static int run(const gp_opts *o, ntpc_session *s) {
  plan_profile prof;
  int rc = load_profile(o, &prof);
  if (rc >= 0) return rc;
  gp_config *c = new_config(o, &rc);
  if (!c) return rc;
  const ir_module *m = ntpc_module(s);
  plan_model *pm = plan_model_new(m, ntpc_diag_sink(s));
  gp_priced pr = {0};
  c->stage_layers = o->stage_layers >= 0 ? (int32_t)o->stage_layers : repeated_blocks(m);
  if (!pm || !price(pm, m, &prof, o, c, &pr, s)) { /* the planner's errors: printed by the caller */
    plan_model_free(pm);
    free(c);
    return ntpc_diag_sink(s)->out_of_memory ? 3 : 1;
  }
  double tokens = plan_model_tokens(pm);
  plan_model_free(pm);
  if (!(c->tau_ntp[c->tp] > 0)) {
    fprintf(stderr, "ntpc goodput: error: no plan of %s fits a group of %d x %s%s\n", m->name, c->tp, prof.device,
            o->forward ? "" : " for training (--forward prices the forward pass)");
    free(c);
    return 1;
  }
  gp_report_steps(o, c, m, &prof, tokens);
  gp_failures f;
  gp_costs k;
  double steady = gp_report_costs(o, &prof, &pr, &f, &k);
  double(*loss)[GP_NPOLICIES] = calloc((size_t)o->nfractions, sizeof *loss);
  int32_t(*spares)[GP_NPOLICIES] = calloc((size_t)o->nfractions, sizeof *spares);
  rc = loss && spares ? gp_report_loss(o, c, loss, spares) : 3;
  if (!rc) rc = gp_report_run(o, c, &f, &k);
  if (!rc)
    rc = gp_report_picture(o, c, m, &prof, (const double(*)[GP_NPOLICIES])loss, (const int32_t(*)[GP_NPOLICIES])spares,
                           steady);
  if (rc == 3) fprintf(stderr, "ntpc goodput: error: out of memory\n");
  free(loss), free(spares);
  free(c);
  return rc;
}

int ntpc_goodput_parse_options(int argc, char **argv) {
  gp_opts o;
  return parse(argc, argv, &o);
}

int ntpc_goodput_command(int argc, char **argv) {
  gp_opts o;
  int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  ntp_outfile_install_cleanup();
  ntpc_session *s = ntpc_session_new();
  if (!s) return 3;
  for (int i = 0; i < o.ndefines; i++)
    if (ntpc_define_str(s, o.defines[i]) != NTPC_OK) {
      rc = usage_fail("%s", ntpc_last_error(s));
      ntpc_session_free(s);
      return rc;
    }
  if (o.model) ntpc_select_model(s, o.model);
  ntpc_set_world(s, (int32_t)o.tp);
  ntpc_status st = ntpc_compile_file(s, o.file);
  ntpc_print_diags(s, stderr, cli_color(o.color));
  if (st != NTPC_OK) {
    if (st == NTPC_ERR_USAGE) fprintf(stderr, "ntpc goodput: error: %s\n", ntpc_last_error(s));
    ntpc_session_free(s);
    return st == NTPC_ERR_USAGE ? 2 : st == NTPC_ERR_INTERNAL ? 3 : 1;
  }
  if (!o.forward) { /* training is priced: the model must train (a scalar loss), as ntpc train checks */
    ntpc_session *g = ntpc_session_new();
    for (int i = 0; g && i < o.ndefines; i++) ntpc_define_str(g, o.defines[i]);
    if (g && o.model) ntpc_select_model(g, o.model);
    if (g) ntpc_set_world(g, (int32_t)o.tp), ntpc_want_grad(g, true);
    ntpc_status gs = g ? ntpc_compile_file(g, o.file) : NTPC_ERR_INTERNAL;
    if (gs != NTPC_OK) {
      if (g) ntpc_print_diags(g, stderr, cli_color(o.color));
      fprintf(stderr, "ntpc goodput: error: %s has no training program (--forward prices the forward pass)\n", o.file);
      ntpc_session_free(g);
      ntpc_session_free(s);
      return gs == NTPC_ERR_INTERNAL ? 3 : 1;
    }
    ntpc_session_free(g);
  }
  size_t seen = ntpc_diag_count(s);
  rc = run(&o, s);
  if (rc == 1 && ntpc_diag_count(s) > seen) ntpc_print_diags_from(s, seen, stderr, cli_color(o.color));
  ntpc_session_free(s);
  return rc;
}
