/* progress.c — one status line on stderr while the CPU backend works for long (see ntprt.h).
 *
 * Nothing is printed unless stderr is a terminal, progress has not been turned off, and the
 * work has run for 2 s: short runs, pipes, files and tests see exactly what they saw before.
 * The line is redrawn at most 10 times a second and erased when the work ends, so it never
 * stays between the lines a program prints. The estimate weighs each step by its arithmetic
 * (a GEMM by its multiply-adds, other ops by their elements), because one output-head GEMM
 * can cost as much as a dozen blocks of elementwise ops. */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "ntprt.h"

static int g_enabled = 1;

void ntp_progress_enable(int on) { g_enabled = on; }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void ntp_progress_begin(ntp_progress *p, const char *stage, double total_cost, int32_t n_layers) {
  *p = (ntp_progress){.stage = stage, .total = total_cost > 0 ? total_cost : 1, .n_layers = n_layers};
  p->active = g_enabled && isatty(fileno(stderr));
  if (p->active) p->t0 = now_s();
}

void ntp_progress_update(ntp_progress *p, double cost_done, int32_t layer, const char *layer_name) {
  if (!p->active) return;
  double t = now_s(), el = t - p->t0;
  if (el < 2.0 || t - p->last < 0.1) return;
  p->last = t;
  p->shown = true;
  double frac = cost_done / p->total;
  char left[48] = "";
  if (frac > 0.01 && frac < 1) snprintf(left, sizeof left, ", about %.0f s left", el * (1 - frac) / frac);
  if (layer >= 0)
    fprintf(stderr, "\r%s: layer %d of %d (%s), %.0f%%, %.1f s%s\033[K", p->stage, layer + 1, p->n_layers,
            layer_name ? layer_name : "?", 100 * frac, el, left);
  else
    fprintf(stderr, "\r%s: %.0f%%, %.1f s%s\033[K", p->stage, 100 * frac, el, left);
  fflush(stderr);
}

void ntp_progress_end(ntp_progress *p) {
  if (p->active && p->shown) {
    fputs("\r\033[K", stderr); /* erase the line: what follows starts on a clean one */
    fflush(stderr);
  }
  p->active = false;
}

double ntp_op_cost(const ntp_op *op, const ntp_shape *out, const ntp_shape *a) {
  double n = (double)shape_numel(out);
  switch (op->code) {
  case IR_MATMUL: /* out elements times the contracted length */
    return a && a->ndim ? n * (double)a->dim[a->ndim - 1] : n;
  case IR_ATTENTION: /* q [b][s][h][hd]: every query against every key, twice (scores, values) */
    return a && a->ndim == 4 ? 2.0 * n * (double)a->dim[1] : n;
  case IR_INPUT:
  case IR_PARAM: /* a hash and a rounding per element: some ten elementwise ops' worth */
    return 10 * n;
  default:
    return n;
  }
}
