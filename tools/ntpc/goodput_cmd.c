/* goodput_cmd.c — `ntpc goodput`: what GPU failures cost a cluster-scale training run under four
 * policies (docs/goodput.md). The planner prices one pipeline stage of the model (the FILE) at
 * every TP group size a failure can leave, per layer and uniform; the simulation
 * (compiler/planner/goodput.c) turns those into throughput against the failed fraction and a run
 * of weeks of failures and repairs. Exit status: 0 ok, 1 errors in the input or no plan fits the
 * healthy group, 2 usage, 3 internal errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "goodput.h"
#include "ntpc.h"
#include "outfile.h"
#include "planner.h"

static const char goodput_usage[] =
    "usage: ntpc goodput FILE [options]\n"
    "\n"
    "Simulates a training run on a cluster whose GPUs fail and are repaired, and compares four\n"
    "answers to a failure: drop the data-parallel replicas it touches (dp-drop), restart at the\n"
    "best uniform TP degree (uniform), restart with the degraded groups at one lower degree\n"
    "(two-degree, Megatron's non-uniform TP), and re-plan each degraded group per layer, live\n"
    "(ntp). FILE is one pipeline stage (with its loss); the planner prices it at every group size.\n"
    "Prints the plans' step times, the throughput lost against the failed fraction, and a run's\n"
    "throughput and goodput per policy; draws the loss curve (SVG).\n"
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
    "failures (defaults: Llama 3's 54-day report on 16,384 H100s, docs/goodput.md):\n"
    "  --mtbf-h H         hours between failures of one GPU (default 50710: 419 in 54 days)\n"
    "  --failed-frac F    instead: the failure rate whose long-run failed fraction is F\n"
    "  --hw-frac X        hardware share of the failures (default 0.78)\n"
    "  --hw-repair-days A-B  hardware repair time, uniform (default 3-5)\n"
    "  --sw-repair-h H    software repair time (default 3)\n"
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
    "  --svg FILE         the curve (default goodput.svg; '-' for none)\n"
    "\n"
    "exit status: 0 ok, 1 errors in the input or no plan fits the healthy group, 2 usage\n";

typedef struct gp_opts {
  const char *file, *model, *gpu, *profile, *svg, *color;
  const char *defines[256];
  int ndefines;
  double gpus, domain, tp, pp, micro, max_lost, mem_cap_gib;
  bool forward;
  gp_failures f;
  double mtbf_h, failed_frac; /* failed_frac >= 0: sets the rate */
  double replan_s;            /* ntp: the re-plan's share of a resume */
  gp_costs k;
  double days, seed, samples;
  double fractions[32];
  int nfractions;
} gp_opts;

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

static int parse(int argc, char **argv, gp_opts *o) {
  *o = (gp_opts){.gpus = 32768, .domain = 32, .tp = 0, .pp = 4, .micro = 0, .max_lost = 4, .mtbf_h = 0,
                 .failed_frac = -1, .replan_s = 1, .days = 28, .seed = 1, .samples = 40,
                 .f = {.hw_frac = 0.78, .hw_min_h = 72, .hw_max_h = 120, .sw_h = 3},
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
    else if ((v = cli_option_value(argc, argv, &i, "--hw-repair-days", &missing))) {
      char *end = (char *)v;
      double lo = decimal_chars(v, "-") ? strtod(v, &end) : 0, hi = lo;
      if (end != v && *end == '-') hi = strtod(end + 1, &end);
      if (end == v || *end || !(lo > 0) || !(hi >= lo) || hi > 1e4)
        return usage_fail("--hw-repair-days expects days or a range A-B, got '%s'", v);
      o->f.hw_min_h = lo * 24, o->f.hw_max_h = hi * 24;
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
  const double whole[] = {o->gpus, o->domain, o->tp, o->pp, o->micro, o->max_lost};
  for (size_t n = 0; n < sizeof whole / sizeof whole[0]; n++)
    if (whole[n] != floor(whole[n])) return usage_fail("%s", "--gpus, --domain, --tp, --pp, --micro and --max-lost take whole numbers");
  if (o->seed != floor(o->seed) || o->samples != floor(o->samples))
    return usage_fail("%s", "--seed and --samples take whole numbers");
  return -1;
}

/* the healthy degree's and the degraded degrees' plans into the config's tables */
typedef struct priced {
  double search_ms;   /* the planner's time for one degraded group's plan */
  double state_bytes; /* per GPU of the healthy group: what the hand-over after a failure refills */
} priced;

static bool price(const plan_model *pm, const ir_module *m, const plan_profile *prof, const gp_opts *o, gp_config *c,
                  priced *pr, ntpc_session *s) {
  int32_t T = c->tp, D = c->domain, lo = T - c->max_lost;
  plan_request rq = {.prof = prof, .mem_cap = o->mem_cap_gib * 1073741824.0, .nodes_of = D, .train = !o->forward};
  diag_sink *diags = ntpc_diag_sink(s);
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
        if (!uni && t == T && tau > 0) pr->state_bytes = sol.mem_peak - sol.act_reserve;
        if (!uni && t == T - 1 && solved) pr->search_ms = sol.search_ms + sol.tables_ms;
        if (solved) plan_solution_free(&sol);
      }
    }
  /* ntp runs any plan, the uniform one too: the search over every placement can end a little
   * above the one restricted to uniform (its memory quantisation and pruned peaks differ) */
  for (int32_t t = lo > 1 ? lo : 1; t <= T; t++)
    if (c->tau_uni[t] > 0 && (!(c->tau_ntp[t] > 0) || c->tau_uni[t] < c->tau_ntp[t])) c->tau_ntp[t] = c->tau_uni[t];
  /* and a group may leave GPUs idle: where fewer run faster (128 heads over 63 GPUs put as many
   * on the busiest as over 61), it uses fewer; the healthy group too (a failure is never a gain) */
  for (int32_t t = (lo > 1 ? lo : 1) + 1; t <= T; t++)
    if (c->tau_ntp[t - 1] > 0 && (!(c->tau_ntp[t] > 0) || c->tau_ntp[t - 1] < c->tau_ntp[t])) c->tau_ntp[t] = c->tau_ntp[t - 1];
  return true;
}

static void svg_curve(FILE *f, const gp_opts *o, const double (*loss)[GP_NPOLICIES], double steady, const char *title) {
  const double W = 760, H = 440, L = 70, R = 270, T = 56, B = 56;
  double xmax = 0, ymax = 0;
  for (int i = 0; i < o->nfractions; i++) {
    if (o->fractions[i] > xmax) xmax = o->fractions[i];
    for (int p = 0; p < GP_NPOLICIES; p++)
      if (loss[i][p] > ymax) ymax = loss[i][p];
  }
  if (xmax <= 0) xmax = 1e-3;
  double ystep = ymax > 20 ? 5 : ymax > 8 ? 2 : ymax > 4 ? 1 : 0.5;
  ymax = ceil((ymax + 1e-9) / ystep) * ystep;
  double pw = W - L - R, ph = H - T - B;
#define X(v) (L + (v) / xmax * pw)
#define Y(v) (T + ph - (v) / ymax * ph)
  static const char *const colour[] = {"#d62728", "#ff7f0e", "#1f77b4", "#2ca02c"};
  static const char *const legend[] = {"drop the replicas (restart)", "best uniform degree (restart)",
                                       "degraded groups at one degree (restart)", "each group re-planned (live)"};
  fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' font-family='sans-serif' "
             "font-size='12'>\n<rect width='100%%' height='100%%' fill='white'/>\n", W, H);
  fprintf(f, "<text x='%.0f' y='22' font-size='14' font-weight='bold'>throughput lost to failed GPUs</text><text "
             "x='%.0f' y='38' fill='#444'>%s</text>\n", L, L, title);
  for (double y = 0; y <= ymax + 1e-9; y += ystep)
    fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/><text x='%.1f' y='%.1f' "
               "text-anchor='end'>%g%%</text>\n", L, Y(y), L + pw, Y(y), L - 6, Y(y) + 4, y);
  /* x ticks at a round step, not at the data (small fractions would overlap) */
  double xstep = pow(10, floor(log10(xmax))) / 2;
  while (xmax / xstep > 8) xstep *= 2;
  for (double x = 0; x <= xmax * (1 + 1e-9); x += xstep)
    fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='black'/><text x='%.1f' y='%.1f' "
               "text-anchor='middle'>%g%%</text>\n", X(x), T + ph, X(x), T + ph + 4, X(x), T + ph + 18, 100 * x);
  fprintf(f, "<line x1='%.0f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='black'/><line x1='%.0f' y1='%.0f' x2='%.0f' "
             "y2='%.1f' stroke='black'/>\n", L, T + ph, L + pw, T + ph, L, T, L, T + ph);
  fprintf(f, "<text x='%.1f' y='%.0f' text-anchor='middle'>GPUs failed</text>\n", L + pw / 2, H - 16);
  fprintf(f, "<text transform='translate(18,%.1f) rotate(-90)' text-anchor='middle'>throughput lost</text>\n",
          T + ph / 2);
  if (steady > 0 && steady <= xmax)
    fprintf(f, "<line x1='%.1f' y1='%.0f' x2='%.1f' y2='%.1f' stroke='#888' stroke-dasharray='4,3'/><text "
               "x='%.1f' y='%.0f' fill='#555' font-size='11'>long-run failed fraction</text>\n",
            X(steady), T, X(steady), T + ph, X(steady) + 4, T + 12);
  for (int p = 0; p < GP_NPOLICIES; p++) {
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", colour[p]);
    for (int i = 0; i < o->nfractions; i++) fprintf(f, "%.1f,%.1f ", X(o->fractions[i]), Y(loss[i][p]));
    fprintf(f, "'/>\n");
    for (int i = 0; i < o->nfractions; i++)
      fprintf(f, "<circle cx='%.1f' cy='%.1f' r='3' fill='%s'/>\n", X(o->fractions[i]), Y(loss[i][p]), colour[p]);
    double ly = T + 20 + 36 * p;
    fprintf(f, "<line x1='%.0f' y1='%.0f' x2='%.0f' y2='%.0f' stroke='%s' stroke-width='3'/><text x='%.0f' "
               "y='%.0f' font-weight='bold'>%s</text><text x='%.0f' y='%.0f' font-size='10' fill='#444'>%s</text>\n",
            L + pw + 16, ly, L + pw + 36, ly, colour[p], L + pw + 42, ly + 4, gp_policy_name((gp_policy)p),
            L + pw + 42, ly + 17, legend[p]);
  }
  fprintf(f, "</svg>\n");
#undef X
#undef Y
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

/* The cluster, then the priced step of a stage by the GPUs its group has left. */
static void print_steps(const gp_opts *o, const gp_config *c, const ir_module *m, const plan_profile *prof,
                        double tokens) {
  int32_t T = c->tp, R = gp_replicas(c);
  char mb[96];
  if (c->micro) snprintf(mb, sizeof mb, "%d micro-batches of %.0f tokens each a step", c->micro, tokens);
  else snprintf(mb, sizeof mb, "micro-batches of %.0f tokens, the batch shared by speed", tokens);
  printf("ntpc goodput: %s (one of %d pipeline stages) on %d x %s in domains of %d; TP %d: %d replicas of %d GPUs, "
         "%s\n\n", m->name, c->pp, c->gpus, prof->device, c->domain, T, R, T * c->pp, mb);
  printf("the planner's %s step of a stage, by the GPUs its group has left:\n", o->forward ? "forward" : "training");
  printf("  GPUs  per-layer plan (ntp)        uniform TP (every layer over all)\n");
  double h = c->tau_ntp[T];
  for (int32_t t = T; t >= 1; t--) {
    if (!(c->tau_ntp[t] > 0 || c->tau_uni[t] > 0) && t < T - c->max_lost) continue;
    char a[64] = "no plan fits", b[64] = "no plan fits";
    /* per GPU against the healthy group's per GPU: what a degraded group wastes */
    int dec = h < 0.01 ? 3 : 1; /* small models: ms to the microsecond */
    if (c->tau_ntp[t] > 0) snprintf(a, sizeof a, "%9.*f ms  %5.1f%%/GPU", dec, c->tau_ntp[t] * 1e3, 100 * h * T / (c->tau_ntp[t] * t));
    if (c->tau_uni[t] > 0) snprintf(b, sizeof b, "%9.*f ms  %5.1f%%/GPU", dec, c->tau_uni[t] * 1e3, 100 * h * T / (c->tau_uni[t] * t));
    printf("  %4d  %-26s  %s\n", t, t >= T - c->max_lost ? a : "", b);
  }
  printf("  (%%/GPU: tokens per second per GPU against the healthy group's)\n\n");
}

/* The failures and the costs of the options, printed: into *f and *k. The long-run failed
 * fraction. */
static double failures_and_costs(const gp_opts *o, const plan_profile *prof, const priced *pr, gp_failures *f,
                               gp_costs *k) {
  *f = o->f;
  f->rate_per_gpu_h = o->failed_frac >= 0 ? gp_rate_for_fraction(f, o->failed_frac) : 1 / o->mtbf_h;
  double steady = gp_steady_fraction(f);
  printf("failures: one per %.0f GPU-hours (%s); %.0f%% hardware, repaired in %g-%g days, the rest software, %g h;\n"
         "  mean repair %.1f h, long-run failed fraction %.3f%%\n", 1 / f->rate_per_gpu_h,
         o->failed_frac >= 0 ? "set by --failed-frac" : "Llama 3's rate unless --mtbf-h", 100 * f->hw_frac,
         f->hw_min_h / 24, f->hw_max_h / 24, f->sw_h, gp_mean_repair_h(f), 100 * steady);
  *k = o->k;
  /* ntp's hand-over: each survivor's share of the failed GPU's state over its own inter-domain
   * link from a replica that holds it, after the planner's re-plan of the group */
  k->resume_s = o->replan_s + pr->state_bytes / prof->link_bw[PLAN_INTER];
  printf("costs: a restart %.0f min plus half a %.0f-minute checkpoint interval redone; ntp: %.0f s to notice, "
         "%.1f s to resume (re-plan %g s, %.2f GiB of state per GPU at %.0f GB/s)\n", k->restart_s / 60, k->ckpt_s / 60,
         k->detect_s, k->resume_s, o->replan_s, pr->state_bytes / 1073741824.0, prof->link_bw[PLAN_INTER] / 1e9);
  /* measured, so not in the simulation (the same seed gives the same run) */
  printf("  (the planner's re-plan of a group that lost one GPU took %.0f ms here)\n\n", pr->search_ms);
  return steady;
}

/* The throughput each policy loses at each failed fraction, printed and into loss: 0, or 3 (out
 * of memory). */
static int loss_table(const gp_opts *o, const gp_config *c, double (*loss)[GP_NPOLICIES]) {
  printf("throughput lost with a fraction of the GPUs failed (%d random sets each):\n", (int)o->samples);
  printf("  failed   GPUs ");
  for (int p = 0; p < GP_NPOLICIES; p++) printf("  %10s", gp_policy_name((gp_policy)p));
  printf("\n");
  for (int i = 0; i < o->nfractions; i++) {
    double thr[GP_NPOLICIES];
    if (!gp_static_loss(c, o->fractions[i], (int32_t)o->samples, (uint64_t)o->seed + (uint64_t)i, thr)) return 3;
    printf("  %5.2f%%  %5.0f ", 100 * o->fractions[i], llround(o->fractions[i] * c->gpus) * 1.0);
    for (int p = 0; p < GP_NPOLICIES; p++) {
      loss[i][p] = 100 * (1 - thr[p]);
      if (fabs(loss[i][p]) < 5e-10) loss[i][p] = 0; /* no "-0.00%" */
      printf("  %9.2f%%", loss[i][p]);
    }
    printf("\n");
  }
  return 0;
}

/* A run of weeks of failures and repairs, each policy's throughput and goodput printed: 0, or 3. */
static int simulated_run(const gp_opts *o, const gp_config *c, const gp_failures *f, const gp_costs *k) {
  gp_run_result r;
  double burn = f->hw_max_h > f->sw_h ? f->hw_max_h / 24 : f->sw_h / 24;
  if (!gp_simulate(c, f, k, o->days, burn, (uint64_t)o->seed, &r)) return 3;
  printf("\na run of %g days (seed %.0f): %lld failures, %lld repairs; failed %.3f%% of the time on average, at "
         "most %.3f%%\n", o->days, o->seed, (long long)r.failures, (long long)r.repairs, 100 * r.mean_failed_frac,
         100 * r.max_failed_frac);
  printf("  policy      throughput   goodput   stops  paused or redone  what it does\n");
  for (int p = 0; p < GP_NPOLICIES; p++)
    printf("  %-10s  %9.2f%%  %7.2f%%  %6lld  %10.1f h      %s\n", gp_policy_name((gp_policy)p), 100 * r.throughput[p],
           100 * r.goodput[p], (long long)r.stops[p], r.paused_h[p], gp_policy_title((gp_policy)p));
  printf("  (of a healthy cluster's; goodput also loses the pauses and the work redone after restarts)\n");
  /* the restart's cost is an assumption: the same run (the same failures) at other costs */
  static const double minutes[] = {1, 5, 15};
  printf("the restart's cost (--restart-min, an input; %g min above): goodput of the same run at\n", k->restart_s / 60);
  printf("  restart   ");
  for (int p = 0; p < GP_NPOLICIES; p++) printf("  %10s", gp_policy_name((gp_policy)p));
  printf("   ntp's lead over the best restart policy\n");
  for (int i = 0; i < 3; i++) {
    gp_costs ki = *k;
    ki.restart_s = minutes[i] * 60;
    gp_run_result ri;
    if (!gp_simulate(c, f, &ki, o->days, burn, (uint64_t)o->seed, &ri)) return 3;
    double best = 0;
    printf("  %4g min  ", minutes[i]);
    for (int p = 0; p < GP_NPOLICIES; p++) {
      printf("  %9.2f%%", 100 * ri.goodput[p]);
      if (p != GP_NTP && ri.goodput[p] > best) best = ri.goodput[p];
    }
    printf("   %+.2f points\n", 100 * (ri.goodput[GP_NTP] - best));
  }
  return 0;
}

/* The loss curve into the file --svg names (default goodput.svg; '-': none): 0, or 2. */
static int write_curve(const gp_opts *o, const gp_config *c, const ir_module *m, const plan_profile *prof,
                       const double (*loss)[GP_NPOLICIES], double steady) {
  const char *svg = o->svg ? o->svg : "goodput.svg";
  if (strcmp(svg, "-") == 0) return 0;
  ntp_outfile out;
  char title[200], err[1024] = "";
  snprintf(title, sizeof title, "%s on %d x %s, domains of %d, TP %d x PP %d (ntpc goodput)", m->name, c->gpus,
           prof->device, c->domain, c->tp, c->pp);
  if (ntp_outfile_open(&out, svg, NULL, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc goodput: error: %s\n", err);
    return 2;
  }
  svg_curve(out.f, o, loss, steady, title);
  if (ntp_outfile_commit(&out, !ferror(out.f), err, sizeof err) != 0) {
    fprintf(stderr, "ntpc goodput: error: %s\n", err);
    return 2;
  }
  printf("wrote %s\n", svg);
  return 0;
}

static int run(const gp_opts *o, ntpc_session *s) {
  plan_profile prof;
  int rc = load_profile(o, &prof);
  if (rc >= 0) return rc;
  gp_config *c = new_config(o, &rc);
  if (!c) return rc;
  const ir_module *m = ntpc_module(s);
  plan_model *pm = plan_model_new(m, ntpc_diag_sink(s));
  priced pr = {0};
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
  print_steps(o, c, m, &prof, tokens);
  gp_failures f;
  gp_costs k;
  double steady = failures_and_costs(o, &prof, &pr, &f, &k);
  double(*loss)[GP_NPOLICIES] = calloc((size_t)o->nfractions, sizeof *loss);
  if (!loss) {
    free(c);
    return 3;
  }
  rc = loss_table(o, c, loss);
  if (!rc) rc = simulated_run(o, c, &f, &k);
  if (!rc) rc = write_curve(o, c, m, &prof, (const double(*)[GP_NPOLICIES])loss, steady);
  if (rc == 3) fprintf(stderr, "ntpc goodput: error: out of memory\n");
  free(loss);
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
