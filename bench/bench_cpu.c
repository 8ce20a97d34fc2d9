/* bench_cpu.c — the CPU backend against PyTorch CPU eager and NumPy's matmul.
 *
 *   build/bench/bench_cpu [--quick] [--repeats N] [--threads N] [--python PY] [--case NAME]...
 *
 * Cases: gpt2_b1s128 and gpt2_b4s256 (GPT-2 124M, full width and vocabulary, 12 blocks) and
 * llama3_l2 (the Llama-3 8B architecture at 2 blocks, B=1, S=128), plus sim_mixed8: GPT-2 at
 * B=8, S=64 with examples/plans/gpt2_mixed8.ntp, 8 simulated ranks against the unsharded run.
 * --quick runs gpt2_b1s128 and sim_mixed8 only. --threads N gives both sides N threads (on a
 * machine busy with other work, one thread each compares the code rather than how each
 * side's threads wait for a core). Run from the source root.
 *
 * Per case it prints the median forward time of `ntp_cpu_run` (the initialisation excluded, as
 * `ntpc run` reports it), the model's FLOPs over that time, and:
 *   - torch: the median forward of transformers' model with the same configuration, fp32,
 *     eager, under torch.inference_mode(), in a child process (bench/bench_cpu_ref.py serve),
 *     each of its forwards right after one of ntp's — the column says "-" when PY cannot
 *     import torch and transformers;
 *   - GEMM: ntp's GEMM throughput (ntp_cpu_matmul) and NumPy's (np.matmul in the same child)
 *     on the model's own GEMM shapes, each weighted by how often the model runs it, the two
 *     timed alternately in bursts of the shape's calls (its BLAS throughput, not the wake-up of
 *     idle threads), and ntp's share of NumPy's.
 *     A line per shape gives both sides' GFLOP/s and the share, so a low total can be traced.
 * The child runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from its environment
 * (they may be set on machines whose OpenBLAS misbehaves; they would slow NumPy's), and prints
 * the BLAS threadpoolctl sees. Every ratio is measured within one run of this program, with
 * the two sides interleaved; the load average is printed first, since on a shared machine the
 * absolute figures follow it.
 * Exit 0, 1 when a model fails to compile or run. Not a CTest test. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_kernels.h"
#include "ntpc.h"
#include "ntprt.h"
#include "session_program.h"

typedef struct bcase {
  const char *name, *file, *plan;
  const char *defines[8];
  const char *torch_args; /* model B S L for bench_cpu_ref.py */
} bcase;

static const bcase cases[] = {
    {"gpt2_b1s128", "examples/gpt2.ntp", NULL, {"B=1", "S=128"}, "gpt2 1 128 12"},
    {"gpt2_b4s256", "examples/gpt2.ntp", NULL, {"B=4", "S=256"}, "gpt2 4 256 12"},
    {"llama3_l2", "examples/llama3_8b.ntp", NULL, {"B=1", "S=128", "L=2"}, "llama 1 128 2"},
    {"sim_mixed8", "examples/gpt2.ntp", "examples/plans/gpt2_mixed8.ntp", {"B=8", "S=64"}, NULL},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- the model's GEMMs, from the IR ---- */

typedef struct gemm {
  int64_t batch, m, k, n;
  bool trans_b, shared_b;
  int64_t count;
} gemm;

typedef struct gemms {
  gemm *v;
  size_t n, cap;
  double flops;      /* all matmuls */
  double attn_flops; /* QK^T and PV: the entries a causal mask leaves */
} gemms;

static void add_gemm(gemms *g, gemm x) {
  for (size_t i = 0; i < g->n; i++) {
    gemm *y = &g->v[i];
    if (y->batch == x.batch && y->m == x.m && y->k == x.k && y->n == x.n && y->trans_b == x.trans_b &&
        y->shared_b == x.shared_b) {
      y->count++;
      return;
    }
  }
  if (g->n == g->cap) {
    g->cap = g->cap ? 2 * g->cap : 16;
    g->v = realloc(g->v, g->cap * sizeof *g->v);
    if (!g->v) exit(2);
  }
  x.count = 1;
  g->v[g->n++] = x;
}

/* The same shapes ntp_exec_op hands to ntp_cpu_matmul. */
static void collect_gemms(const ntp_module *m, gemms *g) {
  for (size_t i = 0; i < m->n_ops; i++) {
    const ntp_op *op = &m->ops[i];
    if (op->code == IR_MATMUL) {
      const ntp_shape *a = &m->values[op->args[0]].shape, *b = &m->values[op->args[1]].shape;
      bool tb = op->attr.mm.trans_b;
      gemm x = {.k = a->dim[a->ndim - 1], .m = a->ndim >= 2 ? a->dim[a->ndim - 2] : 1,
                .n = b->dim[b->ndim - (tb ? 2 : 1)], .trans_b = tb, .shared_b = b->ndim <= 2};
      x.batch = shape_numel(a) / (x.m * x.k);
      if (x.shared_b) { /* as ntp_cpu_matmul runs it: one GEMM of batch*m rows */
        x.m *= x.batch;
        x.batch = 1;
      }
      g->flops += 2.0 * (double)(x.batch * x.m) * (double)x.k * (double)x.n;
      add_gemm(g, x);
    } else if (op->code == IR_ATTENTION) {
      const ntp_shape *q = &m->values[op->args[0]].shape;
      double b = (double)q->dim[0], s = (double)q->dim[1], h = (double)q->dim[2], hd = (double)q->dim[3];
      double pairs = op->attr.attn.causal ? s * (s + 1) / 2 : s * s;
      g->attn_flops += 4.0 * b * h * pairs * hd;
    }
  }
}

static float *rand_floats(int64_t n, uint64_t salt) {
  float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
  if (!p) exit(2);
  for (int64_t i = 0; i < n; i++) p[i] = ntp_init_uniform(salt, 7, (uint64_t)i);
  return p;
}

/* ---- the Python child: NumPy and PyTorch, one command at a time ----
 * bench_cpu_ref.py serve reads commands on stdin and answers one line each, so that ntp's and
 * the reference's repeats alternate: on a machine shared with other work, the load then drifts
 * under both alike and their ratio holds (a block of ntp runs, then a block of PyTorch runs,
 * gave ratios that moved by 2x between two runs of this program). */

typedef struct child {
  pid_t pid;
  FILE *to, *from;
} child;

static bool child_start(child *c, const char *python) {
  int in[2], out[2];
  *c = (child){.pid = -1};
  if (pipe(in) != 0) return false;
  if (pipe(out) != 0) {
    close(in[0]);
    close(in[1]);
    return false;
  }
  fflush(stdout);
  c->pid = fork();
  if (c->pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    /* set on machines whose OpenBLAS misbehaves; NumPy's own OpenBLAS needs neither */
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("OPENBLAS_L2_SIZE");
    if (getenv("NTP_SET_GOMP_SPINCOUNT")) { /* ours (omp_env.c), not the user's: PyTorch runs as it would */
      unsetenv("GOMP_SPINCOUNT");
      unsetenv("NTP_SET_GOMP_SPINCOUNT");
    }
    execlp(python, python, "bench/bench_cpu_ref.py", "serve", (char *)NULL);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  if (c->pid < 0) {
    close(in[1]);
    close(out[0]);
    return false;
  }
  c->to = fdopen(in[1], "w");
  c->from = fdopen(out[0], "r");
  return c->to && c->from;
}

/* Sends one command; returns the number after "t=", 0 for "ok", NAN for "skip" / an error / a
 * child that is gone. "info: " lines on the way are printed. */
static double child_ask(child *c, const char *cmd) {
  if (!c->to || !c->from) return NAN;
  fprintf(c->to, "%s\n", cmd);
  fflush(c->to);
  char line[1024];
  while (fgets(line, sizeof line, c->from)) {
    if (!strncmp(line, "info: ", 6)) printf("  %s", line + 6);
    else if (!strncmp(line, "t=", 2)) return strtod(line + 2, NULL);
    else if (!strncmp(line, "ok", 2)) return 0;
    else if (!strncmp(line, "skip", 4)) return NAN;
    else {
      printf("  reference: %s", line);
      return NAN;
    }
  }
  fclose(c->to);
  fclose(c->from);
  c->to = c->from = NULL;
  return NAN;
}

/* Before each timed call of either side: the other side's idle threads go to sleep first
 * (OpenBLAS's pthreads spin about 0.1 s after a call, libgomp's 300,000 rounds by default), so
 * neither side is timed against the other's spinning threads. */
static void settle(void) {
  struct timespec t = {0, 250 * 1000 * 1000};
  nanosleep(&t, NULL);
}

static void child_stop(child *c) {
  if (c->to) {
    fputs("quit\n", c->to);
    fclose(c->to);
  }
  if (c->from) fclose(c->from);
  if (c->pid > 0) waitpid(c->pid, NULL, 0);
  *c = (child){.pid = -1};
}

/* Seconds for the whole list, ntp's and NumPy's (each shape's median time times its count),
 * the two timed alternately. *np is NAN when the child has no NumPy. */
static double time_gemms(const gemms *g, int repeats, child *py, double *np) {
  double total = 0, total_np = 0;
  bool have_np = true;
  for (size_t i = 0; i < g->n; i++) {
    const gemm *x = &g->v[i];
    int64_t nb = x->shared_b ? 1 : x->batch, bs = x->shared_b ? 0 : x->k * x->n;
    float *a = rand_floats(x->batch * x->m * x->k, 1), *b = rand_floats(nb * x->k * x->n, 2);
    float *c = malloc((size_t)(x->batch * x->m * x->n) * sizeof *c);
    if (!c) exit(2);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "gemm %lld %lld %lld %lld %d %d", (long long)x->batch, (long long)x->m,
             (long long)x->k, (long long)x->n, x->trans_b, x->shared_b);
    have_np = have_np && !isnan(child_ask(py, cmd)); /* the child allocates and warms up */
    double t[16], tn[16];
    int r = repeats < 16 ? repeats : 16;
    /* each sample: a burst of the shape's calls back to back (as many as one forward makes, 2 to
     * 16), the mean of one: the BLAS's throughput on the shape once its threads run. A single call
     * after the other side's turn times the wake-up of sleeping threads as much as the product
     * (OpenBLAS's OpenMP build at 128x768x768: 80 GFLOP/s so, 190 in a burst, on 2 cores). */
    int burst = x->count < 2 ? 2 : x->count > 16 ? 16 : (int)x->count;
    char mm[32];
    snprintf(mm, sizeof mm, "mm %d", burst);
    ntp_cpu_matmul(a, b, c, x->batch, x->m, x->k, x->n, x->trans_b, bs); /* warm */
    for (int j = 0; j < r; j++) {
      if (have_np) settle();
      double t0 = now_s();
      for (int q = 0; q < burst; q++) ntp_cpu_matmul(a, b, c, x->batch, x->m, x->k, x->n, x->trans_b, bs);
      t[j] = (now_s() - t0) / burst;
      if (have_np) settle();
      tn[j] = have_np ? child_ask(py, mm) : NAN;
      have_np = have_np && !isnan(tn[j]);
    }
    double mt = median(t, r), mn = have_np ? median(tn, r) : NAN, fl = 2.0 * (double)(x->batch * x->m * x->k * x->n);
    total += (double)x->count * mt;
    if (have_np) total_np += (double)x->count * mn;
    /* per shape, so a low share can be traced to the shapes that lose it */
    printf("    GEMM %lld x %lldx%lldx%lld%s%s, %lld times: ntp %.1f GFLOP/s", (long long)x->batch, (long long)x->m,
           (long long)x->k, (long long)x->n, x->trans_b ? " (B^T)" : "", x->shared_b ? "" : " (batched B)",
           (long long)x->count, fl / mt * 1e-9);
    if (have_np) printf(", NumPy %.1f, share %.2f", fl / mn * 1e-9, mn / mt);
    printf("\n");
    free(a);
    free(b);
    free(c);
  }
  *np = have_np ? total_np : NAN;
  return total;
}

/* ---- ntp runs ---- */

static ntpc_session *compile(const bcase *c, bool sharded) {
  ntpc_session *s = ntpc_session_new();
  for (int i = 0; i < 8 && c->defines[i]; i++) ntpc_define_str(s, c->defines[i]);
  if (sharded && c->plan) {
    ntpc_add_plan_file(s, c->plan);
    ntpc_set_world(s, 0);
  }
  if (ntpc_compile_file(s, c->file) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    fprintf(stderr, "bench_cpu: %s does not compile: %s\n", c->file, ntpc_last_error(s));
    ntpc_session_free(s);
    return NULL;
  }
  return s;
}

/* Median forward seconds over `repeats` runs (init excluded); wall: one run's total with init.
 * With a reference model loaded in the child, its forwards alternate with ntp's (*ref: median). */
static int time_ntp(const ntp_module *m, const ntp_program *p, int repeats, double *fwd, double *wall, child *py,
                    double *ref) {
  double t[16], tr[16];
  int r = repeats < 16 ? repeats : 16;
  bool have_ref = py != NULL;
  char err[512];
  for (int j = 0; j < r; j++) {
    ntp_cpu_result res;
    if (have_ref) settle();
    double t0 = now_s();
    int rc = p ? ntp_sim_run(p, 1, &res, err, sizeof err) : ntp_cpu_run(m, 1, 0, &res, err, sizeof err);
    if (rc != 0) {
      fprintf(stderr, "bench_cpu: %s\n", err);
      return -1;
    }
    if (j == 0) *wall = now_s() - t0;
    t[j] = res.seconds;
    ntp_cpu_result_free(&res);
    if (have_ref) settle();
    tr[j] = have_ref ? child_ask(py, "fwd") : NAN;
    have_ref = have_ref && !isnan(tr[j]);
  }
  *fwd = median(t, r);
  if (ref) *ref = have_ref ? median(tr, r) : NAN;
  return 0;
}

static void print_load(void) {
  FILE *f = fopen("/proc/loadavg", "r");
  char buf[128] = "?";
  if (f) {
    if (!fgets(buf, sizeof buf, f)) strcpy(buf, "?\n");
    fclose(f);
  }
  printf("load average (1, 5, 15 min; running/total): %s", buf);
}

int main(int argc, char **argv) {
  const char *python = getenv("NTP_BENCH_PYTHON") ? getenv("NTP_BENCH_PYTHON") : "python3";
  int repeats = 5, threads = 0;
  bool want[NCASES] = {0}, any = false, quick = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--python") && i + 1 < argc) python = argv[++i];
    else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--case") && i + 1 < argc) {
      const char *n = argv[++i];
      int k = 0;
      while (k < NCASES && strcmp(cases[k].name, n)) k++;
      if (k == NCASES) {
        fprintf(stderr, "bench_cpu: unknown case '%s'\n", n);
        return 2;
      }
      want[k] = any = true;
    } else {
      fprintf(stderr, "usage: bench_cpu [--quick] [--repeats N] [--threads N] [--python PY] [--case NAME]...\n");
      return 2;
    }
  }
  if (repeats < 1) repeats = 1;
  if (threads > 0) {
    /* the same count on both sides: ntp's pool and BLAS now, the children through the
     * environment they start with (PyTorch's OpenMP, NumPy's OpenBLAS) */
    char n[16];
    snprintf(n, sizeof n, "%d", threads);
    setenv("OMP_NUM_THREADS", n, 1);
    setenv("OPENBLAS_NUM_THREADS", n, 1);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* each row as it is measured: a long run stopped early keeps its rows */
  for (int k = 0; k < NCASES && !any; k++) want[k] = !quick || !strcmp(cases[k].name, "gpt2_b1s128") ||
                                                    !strcmp(cases[k].name, "sim_mixed8");
  print_load();
  printf("python for NumPy / PyTorch: %s; medians of %d runs; threads: %s\n", python, repeats,
         threads > 0 ? getenv("OMP_NUM_THREADS") : "default (one per core)");
  printf("%-12s %10s %9s %10s %8s %9s %9s %7s\n", "case", "ntp fwd", "GFLOP/s", "torch fwd", "ntp/pt", "GEMM ntp",
         "GEMM np", "share");
  /* NumPy and PyTorch in separate processes: PyTorch's idle OpenMP threads would spin beside
   * NumPy's BLAS threads */
  child py, np;
  bool started = child_start(&py, python);
  started = child_start(&np, python) && started;
  if (!started) printf("  (cannot start %s: no NumPy / PyTorch columns)\n", python);
  int rc = 0;
  for (int k = 0; k < NCASES; k++) {
    if (!want[k]) continue;
    const bcase *c = &cases[k];
    ntpc_session *s = compile(c, false);
    if (!s) return 1;
    char perr[512];
    ntp_program *prog = session_program(s, perr, sizeof perr);
    if (!prog) {
      fprintf(stderr, "bench_cpu: %s\n", perr);
      return 1;
    }
    const ntp_module *m = &prog->global;
    double fwd = 0, wall = 0;
    int reps = strstr(c->name, "llama") ? (repeats < 3 ? repeats : 3) : repeats;
    if (c->plan) { /* the simulation over the unsharded run, the two alternating */
      ntpc_session *ss = compile(c, true);
      ntp_program *sprog = ss ? session_program(ss, perr, sizeof perr) : NULL;
      if (!sprog) return 1;
      double tu[16], tsim[16], u1, s1, swall = 0;
      int r = reps < 16 ? reps : 16;
      for (int j = 0; j < r && rc == 0; j++) {
        if (time_ntp(m, NULL, 1, &tu[j], &u1, NULL, NULL) != 0 ||
            time_ntp(&sprog->global, sprog, 1, &tsim[j], &s1, NULL, NULL) != 0)
          rc = 1;
        else if (j == 0)
          wall = u1, swall = s1;
      }
      if (rc == 0) {
        double uf = median(tu, r), sf = median(tsim, r);
        printf("%-12s unsharded %.3f s, %d ranks simulated %.3f s: %.2fx (target <= 1.3); with init %.2f s / %.2f s\n",
               c->name, uf, sprog->world, sf, sf / uf, wall, swall);
      }
      ntp_program_free(sprog);
      ntp_program_free(prog);
      ntpc_session_free(ss);
      ntpc_session_free(s);
      continue;
    }
    double torch = NAN;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "torch %s", c->torch_args ? c->torch_args : "");
    bool ref = c->torch_args && !isnan(child_ask(&py, cmd)); /* builds the model, warms up */
    if (time_ntp(m, NULL, reps, &fwd, &wall, ref ? &py : NULL, &torch) != 0) {
      ntp_program_free(prog);
      ntpc_session_free(s);
      return 1;
    }
    gemms g = {0};
    collect_gemms(m, &g);
    child_ask(&py, "free"); /* the reference model's memory back before the GEMMs */
    double gemm_np, gemm_ntp = time_gemms(&g, reps, &np, &gemm_np);
    char tcol[16] = "-", rcol[16] = "-", npcol[16] = "-", shcol[16] = "-";
    if (!isnan(torch)) {
      snprintf(tcol, sizeof tcol, "%.3f s", torch);
      snprintf(rcol, sizeof rcol, "%.2f", fwd / torch);
    }
    double gf_ntp = g.flops / gemm_ntp * 1e-9;
    if (!isnan(gemm_np)) {
      snprintf(npcol, sizeof npcol, "%.1f", g.flops / gemm_np * 1e-9);
      snprintf(shcol, sizeof shcol, "%.2f", gemm_np / gemm_ntp);
    }
    printf("%-12s %8.3f s %9.1f %10s %8s %9.1f %9s %7s\n", c->name, fwd, (g.flops + g.attn_flops) / fwd * 1e-9, tcol,
           rcol, gf_ntp, npcol, shcol);
    printf("  %s: %.2f GFLOP in %zu GEMM shapes + %.2f GFLOP attention; first run with init %.2f s\n", c->name,
           g.flops * 1e-9, g.n, g.attn_flops * 1e-9, wall);
    free(g.v);
    ntp_program_free(prog);
    ntpc_session_free(s);
  }
  child_stop(&py);
  child_stop(&np);
  printf("columns: forward seconds; model GFLOP/s (GEMMs + attention) over it; PyTorch CPU eager fp32 forward and\n"
         "ntp / PyTorch (target <= 1.0 for gpt2_b1s128); GEMM GFLOP/s of ntp_cpu_matmul and of NumPy's matmul on\n"
         "the model's shapes, and ntp's share of NumPy's (target >= 0.9)\n");
  return rc;
}
