/* profile_write.c — device profiles as text (the format plan_profile_parse reads, docs/planner.md)
 * and the fits that turn measurements into a profile's curves (ntpc calibrate). */
#include <ctype.h>
#include <math.h>
#include <string.h>

#include "planner.h"

static void note(FILE *out, const char *n) {
  if (n && n[0]) fprintf(out, "  # %s", n);
  fputc('\n', out);
}

static void curve_text(FILE *out, const plan_curve *c) {
  for (int i = 0; i < c->n; i++) fprintf(out, " %.0f:%.4g", c->x[i], c->y[i]);
}

bool plan_profile_write(FILE *out, const plan_profile *p, const plan_profile_notes *nt) {
  static const plan_profile_notes none;
  if (!nt) nt = &none;
  fprintf(out, "# ntp device profile: %s\n", p->device);
  fprintf(out, "# Format: docs/planner.md#profile-format. Units: FLOP/s, bytes, bytes/s, seconds.\n");
  for (const char *h = nt->header; *h;) { /* the header's lines, each a comment */
    size_t n = strcspn(h, "\n");
    fprintf(out, "# %.*s\n", (int)n, h);
    h += n + (h[n] == '\n');
  }
  fprintf(out, "name %s\ndevice %s\n\n", p->name, p->device);
  for (int dt = 0; dt < NTP_DTYPE_COUNT; dt++) {
    if (p->flops[dt] <= 0) continue;
    fprintf(out, "flops %s %.6g", dtype_name((ntp_dtype)dt), p->flops[dt]);
    note(out, nt->flops[dt]);
  }
  if (p->gemm_eff.n) {
    fputs("gemm_efficiency", out);
    curve_text(out, &p->gemm_eff);
    note(out, nt->gemm);
  }
  fprintf(out, "attention_efficiency %.4g", p->attn_eff);
  note(out, nt->attn);
  if (p->attn_gemm_from == PLAN_ATTN_GEMM_NEVER) fputs("attention_gemm_from never", out);
  else if (p->attn_gemm_from > 0) fprintf(out, "attention_gemm_from %lld", (long long)p->attn_gemm_from);
  if (p->attn_gemm_from > 0) note(out, nt->attn_gemm); /* 0: not given, no line (the codegen's default) */
  fprintf(out, "memory_bandwidth %.6g", p->mem_bw);
  note(out, nt->mem_bw);
  fprintf(out, "memory_capacity %.6g", p->mem_capacity);
  note(out, nt->mem_cap);
  fprintf(out, "memory_efficiency %.4g", p->mem_eff);
  note(out, nt->mem_eff);
  fprintf(out, "kernel_launch %.6g", p->launch);
  note(out, nt->launch);
  static const char *const levels[PLAN_NLEVELS] = {"intra", "inter"};
  fputc('\n', out);
  for (int lv = 0; lv < PLAN_NLEVELS; lv++) {
    fprintf(out, "link %s %.6g", levels[lv], p->link_bw[lv]);
    note(out, nt->link[lv]);
  }
  fputc('\n', out);
  for (int lv = 0; lv < PLAN_NLEVELS; lv++)
    for (int c = 0; c < PLAN_NCOLLS; c++) {
      if (!p->eff[lv][c].n) continue; /* unpriced: the parser's default */
      fprintf(out, "collective %s %-15s %.6g", levels[lv], plan_coll_name((plan_coll)c), p->lat[lv][c]);
      curve_text(out, &p->eff[lv][c]);
      note(out, nt->coll[lv][c]);
    }
  return !ferror(out);
}

static double clamp_fraction(double y) {
  if (!(y >= 1e-4)) return 1e-4; /* also NaN */
  return y > 1 ? 1 : y;
}

plan_curve plan_fit_curve(const double *x, const double *y, int n) {
  plan_curve c = {0};
  double sum[PLAN_CURVE_MAX] = {0};
  int count[PLAN_CURVE_MAX] = {0};
  for (int i = 0; i < n; i++) {
    if (!(x[i] > 0) || !isfinite(y[i])) continue;
    int k = 0;
    while (k < c.n && c.x[k] != x[i]) k++;
    if (k == c.n) {
      if (c.n == PLAN_CURVE_MAX) continue;
      c.x[c.n++] = x[i];
    }
    sum[k] += y[i];
    count[k]++;
  }
  for (int k = 0; k < c.n; k++) c.y[k] = clamp_fraction(sum[k] / count[k]);
  for (int i = 1; i < c.n; i++) /* insertion sort by x */
    for (int j = i; j > 0 && c.x[j - 1] > c.x[j]; j--) {
      double tx = c.x[j], ty = c.y[j];
      c.x[j] = c.x[j - 1], c.y[j] = c.y[j - 1];
      c.x[j - 1] = tx, c.y[j - 1] = ty;
    }
  return c;
}

plan_curve plan_fit_collective(const double *bytes, const double *seconds, int n, double traffic, double link_bw,
                               double latency) {
  double x[PLAN_CURVE_MAX], y[PLAN_CURVE_MAX];
  int k = 0;
  for (int i = 0; i < n && k < PLAN_CURVE_MAX; i++) {
    double rest = seconds[i] - latency; /* the part of the time that moves bytes */
    x[k] = bytes[i];
    y[k++] = rest > 0 ? traffic * bytes[i] / (rest * link_bw) : 1; /* no slower than the latency: the link's rate */
  }
  return plan_fit_curve(x, y, k);
}

const char *plan_profile_closest(const char *device) {
  char low[128];
  size_t i = 0;
  for (; device[i] && i + 1 < sizeof low; i++) low[i] = (char)tolower((unsigned char)device[i]);
  low[i] = 0;
  for (const char *const *n = plan_profile_names(); *n; n++)
    if (strstr(low, *n)) return *n;
  return NULL;
}
