/* goodput_report.c — `ntpc goodput`'s report (docs/goodput.md): the planner's step of a stage by
 * group size, the failures and their costs, the throughput lost and the spare domains needed
 * against the failed fraction, a run of weeks per policy, and the picture of both curves. Only
 * this file and goodput_cmd.c print. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "goodput_cmd.h"
#include "outfile.h"

/* one chart of the picture: a value per policy at each failed fraction */
typedef struct panel {
  double x, y, w, h;           /* the plot area */
  const char *title, *ylabel;  /* the y values: "%" appended when percent */
  bool percent;
} panel;

static const char *const colour[GP_NPOLICIES] = {"#d62728", "#ff7f0e", "#1f77b4", "#9467bd", "#2ca02c", "#111111"};

static double nice_step(double ymax) {
  double s = pow(10, floor(log10(ymax > 0 ? ymax : 1)));
  while (ymax / s > 8) s *= 2;
  while (ymax / s < 3 && s > 1e-9) s /= 2;
  return s;
}

static void draw_panel(FILE *f, const gp_opts *o, const panel *pn, const double (*v)[GP_NPOLICIES], double steady) {
  double xmax = 0, ymax = 0;
  for (int i = 0; i < o->nfractions; i++) {
    if (o->fractions[i] > xmax) xmax = o->fractions[i];
    for (int p = 0; p < GP_NPOLICIES; p++)
      if (v[i][p] > ymax) ymax = v[i][p];
  }
  if (xmax <= 0) xmax = 1e-3;
  double ystep = nice_step(ymax);
  ymax = ceil((ymax + 1e-9) / ystep) * ystep;
#define X(a) (pn->x + (a) / xmax * pn->w)
#define Y(a) (pn->y + pn->h - (a) / ymax * pn->h)
  fprintf(f, "<text x='%.0f' y='%.0f' font-size='13' font-weight='bold'>%s</text>\n", pn->x, pn->y - 10, pn->title);
  for (double y = 0; y <= ymax + 1e-9; y += ystep)
    fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/><text x='%.1f' y='%.1f' "
               "text-anchor='end'>%g%s</text>\n", pn->x, Y(y), pn->x + pn->w, Y(y), pn->x - 6, Y(y) + 4, y,
            pn->percent ? "%" : "");
  /* x ticks at a round step, not at the data (small fractions would overlap) */
  double xstep = pow(10, floor(log10(xmax))) / 2;
  while (xmax / xstep > 6) xstep *= 2;
  for (double x = 0; x <= xmax * (1 + 1e-9); x += xstep)
    fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='black'/><text x='%.1f' y='%.1f' "
               "text-anchor='middle'>%g%%</text>\n", X(x), pn->y + pn->h, X(x), pn->y + pn->h + 4, X(x),
            pn->y + pn->h + 18, 100 * x);
  fprintf(f, "<line x1='%.0f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='black'/><line x1='%.0f' y1='%.0f' x2='%.0f' "
             "y2='%.1f' stroke='black'/>\n", pn->x, pn->y + pn->h, pn->x + pn->w, pn->y + pn->h, pn->x, pn->y, pn->x,
          pn->y + pn->h);
  fprintf(f, "<text x='%.1f' y='%.0f' text-anchor='middle'>GPUs failed</text>\n", pn->x + pn->w / 2,
          pn->y + pn->h + 36);
  fprintf(f, "<text transform='translate(%.0f,%.1f) rotate(-90)' text-anchor='middle'>%s</text>\n", pn->x - 50,
          pn->y + pn->h / 2, pn->ylabel);
  if (steady > 0 && steady <= xmax)
    fprintf(f, "<line x1='%.1f' y1='%.0f' x2='%.1f' y2='%.1f' stroke='#888' stroke-dasharray='4,3'/><text "
               "x='%.1f' y='%.0f' fill='#555' font-size='11'>long-run failed fraction</text>\n",
            X(steady), pn->y, X(steady), pn->y + pn->h, X(steady) + 4, pn->y + 12);
  for (int p = 0; p < GP_NPOLICIES; p++) {
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", colour[p]);
    for (int i = 0; i < o->nfractions; i++) fprintf(f, "%.1f,%.1f ", X(o->fractions[i]), Y(v[i][p]));
    fprintf(f, "'/>\n");
    for (int i = 0; i < o->nfractions; i++)
      fprintf(f, "<circle cx='%.1f' cy='%.1f' r='3' fill='%s'/>\n", X(o->fractions[i]), Y(v[i][p]), colour[p]);
  }
#undef X
#undef Y
}

static void svg_curves(FILE *f, const gp_opts *o, const double (*loss)[GP_NPOLICIES], const int32_t (*spares)[GP_NPOLICIES],
                       double steady, const char *title) {
  const double W = 1180, H = 470, L = 80, T = 80, PW = 360, PH = 320, GAP = 110;
  static const char *const legend[GP_NPOLICIES] = {
      "drop the replicas (restart)", "best uniform degree (restart)", "degraded groups at one degree (restart)",
      "each group re-planned at uniform TP (live)", "each group re-planned per layer (live)",
      "and layers moved between stages (live)"};
  fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' font-family='sans-serif' "
             "font-size='12'>\n<rect width='100%%' height='100%%' fill='white'/>\n", W, H);
  fprintf(f, "<text x='%.0f' y='24' font-size='15' font-weight='bold'>what failed GPUs cost a training run</text><text "
             "x='%.0f' y='42' fill='#444'>%s</text>\n", L, L, title);
  double (*sp)[GP_NPOLICIES] = calloc((size_t)o->nfractions, sizeof *sp);
  panel a = {L, T, PW, PH, "throughput lost", "throughput lost", true};
  draw_panel(f, o, &a, loss, steady);
  if (sp) {
    for (int i = 0; i < o->nfractions; i++)
      for (int p = 0; p < GP_NPOLICIES; p++) sp[i][p] = spares[i][p];
    panel b = {L + PW + GAP, T, PW, PH, "spare domains for the healthy throughput (worst set)", "spare domains", false};
    draw_panel(f, o, &b, (const double(*)[GP_NPOLICIES])sp, 0);
  }
  free(sp);
  for (int p = 0; p < GP_NPOLICIES; p++) {
    double lx = L + 2 * PW + GAP + 30, ly = T + 10 + 36 * p;
    fprintf(f, "<line x1='%.0f' y1='%.0f' x2='%.0f' y2='%.0f' stroke='%s' stroke-width='3'/><text x='%.0f' "
               "y='%.0f' font-weight='bold'>%s</text><text x='%.0f' y='%.0f' font-size='10' fill='#444'>%s</text>\n",
            lx, ly, lx + 20, ly, colour[p], lx + 26, ly + 4, gp_policy_name((gp_policy)p), lx + 26, ly + 17, legend[p]);
  }
  fprintf(f, "</svg>\n");
}

/* The cluster, then the priced step of a stage by the GPUs its group has left. */
void gp_report_steps(const gp_opts *o, const gp_config *c, const ir_module *m, const plan_profile *prof, double tokens) {
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
  printf("  (%%/GPU: tokens per second per GPU against the healthy group's)\n");
  if (c->pp > 1 && c->stage_layers > 1) {
    printf("ntp-3d moves whole layers between a replica's stages (%d a stage): a healthy group holding more,\n"
           "  in the memory left for them:", c->stage_layers);
    int32_t k = 1;
    for (; k <= GP_MORE_LAYERS && c->tau_more[k] > 0; k++)
      printf("%s %d layers %.*f ms", k > 1 ? "," : "", c->stage_layers + k, h < 0.01 ? 3 : 1, c->tau_more[k] * 1e3);
    printf("%s\n", k == 1 ? " none fits (no layer moves)" : k <= GP_MORE_LAYERS ? "; no more fits" : "");
  }
  printf("\n");
}

/* The failures and the costs of the options, printed: into *f and *k. The long-run failed
 * fraction. */
double gp_report_costs(const gp_opts *o, const plan_profile *prof, const gp_priced *pr, gp_failures *f, gp_costs *k) {
  *f = o->f;
  f->rate_per_gpu_h = o->failed_frac >= 0 ? gp_rate_for_fraction(f, o->failed_frac) : 1 / o->mtbf_h;
  f->slow_rate_per_gpu_h = o->slow_per_day / 24;
  double steady = gp_steady_fraction(f);
  printf("failures: one per %.0f GPU-hours (%s); %.0f%% hardware, repaired in %g-%g days, the rest software, %g h;\n"
         "  mean repair %.1f h, long-run failed fraction %.3f%%\n", 1 / f->rate_per_gpu_h,
         o->failed_frac >= 0 ? "set by --failed-frac" : "Llama 3's rate unless --mtbf-h", 100 * f->hw_frac,
         f->hw_min_h / 24, f->hw_max_h / 24, f->sw_h, gp_mean_repair_h(f), 100 * steady);
  if (f->slow_rate_per_gpu_h > 0)
    printf("stragglers: %g slowdowns per GPU-day, each by %g-%gx for %g-%g h (log-uniform)\n", o->slow_per_day,
           f->slow_min, f->slow_max, f->slow_min_h, f->slow_max_h);
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

/* a table's first words, then the policies' names as its columns */
static void policy_header(const char *first) {
  printf("%s", first);
  for (int p = 0; p < GP_NPOLICIES; p++) printf("  %10s", gp_policy_name((gp_policy)p));
}

/* The throughput each policy loses at each failed fraction and the spare domains its worst draw
 * needs, printed and into loss and spares: 0, or 3 (out of memory). */
int gp_report_loss(const gp_opts *o, const gp_config *c, double (*loss)[GP_NPOLICIES], int32_t (*spares)[GP_NPOLICIES]) {
  printf("throughput lost with a fraction of the GPUs failed (%d random sets each):\n", (int)o->samples);
  policy_header("  failed   GPUs ");
  printf("\n");
  for (int i = 0; i < o->nfractions; i++) {
    double thr[GP_NPOLICIES];
    if (!gp_static_loss(c, o->fractions[i], (int32_t)o->samples, (uint64_t)o->seed + (uint64_t)i, thr, spares[i]))
      return 3;
    printf("  %5.2f%%  %5.0f ", 100 * o->fractions[i], llround(o->fractions[i] * c->gpus) * 1.0);
    for (int p = 0; p < GP_NPOLICIES; p++) {
      loss[i][p] = 100 * (1 - thr[p]);
      if (fabs(loss[i][p]) < 5e-10) loss[i][p] = 0; /* no "-0.00%" */
      printf("  %9.2f%%", loss[i][p]);
    }
    printf("\n");
  }
  /* what the paper counts as the cost of non-stop training: spares swapped in to keep the
   * healthy throughput, here whole healthy replicas making up what a policy loses */
  printf("spare domains (of %d GPUs) that keep the healthy throughput, for the worst of the sets:\n", c->domain);
  policy_header("  failed   GPUs ");
  printf("\n");
  for (int i = 0; i < o->nfractions; i++) {
    printf("  %5.2f%%  %5.0f ", 100 * o->fractions[i], llround(o->fractions[i] * c->gpus) * 1.0);
    for (int p = 0; p < GP_NPOLICIES; p++) printf("  %10d", spares[i][p]);
    printf("\n");
  }
  return 0;
}

static double best_restart(const gp_run_result *r) {
  double best = 0;
  for (int p = 0; p < GP_NPOLICIES; p++)
    if (!gp_policy_live((gp_policy)p) && r->goodput[p] > best) best = r->goodput[p];
  return best;
}

/* A run of weeks of failures, repairs and slowdowns: each policy's throughput, goodput and spares
 * printed, then the same run at other restart costs: 0, or 3. */
int gp_report_run(const gp_opts *o, const gp_config *c, const gp_failures *f, const gp_costs *k) {
  gp_run_result r;
  double burn = f->hw_max_h > f->sw_h ? f->hw_max_h / 24 : f->sw_h / 24;
  if (!gp_simulate(c, f, k, o->days, burn, (uint64_t)o->seed, &r)) return 3;
  printf("\na run of %g days (seed %.0f): %lld failures, %lld repairs", o->days, o->seed, (long long)r.failures,
         (long long)r.repairs);
  if (f->slow_rate_per_gpu_h > 0) printf(", %lld slowdowns", (long long)r.slowdowns);
  printf("; failed %.3f%% of the time on average, at most %.3f%%\n", 100 * r.mean_failed_frac, 100 * r.max_failed_frac);
  printf("  policy      throughput   goodput   stops  paused or redone   spare domains: always  99%%  what it does\n");
  for (int p = 0; p < GP_NPOLICIES; p++)
    printf("  %-10s  %9.2f%%  %7.2f%%  %6lld  %10.1f h  %20d %5d  %s\n", gp_policy_name((gp_policy)p),
           100 * r.throughput[p], 100 * r.goodput[p], (long long)r.stops[p], r.paused_h[p], r.spares_max[p],
           r.spares_p99[p], gp_policy_title((gp_policy)p));
  printf("  (of a healthy cluster's; goodput also loses the pauses and the work redone after restarts;\n"
         "   spare domains: healthy ones swapped in to keep the healthy throughput at every moment, 99%% of the time)\n");
  /* the restart's cost is an assumption: the same run (the same failures) at other costs */
  static const double minutes[] = {1, 5, 15};
  printf("the restart's cost (--restart-min, an input; %g min above): goodput of the same run at\n", k->restart_s / 60);
  policy_header("  restart   ");
  printf("   ntp-3d's lead over the best restart policy\n");
  for (int i = 0; i < 3; i++) {
    gp_costs ki = *k;
    ki.restart_s = minutes[i] * 60;
    gp_run_result ri;
    if (!gp_simulate(c, f, &ki, o->days, burn, (uint64_t)o->seed, &ri)) return 3;
    printf("  %4g min  ", minutes[i]);
    for (int p = 0; p < GP_NPOLICIES; p++) printf("  %9.2f%%", 100 * ri.goodput[p]);
    printf("   %+.2f points\n", 100 * (ri.goodput[GP_NTP_3D] - best_restart(&ri)));
  }
  return 0;
}

/* Both curves into the file --svg names (default goodput.svg; '-': none): 0, or 2. */
int gp_report_picture(const gp_opts *o, const gp_config *c, const ir_module *m, const plan_profile *prof,
                      const double (*loss)[GP_NPOLICIES], const int32_t (*spares)[GP_NPOLICIES], double steady) {
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
  svg_curves(out.f, o, loss, spares, steady, title);
  if (ntp_outfile_commit(&out, !ferror(out.f), err, sizeof err) != 0) {
    fprintf(stderr, "ntpc goodput: error: %s\n", err);
    return 2;
  }
  printf("wrote %s\n", svg);
  return 0;
}
