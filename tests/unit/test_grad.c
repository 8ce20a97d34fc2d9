/* test_grad.c — every backward rule of the gradient pass (compiler/grad/) against central finite
 * differences of the loss, on the CPU reference in fp32, with random (never zero) parameters and
 * inputs. Each model isolates a group of ops; every parameter is probed at up to PROBES
 * elements: (loss(p + h) - loss(p - h)) / 2h against the gradient the backward ops compute.
 * Prints a table: model, parameter, elements probed, the worst error and where. The bound
 * |fd - g| <= ATOL + RTOL |g| allows fp32 rounding of the loss over 2h (about 1e-4) and the
 * h^2 term; a wrong rule is off by O(|g|) (a softmax_grad without its row sum, or gelu's
 * derivative without its second term, fails it: docs/training.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ntpc.h"
#include "ntprt.h"
#include "session_program.h"

enum { PROBES = 6 };
static const double H = 2e-3, ATOL = 4e-4, RTOL = 2e-2;

static const struct {
  const char *name, *src;
} models[] = {
    {"elementwise", /* mul, sub, div, exp, tanh, sigmoid, neg, relu, silu, gelu, broadcasting, a linear with bias */
     "model ew {\n"
     "  dim B = 2, S = 3, D = 6, V = 5;\n"
     "  dtype fp32;\n"
     "  input x : fp32[B, S, D];\n"
     "  input targets : i32[B, S];\n"
     "  param a : fp32[D];\n"
     "  param c : fp32[S, 1];\n"
     "  h = (x * a - c) / (exp(a) + 2);\n"
     "  h = tanh(h) + sigmoid(-h) * relu(h + 0.5) + silu(x / (c + 3));\n"
     "  logits = proj: linear(gelu(h), out = V, bias = true);\n"
     "  output loss = cross_entropy(logits, targets);\n"
     "}\n"},
    {"transformer", /* embedding + positions, layernorm, rmsnorm, attention (causal, bias, GQA, RoPE), MLPs, softmax, tied head, ignore */
     "model tf {\n"
     "  dim B = 2, S = 5, D = 16, H = 4, V = 11;\n"
     "  dtype fp32;\n"
     "  input tokens : i32[B, S];\n"
     "  input targets : i32[B, S];\n"
     "  x = embed: embedding(tokens, vocab = V, dim = D, positions = S);\n"
     "  h = ln1: layernorm(x);\n"
     "  x = x + attn: attention(h, heads = H, causal, bias = true);\n"
     "  h = n2: rmsnorm(x);\n"
     "  x = x + at2: attention(h, heads = H, kv_heads = 2, rope = 10000, causal);\n"
     "  h = n3: rmsnorm(x);\n"
     "  x = x + mlp: mlp(h, hidden = 24, act = swiglu);\n"
     "  h = ln4: layernorm(x);\n"
     "  x = x + mlp2: mlp(h, hidden = 20, act = gelu, bias = true);\n"
     "  x = softmax(x) * 3 + x;\n"
     "  logits = head: linear(x, out = V, tied = embed);\n"
     "  output loss = cross_entropy(logits, targets, ignore = 3);\n"
     "}\n"},
    {"matmul", /* batched and shared right operands, a 4-D batch */
     "model mm {\n"
     "  dim B = 2, G = 2, M = 3, K = 4, N = 5;\n"
     "  dtype fp32;\n"
     "  input a : fp32[B, G, M, K];\n"
     "  input targets : i32[B, G, M];\n"
     "  param w : fp32[B, G, K, N];\n"
     "  param u : fp32[K, N];\n"
     "  output loss = cross_entropy(a @ w + a @ u, targets);\n"
     "}\n"},
};
enum { NMODELS = sizeof models / sizeof models[0] };

static double loss_of(const ntp_module *m, const ntp_host_tensor *const *given) {
  ntp_cpu_result r;
  char err[256];
  if (ntp_cpu_run_given(m, 5, 0, NULL, given, &r, err, sizeof err) != 0) {
    fprintf(stderr, "run: %s\n", err);
    exit(1);
  }
  double l = r.outputs[0].f[0];
  ntp_cpu_result_free(&r);
  return l;
}

static int check_model(int k) {
  ntpc_session *s = ntpc_session_new();
  ntpc_want_grad(s, true);
  if (ntpc_compile_string(s, models[k].name, models[k].src) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    return 1;
  }
  char err[256];
  ntp_program *p = session_program(s, err, sizeof err);
  if (!p) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  const ntp_module *m = &p->global;
  ntp_cpu_result base;
  if (ntp_cpu_run_given(m, 5, 1, NULL, NULL, &base, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  /* every input and parameter given, as the base run initialised them */
  const ntp_host_tensor **given = calloc(m->n_values, sizeof *given);
  for (size_t i = 0, ki = 0, kp = 0; i < m->n_ops; i++) {
    if (m->ops[i].code == IR_INPUT) given[m->ops[i].result] = &base.inputs[ki++];
    if (m->ops[i].code == IR_PARAM) given[m->ops[i].result] = &base.params[kp++];
  }
  int bad = 0;
  for (size_t pi = 0; pi < base.n_params; pi++) {
    ntp_host_tensor *pt = &base.params[pi];
    char gname[256];
    snprintf(gname, sizeof gname, "grad.%s", pt->name);
    const ntp_host_tensor *g = NULL;
    for (size_t o = 0; o < base.n_outputs; o++)
      if (!strcmp(base.outputs[o].name, gname)) g = &base.outputs[o];
    CHECK(g != NULL);
    if (!g) continue;
    int64_t n = shape_numel(&pt->shape);
    double worst = 0, gmax = 0;
    int64_t at = -1;
    for (int64_t e = 0; e < n; e++) gmax = fmax(gmax, fabs(g->f[e]));
    int probes = n < PROBES ? (int)n : PROBES;
    for (int j = 0; j < probes; j++) {
      int64_t e = (int64_t)((uint64_t)(j * 2654435761u + pi * 40503u) % (uint64_t)n);
      float keep = pt->f[e];
      pt->f[e] = keep + (float)H;
      double lp = loss_of(m, given);
      pt->f[e] = keep - (float)H;
      double lm = loss_of(m, given);
      pt->f[e] = keep;
      double fd = (lp - lm) / ((double)(keep + (float)H) - (double)(keep - (float)H));
      double err_e = fabs(fd - g->f[e]), allowed = ATOL + RTOL * fabs(g->f[e]);
      if (err_e / allowed > worst) worst = err_e / allowed, at = e;
    }
    bool ok = worst <= 1.0;
    bad += !ok;
    printf("%-12s %-22s %3d of %6lld  max|g| %.3e  worst error %.2f of the bound (element %lld)  %s\n", models[k].name,
           pt->name, probes, (long long)n, gmax, worst, (long long)at, ok ? "ok" : "FAIL");
  }
  free(given);
  ntp_cpu_result_free(&base);
  ntp_program_free(p);
  ntpc_session_free(s);
  return bad;
}

int main(void) {
  int bad = 0;
  for (int k = 0; k < NMODELS; k++) bad += check_model(k);
  CHECK(bad == 0);
  return check_report("grad");
}
