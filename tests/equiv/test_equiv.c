/* test_equiv.c — the proof of equivalence: random (model, plan) cases, each sharded run
 * compared element by element with the unsharded CPU reference.
 *
 *   test_equiv [--cases N] [--seed S] [--verbose] [--train | --pipeline] [--zero]
 *
 * --train: every case a transformer stack (fp32) with a cross-entropy loss, compiled with its
 * gradient pass; the sharded loss and every gradient (the sharded backward) against the
 * reference's, then 3 AdamW steps on each side: losses, parameters and the optimizer's state
 * (masters, moments) within 1e-5.
 *
 * --zero: training cases (with --pipeline, pipelined ones) under the distributed optimizer: ZeRO-1
 * or 2, each part on 1 to 3 owners, failure domains of 1 to 4 GPUs.
 *
 * --pipeline: training cases with pipeline stages (1 to 4 rank sets, uneven layer splits,
 * interleaved chunks, one or two replicas staged differently), non-uniform TP inside each stage,
 * 1 to 8 micro-batches and every schedule (GPipe, 1F1B, interleaved 1F1B, ZB-H1), recompute, SP.
 *
 * Case i uses seed S + i. A failing case prints its seed, its model and plan, and the
 * command that re-runs it alone. Half the cases are transformer stacks (random degrees,
 * unequal groups, uneven splits, sequence parallelism, batch shares, worlds 1..8); the
 * other half are explicit-layout matmul chains on random meshes with requested layouts.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ntpc.h"
#include "session_program.h"
#include "ntprt.h"
#include "shard.h"

#include "rng.h"
#include "train_compare.h"

static bool train_mode; /* --train */
static bool pipe_mode;  /* --pipeline */
static bool zero_mode;  /* --zero */
static int case_domain; /* the case's failure domain size (zero mode) */
static int case_mb;           /* the case's micro-batches (pipeline mode) */
static const char *case_sched; /* and its schedule */

typedef struct text {
  char buf[16384];
  size_t n;
} text;

static void put(text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(t->buf + t->n, sizeof t->buf - t->n, fmt, ap);
  va_end(ap);
  if (k > 0) t->n += (size_t)k;
  if (t->n >= sizeof t->buf) t->n = sizeof t->buf - 1;
}

/* A TP spec for a world of W ranks: a uniform degree that divides W, or unequal groups. */
static void put_tp(text *t, rng *r, int W, int maxgroup, int S, bool *sp_ok) {
  int groups[8], ng = 0;
  if (chance(r, 50)) {
    int divs[8], nd = 0;
    for (int d = 1; d <= W; d++)
      if (W % d == 0 && d <= maxgroup) divs[nd++] = d;
    int d = divs[uni(r, 0, nd - 1)];
    put(t, "tp %d", d);
    for (int i = 0; i < W / d; i++) groups[ng++] = d;
  } else {
    int left = W;
    while (left > 0) {
      int g = uni(r, 1, left < maxgroup ? left : maxgroup);
      groups[ng++] = g;
      left -= g;
    }
    if (ng == 1) put(t, "tp %d", groups[0]);
    else {
      put(t, "tp (");
      for (int i = 0; i < ng; i++) put(t, "%s%d", i ? ", " : "", groups[i]);
      put(t, ")");
    }
  }
  int biggest = 0;
  for (int i = 0; i < ng; i++) biggest = groups[i] > biggest ? groups[i] : biggest;
  *sp_ok = S >= biggest;
  if (*sp_ok && chance(r, 30)) put(t, ", sequence_parallel");
  if (ng > 1 && chance(r, 30)) {
    put(t, ", batch (");
    for (int i = 0; i < ng; i++) put(t, "%s%d", i ? ", " : "", uni(r, 1, 5));
    put(t, ")");
  }
  if (train_mode && chance(r, 20)) put(t, ", recompute"); /* the backward on recomputed activations */
}

/* ---- transformer stacks ------------------------------------------------------------ */

static int gen_transformer(rng *r, text *t) {
  int W = uni(r, 1, 8);
  bool bf16 = chance(r, 20) && !train_mode;
  const char *dt = bf16 ? "bf16" : "fp32";
  int Hs[] = {8, 12, 16}, H = Hs[uni(r, 0, 2)];
  int kvs[6], nk = 0;
  for (int k = 1; k <= H; k++)
    if (H % k == 0 && nk < 6) kvs[nk++] = k;
  int KV = kvs[uni(r, 0, nk - 1)];
  bool explicit_hd = chance(r, 25);
  int HD = 2 * uni(r, 1, 2), D = explicit_hd ? uni(r, 8, 30) : H * HD;
  int F = uni(r, 8, 40), V = uni(r, 8, 48), B = uni(r, 1, 9), S = uni(r, 1, 8), L = uni(r, 1, 2);
  bool tokens = chance(r, 60), positions = tokens && chance(r, 50), tied = tokens && chance(r, 50);
  bool rope = chance(r, 40), causal = chance(r, 60), abias = chance(r, 30), mbias = chance(r, 30);
  bool with_lin = chance(r, 30), rms = chance(r, 50), second_out = chance(r, 30);
  const char *acts[] = {"gelu", "relu", "silu", "swiglu", "geglu"}, *act = acts[uni(r, 0, 4)];
  int OUT = uni(r, 8, 24);

  put(t, "model m {\n  dim B = %d, S = %d, D = %d, F = %d, V = %d;\n  dtype %s;\n", B, S, D, F, V, dt);
  if (train_mode) put(t, "  input targets : i32[B, S];\n");
  if (tokens) {
    put(t, "  input tokens : i32[B, S];\n");
    put(t, "  x = embed: embedding(tokens, vocab = V, dim = D%s);\n", positions ? ", positions = S + 2" : "");
  } else {
    put(t, "  input x : %s[B, S, D];\n", dt);
  }
  put(t, "  repeat %d as blk {\n", L);
  put(t, "    h = n1: %s(x);\n", rms ? "rmsnorm" : "layernorm");
  put(t, "    x = x + attn: attention(h, heads = %d, kv_heads = %d", H, KV);
  if (explicit_hd) put(t, ", head_dim = %d", HD);
  if (rope) put(t, ", rope = 10000");
  if (causal) put(t, ", causal");
  if (abias) put(t, ", bias = true");
  put(t, ");\n    h = n2: %s(x);\n", rms ? "rmsnorm" : "layernorm");
  put(t, "    x = x + ffn: mlp(h, hidden = F, act = %s%s);\n", act, mbias ? ", bias = true" : "");
  if (with_lin) put(t, "    x = lin: linear(x, out = D%s);\n", chance(r, 50) ? ", bias = true" : "");
  put(t, "  }\n");
  if (second_out) put(t, "  output x;\n");
  const char *lo = train_mode ? "logits" : "output logits";
  if (tied) put(t, "  %s = head: linear(x, out = V, tied = embed);\n", lo);
  else put(t, "  %s = head: linear(x, out = %d%s);\n", lo, OUT, chance(r, 50) ? ", bias = true" : "");
  if (train_mode) put(t, "  output loss = cross_entropy(logits, targets);\n");
  put(t, "}\n");

  /* the plan: a default rule, then more specific ones (later and more specific win) */
  int maxgroup = 8;
  bool sp;
  put(t, "plan p for m {\n  world %d;\n  * ", W);
  put_tp(t, r, W, maxgroup, S, &sp);
  put(t, ";\n");
  const char *pats[] = {"blk.*.attn", "blk.*.ffn", "blk.0.attn", "blk.0.ffn", "head", "embed", "blk.*.n1", "blk.*.lin"};
  for (int i = 0; i < 8; i++) {
    if (!chance(r, 45)) continue;
    if (i == 5 && !tokens) continue;
    if (i == 7 && !with_lin) continue;
    put(t, "  %s ", pats[i]);
    put_tp(t, r, W, maxgroup, S, &sp);
    put(t, ";\n");
  }
  if (L > 1 && chance(r, 40)) {
    put(t, "  blk.1.attn ");
    put_tp(t, r, W, maxgroup, S, &sp);
    put(t, ";\n");
  }
  put(t, "}\n");
  return W;
}

/* ---- pipelines ------------------------------------------------------------------------- */

/* A TP spec valid on every stage size in sizes[0..n): groups for one size, else a common divisor. */
static void put_stage_tp(text *t, rng *r, const int *sizes, int n, int S) {
  bool same = true, sp;
  for (int i = 1; i < n; i++) same &= sizes[i] == sizes[0];
  if (same) {
    put_tp(t, r, sizes[0], 8, S, &sp);
    return;
  }
  int g = sizes[0];
  for (int i = 1; i < n; i++)
    for (int b = sizes[i]; b;) {
      int m = g % b;
      g = b;
      b = m;
    }
  int d = 1;
  for (int k = 1; k <= g; k++)
    if (g % k == 0 && chance(r, 50)) d = k;
  put(t, "tp %d", d);
  if (chance(r, 20)) put(t, ", recompute");
}

static int gen_pipeline(rng *r, text *t) {
  int H = 4 * uni(r, 1, 2), KV = chance(r, 50) ? H : H / 2, HD = 2 * uni(r, 1, 2), D = H * HD;
  int F = uni(r, 8, 24), V = uni(r, 8, 32), B = uni(r, 2, 10), S = uni(r, 2, 6), L = uni(r, 1, 3);
  bool rope = chance(r, 50), rms = chance(r, 50), tied = chance(r, 50), lin = chance(r, 30);
  const char *acts[] = {"gelu", "swiglu", "relu"}, *act = acts[uni(r, 0, 2)];
  const char *names[32];
  char buf[32][24];
  int nl = 0;
  snprintf(buf[nl], 24, "embed"), names[nl] = buf[nl], nl++;
  for (int b = 0; b < L; b++) {
    const char *parts[] = {"n1", "attn", "n2", "ffn", "lin"};
    for (int k = 0; k < (lin ? 5 : 4); k++) snprintf(buf[nl], 24, "blk.%d.%s", b, parts[k]), names[nl] = buf[nl], nl++;
  }
  snprintf(buf[nl], 24, "nf"), names[nl] = buf[nl], nl++;
  snprintf(buf[nl], 24, "head"), names[nl] = buf[nl], nl++;
  put(t, "model m {\n  dim B = %d, S = %d, D = %d, F = %d, V = %d;\n  dtype fp32;\n", B, S, D, F, V);
  put(t, "  input tokens : i32[B, S];\n  input targets : i32[B, S];\n");
  put(t, "  x = embed: embedding(tokens, vocab = V, dim = D);\n  repeat %d as blk {\n", L);
  put(t, "    h = n1: %s(x);\n    x = x + attn: attention(h, heads = %d, kv_heads = %d%s, causal);\n",
      rms ? "rmsnorm" : "layernorm", H, KV, rope ? ", rope = 10000" : "");
  put(t, "    h = n2: %s(x);\n    x = x + ffn: mlp(h, hidden = F, act = %s);\n", rms ? "rmsnorm" : "layernorm", act);
  if (lin) put(t, "    x = lin: linear(x, out = D, bias = true);\n");
  put(t, "  }\n  x = nf: %s(x);\n", rms ? "rmsnorm" : "layernorm");
  put(t, "  logits = head: linear(x, out = V%s);\n", tied ? ", tied = embed" : "");
  put(t, "  output loss = cross_entropy(logits, targets);\n}\n");

  /* pipelines: P rank sets of 1..3 ranks, v chunks each (interleaved when 2), layers split unevenly */
  int npipes = chance(r, 25) ? 2 : 1, P = uni(r, 1, 4), v = P > 1 && nl >= 2 * P && chance(r, 30) ? 2 : 1;
  int W = 0, stage_of[2][32], size_of[2][8], set_lo[2][8];
  for (int q = 0; q < npipes; q++) {
    int nst = P * v, cut[33];
    /* nst - 1 distinct cut points in 1..nl-1 */
    for (int c = 0; c < nst - 1; c++) {
      int x;
      bool dup;
      do {
        x = uni(r, 1, nl - 1);
        dup = false;
        for (int k = 0; k < c; k++) dup |= cut[k] == x;
      } while (dup);
      cut[c] = x;
    }
    for (int a = 0; a < nst - 1; a++) /* sorted */
      for (int b = a + 1; b < nst - 1; b++)
        if (cut[b] < cut[a]) { int x = cut[a]; cut[a] = cut[b]; cut[b] = x; }
    for (int i = 0; i < P; i++) size_of[q][i] = uni(r, 1, 3), set_lo[q][i] = W, W += size_of[q][i];
    int at = 0;
    for (int c = 0; c < nst; c++) {
      int end = c < nst - 1 ? cut[c] : nl;
      for (int l = at; l < end; l++) stage_of[q][l] = c % P;
      at = end;
    }
  }
  put(t, "plan p for m {\n  world %d;\n", W);
  for (int q = 0; q < npipes; q++) {
    if (npipes > 1) put(t, "  pipeline {\n");
    int c = 0;
    for (int l = 0; l < nl;) {
      int e = l; /* this chunk: layers l..e */
      while (e + 1 < nl && stage_of[q][e + 1] == stage_of[q][l]) e++;
      int i = stage_of[q][l];
      put(t, "  stage %s .. %s ranks %d..%d;\n", names[l], names[e], set_lo[q][i], set_lo[q][i] + size_of[q][i] - 1);
      l = e + 1;
      c++;
    }
    if (npipes > 1) put(t, "  }\n");
  }
  for (int l = 0; l < nl; l++) {
    if (strstr(names[l], ".n") || !strcmp(names[l], "nf") || !chance(r, 80)) continue;
    int sizes[2];
    for (int q = 0; q < npipes; q++) sizes[q] = size_of[q][stage_of[q][l]];
    put(t, "  %s ", names[l]);
    put_stage_tp(t, r, sizes, npipes, S);
    put(t, ";\n");
  }
  put(t, "}\n");
  /* micro-batches and a schedule that suits the chunks */
  case_mb = uni(r, 1, 8);
  if (v > 1) {
    if (chance(r, 70)) case_mb = P * uni(r, 1, 8 / P < 1 ? 1 : 8 / P), case_sched = "interleaved";
    else case_sched = "gpipe";
  } else {
    const char *k[] = {"gpipe", "1f1b", "zb-h1"};
    case_sched = k[uni(r, 0, 2)];
  }
  put(t, "// --micro-batches %d --schedule %s\n", case_mb, case_sched);
  return W;
}

/* ---- explicit layouts ----------------------------------------------------------------- */

static const char *axis_spec(rng *r, int R, int C, uint8_t *used, int size) {
  /* a random set of unused axes whose combined size fits the dim */
  static const char *names[] = {"", "{r}", "{c}", "{r, c}"};
  for (int tries = 0; tries < 8; tries++) {
    int k = uni(r, 0, 3);
    if (k & *used) continue;
    int parts = (k & 1 ? R : 1) * (k & 2 ? C : 1);
    if (parts > size) continue;
    *used |= (uint8_t)k;
    return names[k];
  }
  return "";
}

static int gen_layouts(rng *r, text *t) {
  static const int shapes[][2] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {1, 3}, {3, 1}, {1, 4}, {4, 1},
                                  {2, 3}, {3, 2}, {1, 5}, {1, 6}, {1, 7}, {2, 4}, {4, 2}, {1, 8}};
  int pick = uni(r, 0, 15), R = shapes[pick][0], C = shapes[pick][1];
  bool bf16 = chance(r, 20) && !train_mode;
  const char *dt = bf16 ? "bf16" : "fp32";
  int M = uni(r, 8, 14), K = uni(r, 8, 14), N = uni(r, 8, 14), P = uni(r, 8, 14);
  put(t, "model m {\n  dim M = %d, K = %d, N = %d, P = %d;\n  dtype %s;\n  mesh g = %d x %d (r, c);\n", M, K, N, P, dt,
      R, C);
  uint8_t u = 0;
  const char *a0 = axis_spec(r, R, C, &u, M), *a1 = axis_spec(r, R, C, &u, K);
  put(t, "  input a : %s[M%s, K%s];\n", dt, a0, a1);
  /* w: sometimes diagonal (rows over r, columns over c) */
  if (R > 1 && C > 1 && chance(r, 30)) {
    put(t, "  param w : %s[K{r}, N{c}] diagonal;\n", dt);
  } else {
    u = 0;
    a0 = axis_spec(r, R, C, &u, K);
    a1 = axis_spec(r, R, C, &u, N);
    put(t, "  param w : %s[K%s, N%s];\n", dt, a0, a1);
  }
  put(t, "  y = a @ w;\n");
  if (chance(r, 40)) {
    u = 0;
    put(t, "  param bias : %s[N%s];\n  y = gelu(y + bias);\n", dt, axis_spec(r, R, C, &u, N));
  }
  u = 0;
  a0 = axis_spec(r, R, C, &u, N);
  a1 = axis_spec(r, R, C, &u, P);
  put(t, "  param v : %s[N%s, P%s];\n", dt, a0, a1);
  put(t, "  output z = y @ v");
  if (chance(r, 60)) {
    u = 0;
    a0 = axis_spec(r, R, C, &u, M);
    a1 = axis_spec(r, R, C, &u, P);
    put(t, " -> [M%s, P%s]", a0, a1);
  }
  put(t, ";\n}\nplan p for m {\n  world %d;\n}\n", R * C);
  return R * C;
}

/* ---- one case ----------------------------------------------------------------------------- */

/* --zero: the plan's last line an 'optimizer zero Z redundancy K' (ZeRO-1 or 2, 1 to 3 copies of each
 * part), and failure domains of 0 (each GPU) to 4 GPUs. */
static void add_optimizer(rng *r, text *t) {
  char *close = strrchr(t->buf, '}'), rest[256]; /* the plan's closing brace (a comment may follow) */
  snprintf(rest, sizeof rest, "%s", close ? close : "}\n");
  if (close) t->n = (size_t)(close - t->buf), t->buf[t->n] = 0;
  put(t, "  optimizer zero %d redundancy %d;\n%s", uni(r, 1, 2), uni(r, 1, 3), rest);
  case_domain = uni(r, 0, 4);
}

typedef struct outcome {
  int ok;
  double worst; /* max relative error over outputs */
  char why[512];
} outcome;

static outcome run_case(const char *source, int W) {
  outcome oc = {0, 0, ""};
  ntpc_session *s = ntpc_session_new();
  ntpc_select_plan(s, "p");
  ntpc_set_world(s, W);
  ntpc_want_grad(s, train_mode);
  if (pipe_mode) ntpc_set_pipeline(s, case_mb, case_sched);
  if (zero_mode) ntpc_set_domain_size(s, case_domain);
  if (ntpc_compile_string(s, "case.ntp", source) != NTPC_OK) {
    size_t n = 0;
    for (size_t i = 0; i < ntpc_diag_count(s) && n < sizeof oc.why - 1; i++) {
      const ntpc_diag *d = ntpc_diag_at(s, i);
      n += (size_t)snprintf(oc.why + n, sizeof oc.why - n, "%d:%d: %s; ", d->line, d->col, d->message);
    }
    ntpc_session_free(s);
    return oc;
  }
  ntp_cpu_result ref, got;
  char err[256];
  ntp_program *p = session_program(s, err, sizeof err); /* the program as the runtime reads it */
  if (!p) {
    snprintf(oc.why, sizeof oc.why, "program image: %s", err);
  } else if (ntp_cpu_run(&p->global, 11, 0, &ref, err, sizeof err) != 0) {
    snprintf(oc.why, sizeof oc.why, "reference run: %s", err);
  } else if (ntp_sim_run(p, 11, &got, err, sizeof err) != 0) {
    snprintf(oc.why, sizeof oc.why, "sharded run: %s", err);
    ntp_cpu_result_free(&ref);
  } else if (train_mode) { /* the loss and every gradient, then 3 AdamW steps on each side */
    const char *where = "?";
    double e = worst_error(&got, &ref, &where), lw, pw;
    size_t skipped;
    ntp_program unsharded = *p; /* the same image's module, on the CPU reference */
    unsharded.world = 0;
    oc.worst = e;
    if (!(e <= 1e-5)) {
      snprintf(oc.why, sizeof oc.why, "%s: max relative error %.3g > 1e-5", where, e);
    } else if (adamw_compare(&unsharded, p, 3, &lw, &pw, &skipped, err, sizeof err) != 0) {
      snprintf(oc.why, sizeof oc.why, "training: %s", err);
    } else if (!(lw <= 1e-5 && pw <= 1e-5)) {
      snprintf(oc.why, sizeof oc.why, "3 AdamW steps: losses within %.3g, parameters and state within %.3g (> 1e-5)",
               lw, pw);
    } else {
      oc.ok = 1;
      if (pw > oc.worst) oc.worst = pw;
    }
    ntp_cpu_result_free(&ref);
    ntp_cpu_result_free(&got);
  } else {
    oc.ok = 1;
    for (size_t o = 0; o < ref.n_outputs; o++) {
      double e = ntp_max_rel_error(&got.outputs[o], &ref.outputs[o]);
      /* fp32: only the order of sums differs; bf16: partial sums are rounded before reduction */
      double tol = ref.outputs[o].dtype == NTP_FP32 ? 1e-5 : 5e-2;
      if (e > oc.worst) oc.worst = e;
      if (!(e <= tol)) {
        oc.ok = 0;
        snprintf(oc.why, sizeof oc.why, "output %s: max relative error %.3g > %.0e", ref.outputs[o].name, e, tol);
      }
    }
    ntp_cpu_result_free(&ref);
    ntp_cpu_result_free(&got);
  }
  ntp_program_free(p);
  ntpc_session_free(s);
  return oc;
}

int main(int argc, char **argv) {
  long cases = 600;
  uint64_t seed = 1;
  bool verbose = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--cases") && i + 1 < argc) cases = atol(argv[++i]);
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--verbose")) verbose = true;
    else if (!strcmp(argv[i], "--train")) train_mode = true;
    else if (!strcmp(argv[i], "--pipeline")) train_mode = pipe_mode = true;
    else if (!strcmp(argv[i], "--zero")) train_mode = zero_mode = true;
    else {
      fprintf(stderr, "usage: test_equiv [--cases N] [--seed S] [--verbose] [--train | --pipeline] [--zero]\n");
      return 2;
    }
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long passed = 0, failed = 0, worlds[33] = {0}, layouts = 0;
  double worst32 = 0;
  for (long c = 0; c < cases; c++) {
    uint64_t cs = seed + (uint64_t)c;
    rng r = {cs * 0x2545f4914f6cdd1dull + 1};
    text t = {.n = 0};
    bool lay = cs % 2 == 1 && !train_mode;
    int W = pipe_mode ? gen_pipeline(&r, &t) : lay ? gen_layouts(&r, &t) : gen_transformer(&r, &t);
    if (zero_mode) add_optimizer(&r, &t);
    outcome oc = run_case(t.buf, W);
    worlds[W]++;
    layouts += lay;
    if (oc.ok) {
      passed++;
      if (!strstr(t.buf, "bf16") && oc.worst > worst32) worst32 = oc.worst;
      if (verbose) printf("case %" PRIu64 ": world %d, ok, max rel err %.3g\n%s\n", cs, W, oc.worst, t.buf);
    } else {
      failed++;
      printf("FAIL case seed %" PRIu64 " (world %d): %s\n--- model and plan ---\n%s--- re-run alone: test_equiv "
             "--seed %" PRIu64 " --cases 1 --verbose%s\n",
             cs, W, oc.why, t.buf, cs, pipe_mode ? (zero_mode ? " --pipeline --zero" : " --pipeline")
                                       : zero_mode ? " --zero" : train_mode ? " --train" : "");
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  printf("equivalence%s: %ld cases (%ld transformer stacks, %ld explicit-layout chains), seeds %" PRIu64 "..%" PRIu64
         ", %.2f s\n",
         train_mode ? " of training (loss, gradients, 3 AdamW steps)" : "", cases, cases - layouts, layouts, seed, seed + (uint64_t)cases - 1, secs);
  printf("worlds:");
  for (int w = 1; w <= 32; w++)
    if (worlds[w] || w <= 8) printf(" %d:%ld", w, worlds[w]);
  printf("\nworst fp32 max relative error among passing cases: %.3g\n", worst32);
  printf("%ld passed, %ld failed\n", passed, failed);
  return failed ? 1 : 0;
}
