/* main.c — ntpc, a thin command line over libntpc and the CPU runtime.
 * Exit codes: 0 ok, 1 errors in the input, 2 usage (or an environment failure). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "artifact.h"
#include "cli.h"
#include "outfile.h"
#include "session_program.h"
#include "cuda_backend.h"
#include "layer_times.h"

#include "ntpc.h"
#include "ntprt.h"
#include "planner.h"
#include "shard.h"

#ifndef NTP_VERSION
#define NTP_VERSION NTPC_VERSION_STRING
#endif

static const char usage_text[] =
    "usage: ntpc FILE [options] -o model.so    compile a model library (C ABI, see ntp_model.h)\n"
    "       ntpc check FILE [options]          parse and check a model, report diagnostics\n"
    "       ntpc run FILE [options]            compile and run the forward pass\n"
    "       ntpc report FILE [options]         per layer and rank: placement, memory, bytes moved\n"
    "       ntpc plan FILE --world W [--gpu h200] [--fail R,..]  choose per-layer degrees (see 'ntpc plan --help')\n"
    "       ntpc train FILE --data TOKENS --steps N [--lr X]  train with AdamW (see 'ntpc train --help')\n"
    "       ntpc goodput FILE [--gpus N --domain D --tp T]  throughput and goodput under GPU failures, by policy\n"
    "                     (see 'ntpc goodput --help')\n"
    "       ntpc calibrate [-o FILE] [--quick]  measure the local GPU(s), write a device profile for\n"
    "                     'ntpc plan --profile' (see 'ntpc calibrate --help')\n"
    "       ntpc FILE --emit=KIND [-o OUT]     print a stage: tokens, ast, ir, sharded-ir, rank:N, report, cuda, image\n"
    "       ntpc --help | --version\n"
    "\n"
    "options:\n"
    "  -D NAME=VALUE      override dim NAME (repeatable), e.g. -D S=128\n"
    "  --plan FILE        read a plan file; its plan for the model becomes active\n"
    "  --plan-name NAME   choose the active plan by name\n"
    "  --model NAME       the model to compile when the file holds several\n"
    "  --world W          shard for W ranks (default: the plan's world, else 1); run then\n"
    "                     simulates all ranks and compares with the unsharded run\n"
    "  --gpu NAME|FILE    the device profile: 'tp auto' layers are planned for it (h100 default,\n"
    "                     h200, a100, b200, as 'ntpc plan --gpu'); a calibrated FILE also picks\n"
    "                     attention's CUDA kernel by its measured crossover ('ntpc calibrate')\n"
    "  --emit=KIND        tokens | ast | ir | sharded-ir | rank:N | report | cuda[:N] (rank N's kernels) | image\n"
    "  -o FILE            the model library, or the emitted text (written whole or not at all)\n"
    "  --keep-c           keep the model library's generated C file (FILE.c)\n"
    "  --backend NAME     run on: cpu (the reference; default) or cuda (NVRTC kernels, cuBLASLt)\n"
    "  --loopback         cuda: every rank on one GPU, collectives as device copies\n"
    "  --train            compile the training step: the loss's backward and every parameter's\n"
    "                     gradient as outputs (report: the backward's bytes, the gradient sync; -o: a\n"
    "                     training library, docs/runtime.md)\n"
    "  --iters N          cuda: timed forwards after a warm-up (default 10)\n"
    "  --seed N           seed of the deterministic default initialisation (default 0)\n"
    "  --quiet, -q        no progress line (otherwise shown on a terminal for work over 2 s)\n"
    "  --dump DIR         (run) write inputs, params and outputs as raw files + manifest.tsv\n"
    "  --params FILE      (run) read parameters from a safetensors file (global layout; each\n"
    "                     simulated rank reads only its slices)\n"
    "  --save-params FILE (run) write the parameters used to a safetensors file\n"
    "  --params-format F  (run) the layout of --params and --save-params: ntp (the model's names;\n"
    "                     default), hf-gpt2, hf-llama (Hugging Face checkpoints, docs/runtime.md)\n"
    "  --inputs [NAME=]FILE  (run) an input from a file: a .npy array, an llm.c token file (.bin) or\n"
    "                     text (a token is a byte); token ids also give the targets (repeatable)\n"
    "  --text STRING      (run) the token input from text through the byte tokenizer\n"
    "  --color=WHEN       auto | always | never (diagnostics)\n"
    "  -ferror-limit=N    stop after N errors (default 20; 0: no limit)\n"
    "  --dump-after=PASS  print what a pass built, as it completes (comma-separated; passes: parse,\n"
    "                     sema, grad, place, autoplan, shard, memplan, codegen, image)\n"
    "\n"
    "exit status: 0 ok, 1 errors in the input, 2 usage or environment errors\n";

typedef struct options {
  const char *command, *file, *emit, *out, *backend, *dump, *color, *params, *save_params;
  unsigned long long seed;
  long world; /* -1: not given */
  bool plan;  /* --plan or --plan-name given */
  bool keep_c, loopback, train;
  long iters;
  const char *inputs[16]; /* --inputs SPEC */
  int ninputs;
  const char *text;       /* --text STRING */
  const char *params_format; /* --params-format: the layout of --params and --save-params */
} options;

static int usage_error(const char *fmt, const char *arg) { return cli_usage_error("ntpc", fmt, arg); }

/* Writes via a temporary file renamed into place, so a failure leaves no partial output. */
static int emit_to(ntpc_session *s, const char *kind, const char *path) {
  if (!path || strcmp(path, "-") == 0) {
    if (ntpc_emit(s, kind, stdout) != NTPC_OK) return usage_error("%s", ntpc_last_error(s));
    return 0;
  }
  char err[512];
  ntp_outfile out;
  if (ntp_outfile_open(&out, path, NULL, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    return 2;
  }
  ntpc_status st = ntpc_emit(s, kind, out.f);
  bool written = !ferror(out.f);
  if (st != NTPC_OK) {
    ntp_outfile_abort(&out);
    return usage_error("%s", ntpc_last_error(s));
  }
  if (ntp_outfile_commit(&out, written, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    return 2;
  }
  return 0;
}

/* Where the runtime's headers and library are: $NTP_INCLUDE_DIR / $NTP_LIB_DIR, an install
 * prefix beside this executable (bin/../include/ntp), or the build tree ntpc was built in. */
static void runtime_dirs(char inc[static 2 * PATH_MAX], char lib[static 2 * PATH_MAX], size_t cap) {
  const char *ei = getenv("NTP_INCLUDE_DIR"), *el = getenv("NTP_LIB_DIR");
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  snprintf(inc, cap, "%s", NTP_BUILD_INCLUDES);
  snprintf(lib, cap, "%s", NTP_BUILD_LIBDIR);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      char probe[PATH_MAX + 64];
      struct stat sb;
      snprintf(probe, sizeof probe, "%s/../include/ntp/ntp_artifact.h", exe);
      if (stat(probe, &sb) == 0) { /* installed beside this executable */
        snprintf(inc, cap, "%s/../include/ntp", exe);
        snprintf(lib, cap, "%s/../lib", exe);
      }
    }
  }
  if (ei) snprintf(inc, cap, "%s", ei);
  if (el) snprintf(lib, cap, "%s", el);
}

/* The model library: its C file, compiled by the system C compiler against libntprt.
 * Built beside the target under a temporary name and renamed into place. */
static int build_library(ntpc_session *s, const char *out, bool keep_c) {
  const sh_program *p = ntpc_sharded(s);
  size_t n = strlen(out) + 32;
  char *csrc = malloc(n), *tmp = malloc(n);
  if (!csrc || !tmp) {
    free(csrc);
    free(tmp);
    fprintf(stderr, "ntpc: error: out of memory\n");
    return 2;
  }
  snprintf(csrc, n, "%s.c", out);
  snprintf(tmp, n, "%s.tmp%ld", out, (long)getpid());
  char err[512];
  int rc = 2;
  bool csrc_ours = false;
  /* both targets must be regular files (or absent) before anything is written */
  if (ntp_outfile_check_target(out, err, sizeof err) != 0 || ntp_outfile_check_target(csrc, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    goto done;
  }
  ntp_outfile cf; /* FILE.c, itself written whole: a killed build leaves neither it nor a part of it */
  if (ntp_outfile_open(&cf, csrc, ".c", err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    goto done;
  }
  const void *image;
  size_t image_len;
  int w = ntpc_program_image(s, &image, &image_len) == NTPC_OK ? artifact_write_c(p, image, image_len, cf.f, err, sizeof err)
                                                               : (snprintf(err, sizeof err, "no program image"), -1);
  if (w != 0) {
    fprintf(stderr, "ntpc: error: writing %s: %s\n", csrc, err);
    ntp_outfile_abort(&cf);
    goto done;
  }
  ntp_outfile_track(csrc); /* from the rename on, removed if killed: --keep-c keeps it only on success */
  csrc_ours = true;
  if (ntp_outfile_commit(&cf, !ferror(cf.f), err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    goto done;
  }
  ntp_outfile_track(tmp);
  char inc[2 * PATH_MAX], lib[2 * PATH_MAX], rpath[2 * PATH_MAX + 16], libflag[2 * PATH_MAX + 8];
  runtime_dirs(inc, lib, sizeof inc);
  char *argv[64];
  int k = 0;
  const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
  argv[k++] = (char *)cc;
  argv[k++] = "-std=c17";
  argv[k++] = "-O1";
  argv[k++] = "-shared";
  argv[k++] = "-fPIC";
  argv[k++] = "-fvisibility=hidden";
  char incs[2 * PATH_MAX];
  snprintf(incs, sizeof incs, "%s", inc);
  for (char *dir = strtok(incs, ":"); dir && k < 50; dir = strtok(NULL, ":")) {
    argv[k++] = "-I";
    argv[k++] = dir;
  }
  argv[k++] = csrc;
  argv[k++] = "-o";
  argv[k++] = tmp;
  snprintf(libflag, sizeof libflag, "-L%s", lib);
  argv[k++] = libflag;
  argv[k++] = "-lntprt";
  snprintf(rpath, sizeof rpath, "-Wl,-rpath,%s", lib);
  argv[k++] = rpath;
  argv[k] = NULL;
  pid_t pid = fork();
  if (pid == 0) {
    execvp(cc, argv);
    fprintf(stderr, "ntpc: error: cannot run the C compiler '%s': %s\n", cc, strerror(errno));
    _exit(127);
  }
  ntp_outfile_set_child(pid);
  int status = 0;
  int waited = pid < 0 ? -1 : waitpid(pid, &status, 0);
  ntp_outfile_set_child(0);
  if (pid < 0 || waited < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "ntpc: error: the C compiler failed on %s (set CC to choose another)\n", csrc);
    remove(tmp);
    goto done;
  }
  err[0] = 0;
  if (ntp_outfile_check_target(out, err, sizeof err) != 0 || rename(tmp, out) != 0) {
    if (!err[0]) snprintf(err, sizeof err, "cannot write '%s': %s", out, strerror(errno));
    fprintf(stderr, "ntpc: error: %s\n", err);
    remove(tmp);
    goto done;
  }
  rc = 0;
done:
  ntp_outfile_untrack(tmp);
  if (csrc_ours && (!keep_c || rc)) remove(csrc);
  ntp_outfile_untrack(csrc);
  free(csrc);
  free(tmp);
  return rc;
}

static void print_model_summary(const ir_module *m, FILE *out) {
  size_t params = 0, inputs = 0;
  long long elems = 0;
  for (size_t i = 0; i < m->n_ops; i++) {
    if (m->ops[i].code == IR_PARAM) {
      params++;
      elems += shape_numel(&m->values[m->ops[i].result].shape);
    }
    inputs += m->ops[i].code == IR_INPUT;
  }
  fprintf(out, "model %s: %zu layers, %zu ops, %zu inputs, %zu params (%.3fM elements), %zu outputs, dtype %s\n",
          m->name, m->n_layers, m->n_ops, inputs, params, (double)elems / 1e6, m->n_outputs, dtype_name(m->dtype));
}

/* Gradients (--train) are measured against at least a share of the largest one (1e-3 in fp32,
 * 1e-2 in bf16 and fp16): a gradient that vanishes (a key bias's: softmax does not see it) is
 * round-off on both sides. */
static double grad_floor(const ntp_cpu_result *ref, ntp_dtype model) {
  double f = 0, share = model == NTP_FP32 ? 1e-3 : 1e-2;
  for (size_t i = 0; i < ref->n_outputs; i++)
    if (!strncmp(ref->outputs[i].name, "grad.", 5)) f = fmax(f, share * ntp_max_abs(&ref->outputs[i]));
  return f;
}

/* An output is as precise as what it is computed from: an fp32 loss of a bf16 model's logits is
 * held to bf16's tolerance. fp32_tol: the fp32 tolerance of the comparison (sums in another order). */
static double tolerance(const ntp_host_tensor *out, ntp_dtype model, double fp32_tol) {
  ntp_dtype d = out->dtype == NTP_FP32 && (model == NTP_BF16 || model == NTP_FP16) ? model : out->dtype;
  return d == NTP_FP32 ? fp32_tol : d == NTP_BF16 ? 5e-2 : 1e-2;
}

static double output_error(const ntp_host_tensor *got, const ntp_host_tensor *ref, double gfloor) {
  return ntp_max_rel_error_floor(got, ref, strncmp(ref->name, "grad.", 5) == 0 ? gfloor : 0);
}

/* --inputs and --text into given[] (over the module's values): 0, or 1 (an input error, said). */
static int load_inputs(const ntp_module *m, const options *o, ntp_host_tensor ***given) {
  *given = NULL;
  if (!o->ninputs && !o->text) return 0;
  char err[512];
  if (!(*given = calloc(m->n_values ? m->n_values : 1, sizeof **given))) {
    fprintf(stderr, "ntpc: error: out of memory\n");
    return 1;
  }
  for (int i = 0; i < o->ninputs; i++)
    if (ntp_inputs_load(m, o->inputs[i], *given, err, sizeof err) != 0) goto fail;
  if (o->text && ntp_inputs_text(m, o->text, strlen(o->text), *given, err, sizeof err) != 0) goto fail;
  return 0;
fail:
  fprintf(stderr, "ntpc: error: %s\n", err);
  ntp_inputs_free(m, *given);
  free(*given);
  *given = NULL;
  return 1;
}

static void free_inputs(const ntp_module *m, ntp_host_tensor **given) {
  if (given) ntp_inputs_free(m, given);
  free(given);
}

/* The CUDA run: kernels generated for every rank, NVRTC (cached), cuBLASLt; outputs compared
 * with the unsharded CPU reference; time per forward over o->iters runs after a warm-up. */
static int run_cuda(const ir_module *summary, const ntp_program *p, const options *o) {
  char err[1024] = "";
  int rc = 2; /* until the forwards ran: an environment failure (no GPU, no library, too few GPUs) */
  ntp_cuda *c = NULL;
  ntp_safetensors *params = NULL;
  ntp_cpu_result ref = {0}, res = {0};
  ntp_host_tensor **given = NULL;
  /* all ranks in this process: on one GPU (loopback) or one GPU each with NCCL */
  ntp_cuda_options co = {.loopback = o->loopback || p->world == 1, .rank_hi = p->world};
  if (o->params && (ntp_safetensors_open(o->params, &params, err, sizeof err) != 0 ||
                    ntp_safetensors_set_format(params, o->params_format, &p->global, err, sizeof err) != 0)) {
    rc = 1; /* a --params file that cannot be read is an input error, as on the cpu backend */
    goto done;
  }
  if (load_inputs(&p->global, o, &given)) {
    rc = 1;
    goto done;
  }
  if (ntp_cuda_create(p, &co, &c, err, sizeof err) != 0) goto done;
  cli_verbose_gemms(c);
  if (params && ntp_cuda_load(c, params, err, sizeof err) != 0) {
    rc = 1;
    goto done;
  }
  for (size_t v = 0; given && v < p->global.n_values; v++)
    if (given[v] && ntp_cuda_set(c, (int32_t)v, given[v], err, sizeof err) != 0) goto done;
  if (ntp_cuda_forward(c, o->seed, &res, err, sizeof err) != 0) goto done; /* warm-up */
  double total = 0, host[2] = {0, 0}; /* host seconds to launch a forward: [0] in the mode it runs in, [1] the other */
  ntp_cuda_host ht;
  ntp_cuda_host_time(c, &ht);
  bool graphs = ht.graphs;
  bool both = ntp_cuda_use_graphs(c, true) == 0; /* graphs can be had here (not: NCCL joins several GPUs here) */
  ntp_cuda_use_graphs(c, graphs);
  if (o->iters > 0 && !both)
    printf("graphs: not used: NCCL joins the %d GPUs of this process, and graphs launched from one thread may "
           "deadlock (NCCL's guide); one rank per process keeps them\n", p->world);
  if (o->iters > 0 && both) { /* the same forwards in the other mode first, for the host's side of graphs */
    ntp_cpu_result other = {0};
    ntp_cuda_use_graphs(c, !graphs);
    for (long i = 0; i <= o->iters; i++) { /* one warm-up: the capture */
      ntp_cpu_result_free(&other);
      if (ntp_cuda_forward(c, o->seed, &other, err, sizeof err) != 0) goto done;
      ntp_cuda_host_time(c, &ht);
      if (i) host[1] += ht.last_s;
    }
    ntp_cpu_result_free(&other);
    ntp_cuda_use_graphs(c, graphs);
  }
  /* the timed forwards last: the per-layer times printed below are those of the last of them */
  for (long i = 0; i < o->iters; i++) {
    ntp_cpu_result_free(&res);
    if (ntp_cuda_forward(c, o->seed, &res, err, sizeof err) != 0) goto done;
    total += res.seconds;
    ntp_cuda_host_time(c, &ht);
    host[0] += ht.last_s;
  }
  rc = 1;
  if (ntp_cpu_run_given(&p->global, o->seed, 0, params, (const ntp_host_tensor *const *)given, &ref, err,
                        sizeof err) != 0)
    goto done;
  print_model_summary(summary, stdout);
  printf("backend cuda%s, %d ranks, seed %llu, forward %.3f ms (mean of %ld)\n",
         co.loopback && p->world > 1 ? " loopback" : p->world > 1 ? " nccl" : "",
         p->world, o->seed, o->iters ? total / (double)o->iters * 1e3 : res.seconds * 1e3, o->iters);
  if (o->iters > 0 && both) { /* the host time per forward and per layer, with and without graphs (docs/runtime.md) */
    double with = (graphs ? host[0] : host[1]) / (double)o->iters * 1e6, without = (graphs ? host[1] : host[0]) / (double)o->iters * 1e6;
    printf("host launch: %.1f us per forward, %.2f us per layer with graphs; %.1f us, %.2f us per layer without "
           "(%d layers, mean of %ld)\n", with, with / ht.layers, without, without / ht.layers, ht.layers, o->iters);
  }
  rc = 0;
  if (layer_times_print(stdout, c, p, err, sizeof err) != 0) {
    rc = 2;
    goto done;
  }
  double gfloor = grad_floor(&ref, p->global.dtype);
  for (size_t i = 0; i < res.n_outputs; i++) {
    fputs("output ", stdout);
    ntp_print_tensor_summary(&res.outputs[i], stdout);
    double e = output_error(&res.outputs[i], &ref.outputs[i], gfloor);
    double tol = tolerance(&res.outputs[i], p->global.dtype, 1e-4);
    printf("  vs cpu reference: max relative error %.3g (tolerance %.0e) %s\n", e, tol, e <= tol ? "ok" : "MISMATCH");
    if (e > tol) rc = 1;
  }
done:
  if (rc && err[0]) fprintf(stderr, "ntpc: error: cuda: %s\n", err);
  free_inputs(&p->global, given);
  ntp_cpu_result_free(&ref);
  ntp_cpu_result_free(&res);
  ntp_cuda_free(c);
  ntp_safetensors_close(params);
  return rc;
}

/* The sharded run: all ranks simulated, outputs assembled and compared with the unsharded run. */
static int run_sharded(const ntp_program *p, const ntp_safetensors *params, ntp_host_tensor *const *given,
                       const ntp_cpu_result *ref, const options *o) {
  ntp_cpu_result res;
  char err[512];
  ntp_sim *sim = NULL;
  bool ok = ntp_sim_new(p, &sim, err, sizeof err) == 0 && (!params || ntp_sim_load(sim, params, err, sizeof err) == 0);
  for (size_t v = 0; ok && given && v < p->global.n_values; v++)
    if (given[v]) ok = ntp_sim_set(sim, (int32_t)v, given[v], err, sizeof err) == 0;
  if (!ok || ntp_sim_forward(sim, o->seed, &res, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: sharded run: %s\n", err);
    ntp_sim_free(sim);
    return 1;
  }
  ntp_sim_free(sim);
  printf("sharded: %d ranks simulated on the cpu backend, forward %.3f ms\n", p->world, res.seconds * 1e3);
  int rc = 0;
  double gfloor = grad_floor(ref, p->global.dtype);
  for (size_t i = 0; i < res.n_outputs; i++) {
    fputs("output ", stdout);
    ntp_print_tensor_summary(&res.outputs[i], stdout);
    double e = output_error(&res.outputs[i], &ref->outputs[i], gfloor);
    /* fp32: sums in another order; bf16/fp16: partial sums rounded before the reduction */
    double tol = tolerance(&res.outputs[i], p->global.dtype, 1e-5);
    printf("  vs unsharded: max relative error %.3g (tolerance %.0e) %s\n", e, tol, e <= tol ? "ok" : "MISMATCH");
    if (e > tol) rc = 1;
  }
  ntp_cpu_result_free(&res);
  return rc;
}

/* The host memory a CPU run may use: $NTP_CPU_MEMORY_LIMIT (bytes), else the machine's. */
static double host_memory_limit(void) {
  const char *e = getenv("NTP_CPU_MEMORY_LIMIT");
  if (e && *e) {
    char *end;
    double v = strtod(e, &end);
    if (!*end && v > 0) return v;
  }
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? (double)pages * (double)size : 1e300;
}

static const char *bytes_str(double b, char *buf, size_t cap) {
  static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, u++;
  snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
  return buf;
}

/* Before anything is allocated: the CPU reference holds every value in fp32 (parameters and
 * inputs throughout, each activation while it is live), and the simulation adds every rank's
 * arena and slices. A model that cannot fit is refused with the tensor that dominates, instead
 * of allocating until the machine gives out. */
static int check_host_memory(const ir_module *m, const ntp_program *p) {
  double limit = host_memory_limit(), held = 0, biggest = 0;
  int32_t big = -1;
  for (size_t v = 0; v < m->n_values; v++) {
    double b = (double)shape_numel(&m->values[v].shape) * 4;
    ir_opcode code = m->ops[m->values[v].def].code;
    if (code == IR_PARAM || code == IR_INPUT) held += b;
    if (b > biggest) biggest = b, big = (int32_t)v;
  }
  double sim = 0;
  for (int32_t r = 0; p && r < p->world; r++)
    sim += (double)(p->mem[r].arena_bytes + p->mem[r].param_bytes + p->mem[r].input_bytes);
  char a[32], b[32], c[32], shp[160];
  if (big >= 0 && (biggest > limit || held + biggest > limit)) {
    const ir_value *val = &m->values[big];
    const ir_op *op = &m->ops[val->def];
    const char *name = val->name ? val->name : op->layer >= 0 ? m->layers[op->layer].name : ir_op_name(op->code);
    fprintf(stderr,
            "ntpc: error: the cpu reference needs %s for parameters and inputs, and %s for tensor '%s' %s%s alone "
            "(fp32 on the cpu); this machine allows %s (NTP_CPU_MEMORY_LIMIT)\n",
            bytes_str(held, a, sizeof a), bytes_str(biggest, b, sizeof b), name, dtype_name(val->dtype),
            shape_str(&val->shape, shp, sizeof shp), bytes_str(limit, c, sizeof c));
    return 2;
  }
  if (sim > limit) {
    int32_t worst = 0;
    for (int32_t r = 1; r < p->world; r++)
      if (p->mem[r].arena_bytes + p->mem[r].param_bytes > p->mem[worst].arena_bytes + p->mem[worst].param_bytes) worst = r;
    fprintf(stderr,
            "ntpc: error: simulating %d ranks needs %s (rank %d alone: %s); this machine allows %s (NTP_CPU_MEMORY_LIMIT)\n",
            p->world, bytes_str(sim, a, sizeof a), worst,
            bytes_str((double)(p->mem[worst].arena_bytes + p->mem[worst].param_bytes + p->mem[worst].input_bytes), b,
                      sizeof b),
            bytes_str(limit, c, sizeof c));
    return 2;
  }
  return 0;
}

static int run_cpu(const ir_module *m, const ntp_program *prog, const options *o) {
  const ntp_program *sharded = prog->world ? prog : NULL;
  ntp_cpu_result res;
  char err[512];
  int mem = check_host_memory(m, sharded);
  if (mem) return mem;
  if (o->save_params && ntp_safetensors_format_check(o->params_format, &prog->global, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: --save-params: %s\n", err); /* the model does not fit the layout: its input */
    return 1;
  }
  ntp_safetensors *params = NULL;
  if (o->params && (ntp_safetensors_open(o->params, &params, err, sizeof err) != 0 ||
                    ntp_safetensors_set_format(params, o->params_format, &prog->global, err, sizeof err) != 0)) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    ntp_safetensors_close(params);
    return 1; /* docs/cli.md: a --params file that cannot be read or does not fit is an input error */
  }
  ntp_host_tensor **given = NULL;
  if (load_inputs(&prog->global, o, &given)) {
    ntp_safetensors_close(params);
    return 1;
  }
  if (ntp_cpu_run_given(&prog->global, o->seed, o->dump != NULL || o->save_params != NULL, params,
                        (const ntp_host_tensor *const *)given, &res, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    ntp_safetensors_close(params);
    free_inputs(&prog->global, given);
    return 1;
  }
  if (o->save_params && ntp_safetensors_save_format(o->save_params, o->params_format, &prog->global, res.params,
                                                    res.n_params, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    ntp_safetensors_close(params);
    free_inputs(&prog->global, given);
    ntp_cpu_result_free(&res);
    return 2;
  }
  print_model_summary(m, stdout);
  printf("backend cpu (reference), seed %llu, forward %.3f ms\n", o->seed, res.seconds * 1e3);
  for (size_t i = 0; i < res.n_outputs; i++) {
    fputs("output ", stdout);
    ntp_print_tensor_summary(&res.outputs[i], stdout);
  }
  if (sharded && run_sharded(sharded, params, given, &res, o) != 0) {
    ntp_cpu_result_free(&res);
    ntp_safetensors_close(params);
    free_inputs(&prog->global, given);
    return 1;
  }
  ntp_safetensors_close(params);
  free_inputs(&prog->global, given);
  int rc = 0;
  if (o->dump && ntp_dump_tensors(&res, o->dump, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    rc = 2;
  }
  ntp_cpu_result_free(&res);
  return rc;
}


/* The command line into *o and the session: -1 to go on, else the exit status (--help: 0). */
static int parse_args(int argc, char **argv, ntpc_session *s, options *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    bool missing = false;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_text, stdout);
      return 0;
    } else if (strcmp(a, "--version") == 0) {
      printf("ntpc %s\n", NTP_VERSION);
      return 0;
    } else if (strncmp(a, "-D", 2) == 0) {
      const char *def = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
      if (!def) return usage_error("-D needs NAME=VALUE%s", "");
      if (ntpc_define_str(s, def) != NTPC_OK) return usage_error("%s", ntpc_last_error(s));
    } else if ((v = cli_option_value(argc, argv, &i, "--emit", &missing))) {
      o->emit = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--plan-name", &missing))) {
      ntpc_select_plan(s, v);
      o->plan = true;
    } else if ((v = cli_option_value(argc, argv, &i, "--plan", &missing))) {
      ntpc_add_plan_file(s, v);
      o->plan = true;
    } else if ((v = cli_option_value(argc, argv, &i, "--model", &missing))) {
      ntpc_select_model(s, v);
    } else if ((v = cli_option_value(argc, argv, &i, "--gpu", &missing))) {
      plan_profile probe; /* read once here, so a bad name or file is a usage error */
      char why[512];
      if (!plan_profile_find(v, &probe, why, sizeof why)) return usage_error("%s", why);
      ntpc_set_gpu(s, v);
    } else if ((v = cli_option_value(argc, argv, &i, "--dump-after", &missing))) {
      if (ntpc_dump_after(s, v, stdout) != NTPC_OK) return usage_error("%s", ntpc_last_error(s));
    } else if ((v = cli_option_value(argc, argv, &i, "--backend", &missing))) {
      o->backend = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--seed", &missing))) {
      char *end;
      errno = 0;
      o->seed = strtoull(v, &end, 10);
      if (*end || !*v || *v == '-' || *v == '+' || *v == ' ') return usage_error("--seed needs a non-negative integer, got '%s'", v);
      if (errno == ERANGE) return usage_error("--seed must be below 2^64, got '%s'", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--world", &missing))) {
      char *end;
      o->world = strtol(v, &end, 10);
      if (*end || o->world < 1 || o->world > 4096) return usage_error("--world needs a rank count from 1 to 4096, got '%s'", v);
    } else if (strcmp(a, "--keep-c") == 0) {
      o->keep_c = true;
    } else if (strcmp(a, "--train") == 0) {
      ntpc_want_grad(s, true);
      o->train = true;
    } else if (strcmp(a, "--loopback") == 0) {
      o->loopback = true;
    } else if ((v = cli_option_value(argc, argv, &i, "--iters", &missing))) {
      char *end;
      o->iters = strtol(v, &end, 10);
      if (*end || !*v || o->iters < 0) return usage_error("--iters needs a count of 0 or more, got '%s'", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--inputs", &missing))) {
      if (o->ninputs == 16) return usage_error("at most 16 --inputs%s", "");
      o->inputs[o->ninputs++] = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--params-format", &missing))) {
      if (!ntp_param_format_known(v)) return usage_error("--params-format expects ntp, hf-gpt2 or hf-llama, got '%s'", v);
      o->params_format = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--text", &missing))) {
      if (o->text) return usage_error("--text is given twice (one text fills the token input)%s", "");
      o->text = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--params", &missing))) {
      o->params = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--save-params", &missing))) {
      o->save_params = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--dump", &missing))) {
      o->dump = v;
    } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
      ntp_progress_enable(0);
    } else if ((v = cli_option_value(argc, argv, &i, "--color", &missing))) {
      if (strcmp(v, "auto") != 0 && strcmp(v, "always") != 0 && strcmp(v, "never") != 0) {
        return usage_error("--color takes auto, always or never, got '%s'", v);
      }
      o->color = v;
    } else if (strncmp(a, "-ferror-limit=", 14) == 0) {
      char *end;
      errno = 0;
      unsigned long long n = strtoull(a + 14, &end, 10);
      if (*end || !a[14] || a[14] == '-' || errno) return usage_error("-ferror-limit needs a count (0: no limit), got '%s'", a + 14);
      ntpc_set_error_limit(s, (size_t)n);
    } else if ((v = cli_option_value(argc, argv, &i, "-o", &missing))) {
      o->out = v;
    } else if (missing) {
      return usage_error("option '%s' needs a value", a);
    } else if (a[0] == '-' && a[1]) {
      return usage_error("unknown option '%s'", a);
    } else if (!o->command && !o->file && (strcmp(a, "check") == 0 || strcmp(a, "run") == 0 || strcmp(a, "report") == 0)) {
      o->command = a;
    } else if (!o->file) {
      o->file = a;
    } else {
      return usage_error("unexpected argument '%s'", a);
    }
  }
  return -1;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "plan") == 0) return ntpc_plan_command(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "train") == 0) return ntpc_train_command(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "goodput") == 0) return ntpc_goodput_command(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "calibrate") == 0) return ntpc_calibrate_command(argc - 1, argv + 1);
  options o = {.world = -1, .iters = 10, .params_format = "ntp"};
  ntp_outfile_install_cleanup(); /* a killed ntpc leaves no temporary or half-built file */
  ntpc_session *s = ntpc_session_new();
  if (!s) return 2;
  int rc = 0;
  if ((rc = parse_args(argc, argv, s, &o)) >= 0) goto out;
  rc = 0;
  if (!o.file) {
    rc = usage_error("no input file%s", "");
    goto out;
  }
  if (!o.command && !o.emit && !o.out) {
    rc = usage_error("nothing to do: give a command (check, run, report), --emit=KIND or -o model.so%s", "");
    goto out;
  }
  bool library = !o.command && !o.emit && o.out;
  /* what only a run reads or writes: silently ignored elsewhere, it would look used */
  const char *run_only = o.dump ? "--dump" : o.params ? "--params" : o.save_params ? "--save-params"
                         : o.ninputs ? "--inputs" : o.text ? "--text" : NULL;
  if (run_only && !(o.command && strcmp(o.command, "run") == 0)) {
    rc = usage_error("%s applies to 'ntpc run' only", run_only);
    goto out;
  }
  if (o.out && o.command && !o.emit && strcmp(o.command, "report") != 0) {
    rc = usage_error("-o applies to --emit and report, not to '%s'", o.command);
    goto out;
  }
  if (o.backend && strcmp(o.backend, "cpu") != 0 && strcmp(o.backend, "cuda") != 0) {
    rc = usage_error("unknown backend '%s' (expected cpu or cuda)", o.backend);
    goto out;
  }
  bool cuda = o.backend && strcmp(o.backend, "cuda") == 0;
  if (cuda && (o.dump || o.save_params)) {
    rc = usage_error("%s is a cpu-backend option (it writes the reference run's tensors)", o.dump ? "--dump" : "--save-params");
    goto out;
  }
  if (cuda && o.command && strcmp(o.command, "run") == 0) {
    char why[512];
    if (ntp_cuda_available(why, sizeof why) != 0) {
      fprintf(stderr, "ntpc: error: --backend cuda: %s\n", why);
      rc = 2;
      goto out;
    }
  }

  bool wants_shards = (o.command && strcmp(o.command, "report") == 0) ||
                      (o.emit && (strcmp(o.emit, "sharded-ir") == 0 || strcmp(o.emit, "report") == 0 ||
                                  strncmp(o.emit, "rank:", 5) == 0 || strncmp(o.emit, "cuda", 4) == 0 ||
                                  strcmp(o.emit, "image") == 0));
  /* check, run and report shard when a plan or a world is given; --emit=ir shows the plan as data */
  if (o.world > 0) ntpc_set_world(s, (int32_t)o.world);
  else if (wants_shards || library || cuda || (o.plan && o.command)) ntpc_set_world(s, 0);
  ntpc_want_cuda(s, library || cuda || (o.emit && (strncmp(o.emit, "cuda", 4) == 0 || strcmp(o.emit, "image") == 0)));
  ntpc_status st = ntpc_compile_file(s, o.file);
  ntpc_print_diags(s, stderr, cli_color(o.color));
  if (st == NTPC_ERR_USAGE) {
    fprintf(stderr, "ntpc: error: %s\n", ntpc_last_error(s));
    rc = 2;
    goto out;
  }
  if (st != NTPC_OK) {
    size_t n = ntpc_error_count(s);
    fprintf(stderr, "%zu error%s generated.\n", n, n == 1 ? "" : "s");
    rc = st == NTPC_ERR_INPUT ? 1 : 3;
    goto out;
  }
  if (library) {
    rc = build_library(s, o.out, o.keep_c);
  } else if (o.emit) {
    rc = emit_to(s, o.emit, o.out);
  } else if (strcmp(o.command, "check") == 0) {
    print_model_summary(ntpc_module(s), stdout);
  } else if (strcmp(o.command, "report") == 0) {
    rc = emit_to(s, "report", o.out);
  } else {
    char err[512];
    ntp_program *prog = session_program(s, err, sizeof err);
    if (!prog) {
      fprintf(stderr, "ntpc: internal error: %s\n", err);
      rc = 3;
    } else {
      rc = cuda ? run_cuda(ntpc_module(s), prog, &o) : run_cpu(ntpc_module(s), prog, &o);
    }
    ntp_program_free(prog);
  }
out:
  ntpc_session_free(s);
  return rc;
}
