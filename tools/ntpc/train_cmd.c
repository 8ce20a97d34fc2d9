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
#include "cuda_backend.h"
#include "ntp_train.h"
#include "ntpc.h"
#include "outfile.h"
#include "session_program.h"
#include "train_failover.h"

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
    "  --steps N          steps to take (default 10)\n"
    "  --lr X             peak learning rate (default 1e-3)\n"
    "  --warmup N         steps of linear warmup (default 0); then a cosine to lr * --min-lr-frac\n"
    "  --min-lr-frac X    the cosine's end, as a fraction of --lr (default 0.1)\n"
    "  --beta1 X, --beta2 X, --eps X   AdamW's (default 0.9, 0.95, 1e-8)\n"
    "  --weight-decay X   decoupled, on matrices and embeddings (default 0.1)\n"
    "  --clip X           clip the gradients' global norm to X (default 1; 0: off)\n"
    "  --shuffle          visit the file's batches in a seeded random order each epoch\n"
    "  --seed N           the default initialisation's and the shuffle's seed (default 0)\n"
    "  -D NAME=VALUE      override dim NAME (repeatable), e.g. -D B=8 -D S=64\n"
    "  --model NAME       the model to train when the file holds several\n"
    "  --plan FILE        train sharded as this plan says (per-layer degrees, groups, shares), every\n"
    "                     rank simulated; the same losses as unsharded, within fp32 rounding\n"
    "  --plan-name NAME   the plan to use (from --plan, or the model's own file)\n"
    "  --world W          ranks (default: the plan's world)\n"
    "  --backend NAME     cpu (default) or cuda: every rank's forward, backward, gradient sync and\n"
    "                     AdamW on the GPUs (NVRTC kernels, cuBLASLt, NCCL)\n"
    "  --loopback         cuda: every rank on one GPU, collectives as device copies\n"
    "  --rank R|env       cuda: this process runs rank R alone, on GPU R (env: RANK and LOCAL_RANK,\n"
    "                     as torchrun sets them; or Slurm's, Open MPI's); start one process per rank,\n"
    "                     all with the same options and NTP_NCCL_ID_FILE (where rank 0 writes the NCCL\n"
    "                     id). With --fail-at the failing GPU's process is killed (SIGKILL) and the\n"
    "                     survivors' processes notice it through NCCL and go on\n"
    "  --params FILE      start from these parameters (safetensors, global layout)\n"
    "  --init-std X       start from a training initialisation: matrices and tables uniform with\n"
    "                     standard deviation X (0.02 as GPT-2), gains 1, biases 0\n"
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
    "                     and go on with the same batches\n"
    "  --dump DIR         write step 1's inputs, parameters, loss and every gradient (grad.NAME)\n"
    "                     as raw files + manifest.tsv (the format of 'ntpc run --dump')\n"
    "  --quiet, -q        no progress line\n"
    "  --color=WHEN       auto | always | never (diagnostics)\n"
    "\n"
    "exit status: 0 ok, 1 errors in the input or a loss that is not finite, 2 usage\n";

typedef struct train_opts {
  const char *file, *data, *model, *params, *save_params, *dump, *color;
  const char *params_format; /* the layout of --params and --save-params */
  bool cuda, loopback;
  int rank, device; /* --rank: this process runs rank `rank` alone, on GPU `device`; -1: every rank */
  long steps;
  unsigned long long seed;
  bool shuffle, sharded;
  int32_t world; /* 0: the plan's */
  double init_std; /* > 0: a training initialisation (ntp_trainer_init_std) */
  const char *ckpt, *resume; /* checkpoint folders */
  long ckpt_every;
  ntp_adamw adamw;
  const char *plan_file, *plan_name, *defines[256];
  int ndefines;
  long fail_step[64];    /* --fail-at: before step fail_step[i] (1-based), GPU fail_rank[i] fails */
  int32_t fail_rank[64];
  int nfail;
} train_opts;

static int usage(const char *fmt, const char *arg) { return cli_usage_error("ntpc train", fmt, arg); }

/* a finite number of at least lo (cli_number with no upper bound) */
static bool number(const char *v, double lo, double *out) { return cli_number(v, lo, DBL_MAX, out); }

/* A decimal whole number in [lo, hi] at *p, which advances past its digits (no sign, no
 * spaces, no other base: what the user wrote is what is used). */
static bool whole(const char **p, long lo, long hi, long *out) {
  long x = 0;
  const char *q = *p;
  for (; *q >= '0' && *q <= '9'; q++)
    if ((x = x * 10 + (*q - '0')) > hi) return false;
  if (q == *p || x < lo) return false;
  *p = q, *out = x;
  return true;
}

/* --fail-at STEP:RANK[,STEP:RANK...] */
static bool parse_fail_at(const char *v, train_opts *o) {
  for (const char *p = v;;) {
    long st, r;
    if (o->nfail == 64 || !whole(&p, 1, 1000000000, &st) || *p++ != ':' || !whole(&p, 0, 4095, &r)) return false;
    o->fail_step[o->nfail] = st;
    o->fail_rank[o->nfail++] = (int32_t)r;
    if (!*p) return true;
    if (*p++ != ',') return false;
  }
}

static int parse(int argc, char **argv, ntpc_session *s, train_opts *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    bool missing = false;
    double d;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(train_usage, stdout);
      return 0;
    } else if (!strcmp(a, "--shuffle")) {
      o->shuffle = true;
    } else if (!strcmp(a, "--loopback")) {
      o->loopback = true;
    } else if ((v = cli_option_value(argc, argv, &i, "--rank", &missing))) {
      if (!strcmp(v, "env")) {
        if (ntp_launcher_rank(&o->rank, &o->device) != 0)
          return usage("--rank env: no launcher rank in the environment (RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK)%s", "");
      } else if (!number(v, 0, &d) || d != floor(d) || d > 4095) {
        return usage("--rank %s: expected a rank from 0, or env", v);
      } else {
        o->rank = o->device = (int)d;
      }
    } else if ((v = cli_option_value(argc, argv, &i, "--backend", &missing))) {
      if (strcmp(v, "cpu") && strcmp(v, "cuda")) return usage("unknown backend '%s' (expected cpu or cuda)", v);
      o->cuda = !strcmp(v, "cuda");
    } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
      ntp_progress_enable(0);
    } else if (!strncmp(a, "-D", 2)) {
      const char *def = a[2] ? a + 2 : i + 1 < argc ? argv[++i] : NULL;
      if (!def) return usage("-D needs NAME=VALUE%s", "");
      if (ntpc_define_str(s, def) != NTPC_OK) return usage("%s", ntpc_last_error(s));
      if (o->ndefines == 256) return usage("more than 256 -D overrides%s", "");
      o->defines[o->ndefines++] = def;
    } else if ((v = cli_option_value(argc, argv, &i, "--data", &missing))) {
      o->data = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--model", &missing))) {
      o->model = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--plan-name", &missing))) {
      ntpc_select_plan(s, v);
      o->plan_name = v;
      o->sharded = true;
    } else if ((v = cli_option_value(argc, argv, &i, "--plan", &missing))) {
      if (ntpc_add_plan_file(s, v) != NTPC_OK) return usage("%s", ntpc_last_error(s));
      o->plan_file = v;
      o->sharded = true;
    } else if ((v = cli_option_value(argc, argv, &i, "--fail-at", &missing))) {
      if (!parse_fail_at(v, o))
        return usage("--fail-at %s: expected STEP:RANK[,STEP:RANK...] (steps 1 to 10^9, ranks 0 to 4095, at most 64)", v);
    } else if ((v = cli_option_value(argc, argv, &i, "--world", &missing))) {
      if (!number(v, 1, &d) || d != floor(d) || d > 4096) return usage("--world %s: expected 1 to 4096 ranks", v);
      o->world = (int32_t)d;
      o->sharded = true;
    } else if ((v = cli_option_value(argc, argv, &i, "--params-format", &missing))) {
      if (!ntp_param_format_known(v)) return usage("--params-format expects ntp, hf-gpt2 or hf-llama, got '%s'", v);
      o->params_format = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--params", &missing))) {
      o->params = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--save-params", &missing))) {
      o->save_params = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--dump", &missing))) {
      o->dump = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--color", &missing))) {
      if (strcmp(v, "auto") && strcmp(v, "always") && strcmp(v, "never")) return usage("--color=%s: expected auto, always or never", v);
      o->color = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--steps", &missing))) {
      if (!number(v, 0, &d) || d != floor(d) || d > 1e9) return usage("--steps %s: expected a whole number", v);
      o->steps = (long)d;
    } else if ((v = cli_option_value(argc, argv, &i, "--checkpoint-every", &missing))) {
      if (!number(v, 1, &d) || d != floor(d) || d > 1e9) return usage("--checkpoint-every %s: expected a whole number of steps", v);
      o->ckpt_every = (long)d;
    } else if ((v = cli_option_value(argc, argv, &i, "--checkpoint", &missing))) {
      o->ckpt = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--resume", &missing))) {
      o->resume = v;
    } else if ((v = cli_option_value(argc, argv, &i, "--init-std", &missing))) {
      if (!number(v, 0, &d) || d <= 0) return usage("--init-std %s: expected a standard deviation above 0", v);
      o->init_std = d;
    } else if ((v = cli_option_value(argc, argv, &i, "--warmup", &missing))) {
      if (!number(v, 0, &d) || d != floor(d) || d > 1e9) return usage("--warmup %s: expected a whole number", v);
      o->adamw.warmup = (int64_t)d;
    } else if ((v = cli_option_value(argc, argv, &i, "--seed", &missing))) {
      char *end;
      errno = 0;
      o->seed = strtoull(v, &end, 10);
      if (errno || end == v || *end || *v == '-') return usage("--seed %s: expected a number below 2^64", v);
    } else {
      static const struct {
        const char *name;
        size_t off;
      } reals[] = {{"--lr", offsetof(ntp_adamw, lr)},
                   {"--min-lr-frac", offsetof(ntp_adamw, min_lr_frac)},
                   {"--beta1", offsetof(ntp_adamw, beta1)},
                   {"--beta2", offsetof(ntp_adamw, beta2)},
                   {"--eps", offsetof(ntp_adamw, eps)},
                   {"--weight-decay", offsetof(ntp_adamw, weight_decay)},
                   {"--clip", offsetof(ntp_adamw, clip)}};
      size_t k = 0;
      for (; k < sizeof reals / sizeof reals[0]; k++)
        if ((v = cli_option_value(argc, argv, &i, reals[k].name, &missing))) break;
      if (k < sizeof reals / sizeof reals[0]) {
        if (!number(v, 0, &d)) return usage("%s: expected a number of 0 or more", argv[i]);
        *(double *)((char *)&o->adamw + reals[k].off) = d;
      } else if (missing) {
        return usage("%s needs a value", a);
      } else if (a[0] == '-' && a[1]) {
        return usage("unknown option '%s'", a);
      } else if (o->file) {
        return usage("one model file only (got '%s' too)", a);
      } else {
        o->file = a;
      }
    }
    if (missing) return usage("%s needs a value", a);
  }
  if (!o->file) return usage("no model file%s", "");
  if (!o->data) return usage("--data TOKENS is required (tools/make_tokens.py makes a token file from text)%s", "");
  if (o->adamw.beta1 >= 1 || o->adamw.beta2 >= 1) return usage("AdamW's betas must be below 1%s", "");
  if (o->init_std > 0 && o->params) return usage("--init-std and --params both set the parameters: give one%s", "");
  if (o->resume && (o->params || o->init_std > 0)) return usage("--resume sets the parameters: no --params or --init-std with it%s", "");
  if (o->ckpt_every && !o->ckpt) return usage("--checkpoint-every needs --checkpoint DIR%s", "");
  if (o->loopback && !o->cuda) return usage("--loopback is a cuda-backend option (with --backend cuda)%s", "");
  if (o->nfail && !o->sharded) return usage("--fail-at needs a sharded run (--plan or --world)%s", "");
  if (o->rank >= 0 && (!o->cuda || o->loopback || !o->sharded))
    return usage("--rank runs one rank of a sharded run through NCCL: it needs --backend cuda and --plan or --world, "
                 "without --loopback%s", "");
  if (o->rank >= 0 && o->dump) return usage("--rank: --dump is not supported yet with one rank per process%s", "");
  return -1;
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

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The training state after a failure (--fail-at): GPUs `now` fail before step `step` (1-based);
 * the survivors' program (train_replan), a trainer on it that takes the state from the surviving
 * replicas, or from the checkpoint when a failed GPU held the only copy (the run then goes back
 * to the checkpoint's step). *tr, *prog and *phys are replaced (the old program stays in *keep
 * until the end: the batch's tensors name its values). 0, or -1 with err. */
typedef struct failover_run {
  const train_opts *o;
  int32_t world0;   /* the healthy world */
  int32_t failed[64];
  int32_t nfailed;
  ntp_program *keep[64];
  int nkeep;
  bool fired[64]; /* per --fail-at entry: happened (a run that went back to a checkpoint does not fail twice) */
  double detected;  /* one rank per process: when NCCL reported the lost peer */
} failover_run;

static int fail_over(failover_run *fr, long step, const int32_t *now, int nnow, ntp_program **prog, ntp_trainer **tr,
                     int32_t **phys, const ntp_adamw *aw, ntp_tokens *data, char *err, size_t cap) {
  const train_opts *o = fr->o;
  for (int k = 0; k < nnow; k++) {
    bool known = false;
    for (int32_t j = 0; j < fr->nfailed; j++) known |= fr->failed[j] == now[k];
    if (now[k] >= fr->world0 || known) {
      snprintf(err, cap, "--fail-at %ld:%d: GPU %d is %s", step, now[k], now[k],
               known ? "down already" : "not in the world");
      return -1;
    }
    fr->failed[fr->nfailed++] = now[k];
  }
  if (fr->nfailed >= fr->world0) {
    snprintf(err, cap, "--fail-at: no GPU survives");
    return -1;
  }
  bool dead[4096] = {false};
  for (int32_t j = 0; j < fr->nfailed; j++) dead[fr->failed[j]] = true;
  printf("step %4ld: GPU", step);
  for (int k = 0; k < nnow; k++) printf(" %d", now[k]);
  printf(" failed; the planner re-plans for the %d survivors:\n", fr->world0 - fr->nfailed);
  double t0 = now_s();
  train_source src = {o->file, o->model, o->plan_file, o->plan_name, o->defines, o->ndefines, o->cuda};
  int32_t *nphys = NULL;
  ntp_trainer *ntr = NULL;
  ntp_program *np = NULL;
  /* through NCCL (a GPU per rank): at once, the communicators with a failed GPU in them are
   * aborted (nothing waits on a dead peer) and the survivors get a world of their own */
  ntp_cuda_survivors sv = {0};
  bool nccl = o->cuda && !o->loopback;
  if (nccl) {
    bool lost[4096] = {false}; /* by the failed run's rank */
    for (int32_t r = 0; r < (*prog)->world; r++) lost[r] = dead[*phys ? (*phys)[r] : r];
    if (ntp_cuda_lose(ntp_trainer_cuda(*tr), lost, &sv, err, cap) != 0) return -1;
  }
  if (!(np = train_replan(&src, fr->world0, fr->failed, fr->nfailed, &nphys, err, cap))) goto fail;
  if (nccl && sv.local >= 0) { /* one rank per process: this process's new rank runs on its own GPU */
    if (sv.n != np->world || nphys[sv.local] != o->rank) {
      snprintf(err, cap, "internal: %d survivors for a program of %d ranks, whose rank %d runs on GPU %d, not this "
               "process's %d", sv.n, np->world, sv.local, nphys[sv.local], o->rank);
      goto fail;
    }
    printf("  communicators: %d aborted (ncclCommAbort: every one of this process's), the world %s %d ranks (%s); "
           "this process (GPU %d) is rank %d of them\n", sv.aborted, sv.shrunk ? "shrunk to" : "created again over the",
           sv.n, sv.how, o->rank, sv.local);
  } else if (nccl) {
    if (sv.n != np->world) {
      snprintf(err, cap, "internal: %d survivors' communicators for a program of %d ranks", sv.n, np->world);
      goto fail;
    }
    printf("  communicators: %d aborted (ncclCommAbort: each with a failed GPU in it), the world %s %d ranks (%s); "
           "the survivors keep their GPUs:", sv.aborted, sv.shrunk ? "shrunk to" : "created again over the", sv.n, sv.how);
    for (int r = 0; r < sv.n; r++) printf(" %d", sv.devices[r]);
    printf("\n");
  }
  int64_t moved = 0, missing = 0;
  /* the survivors: each on its own GPU (rank r on the GPU of physical GPU nphys[r]), or on the one GPU */
  ntp_cuda_options co = nccl ? (ntp_cuda_options){.rank_hi = np->world, .device = sv.devices[0], .devices = sv.devices,
                                                  .nccl_world = sv.world}
                             : (ntp_cuda_options){.loopback = 1, .rank_hi = np->world};
  if (nccl && sv.local >= 0) co.rank_lo = sv.local, co.rank_hi = sv.local + 1;
  if ((o->cuda ? ntp_trainer_new_cuda(np, aw, o->seed, NULL, &co, &ntr, err, cap)
               : ntp_trainer_new(np, aw, o->seed, NULL, &ntr, err, cap)) != 0 ||
      ntp_trainer_take_state(ntr, *tr, *phys, nphys, dead, &moved, &missing, err, cap) != 0)
    goto fail;
  if (missing) {
    if (!o->ckpt) {
      snprintf(err, cap, "the only copies of %lld elements of the training state were on the failed GPU%s, and there "
               "is no checkpoint to fall back on (--checkpoint DIR)", (long long)missing, nnow > 1 ? "s" : "");
      goto fail;
    }
    if (ntp_checkpoint_load(o->ckpt, ntr, data, err, cap) != 0) goto fail;
    printf("  the only copies of %lld elements were on the failed GPU: back to the checkpoint of step %lld (%s)\n",
           (long long)missing, (long long)ntp_trainer_steps_taken(ntr), o->ckpt);
  } else {
    if (o->rank >= 0)
      printf("  resumed on %d GPUs in %.3f s (%.3f s after NCCL reported the lost peer): %.1f KiB of parameters and "
             "optimizer state moved from the surviving replicas, by NCCL send/recv between the survivors' "
             "processes (no checkpoint read)\n", np->world, now_s() - t0, now_s() - fr->detected, (double)moved / 1024.0);
    else
      printf("  resumed on %d GPUs in %.3f s: %.1f KiB of parameters and optimizer state moved from the surviving "
             "replicas (no checkpoint read)\n", np->world, now_s() - t0, (double)moved / 1024.0);
  }
  ntp_trainer_free(*tr); /* nothing on the failed GPUs is touched (ntp_cuda_lose) */
  ntp_cuda_survivors_free(&sv);
  fr->keep[fr->nkeep++] = *prog;
  free(*phys);
  *tr = ntr;
  *prog = np;
  *phys = nphys;
  return 0;
fail:
  ntp_trainer_free(ntr);
  ntp_cuda_survivors_free(&sv);
  ntp_program_free(np);
  free(nphys);
  return -1;
}

static int train(const train_opts *o, ntpc_session *s) {
  char err[1024];
  int rc = 1;
  ntp_program *prog = session_program(s, err, sizeof err);
  ntp_tokens *data = NULL;
  ntp_safetensors *params = NULL;
  ntp_trainer *tr = NULL;
  int32_t *tok = NULL, *tgt = NULL, *phys = NULL; /* phys: the physical GPU of each rank (NULL: the same) */
  const ntp_host_tensor **given = NULL;
  failover_run fr = {.o = o};
  if (!prog) {
    fprintf(stderr, "ntpc train: internal error: %s\n", err);
    return 3;
  }
  const ntp_module *m = &prog->global;
  batch_inputs bi;
  if (!find_inputs(m, &bi, err, sizeof err)) goto fail;
  if (ntp_tokens_open(o->data, &data, err, sizeof err) != 0) goto fail;
  if ((rc = preflight(o, prog, data, bi.vocab, err, sizeof err)) != 0) goto fail;
  rc = 1;
  if (o->shuffle) ntp_tokens_shuffle(data, o->seed);
  if (o->params && (ntp_safetensors_open(o->params, &params, err, sizeof err) != 0 ||
                    ntp_safetensors_set_format(params, o->params_format, m, err, sizeof err) != 0))
    goto fail;
  ntp_adamw aw = o->adamw;
  aw.steps = o->steps;
  /* all ranks in this process: on one GPU (loopback) or one GPU each with NCCL */
  ntp_cuda_options co = {.loopback = o->loopback || prog->world <= 1, .rank_hi = prog->world > 0 ? prog->world : 1};
  if (o->rank >= 0) { /* one rank in this process: the others in theirs, joined through $NTP_NCCL_ID_FILE */
    if (o->rank >= prog->world || prog->world < 2) {
      snprintf(err, sizeof err, "--rank %d: the plan's world is %d ranks (one rank per process needs 2 or more)",
               o->rank, prog->world);
      goto fail;
    }
    co = (ntp_cuda_options){.rank_lo = o->rank, .rank_hi = o->rank + 1, .device = o->device};
  }
  if ((o->cuda ? ntp_trainer_new_cuda(prog, &aw, o->seed, params, &co, &tr, err, sizeof err)
               : ntp_trainer_new(prog, &aw, o->seed, params, &tr, err, sizeof err)) != 0)
    goto fail;
  if (o->init_std > 0 && ntp_trainer_init_std(tr, o->init_std, o->seed, err, sizeof err) != 0) goto fail;
  if (o->resume) {
    if (ntp_checkpoint_load(o->resume, tr, data, err, sizeof err) != 0) goto fail;
    printf("resumed from %s at step %lld\n", o->resume, (long long)ntp_trainer_steps_taken(tr));
  }

  int64_t n = bi.rows * bi.len;
  tok = malloc((size_t)n * sizeof *tok);
  tgt = malloc((size_t)n * sizeof *tgt);
  given = calloc(m->n_values, sizeof *given);
  if (!tok || !tgt || !given) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  ntp_host_tensor ht = {.name = m->values[bi.tokens].name, .dtype = NTP_I32, .shape = m->values[bi.tokens].shape, .i = tok};
  ntp_host_tensor hg = {.name = m->values[bi.targets].name, .dtype = NTP_I32, .shape = m->values[bi.targets].shape, .i = tgt};
  given[bi.tokens] = &ht;
  given[bi.targets] = &hg;
  const ntp_host_tensor *ps;
  size_t np = ntp_trainer_params(tr, &ps);
  int64_t elems = 0;
  for (size_t i = 0; i < np; i++) elems += shape_numel(&ps[i].shape);
  printf("model %s: %zu parameters (%.3fM elements), dtype %s; batch %lld x %lld tokens from %s (%lld tokens)\n",
         m->name, np, (double)elems / 1e6, dtype_name(m->dtype), (long long)bi.rows, (long long)bi.len, o->data,
         (long long)ntp_tokens_count(data));
  if (o->rank >= 0)
    printf("backend cuda nccl: rank %d of %d in this process (pid %ld, GPU %d; each rank in its own process, joined "
           "through NTP_NCCL_ID_FILE; the loss and the gradients' norm merged across them through NCCL)\n", o->rank,
           prog->world, (long)getpid(), o->device);
  else if (o->cuda)
    printf("backend cuda%s: %d rank%s (each rank's forward, backward and AdamW on its GPU, the gradients summed over "
           "their holders)\n", co.loopback && prog->world > 1 ? " loopback" : prog->world > 1 ? " nccl" : "",
           co.rank_hi, co.rank_hi == 1 ? "" : "s");
  else if (o->sharded)
    printf("sharded: %d ranks simulated on the cpu backend (each rank's forward, backward and AdamW on its slices, the "
           "gradients summed over their holders)\n", prog->world);
  if (o->cuda) cli_verbose_gemms(ntp_trainer_cuda(tr));
  printf("AdamW: lr %g (warmup %lld, cosine to %g), betas %g %g, eps %g, weight decay %g, clip %g\n", aw.lr,
         (long long)aw.warmup, aw.lr * aw.min_lr_frac, aw.beta1, aw.beta2, aw.eps, aw.weight_decay, aw.clip);
  double first = NAN, last = NAN, total_s = 0;
  char ckpt_err[1024];
  long long ckpt_failed = 0; /* the step whose checkpoint could not be written */
  long ran = 0; /* steps of this run (a resumed one starts where its checkpoint stopped) */
  for (long step = (long)ntp_trainer_steps_taken(tr); step < o->steps; step++, ran++) {
    int32_t now[64];
    int nnow = 0;
    for (int k = 0; k < o->nfail; k++)
      if (o->fail_step[k] == step + 1 && !fr.fired[k]) now[nnow++] = o->fail_rank[k], fr.fired[k] = true;
    if (nnow && !fr.world0) fr.world0 = prog->world;
    bool lost = nnow && o->rank >= 0; /* one rank per process: the step is to notice the failure */
    for (int k = 0; lost && k < nnow; k++)
      if (now[k] == o->rank) { /* this process's GPU fails: the process dies, as a killed one does */
        printf("step %4ld: GPU %d fails: its process (pid %ld) is killed (SIGKILL)\n", step + 1, o->rank, (long)getpid());
        fflush(stdout);
        raise(SIGKILL);
      }
    if (nnow && !lost) {
      if (fail_over(&fr, step + 1, now, nnow, &prog, &tr, &phys, &aw, data, err, sizeof err) != 0) goto fail;
      m = &prog->global;
      step = (long)ntp_trainer_steps_taken(tr); /* the checkpoint's, when the run went back to it */
    }
    int64_t pos, epoch;
    ntp_tokens_position(data, &pos, &epoch);
  again:
    if (ntp_tokens_next(data, bi.rows, bi.len, bi.vocab, tok, tgt, err, sizeof err) != 0) goto fail;
    ntp_train_stats st;
    bool dump = o->dump && step == 0;
    if (ntp_trainer_step(tr, given, dump, &st, err, sizeof err) != 0) {
      if (!lost || !ntp_cuda_peer_lost(ntp_trainer_cuda(tr))) goto fail;
      /* the survivors: NCCL said a peer is gone; the step is taken again by them, with the same batch */
      fr.detected = now_s();
      printf("step %4ld: NCCL reports a lost peer (%s)\n", step + 1, err);
      ntp_tokens_seek(data, pos, epoch);
      if (fail_over(&fr, step + 1, now, nnow, &prog, &tr, &phys, &aw, data, err, sizeof err) != 0) goto fail;
      m = &prog->global;
      step = (long)ntp_trainer_steps_taken(tr);
      lost = false;
      goto again;
    }
    if (lost) {
      snprintf(err, sizeof err, "step %ld ran to its end though GPU %d failed before it: no NCCL call noticed", step + 1,
               now[0]);
      goto fail;
    }
    if (dump && ntp_dump_tensors(ntp_trainer_last(tr), o->dump, err, sizeof err) != 0) {
      rc = 2;
      goto fail;
    }
    if (isnan(first)) first = st.loss;
    last = st.loss;
    total_s += st.seconds;
    printf("step %4lld/%ld  loss %.6f  lr %.3e  grad norm %.4f  %.0f tokens/s\n", (long long)st.step, o->steps, st.loss,
           st.lr, st.grad_norm, (double)n / st.seconds);
    fflush(stdout);
    if (o->ckpt && ((o->ckpt_every && st.step % o->ckpt_every == 0) || step + 1 == o->steps)) {
      if (ntp_checkpoint_save(o->ckpt, tr, data, ckpt_err, sizeof ckpt_err) != 0) {
        ckpt_failed = st.step; /* the run stops here; what can be saved still is (below) */
        ran++;
        break;
      }
      printf("checkpoint: %s at step %lld\n", o->ckpt, (long long)st.step);
    }
  }
  if (ran)
    printf("trained %ld steps in %.2f s (%.0f tokens/s): loss %.6f -> %.6f\n", ran, total_s,
           (double)n * (double)ran / total_s, first, last);
  if (o->save_params) {
    /* one rank per process: gathered by every process, written by rank 0's */
    if (ntp_trainer_gather(tr, err, sizeof err) != 0) goto fail;
    np = ntp_trainer_params(tr, &ps);
    /* the program now running: after a failure, the survivors' (its module names the same parameters) */
    bool writer = ntp_trainer_writes(tr);
    if (writer &&
        ntp_safetensors_save_format(o->save_params, o->params_format, &prog->global, ps, np, err, sizeof err) != 0) {
      rc = 2;
      goto fail;
    }
    if (writer) printf("wrote %s\n", o->save_params);
  }
  if (ckpt_failed) {
    fprintf(stderr, "ntpc train: error: the checkpoint of step %lld was not written: %s; training stopped there%s%s\n",
            ckpt_failed, ckpt_err, o->save_params ? ", its parameters are in " : "",
            o->save_params ? o->save_params : "");
    rc = 2;
    goto done;
  }
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "ntpc train: error: %s\n", err);
done:
  free(tok);
  free(tgt);
  free(given);
  ntp_trainer_free(tr);
  ntp_safetensors_close(params);
  ntp_tokens_close(data);
  ntp_program_free(prog);
  for (int k = 0; k < fr.nkeep; k++) ntp_program_free(fr.keep[k]);
  free(phys);
  return rc;
}

/* The options with their defaults into *o, in a new session *s (NULL when out of memory: 2). */
static int parse_new(int argc, char **argv, ntpc_session **s, train_opts *o) {
  *o = (train_opts){.steps = 10, .params_format = "ntp", .rank = -1};
  ntp_adamw_defaults(&o->adamw);
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
  if (o.cuda) {
    char why[256];
    if (ntp_cuda_available(why, sizeof why) != 0) {
      fprintf(stderr, "ntpc train: error: --backend cuda: %s\n", why);
      ntpc_session_free(s);
      return 2;
    }
  }
  if (o.sharded || o.cuda) ntpc_set_world(s, o.world);
  ntpc_want_cuda(s, o.cuda);
  ntpc_want_grad(s, true);
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
