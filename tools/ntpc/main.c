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
#include "exec.h"
#include "run_cmd.h"

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
    "       ntpc goodput FILE [--gpus N --domain D --tp T]  throughput and goodput under GPU failures and stragglers, by policy\n"
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
    "  --micro-batches M  cut the batch into M micro-batches whose gradients accumulate (pipelining;\n"
    "                     docs/pipeline.md); the step equals the whole batch's\n"
    "  --schedule S       how micro-batches are ordered on each rank: gpipe, 1f1b (default),\n"
    "                     interleaved (default when a rank holds several stages), zb-h1, or a\n"
    "                     FILE.csv table (one line per rank set, cells as 0F1)\n"
    "  --timeline FILE    (report) draw the schedule's timeline as an SVG\n"
    "  --zero Z           with --train: the distributed optimizer (0, 1, 2; over the plan's line)\n"
    "  --redundancy K     with --zero: each part of the optimizer's state on K replicas\n"
    "  --domain-size D    GPUs per failure domain: a part's copies go to different ones\n"
    "  --gpu NAME|FILE    the device profile: 'tp auto' layers are planned for it (h100 default,\n"
    "                     h200, a100, b200, as 'ntpc plan --gpu'); a calibrated FILE also picks\n"
    "                     attention's CUDA kernel by its measured crossover ('ntpc calibrate')\n"
    "  --emit=KIND        tokens | ast | ir | sharded-ir | rank:N | report | cuda[:N] (rank N's kernels) | image\n"
    "  -o FILE            the model library, or the emitted text (written whole or not at all)\n"
    "  --keep-c           keep the model library's generated C file (FILE.c)\n"
    "  --backend NAME     run on: cpu (the reference, and every rank simulated; default) or cuda\n"
    "                     (NVRTC kernels, cuBLASLt, NCCL); compared with the reference\n"
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
  long micro_batches;        /* --micro-batches */
  cli_optimizer opt;         /* --zero, --redundancy, --domain-size */
  const char *schedule;      /* --schedule NAME or FILE.csv */
  const char *timeline;      /* --timeline FILE.svg (report) */
} options;

static int usage_error(const char *fmt, const char *arg) { return cli_usage_error("ntpc", fmt, arg); }

/* --micro-batches, --schedule, --timeline and the distributed optimizer's options: -2 not one of
 * them, -1 taken, else a usage error's status. */
static int pipeline_option(int argc, char **argv, int *i, options *o, bool *missing) {
  int rc;
  if (cli_optimizer_option("ntpc", argc, argv, i, missing, &o->opt, &rc)) return rc;
  const char *v;
  if ((v = cli_option_value(argc, argv, i, "--micro-batches", missing))) {
    char *end;
    o->micro_batches = strtol(v, &end, 10);
    if (*end || !*v || o->micro_batches < 1 || o->micro_batches > NTP_MAX_MICRO_BATCHES)
      return usage_error("--micro-batches needs a count from 1 to 4096, got '%s'", v);
    return -1;
  }
  if ((v = cli_option_value(argc, argv, i, "--schedule", missing))) return o->schedule = v, -1;
  if ((v = cli_option_value(argc, argv, i, "--timeline", missing))) return o->timeline = v, -1;
  return -2;
}

/* --timeline FILE: the pipelined program's timeline, steps costed by their flops, as an SVG. */
static int write_timeline(ntpc_session *s, const char *path) {
  const sh_program *p = ntpc_sharded(s);
  if (!p || !p->pipelined) return usage_error("--timeline needs a pipelined program: a plan with stages or --micro-batches%s", "");
  double *cost = malloc((p->n_steps + 1) * sizeof *cost);
  sh_timeline t;
  if (!cost) return 2;
  for (size_t k = 0; k < p->n_steps; k++) cost[k] = sh_step_flops(p, k);
  if (!sh_timeline_run(p, cost, &t)) {
    free(cost);
    return 2;
  }
  char err[512], title[256];
  snprintf(title, sizeof title, "%s: schedule %s, %d micro-batches (steps costed by their flops)", p->global->name,
           p->sched.name, p->micro_batches);
  ntp_outfile out;
  int rc = 0;
  if (ntp_outfile_open(&out, path, NULL, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    rc = 2;
  } else {
    sh_timeline_svg(p, &t, title, out.f);
    if (ntp_outfile_commit(&out, !ferror(out.f), err, sizeof err) != 0) fprintf(stderr, "ntpc: error: %s\n", err), rc = 2;
  }
  sh_timeline_free(&t);
  free(cost);
  return rc;
}

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








/* The sharded run: all ranks simulated, outputs assembled and compared with the unsharded run. */






/* The command line into *o and the session: -1 to go on, else the exit status (--help: 0). */
static int parse_args(int argc, char **argv, ntpc_session *s, options *o) {
  for (int i = 1, rc; i < argc; i++) {
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
    } else if ((rc = pipeline_option(argc, argv, &i, o, &missing)) != -2) {
      if (rc >= 0) return rc;
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

/* The options together, before anything is compiled: -1 when they make sense (*b the backend),
 * else the exit status (a usage error, or 2 when the backend cannot run here). */
static int check_options(const options *o, const ntp_exec_backend **b) {
  char why[512];
  if (!o->file) return usage_error("no input file%s", "");
  if (!o->command && !o->emit && !o->out)
    return usage_error("nothing to do: give a command (check, run, report), --emit=KIND or -o model.so%s", "");
  /* what only a run reads or writes: silently ignored elsewhere, it would look used */
  const char *run_only = o->dump ? "--dump" : o->params ? "--params" : o->save_params ? "--save-params"
                         : o->ninputs ? "--inputs" : o->text ? "--text" : NULL;
  if (run_only && !(o->command && strcmp(o->command, "run") == 0))
    return usage_error("%s applies to 'ntpc run' only", run_only);
  if (o->out && o->command && !o->emit && strcmp(o->command, "report") != 0)
    return usage_error("-o applies to --emit and report, not to '%s'", o->command);
  const char *opt = o->opt.zero >= 0          ? "--zero"
                    : o->opt.redundancy >= 0  ? "--redundancy"
                    : o->opt.domain_size >= 0 ? "--domain-size"
                                              : NULL;
  if (opt && !o->train) /* the optimizer's: a forward alone has none, and it would look used */
    return usage_error("%s shards the optimizer's state: it needs --train", opt);
  if (!(*b = ntp_exec_backend_find(o->backend, why, sizeof why))) return usage_error("%s", why);
  bool run = o->command && strcmp(o->command, "run") == 0;
  if (run && o->loopback && !(*b)->devices) /* a run would ignore it silently, and it would look used */
    return usage_error("--loopback is an option of a backend with devices (--backend cuda)%s", "");
  if ((*b)->devices && (o->dump || o->save_params)) /* the run on the devices is compared, not dumped */
    return usage_error("%s is a cpu-backend option (it writes the reference run's tensors)",
                       o->dump ? "--dump" : "--save-params");
  if (run && (*b)->available(why, sizeof why) != 0) {
    fprintf(stderr, "ntpc: error: --backend %s: %s\n", (*b)->name, why);
    return 2;
  }
  return -1;
}

/* `ntpc run` on the compiled session (run_cmd.c) */
static int run(ntpc_session *s, const options *o) {
  char err[512];
  ntp_program *prog = session_program(s, err, sizeof err);
  if (!prog) {
    fprintf(stderr, "ntpc: internal error: %s\n", err);
    return 3;
  }
  ntpc_run_options ro = {.backend = o->backend, .loopback = o->loopback, .seed = o->seed, .iters = o->iters,
                         .params = o->params, .params_format = o->params_format, .save_params = o->save_params,
                         .dump = o->dump, .inputs = o->inputs, .ninputs = o->ninputs, .text = o->text};
  int rc = ntpc_run(ntpc_module(s), prog, &ro);
  ntp_program_free(prog);
  return rc;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "plan") == 0) return ntpc_plan_command(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "train") == 0) return ntpc_train_command(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "goodput") == 0) return ntpc_goodput_command(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "calibrate") == 0) return ntpc_calibrate_command(argc - 1, argv + 1);
  options o = {.world = -1, .iters = 10, .params_format = "ntp", .opt = CLI_OPTIMIZER_UNSET};
  ntp_outfile_install_cleanup(); /* a killed ntpc leaves no temporary or half-built file */
  ntpc_session *s = ntpc_session_new();
  if (!s) return 2;
  int rc = parse_args(argc, argv, s, &o);
  const ntp_exec_backend *b = NULL;
  if (rc >= 0 || (rc = check_options(&o, &b)) >= 0) goto out;
  rc = 0;
  bool library = !o.command && !o.emit && o.out;
  bool wants_shards = (o.command && strcmp(o.command, "report") == 0) ||
                      (o.emit && (strcmp(o.emit, "sharded-ir") == 0 || strcmp(o.emit, "report") == 0 ||
                                  strncmp(o.emit, "rank:", 5) == 0 || strncmp(o.emit, "cuda", 4) == 0 ||
                                  strcmp(o.emit, "image") == 0));
  /* check, run and report shard when a plan or a world is given; --emit=ir shows the plan as data;
   * a backend that runs the codegen pass's kernels runs the sharded program */
  if (o.world > 0) ntpc_set_world(s, (int32_t)o.world);
  else if (wants_shards || library || b->kernels || (o.plan && o.command) || o.micro_batches > 1 || o.schedule)
    ntpc_set_world(s, 0); /* micro-batches: a sharded program, if of one rank */
  if (o.micro_batches >= 1 || o.schedule) {
    if (ntpc_set_pipeline(s, (int32_t)o.micro_batches, o.schedule) != NTPC_OK) {
      fprintf(stderr, "ntpc: error: %s\n", ntpc_last_error(s));
      rc = 2;
      goto out;
    }
  }
  if (!cli_optimizer_apply("ntpc", s, &o.opt)) {
    rc = 2;
    goto out;
  }
  ntpc_want_cuda(s, library || b->kernels || (o.emit && (strncmp(o.emit, "cuda", 4) == 0 || strcmp(o.emit, "image") == 0)));
  ntpc_status st = ntpc_compile_file(s, o.file);
  ntpc_print_diags(s, stderr, cli_color(o.color));
  if (st == NTPC_ERR_USAGE) {
    fprintf(stderr, "ntpc: error: %s\n", ntpc_last_error(s));
    rc = 2;
  } else if (st != NTPC_OK) {
    size_t n = ntpc_error_count(s);
    fprintf(stderr, "%zu error%s generated.\n", n, n == 1 ? "" : "s");
    rc = st == NTPC_ERR_INPUT ? 1 : 3;
  } else if (library) {
    rc = build_library(s, o.out, o.keep_c);
  } else if (o.emit) {
    rc = emit_to(s, o.emit, o.out);
  } else if (strcmp(o.command, "check") == 0) {
    ntpc_print_model_summary(ntpc_module(s), stdout);
  } else if (strcmp(o.command, "report") == 0) {
    rc = emit_to(s, "report", o.out);
    if (rc == 0 && o.timeline) rc = write_timeline(s, o.timeline);
  } else {
    rc = run(s, &o);
  }
out:
  ntpc_session_free(s);
  return rc;
}
