/* train_cmd.c — `ntpc train`: compile a model with its gradient pass, read batches from an
 * llm.c token file, and train with AdamW on the CPU reference, printing every step's loss,
 * learning rate, gradient norm and throughput. Exit status: 0 ok, 1 errors in the input
 * (the model, the data, a diverging loss), 2 usage or environment, 3 internal. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "exec.h"
#include "ntp_train.h"
#include "ntpc.h"
#include "shard.h"
#include "outfile.h"
#include "session_program.h"
#include "train_failover.h"
#include "train_straggler.h"

static const char train_usage[] =
    "usage: ntpc train FILE --data TOKENS [options]\n"
    "\n"
    "Trains the model on the CPU (the reference, or sharded with --plan / --world, every rank\n"
    "simulated) or on CUDA GPUs (--backend cuda): each step reads a batch of the model's token input\n"
    "(rows x positions, as its shape says) and its targets (the next tokens) from an llm.c token\n"
    "file, runs the forward and backward pass of its loss (an output 'loss = cross_entropy(...)')\n"
    "and updates the parameters with AdamW (fp32 master weights and moments).\n"
    "\n"
    "options:\n"
    "  --data FILE        the token file (llm.c format: tools/make_tokens.py makes one from text)\n"
    "  --steps N          steps to take (default 10), the learning rate schedule's length\n"
    "%s" /* the optimizer's options, from their table (ntp_adamw_option) */
    "  --shuffle          visit the file's batches in a seeded random order each epoch\n"
    "  --seed N           the default initialisation's and the shuffle's seed (default 0)\n"
    "  -D NAME=VALUE      override dim NAME (repeatable), e.g. -D B=8 -D S=64\n"
    "  --model NAME       the model to train when the file holds several\n"
    "  --plan FILE        train sharded as this plan says (per-layer degrees, groups, shares), every\n"
    "                     rank simulated; the same losses as unsharded, within fp32 rounding\n"
    "  --plan-name NAME   the plan to use (from --plan, or the model's own file)\n"
    "  --world W          ranks (default: the plan's world)\n"
    "  --micro-batches M  cut each batch into M micro-batches whose gradients accumulate (pipelining,\n"
    "                     docs/pipeline.md); every step equals the whole batch's\n"
    "  --schedule S       gpipe, 1f1b (default), interleaved, zb-h1, or a FILE.csv table\n"
    "  --zero Z           the distributed optimizer (docs/training.md), over the plan's 'optimizer'\n"
    "                     line: 0 every replica keeps its state, 1 the state sharded over each\n"
    "                     element's replicas, 2 the gradients too\n"
    "  --redundancy K     with --zero: each shard on K replicas (default 1; 2 survives any GPU's loss)\n"
    "  --domain-size D    GPUs per failure domain (a node): a shard's copies go to different ones\n"
    "  --backend NAME     where the ranks run (default cpu):\n%s"
    "  --loopback         cuda: every rank on one GPU, collectives as device copies\n"
    "  --rank R|env       cuda: this process runs rank R alone, on GPU R (env: RANK and LOCAL_RANK,\n"
    "                     as torchrun sets them; or Slurm's, Open MPI's); start one process per rank,\n"
    "                     all with the same options and NTP_NCCL_ID_FILE (where rank 0 writes the NCCL\n"
    "                     id). With --fail-at the failing GPU's process is killed (SIGKILL) and the\n"
    "                     survivors' processes notice it through NCCL and go on\n"
    "  --params FILE      start from these parameters (safetensors, global layout)\n"
    "  --init SCHEME      the start: gpt2 or megatron (normal 0.02, residual outputs 0.02/sqrt(2L)),\n"
    "                     llama (normal 0.02), uniform, comparison (the model's own; the tests');\n"
    "                     default llama with an RMS norm, else gpt2 (docs/training.md)\n"
    "  --init-std X       the initialisation's standard deviation (default 0.02)\n"
    "  --save-params FILE write the trained parameters (safetensors)\n"
    "  --params-format F  the layout of --params and --save-params: ntp (the model's names;\n"
    "                     default), hf-gpt2, hf-llama (Hugging Face checkpoints, docs/runtime.md)\n"
    "  --checkpoint DIR   save the training state there (masters, moments, step, data position) at\n"
    "                     the end and every --checkpoint-every N steps, atomically\n"
    "  --resume DIR       continue from DIR's checkpoint (to --steps in all; under any plan)\n"
    "  --fail-at S:R,...  sharded: GPU (physical rank) R fails before step S; through NCCL its\n"
    "                     communicators are aborted and the survivors' shrunk; the survivors re-plan\n"
    "                     (as ntpc plan --fail), take the parameters and optimizer state from the\n"
    "                     surviving replicas (the --checkpoint when a failed GPU held the only copy)\n"
    "                     and go on with the same batches (pipeline stages: a stage one GPU short\n"
    "                     has its replica's layers cut again)\n"
    "  --slow R:F,...     GPU R runs F times slower (the run's timeline): found within 3 steps, the\n"
    "                     plan is re-split around it (its rows to the others; pipeline stages: its\n"
    "                     replica's stages cut again around it), the state moved live\n"
    "  --join-at S:R,...  a GPU --fail-at failed is back before step S, repaired: the planner\n"
    "                     returns to the healthy plan (or re-plans the larger world), the state is\n"
    "                     handed to the newcomer from the ranks that hold it\n"
    "  --dump DIR         write step 1's inputs, parameters, loss and every gradient (grad.NAME)\n"
    "                     as raw files + manifest.tsv (the format of 'ntpc run --dump')\n"
    "  --quiet, -q        no progress line\n"
    "  --color=WHEN       auto | always | never (diagnostics)\n"
    "\n"
    "exit status: 0 ok, 1 errors in the input or a loss that is not finite, 2 usage\n";

typedef struct train_opts {
  const char *file, *data, *model, *params, *save_params, *dump, *color;
  const char *params_format; /* the layout of --params and --save-params */
  const ntp_exec_backend *backend; /* --backend: where the ranks run (exec.h) */
  bool loopback;
  int rank, device; /* --rank: this process runs rank `rank` alone, on GPU `device`; -1: every rank */
  unsigned long long seed;
  bool shuffle, sharded;
  int32_t world; /* 0: the plan's */
  double init_std; /* > 0: the initialisation's standard deviation (ntp_trainer_init; else 0.02) */
  ntp_init_scheme init; /* --init (init_given), else the model family's */
  bool init_given;
  const char *ckpt, *resume; /* checkpoint folders */
  long ckpt_every;
  ntp_adamw adamw; /* the optimizer's options and the run's length (adamw.steps) */
  const char *plan_file, *plan_name, *defines[256];
  int ndefines;
  int32_t micro_batches;                 /* --micro-batches */
  const char *schedule;                  /* --schedule NAME or FILE.csv */
  cli_optimizer opt;                     /* --zero, --redundancy, --domain-size */
  long fail_step[64];    /* --fail-at: before step fail_step[i] (1-based), GPU fail_rank[i] fails */
  int32_t fail_rank[64];
  int nfail;
  long join_step[64];    /* --join-at: before step join_step[i], GPU join_rank[i] is back, repaired */
  int32_t join_rank[64];
  int njoin;
  double *slow;          /* --slow GPU:FACTOR: per GPU (4096) its time per operation, 1 healthy */
} train_opts;

static int usage(const char *fmt, const char *arg) { return cli_usage_error("ntpc train", fmt, arg); }

/* a finite number of at least lo (cli_number with no upper bound) */
static bool number(const char *v, double lo, double *out) { return cli_number(v, lo, DBL_MAX, out); }

/* The flag of the optimizer's option `name`: "--weight-decay" for "weight_decay". */
static void adamw_flag(const char *name, char *flag, size_t cap) {
  snprintf(flag, cap, "--%s", name);
  for (char *c = flag + 2; *c; c++) *c = *c == '_' ? '-' : *c;
}

/* The help, with the optimizer's options and the backends from their tables. */
static void print_usage(void) {
  char adamw[2048] = "", backends[1024] = "", flag[64], opt[80];
  size_t na = 0, nb = 0;
  const char *name, *help;
  for (size_t i = 0; (name = ntp_adamw_option(i, &help)); i++) {
    if (!strcmp(name, "steps")) continue; /* --steps: the run's length, above */
    adamw_flag(name, flag, sizeof flag);
    snprintf(opt, sizeof opt, "%s %s", flag, !strcmp(name, "warmup") ? "N" : "X");
    na += (size_t)snprintf(adamw + na, sizeof adamw - na, "  %-18s %s\n", opt, help);
  }
  const ntp_exec_backend *b;
  for (size_t i = 0; (b = ntp_exec_backend_at(i)); i++)
    nb += (size_t)snprintf(backends + nb, sizeof backends - nb, "                       %-5s %s\n", b->name, b->what);
  printf(train_usage, adamw, backends);
}

/* --fail-at STEP:RANK[,STEP:RANK...] */
static int set_fail_at(train_opts *o, ntpc_session *s, const char *v) {
  (void)s;
  if (train_parse_events(v, o->fail_step, o->fail_rank, &o->nfail)) return -1;
  return usage("--fail-at %s: expected STEP:RANK[,STEP:RANK...] (steps 1 to 10^9, ranks 0 to 4095, at most 64)", v);
}

/* --slow GPU:FACTOR[,GPU:FACTOR...]: a straggler (FACTOR 1 to 100 times slower) */
static int set_slow(train_opts *o, ntpc_session *s, const char *v) {
  static double factors[4096]; /* one command a process: nothing to free */
  (void)s;
  if (straggler_parse(v, o->slow = factors)) return -1;
  return usage("--slow %s: expected GPU:FACTOR[,GPU:FACTOR...] (GPUs 0 to 4095, factors 1 to 100)", v);
}

/* --join-at STEP:RANK[,STEP:RANK...]: a failed GPU repaired */
static int set_join_at(train_opts *o, ntpc_session *s, const char *v) {
  (void)s;
  if (train_parse_events(v, o->join_step, o->join_rank, &o->njoin)) return -1;
  return usage("--join-at %s: expected STEP:RANK[,STEP:RANK...] (steps 1 to 10^9, ranks 0 to 4095, at most 64)", v);
}

static int set_rank(train_opts *o, ntpc_session *s, const char *v) {
  double d;
  (void)s;
  if (!strcmp(v, "env")) {
    if (ntp_launcher_rank(&o->rank, &o->device) != 0)
      return usage("--rank env: no launcher rank in the environment (RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK)%s", "");
  } else if (!number(v, 0, &d) || d != floor(d) || d > 4095) {
    return usage("--rank %s: expected a rank from 0, or env", v);
  } else {
    o->rank = o->device = (int)d;
  }
  return -1;
}

static int set_backend(train_opts *o, ntpc_session *s, const char *v) {
  char why[256];
  (void)s;
  return (o->backend = ntp_exec_backend_find(v, why, sizeof why)) ? -1 : usage("%s", why);
}

static int set_plan_name(train_opts *o, ntpc_session *s, const char *v) {
  ntpc_select_plan(s, v);
  o->plan_name = v;
  o->sharded = true;
  return -1;
}

static int set_plan(train_opts *o, ntpc_session *s, const char *v) {
  if (ntpc_add_plan_file(s, v) != NTPC_OK) return usage("%s", ntpc_last_error(s));
  o->plan_file = v;
  o->sharded = true;
  return -1;
}

static int set_micro_batches(train_opts *o, ntpc_session *s, const char *v) {
  double d;
  (void)s;
  if (!number(v, 1, &d) || d != floor(d) || d > NTP_MAX_MICRO_BATCHES)
    return usage("--micro-batches %s: expected a count from 1 to 4096", v);
  o->micro_batches = (int32_t)d;
  o->sharded = true; /* a sharded program (of one rank without a plan): its steps are the micro-batches' */
  return -1;
}

static int set_schedule(train_opts *o, ntpc_session *s, const char *v) {
  (void)s;
  o->schedule = v; /* a name or a FILE.csv: ntpc_set_pipeline tells */
  o->sharded = true;
  return -1;
}

static int set_world(train_opts *o, ntpc_session *s, const char *v) {
  double d;
  (void)s;
  if (!number(v, 1, &d) || d != floor(d) || d > 4096) return usage("--world %s: expected 1 to 4096 ranks", v);
  o->world = (int32_t)d;
  o->sharded = true;
  return -1;
}

static int set_params_format(train_opts *o, ntpc_session *s, const char *v) {
  (void)s;
  if (!ntp_param_format_known(v)) return usage("--params-format expects ntp, hf-gpt2 or hf-llama, got '%s'", v);
  o->params_format = v;
  return -1;
}

static int set_color(train_opts *o, ntpc_session *s, const char *v) {
  (void)s;
  if (strcmp(v, "auto") && strcmp(v, "always") && strcmp(v, "never"))
    return usage("--color=%s: expected auto, always or never", v);
  o->color = v;
  return -1;
}

static int set_checkpoint_every(train_opts *o, ntpc_session *s, const char *v) {
  double d;
  (void)s;
  if (!number(v, 1, &d) || d != floor(d) || d > 1e9)
    return usage("--checkpoint-every %s: expected a whole number of steps", v);
  o->ckpt_every = (long)d;
  return -1;
}

static int set_init(train_opts *o, ntpc_session *s, const char *v) {
  (void)s;
  o->init_given = ntp_init_scheme_named(v, &o->init);
  return o->init_given ? -1 : usage("--init %s: expected gpt2, megatron, llama, uniform or comparison", v);
}

static int set_init_std(train_opts *o, ntpc_session *s, const char *v) {
  double d;
  (void)s;
  if (!number(v, 0, &d) || d <= 0) return usage("--init-std %s: expected a standard deviation above 0", v);
  o->init_std = d;
  return -1;
}

static int set_seed(train_opts *o, ntpc_session *s, const char *v) {
  char *end;
  (void)s;
  errno = 0;
  o->seed = strtoull(v, &end, 10);
  if (errno || end == v || *end || *v == '-') return usage("--seed %s: expected a number below 2^64", v);
  return -1;
}

/* The options with a value: a path kept as given (its field), or a setter that checks it (-1: set,
 * else the exit status of the usage error it printed). The optimizer's are the trainer's table's. */
typedef struct valued_option {
  const char *name;
  size_t path;
  int (*set)(train_opts *o, ntpc_session *s, const char *v);
} valued_option;

#define PATH(opt, field) {opt, offsetof(train_opts, field), NULL}
static const valued_option valued[] = {
    PATH("--data", data), PATH("--model", model), PATH("--params", params), PATH("--save-params", save_params),
    PATH("--dump", dump), PATH("--checkpoint", ckpt), PATH("--resume", resume),
    {"--rank", 0, set_rank}, {"--backend", 0, set_backend}, {"--plan-name", 0, set_plan_name},
    {"--plan", 0, set_plan}, {"--fail-at", 0, set_fail_at}, {"--join-at", 0, set_join_at}, {"--slow", 0, set_slow}, {"--world", 0, set_world},
    {"--micro-batches", 0, set_micro_batches}, {"--schedule", 0, set_schedule},
    {"--params-format", 0, set_params_format}, {"--color", 0, set_color},
    {"--checkpoint-every", 0, set_checkpoint_every}, {"--init-std", 0, set_init_std}, {"--init", 0, set_init}, {"--seed", 0, set_seed}};

/* --lr, --weight-decay, ...: the trainer's options (ntp_adamw_set: bounds and messages there) */
static int adamw_option(train_opts *o, int argc, char **argv, int *i, bool *missing, bool *taken) {
  const char *name, *v;
  char opt[64], why[256], msg[512];
  for (size_t k = 0; (name = ntp_adamw_option(k, NULL)); k++) {
    adamw_flag(name, opt, sizeof opt);
    if (!(v = cli_option_value(argc, argv, i, opt, missing))) continue;
    *taken = true;
    if (ntp_adamw_set(&o->adamw, name, v, why, sizeof why) != 0) {
      snprintf(msg, sizeof msg, "%s %s: %s", opt, v, why);
      return usage("%s", msg);
    }
    return -1;
  }
  return -1;
}

/* One option at argv[*i] (which advances past its value): -1 when taken, else the exit status. */
static int parse_one(int argc, char **argv, int *i, ntpc_session *s, train_opts *o) {
  const char *a = argv[*i], *v;
  bool missing = false, taken = false;
  if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
    print_usage();
    return 0;
  }
  if (!strcmp(a, "--shuffle") || !strcmp(a, "--loopback")) {
    *(a[2] == 's' ? &o->shuffle : &o->loopback) = true;
    return -1;
  }
  if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
    ntp_progress_enable(0);
    return -1;
  }
  if (!strncmp(a, "-D", 2)) {
    const char *def = a[2] ? a + 2 : *i + 1 < argc ? argv[++*i] : NULL;
    if (!def) return usage("-D needs NAME=VALUE%s", "");
    if (ntpc_define_str(s, def) != NTPC_OK) return usage("%s", ntpc_last_error(s));
    if (o->ndefines == 256) return usage("more than 256 -D overrides%s", "");
    o->defines[o->ndefines++] = def;
    return -1;
  }
  for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) {
    if (!(v = cli_option_value(argc, argv, i, valued[k].name, &missing))) {
      if (missing) return usage("%s needs a value", a);
      continue;
    }
    if (!valued[k].set) *(const char **)((char *)o + valued[k].path) = v;
    return valued[k].set ? valued[k].set(o, s, v) : -1;
  }
  int rc = adamw_option(o, argc, argv, i, &missing, &taken);
  if (taken || rc >= 0) return rc;
  if (cli_optimizer_option("ntpc train", argc, argv, i, &missing, &o->opt, &rc)) {
    o->sharded = true;
    return rc;
  }
  if (missing) return usage("%s needs a value", a);
  if (a[0] == '-' && a[1]) return usage("unknown option '%s'", a);
  if (o->file) return usage("one model file only (got '%s' too)", a);
  o->file = a;
  return -1;
}

/* The options together: -1 when they make sense, else the exit status of the usage error. */
static int check_options(const train_opts *o) {
  if (!o->file) return usage("no model file%s", "");
  if (!o->data) return usage("--data TOKENS is required (tools/make_tokens.py makes a token file from text)%s", "");
  if ((o->init_std > 0 || o->init_given) && o->params)
    return usage("--init/--init-std and --params both set the parameters: give one%s", "");
  if (o->resume && (o->params || o->init_std > 0 || o->init_given))
    return usage("--resume sets the parameters: no --params, --init or --init-std with it%s", "");
  if (o->ckpt_every && !o->ckpt) return usage("--checkpoint-every needs --checkpoint DIR%s", "");
  if (o->loopback && !o->backend->devices)
    return usage("--loopback is an option of a backend with devices (--backend cuda)%s", "");
  if (o->nfail && !o->sharded) return usage("--fail-at needs a sharded run (--plan or --world)%s", "");
  if (o->slow && (!o->sharded || o->rank >= 0))
    return usage("--slow needs a sharded run with every rank in this process (--plan or --world, not --rank)%s", "");
  if (o->njoin && !o->nfail) return usage("--join-at brings back a GPU --fail-at failed: give --fail-at too%s", "");
  if (o->njoin && o->rank >= 0)
    return usage("--join-at: a repaired GPU rejoins runs with every rank in this process (not --rank)%s", "");
  if (o->rank >= 0 && (!o->backend->devices || o->loopback || !o->sharded))
    return usage("--rank runs one rank of a sharded run on its own device: it needs a backend with devices "
                 "(--backend cuda) and --plan or --world, without --loopback%s", "");
  if (o->rank >= 0 && o->dump) return usage("--rank: --dump is not supported yet with one rank per process%s", "");
  return -1;
}

static int parse(int argc, char **argv, ntpc_session *s, train_opts *o) {
  int rc = -1;
  for (int i = 1; i < argc && rc < 0; i++) rc = parse_one(argc, argv, &i, s, o);
  return rc >= 0 ? rc : check_options(o);
}

/* The token input and the targets: the targets are what cross_entropy reads as its second
 * operand; the tokens the other i32 input. Both [rows, len]. The vocabulary bounds both. */
typedef struct batch_inputs {
  int32_t tokens, targets;
  int64_t rows, len, vocab;
} batch_inputs;

static bool find_inputs(const ntp_module *m, batch_inputs *b, char *err, size_t cap) {
  *b = (batch_inputs){.tokens = -1, .targets = -1, .vocab = INT64_MAX};
  for (size_t i = 0; i < m->n_ops; i++) {
    const ntp_op *op = &m->ops[i];
    if (op->code == IR_CROSS_ENTROPY && m->ops[m->values[op->args[1]].def].code == IR_INPUT) {
      b->targets = op->args[1];
      const ntp_shape *ls = &m->values[op->args[0]].shape;
      if (ls->dim[ls->ndim - 1] < b->vocab) b->vocab = ls->dim[ls->ndim - 1];
    }
  }
  if (b->targets < 0) {
    snprintf(err, cap, "the loss's targets are not a model input (as in 'input targets : i32[B, S]')");
    return false;
  }
  int n_tok = 0;
  for (size_t i = 0; i < m->n_ops; i++) {
    const ntp_op *op = &m->ops[i];
    if (op->code == IR_INPUT && op->result != b->targets) {
      if (m->values[op->result].dtype != NTP_I32) {
        snprintf(err, cap, "input '%s' is not token ids: training feeds token ids and targets only",
                 m->values[op->result].name);
        return false;
      }
      b->tokens = op->result;
      n_tok++;
    }
    if (op->code == IR_GATHER && op->args[1] >= 0 && m->values[op->args[0]].shape.dim[0] < b->vocab)
      b->vocab = m->values[op->args[0]].shape.dim[0];
  }
  if (n_tok != 1) {
    snprintf(err, cap, "training needs one token input beside the targets, the model has %d", n_tok);
    return false;
  }
  const ntp_shape *ts = &m->values[b->tokens].shape, *gs = &m->values[b->targets].shape;
  if (ts->ndim != 2 || !shape_eq(ts, gs)) {
    snprintf(err, cap, "the tokens and the targets must both be [rows, positions]");
    return false;
  }
  b->rows = ts->dim[0];
  b->len = ts->dim[1];
  return true;
}

/* Can path be written (a temporary file beside it created and removed, as the real write
 * will)? */
static bool writable(const char *path, char *err, size_t cap) {
  ntp_outfile f;
  if (ntp_outfile_open(&f, path, NULL, err, cap) != 0) return false;
  ntp_outfile_abort(&f);
  return true;
}

/* Before step 1, everything that would make the run fail later: every output the run writes
 * can be written, the data's ids are in the vocabulary, and --fail-at names GPUs of the world.
 * A bad path found after the last step would throw the trained state away. */
/* 0, or the exit status: 1 for the data (an input), 2 for an option or an output path. */
static int preflight(const train_opts *o, const ntp_program *prog, const ntp_tokens *data, int64_t vocab, char *err,
                     size_t cap) {
  char why[512];
  for (int k = 0; k < o->nfail; k++)
    if (o->fail_rank[k] >= prog->world) {
      snprintf(err, cap, "--fail-at %ld:%d: GPU %d is not in the world of %d", o->fail_step[k], o->fail_rank[k],
               o->fail_rank[k], prog->world);
      return 2;
    }
  if (ntp_tokens_check_vocab(data, vocab, why, sizeof why) != 0) {
    snprintf(err, cap, "%s: %s (checked before the first step)", o->data, why);
    return 1;
  }
  if (o->rank > 0) return 0; /* one rank per process: rank 0's process writes the files */
  if (o->ckpt) {
    struct stat sb;
    bool exists = stat(o->ckpt, &sb) == 0;
    if (exists ? !S_ISDIR(sb.st_mode) : mkdir(o->ckpt, 0777) != 0) {
      snprintf(err, cap, "--checkpoint: '%s' %s%s (checked before the first step)", o->ckpt,
               exists ? "is not a folder" : "cannot be created: ", exists ? "" : strerror(errno));
      return 2;
    }
    size_t n = strlen(o->ckpt) + 32;
    char *index = malloc(n);
    bool ok = index != NULL;
    if (ok) snprintf(index, n, "%s/checkpoint.json", o->ckpt);
    if (ok && !(ok = writable(index, why, sizeof why)))
      snprintf(err, cap, "--checkpoint: %s (checked before the first step)", why);
    free(index);
    if (!ok) return 2;
  }
  if (o->save_params && (ntp_safetensors_format_check(o->params_format, &prog->global, why, sizeof why) != 0 ||
                         !writable(o->save_params, why, sizeof why))) {
    snprintf(err, cap, "--save-params: %s (checked before the first step)", why);
    return 2;
  }
  return 0;
}

/* A run between its steps: what it reads, the trainer and its program (replaced after a failure),
 * the batch's buffers, and what the summary at the end says. */
typedef struct train_run {
  const train_opts *o;
  ntp_program *prog;
  ntp_tokens *data;
  ntp_safetensors *params;
  ntp_trainer *tr;
  batch_inputs bi;
  int32_t *tok, *tgt, *phys; /* phys: the physical GPU of each rank (NULL: the same) */
  ntp_host_tensor ht, hg;
  const ntp_host_tensor **given;
  failover_run fr;
  straggler_watch_state *sw; /* --slow: the GPUs' measured speeds */
  double first, last, total_s;
  long ran;                /* steps of this run (a resumed one starts where its checkpoint stopped) */
  long long ckpt_failed;   /* the step whose checkpoint could not be written */
  char ckpt_err[512];
  ntp_init_scheme init;    /* how the parameters started (MODULE also for --params and --resume) */
} train_run;

/* Where the ranks run: every rank here (on one device with --loopback), or --rank's one, joined
 * with the others' processes (through $NTP_NCCL_ID_FILE on cuda). */
static int trainer_new(train_run *r, char *err, size_t cap) {
  const train_opts *o = r->o;
  ntp_exec_options x = {.backend = o->backend->name, .loopback = o->loopback};
  if (o->rank >= 0) {
    if (o->rank >= r->prog->world || r->prog->world < 2) {
      snprintf(err, cap, "--rank %d: the plan's world is %d ranks (one rank per process needs 2 or more)", o->rank,
               r->prog->world);
      return 1;
    }
    x.rank_lo = o->rank, x.rank_hi = o->rank + 1, x.device = o->device;
  }
  if (ntp_trainer_new(r->prog, &o->adamw, o->seed, r->params, &x, &r->tr, err, cap) != 0) return 1;
  /* the parameters' start: --params or --resume, else the scheme asked for or the family's */
  r->init = o->params || o->resume ? NTP_INIT_MODULE : o->init_given ? o->init : ntp_trainer_family_init(r->tr);
  if (ntp_trainer_init(r->tr, r->init, o->init_std, o->seed, err, cap) != 0) return 1;
  if (o->resume) {
    if (ntp_checkpoint_load(o->resume, r->tr, r->data, err, cap) != 0) return 1;
    printf("resumed from %s at step %lld\n", o->resume, (long long)ntp_trainer_steps_taken(r->tr));
  }
  return 0;
}

/* The program, the data, the parameters, the trainer and the batch's buffers: 0, or the exit
 * status (1 an input, 2 an option or an output path, 3 internal). */
static int open_run(train_run *r, ntpc_session *s, char *err, size_t cap) {
  const train_opts *o = r->o;
  int rc;
  if (!(r->prog = session_program(s, err, cap))) return 3;
  const ntp_module *m = &r->prog->global;
  if (!find_inputs(m, &r->bi, err, cap) || ntp_tokens_open(o->data, &r->data, err, cap) != 0) return 1;
  if ((rc = preflight(o, r->prog, r->data, r->bi.vocab, err, cap)) != 0) return rc;
  if (o->shuffle) ntp_tokens_shuffle(r->data, o->seed);
  if (o->params && (ntp_safetensors_open(o->params, &r->params, err, cap) != 0 ||
                    ntp_safetensors_set_format(r->params, o->params_format, m, err, cap) != 0))
    return 1;
  if ((rc = trainer_new(r, err, cap)) != 0) return rc;
  int64_t n = r->bi.rows * r->bi.len;
  r->tok = malloc((size_t)n * sizeof *r->tok);
  r->tgt = malloc((size_t)n * sizeof *r->tgt);
  r->given = calloc(m->n_values, sizeof *r->given);
  if (!r->tok || !r->tgt || !r->given) {
    snprintf(err, cap, "out of memory");
    return 1;
  }
  r->ht = (ntp_host_tensor){.name = m->values[r->bi.tokens].name, .dtype = NTP_I32,
                            .shape = m->values[r->bi.tokens].shape, .i = r->tok};
  r->hg = (ntp_host_tensor){.name = m->values[r->bi.targets].name, .dtype = NTP_I32,
                            .shape = m->values[r->bi.targets].shape, .i = r->tgt};
  r->given[r->bi.tokens] = &r->ht;
  r->given[r->bi.targets] = &r->hg;
  r->fr = (failover_run){.src = {o->file, o->model, o->plan_file, o->plan_name, o->defines, o->ndefines,
                                 o->backend->kernels, o->micro_batches, o->schedule, o->opt},
                         .ckpt = o->ckpt, .phys_rank = o->rank, .seed = o->seed, .backend = o->backend->name,
                         .loopback = o->loopback};
  return 0;
}

/* The model, the batch, where the ranks run and the optimizer, before step 1. */
static void print_header(train_run *r, const sh_program *sp) {
  const train_opts *o = r->o;
  const ntp_module *m = &r->prog->global;
  const ntp_host_tensor *ps;
  size_t np = ntp_trainer_params(r->tr, &ps);
  int64_t elems = 0;
  for (size_t i = 0; i < np; i++) elems += shape_numel(&ps[i].shape);
  printf("model %s: %zu parameters (%.3fM elements), dtype %s; batch %lld x %lld tokens from %s (%lld tokens)\n",
         m->name, np, (double)elems / 1e6, dtype_name(m->dtype), (long long)r->bi.rows, (long long)r->bi.len, o->data,
         (long long)ntp_tokens_count(r->data));
  ntp_exec *e = ntp_trainer_exec(r->tr);
  int32_t w = r->prog->world;
  if (o->rank >= 0)
    printf("backend %s: rank %d of %d in this process (pid %ld, GPU %d; each rank in its own process, the loss and "
           "the gradients' norm merged across them)\n", ntp_exec_name(e), o->rank, w, (long)getpid(), o->device);
  else if (e)
    printf("backend %s: %d rank%s (each rank's forward, backward and AdamW on its slices, the gradients summed over "
           "their holders)\n", e->ops->label(e->be), w > 0 ? w : 1, w > 1 ? "s" : "");
  cli_verbose_exec(e);
  if (sp && sp->zero) /* the distributed optimizer (docs/training.md) */
    printf("optimizer state: ZeRO-%d, each part on %d of its element's replicas (failure domains of %d GPU%s)\n",
           sp->zero, sp->redundancy, sp->domain_size, sp->domain_size == 1 ? "" : "s");
  const ntp_adamw *aw = &o->adamw;
  printf("AdamW: lr %g (warmup %lld, cosine to %g), betas %g %g, eps %g, weight decay %g, clip %g\n", aw->lr,
         (long long)aw->warmup, aw->lr * aw->min_lr_frac, aw->beta1, aw->beta2, aw->eps, aw->weight_decay, aw->clip);
  if (!o->params && !o->resume)
    printf("init: %s%s, std %g%s\n", ntp_init_scheme_name(r->init),
           r->init == NTP_INIT_MODULE ? " (the model's own)" : "", o->init_std > 0 ? o->init_std : 0.02,
           o->init_given ? "" : " (the model family's; --init to choose)");
}

/* The GPUs --fail-at fails before step `step` (1-based) into now[]; this process dies if its own
 * is among them (one rank per process: as a killed process does, SIGKILL). */
static int failing_now(train_run *r, long step, int32_t *now) {
  const train_opts *o = r->o;
  int nnow = 0;
  for (int k = 0; k < o->nfail; k++)
    if (o->fail_step[k] == step && !r->fr.fired[k]) now[nnow++] = o->fail_rank[k], r->fr.fired[k] = true;
  if (nnow && !r->fr.world0) r->fr.world0 = r->prog->world;
  for (int k = 0; o->rank >= 0 && k < nnow; k++)
    if (now[k] == o->rank) {
      printf("step %4ld: GPU %d fails: its process (pid %ld) is killed (SIGKILL)\n", step, o->rank, (long)getpid());
      fflush(stdout);
      raise(SIGKILL);
    }
  return nnow;
}

/* Step `*step` + 1 (its failures first); *step is moved back when a failure sent the run to a
 * checkpoint. 0, or -1 with err (*dump_failed: the --dump could not be written). */
static int train_step(train_run *r, long *step, bool *dump_failed, char *err, size_t cap) {
  const train_opts *o = r->o;
  int32_t now[64];
  int nnow = failing_now(r, *step + 1, now);
  bool lost = nnow && o->rank >= 0; /* one rank per process: the step is to notice the failure */
  if (nnow && !lost) {
    if (train_fail_over(&r->fr, *step + 1, now, nnow, &r->prog, &r->tr, &r->phys, &o->adamw, r->data, err, cap) != 0)
      return -1;
    if (r->fr.idle) return 0;
    *step = (long)ntp_trainer_steps_taken(r->tr); /* the checkpoint's, when the run went back to it */
  }
  int32_t back[64];
  int nback = 0;
  for (int k = 0; k < o->njoin; k++)
    if (o->join_step[k] == *step + 1) back[nback++] = o->join_rank[k];
  if (nback && train_rejoin(&r->fr, *step + 1, back, nback, &r->prog, &r->tr, &r->phys, &o->adamw, err, cap) != 0)
    return -1;
  int64_t pos, epoch;
  ntp_tokens_position(r->data, &pos, &epoch);
  ntp_train_stats st;
  bool dump = o->dump && *step == 0;
  for (;;) {
    if (ntp_tokens_next(r->data, r->bi.rows, r->bi.len, r->bi.vocab, r->tok, r->tgt, err, cap) != 0) return -1;
    if (ntp_trainer_step(r->tr, r->given, dump, &st, err, cap) == 0) break;
    if (!lost || !ntp_exec_peer_lost(ntp_trainer_exec(r->tr))) return -1;
    /* the survivors: the backend said a peer is gone; the step is taken again by them, with the same batch */
    r->fr.detected = train_now_s();
    printf("step %4ld: NCCL reports a lost peer (%s)\n", *step + 1, err);
    ntp_tokens_seek(r->data, pos, epoch);
    if (train_fail_over(&r->fr, *step + 1, now, nnow, &r->prog, &r->tr, &r->phys, &o->adamw, r->data, err, cap) != 0)
      return -1;
    if (r->fr.idle) return 0;
    *step = (long)ntp_trainer_steps_taken(r->tr);
    lost = false;
  }
  if (lost) {
    snprintf(err, cap, "step %ld ran to its end though GPU %d failed before it: no NCCL call noticed", *step + 1, now[0]);
    return -1;
  }
  if (dump && ntp_dump_tensors(ntp_trainer_last(r->tr), o->dump, err, cap) != 0) {
    *dump_failed = true;
    return -1;
  }
  int64_t n = r->bi.rows * r->bi.len;
  if (isnan(r->first)) r->first = st.loss;
  r->last = st.loss;
  r->total_s += st.seconds;
  printf("step %4lld/%lld  loss %.6f  lr %.3e  grad norm %.4f  %.0f tokens/s\n", (long long)st.step,
         (long long)o->adamw.steps, st.loss, st.lr, st.grad_norm, (double)n / st.seconds);
  fflush(stdout);
  if (o->slow && (r->sw || (r->sw = calloc(1, sizeof *r->sw))) &&
      train_absorb_straggler(r->sw, &r->fr, o->slow, *step + 1, &r->prog, &r->tr, &r->phys, &o->adamw, err, cap) != 0)
    return -1;
  if (o->ckpt && ((o->ckpt_every && st.step % o->ckpt_every == 0) || *step + 1 == o->adamw.steps)) {
    if (ntp_checkpoint_save(o->ckpt, r->tr, r->data, r->ckpt_err, sizeof r->ckpt_err) != 0) {
      r->ckpt_failed = st.step; /* the run stops here; what can be saved still is (finish_run) */
      return 0;
    }
    printf("checkpoint: %s at step %lld\n", o->ckpt, (long long)st.step);
  }
  return 0;
}

/* After the last step: the summary, the parameters (gathered by every process with one rank per
 * process, written by rank 0's), a checkpoint that could not be written. 0, or the exit status. */
static int finish_run(train_run *r, char *err, size_t cap) {
  const train_opts *o = r->o;
  int64_t n = r->bi.rows * r->bi.len;
  if (r->ran)
    printf("trained %ld steps in %.2f s (%.0f tokens/s): loss %.6f -> %.6f\n", r->ran, r->total_s,
           (double)n * (double)r->ran / r->total_s, r->first, r->last);
  if (o->save_params) {
    const ntp_host_tensor *ps;
    if (ntp_trainer_gather(r->tr, err, cap) != 0) return 1;
    size_t np = ntp_trainer_params(r->tr, &ps);
    /* the program now running: after a failure, the survivors' (its module names the same parameters) */
    bool writer = ntp_trainer_writes(r->tr);
    if (writer &&
        ntp_safetensors_save_format(o->save_params, o->params_format, &r->prog->global, ps, np, err, cap) != 0)
      return 2;
    if (writer) printf("wrote %s\n", o->save_params);
  }
  if (r->ckpt_failed) {
    snprintf(err, cap, "the checkpoint of step %lld was not written: %s; training stopped there%s%s", r->ckpt_failed,
             r->ckpt_err, o->save_params ? ", its parameters are in " : "", o->save_params ? o->save_params : "");
    return 2;
  }
  return 0;
}

static int train(const train_opts *o, ntpc_session *s) {
  char err[2048];
  train_run r = {.o = o, .first = NAN, .last = NAN};
  int rc = open_run(&r, s, err, sizeof err);
  if (rc == 0) print_header(&r, ntpc_sharded(s));
  for (long step = r.tr ? (long)ntp_trainer_steps_taken(r.tr) : 0; rc == 0 && !r.fr.idle && step < o->adamw.steps;
       step++, r.ran++) {
    bool dump_failed = false;
    if (train_step(&r, &step, &dump_failed, err, sizeof err) != 0) rc = dump_failed ? 2 : 1;
    if (r.ckpt_failed) { /* this step counts; the run stops */
      r.ran++;
      break;
    }
  }
  if (rc == 0 && !r.fr.idle) rc = finish_run(&r, err, sizeof err);
  if (rc) fprintf(stderr, rc == 3 ? "ntpc train: internal error: %s\n" : "ntpc train: error: %s\n", err);
  free(r.tok);
  free(r.tgt);
  free(r.given);
  ntp_trainer_free(r.tr);
  ntp_safetensors_close(r.params);
  ntp_tokens_close(r.data);
  ntp_program_free(r.prog);
  failover_run_free(&r.fr);
  free(r.sw);
  free(r.phys);
  return rc;
}

/* The options with their defaults into *o, in a new session *s (NULL when out of memory: 2). */
static int parse_new(int argc, char **argv, ntpc_session **s, train_opts *o) {
  *o = (train_opts){.params_format = "ntp", .rank = -1, .backend = ntp_exec_backend_find(NULL, NULL, 0),
                    .opt = CLI_OPTIMIZER_UNSET};
  ntp_adamw_defaults(&o->adamw);
  o->adamw.steps = 10;
  if (!(*s = ntpc_session_new())) return 2;
  return parse(argc, argv, *s, o);
}

int ntpc_train_parse_options(int argc, char **argv) {
  train_opts o;
  ntpc_session *s;
  int rc = parse_new(argc, argv, &s, &o);
  ntpc_session_free(s);
  return rc;
}

int ntpc_train_command(int argc, char **argv) {
  train_opts o;
  ntpc_session *s;
  int rc = parse_new(argc, argv, &s, &o);
  if (!s) return rc;
  if (rc >= 0) {
    ntpc_session_free(s);
    return rc;
  }
  if (o.model) ntpc_select_model(s, o.model);
  char why[256];
  if (o.backend->available(why, sizeof why) != 0) {
    fprintf(stderr, "ntpc train: error: --backend %s: %s\n", o.backend->name, why);
    ntpc_session_free(s);
    return 2;
  }
  /* a backend that runs the codegen pass's kernels runs the sharded program (one rank at least) */
  if (o.sharded || o.backend->kernels) ntpc_set_world(s, o.world);
  ntpc_want_cuda(s, o.backend->kernels);
  ntpc_want_grad(s, true);
  if ((o.micro_batches >= 1 || o.schedule) && ntpc_set_pipeline(s, o.micro_batches, o.schedule) != NTPC_OK) {
    fprintf(stderr, "ntpc train: error: %s\n", ntpc_last_error(s));
    ntpc_session_free(s);
    return 2;
  }
  if (!cli_optimizer_apply("ntpc train", s, &o.opt)) {
    ntpc_session_free(s);
    return 2;
  }
  ntpc_status st = ntpc_compile_file(s, o.file);
  ntpc_print_diags(s, stderr, cli_color(o.color));
  if (st != NTPC_OK) {
    size_t n = ntpc_error_count(s);
    if (n) fprintf(stderr, "%zu error%s generated.\n", n, n == 1 ? "" : "s");
    else fprintf(stderr, "ntpc train: error: %s\n", ntpc_last_error(s));
    ntpc_session_free(s);
    return st == NTPC_ERR_INPUT ? 1 : st == NTPC_ERR_USAGE ? 2 : 3;
  }
  rc = train(&o, s);
  ntpc_session_free(s);
  return rc;
}
