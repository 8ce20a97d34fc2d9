/* test_profile_write.c — what ntpc calibrate relies on in the planner (profile_write.c): a written
 * profile reads back to the same numbers (attention's measured crossover too, and the parser's
 * refusals of a bad one); curves fitted from measurements; a collective's curve inverts
 * plan_coll_time; the closest built-in by a device's name. */
#define _GNU_SOURCE /* open_memstream */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../rng.h"
#include "planner.h"

static double unit(rng *r) { return (double)(next(r) >> 11) / 9007199254740992.0; } /* [0, 1) */

static bool close_to(double a, double b) { return fabs(a - b) <= 1e-5 * fmax(fabs(a), fabs(b)); }

static bool curves_close(const plan_curve *a, const plan_curve *b) {
  if (a->n != b->n) return false;
  for (int i = 0; i < a->n; i++)
    if (!close_to(a->x[i], b->x[i]) || fabs(a->y[i] - b->y[i]) > 5e-4 * b->y[i]) return false;
  return true;
}

/* every built-in, and a random one, written and read back */
static void round_trip(const plan_profile *p) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  plan_profile_notes notes = {0};
  snprintf(notes.header, sizeof notes.header, "line one\nline two");
  snprintf(notes.gemm, sizeof notes.gemm, "measured on a test at noon");
  snprintf(notes.attn_gemm, sizeof notes.attn_gemm, "crossover note");
  CHECK(plan_profile_write(f, p, &notes));
  fclose(f);
  plan_profile q;
  char err[256];
  bool ok = plan_profile_parse(text, "written", &q, err, sizeof err);
  CHECK(ok);
  if (!ok) fprintf(stderr, "%s\n%s", err, text);
  CHECK(strstr(text, "# line two\n") && strstr(text, "  # measured on a test at noon\n"));
  /* attention_gemm_from: a line only where the profile gives one, "never" spelled out, its note */
  const char *agf = strstr(text, "\nattention_gemm_from ");
  if (p->attn_gemm_from == 0) CHECK(!agf);
  else if (p->attn_gemm_from == PLAN_ATTN_GEMM_NEVER) {
    static const char never[] = "\nattention_gemm_from never  # crossover note\n";
    CHECK(agf && !strncmp(agf, never, strlen(never)));
  }
  else CHECK(agf && strtoll(agf + 21, NULL, 10) == p->attn_gemm_from && strstr(agf, "  # crossover note\n"));
  free(text);
  if (!ok) return;
  CHECK(!strcmp(p->name, q.name) && !strcmp(p->device, q.device));
  for (int d = 0; d < NTP_DTYPE_COUNT; d++) CHECK(close_to(p->flops[d], q.flops[d]));
  CHECK(curves_close(&p->gemm_eff, &q.gemm_eff));
  CHECK(fabs(p->attn_eff - q.attn_eff) <= 5e-4 * p->attn_eff && fabs(p->mem_eff - q.mem_eff) <= 5e-4 * p->mem_eff);
  CHECK(p->attn_gemm_from == q.attn_gemm_from);
  CHECK(close_to(p->mem_bw, q.mem_bw) && close_to(p->mem_capacity, q.mem_capacity) && close_to(p->launch, q.launch));
  for (int lv = 0; lv < PLAN_NLEVELS; lv++) {
    CHECK(close_to(p->link_bw[lv], q.link_bw[lv]));
    for (int c = 0; c < PLAN_NCOLLS; c++) {
      CHECK(close_to(p->lat[lv][c], q.lat[lv][c]));
      CHECK(curves_close(&p->eff[lv][c], &q.eff[lv][c]));
    }
  }
}

int main(void) {
  for (const char *const *n = plan_profile_names(); *n; n++) {
    plan_profile p;
    CHECK(plan_profile_builtin(*n, &p));
    round_trip(&p);
  }
  rng r = {7};
  for (int t = 0; t < 50; t++) { /* random measured-looking numbers */
    plan_profile p;
    CHECK(plan_profile_builtin("h200", &p));
    snprintf(p.name, sizeof p.name, "rand%d", t);
    p.flops[NTP_BF16] = 1e12 * (1 + 900 * unit(&r));
    double x[PLAN_CURVE_MAX], y[PLAN_CURVE_MAX];
    for (int i = 0; i < 10; i++) x[i] = 16 << i, y[i] = 0.01 + 0.98 * unit(&r);
    p.gemm_eff = plan_fit_curve(x, y, 10);
    p.attn_eff = 0.001 + 0.99 * unit(&r);
    p.mem_bw = 1e11 * (1 + 50 * unit(&r));
    p.launch = 1e-6 * (1 + 10 * unit(&r));
    p.lat[PLAN_INTRA][COMM_ALL_REDUCE] = 1e-5 * unit(&r);
    /* the crossover: not given, never, or any sequence length up to 2^40 */
    p.attn_gemm_from = t % 5 == 0 ? 0 : t % 5 == 1 ? PLAN_ATTN_GEMM_NEVER : 1 + (int64_t)(next(&r) >> 24);
    round_trip(&p);
  }

  /* the built-ins measure no crossover: no attention_gemm_from, the codegen's default */
  for (const char *const *n = plan_profile_names(); *n; n++) {
    plan_profile b;
    CHECK(plan_profile_builtin(*n, &b) && b.attn_gemm_from == 0);
  }
  /* its values: a positive integer or never; anything else names the line and the key */
  static const char base[] = "name t\nflops bf16 1e12\nmemory_bandwidth 1e12\nmemory_capacity 1e9\nlink intra 1e9\n"
                             "link inter 1e9\n";
  static const struct {
    const char *line;
    int64_t want; /* -1: refused */
  } gf[] = {{"attention_gemm_from 17", 17},  {"attention_gemm_from never  # the GEMMs lost", PLAN_ATTN_GEMM_NEVER},
            {"attention_gemm_from 1", 1},    {"attention_gemm_from 0", -1},
            {"attention_gemm_from -5", -1},  {"attention_gemm_from 12.5", -1},
            {"attention_gemm_from", -1},     {"attention_gemm_from 64 128", -1},
            {"attention_gemm_from Never", -1}, {"attention_gemm_from 99999999999999999999", -1}};
  for (size_t i = 0; i < sizeof gf / sizeof gf[0]; i++) {
    char text[512], err[256];
    snprintf(text, sizeof text, "%s%s\n", base, gf[i].line);
    plan_profile q;
    bool ok = plan_profile_parse(text, "t.prof", &q, err, sizeof err);
    CHECK(ok == (gf[i].want >= 0));
    if (ok) CHECK(q.attn_gemm_from == gf[i].want);
    else CHECK(strstr(err, "t.prof:7: ") && strstr(err, "attention_gemm_from"));
    if (ok != (gf[i].want >= 0) || (ok && q.attn_gemm_from != gf[i].want)) fprintf(stderr, "'%s': %s\n", gf[i].line, err);
  }

  /* fitting: duplicates averaged, sorted, clamped to the parser's range, NaN dropped */
  double x[] = {256, 16, 256, 64, 32, 8192};
  double y[] = {0.5, 0.1, 0.7, 2.0, NAN, 0.0};
  plan_curve c = plan_fit_curve(x, y, 6);
  CHECK(c.n == 4);
  CHECK(c.x[0] == 16 && c.x[1] == 64 && c.x[2] == 256 && c.x[3] == 8192);
  CHECK(close_to(c.y[0], 0.1) && c.y[1] == 1 && close_to(c.y[2], 0.6) && c.y[3] == 1e-4);

  /* a collective: times made by plan_coll_time from a known curve fit back to that curve */
  plan_profile p;
  CHECK(plan_profile_builtin("h100", &p));
  double sizes[] = {64 << 10, 1 << 20, 16 << 20, 256 << 20}, secs[4];
  int n = 8;
  double traffic = 2.0 * (n - 1) / n;
  for (int i = 0; i < 4; i++)
    secs[i] = plan_coll_time(&p, PLAN_INTRA, COMM_ALL_REDUCE, sizes[i], traffic * sizes[i]);
  plan_curve e = plan_fit_collective(sizes, secs, 4, traffic, p.link_bw[PLAN_INTRA], p.lat[PLAN_INTRA][COMM_ALL_REDUCE]);
  CHECK(curves_close(&e, &p.eff[PLAN_INTRA][COMM_ALL_REDUCE]));
  /* no slower than the latency: the link's full rate, not a division by zero */
  double at_lat[] = {1e-5};
  plan_curve z = plan_fit_collective(sizes, at_lat, 1, 1, 1e11, 1e-5);
  CHECK(z.n == 1 && z.y[0] == 1);

  /* the closest built-in */
  CHECK(plan_profile_closest("NVIDIA H200") && !strcmp(plan_profile_closest("NVIDIA H200"), "h200"));
  CHECK(plan_profile_closest("NVIDIA A100-SXM4-80GB") && !strcmp(plan_profile_closest("NVIDIA A100-SXM4-80GB"), "a100"));
  CHECK(plan_profile_closest("NVIDIA H100 80GB HBM3") && !strcmp(plan_profile_closest("NVIDIA H100 80GB HBM3"), "h100"));
  CHECK(plan_profile_closest("NVIDIA GeForce RTX 4090") == NULL);
  return check_report("profile_write");
}
