/* test_exec.c — the executor interface's contracts (runtime/exec/exec.h) and the trainer's one
 * table of options (runtime/train/adamw_options.c):
 *  - every backend of the table fills every operation (a missing one would be a NULL call in
 *    the trainer), names are unique, the cpu backend is the default, an unknown name is refused
 *    with the table's names;
 *  - an unsharded program on the cpu backend gets no executor (the reference runs it), a
 *    sharded one the simulation, which refuses a rank alone; the simulation's lose counts the
 *    survivors and gives cpu options back;
 *  - the trainer's one door: the same losses through NULL options and through {"cpu"};
 *  - the AdamW options: bounds, decimal text only, whole step counts, the first bad field named,
 *    and the model ABI's train step refusing what the table refuses (it took lr = inf before). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "exec.h"
#include "ntp_artifact.h"
#include "ntp_train.h"
#include "session_program.h"

static const char model[] = "model t {\n"
                            "  dim B = 2, S = 4, D = 8, V = 16;\n"
                            "  dtype fp32;\n"
                            "  input tokens : i32[B, S];\n"
                            "  input targets : i32[B, S];\n"
                            "  x = embed: embedding(tokens, vocab = V, dim = D, positions = S) @tp(2);\n"
                            "  x = ln: layernorm(x);\n"
                            "  logits = head: linear(x, out = V) @tp(2);\n"
                            "  output loss = cross_entropy(logits, targets);\n"
                            "}\n";

/* the model compiled for `world` ranks (0: unsharded) with its gradient pass; its image into
 * *image when asked (free it) */
static ntp_program *compile_image(int32_t world, void **image, size_t *len) {
  char err[512];
  const void *im;
  ntpc_session *s = ntpc_session_new();
  if (world > 0) ntpc_set_world(s, world);
  ntpc_want_grad(s, true);
  ntp_program *p = ntpc_compile_string(s, "t.ntp", model) == NTPC_OK ? session_program(s, err, sizeof err) : NULL;
  if (!p) fprintf(stderr, "compile (world %d): %s\n", world, ntpc_last_error(s));
  if (p && image && ntpc_program_image(s, &im, len) == NTPC_OK && (*image = malloc(*len))) memcpy(*image, im, *len);
  ntpc_session_free(s);
  return p;
}

static ntp_program *compile(int32_t world) { return compile_image(world, NULL, NULL); }

static void table(void) {
  char err[256];
  size_t n = 0;
  const ntp_exec_backend *b;
  for (size_t i = 0; (b = ntp_exec_backend_at(i)); i++, n++) {
    const ntp_exec_ops *o = b->ops;
    CHECK(b->name && b->create && b->available && b->versus && b->what && b->fp32_tol > 0);
    CHECK(o && o->name && strcmp(o->name, b->name) == 0);
    CHECK(o->runs_rank && o->all_here && o->set && o->load && o->value_get && o->forward && o->run && o->output);
    CHECK(o->device_of && o->copy_to_host && o->set_device && o->output_device);
    CHECK(o->alloc && o->put && o->get && o->tensor_put && o->sumsq && o->adamw && o->merge && o->exchange);
    CHECK(o->lose && o->peer_lost && o->describe && o->label && o->measure && o->free);
    for (size_t j = 0; j < i; j++) CHECK(strcmp(ntp_exec_backend_at(j)->name, b->name) != 0);
    CHECK(ntp_exec_backend_find(b->name, err, sizeof err) == b);
  }
  CHECK(n >= 2);
  CHECK(ntp_exec_backend_find(NULL, err, sizeof err) == ntp_exec_backend_at(0));
  CHECK(strcmp(ntp_exec_backend_at(0)->name, "cpu") == 0);
  CHECK(ntp_exec_backend_find("tpu", err, sizeof err) == NULL);
  CHECK(strcmp(err, "unknown backend 'tpu' (expected cpu or cuda)") == 0);
}

static void placement(void) {
  char err[256];
  ntp_program *u = compile(0), *s = compile(2);
  CHECK(u && s);
  if (!u || !s) goto done;
  ntp_exec *e = (ntp_exec *)1;
  CHECK(ntp_exec_new(u, NULL, &e, err, sizeof err) == 0 && e == NULL); /* the reference runs it */
  ntp_exec_options cpu = {.backend = "cpu"}, alone = {.backend = "cpu", .rank_lo = 1, .rank_hi = 2};
  CHECK(ntp_exec_new(s, &alone, &e, err, sizeof err) == -1 && e == NULL);
  CHECK(strstr(err, "runs every rank of the model in this process") != NULL);
  CHECK(ntp_exec_new(s, &cpu, &e, err, sizeof err) == 0 && e != NULL);
  if (e) {
    CHECK(strcmp(ntp_exec_name(e), "cpu") == 0 && e->ops->all_here(e->be) && !ntp_exec_peer_lost(e));
    bool lost[2] = {false, true};
    ntp_exec_survivors sv;
    CHECK(ntp_exec_lose(e, lost, 2, &sv, err, sizeof err) == 0);
    CHECK(sv.n == 1 && sv.local == -1 && strcmp(sv.next.backend, "cpu") == 0 && sv.report[0] == 0);
    ntp_exec_survivors_free(&sv);
    /* the survivors in another order, or some idle: the simulation binds nothing to a place */
    bool none[2] = {false, false};
    CHECK(ntp_exec_lose(e, none, 2, &sv, err, sizeof err) == 0 && sv.n == 2);
    CHECK(ntp_exec_survivors_order(e, &sv, 2, (int32_t[]){1, 0}, err, sizeof err) == 0 && sv.n == 2);
    CHECK(ntp_exec_survivors_order(e, &sv, 1, (int32_t[]){1}, err, sizeof err) == 0 && sv.n == 1);
    CHECK(ntp_exec_survivors_order(e, &sv, 1, (int32_t[]){1}, err, sizeof err) == -1 && strstr(err, "survivor 1 of 1"));
    ntp_exec_survivors_free(&sv);
    char line[64] = "x";
    ntp_exec_describe(e, line, sizeof line);
    CHECK(line[0] == 0);
  }
  ntp_exec_free(e);
done:
  ntp_program_free(u);
  ntp_program_free(s);
}

/* one door: NULL options and {"cpu"} train alike, step by step, on the simulation */
static void one_door(void) {
  char err[256];
  ntp_program *s = compile(2);
  if (!s) return;
  ntp_adamw aw;
  ntp_adamw_defaults(&aw);
  aw.steps = 3;
  ntp_exec_options cpu = {.backend = "cpu"};
  ntp_trainer *a = NULL, *b = NULL;
  CHECK(ntp_trainer_new(s, &aw, 7, NULL, NULL, &a, err, sizeof err) == 0);
  CHECK(ntp_trainer_new(s, &aw, 7, NULL, &cpu, &b, err, sizeof err) == 0);
  ntp_exec_options tpu = {.backend = "tpu"};
  ntp_trainer *c = NULL;
  CHECK(ntp_trainer_new(s, &aw, 7, NULL, &tpu, &c, err, sizeof err) == -1 && c == NULL);
  const ntp_module *m = &s->global;
  int32_t tok[8], tgt[8];
  for (int i = 0; i < 8; i++) tok[i] = (i * 5 + 3) % 16, tgt[i] = (i * 7 + 1) % 16;
  const ntp_host_tensor **given = calloc(m->n_values, sizeof *given);
  ntp_host_tensor ht = {.dtype = NTP_I32, .i = tok}, hg = {.dtype = NTP_I32, .i = tgt};
  for (size_t i = 0; given && i < m->n_ops; i++)
    if (m->ops[i].code == IR_INPUT) {
      ntp_host_tensor *h = strcmp(m->values[m->ops[i].result].name, "tokens") == 0 ? &ht : &hg;
      h->name = m->values[m->ops[i].result].name, h->shape = m->values[m->ops[i].result].shape;
      given[m->ops[i].result] = h;
    }
  for (int k = 0; a && b && given && k < 3; k++) {
    ntp_train_stats sa, sb;
    CHECK(ntp_trainer_step(a, given, 0, &sa, err, sizeof err) == 0);
    CHECK(ntp_trainer_step(b, given, 0, &sb, err, sizeof err) == 0);
    CHECK(isfinite(sa.loss) && sa.loss == sb.loss && sa.grad_norm == sb.grad_norm);
  }
  CHECK(a && strcmp(ntp_exec_name(ntp_trainer_exec(a)), "cpu") == 0);
  free(given);
  ntp_trainer_free(a);
  ntp_trainer_free(b);
  ntp_program_free(s);
}

static void adamw_options(void) {
  char err[256];
  ntp_adamw o;
  ntp_adamw_defaults(&o);
  CHECK(ntp_adamw_check(&o, err, sizeof err) == 0);
  CHECK(ntp_adamw_set(&o, "lr", "3e-3", err, sizeof err) == 0 && o.lr == 3e-3);
  CHECK(ntp_adamw_set(&o, "weight_decay", "0", err, sizeof err) == 0 && o.weight_decay == 0);
  CHECK(ntp_adamw_set(&o, "warmup", "20", err, sizeof err) == 0 && o.warmup == 20);
  static const char *const bad_text[] = {"-1", "0x10", "inf", "nan", " 1", "1 ", "", "1e999", "3e-3x"};
  for (size_t i = 0; i < sizeof bad_text / sizeof bad_text[0]; i++) {
    CHECK(ntp_adamw_set(&o, "lr", bad_text[i], err, sizeof err) == -1);
    CHECK(o.lr == 3e-3); /* a refused value leaves the option as it was */
  }
  CHECK(ntp_adamw_set(&o, "lr", "-1", err, sizeof err) == -1 && strcmp(err, "expected a number of 0 or more") == 0);
  CHECK(ntp_adamw_set(&o, "beta1", "1", err, sizeof err) == -1 && strstr(err, "below 1") != NULL);
  CHECK(ntp_adamw_set(&o, "beta2", "0.999", err, sizeof err) == 0 && o.beta2 == 0.999);
  CHECK(ntp_adamw_set(&o, "warmup", "2.5", err, sizeof err) == -1 && strstr(err, "whole number") != NULL);
  CHECK(ntp_adamw_set(&o, "steps", "2000000000", err, sizeof err) == -1);
  CHECK(ntp_adamw_set(&o, "momentum", "0.9", err, sizeof err) == -1 && strstr(err, "momentum") != NULL);
  CHECK(ntp_adamw_set_number(&o, "clip", INFINITY, err, sizeof err) == -1);
  CHECK(ntp_adamw_set_number(&o, "clip", 0.5, err, sizeof err) == 0 && o.clip == 0.5);
  o.eps = NAN;
  CHECK(ntp_adamw_check(&o, err, sizeof err) == -1 && strncmp(err, "eps: ", 5) == 0);
  o.eps = 1e-8, o.lr = INFINITY; /* what the model ABI's train step let through before the table */
  CHECK(ntp_adamw_check(&o, err, sizeof err) == -1 && strncmp(err, "lr: ", 4) == 0);
  const char *name, *help;
  size_t n = 0;
  for (; (name = ntp_adamw_option(n, &help)); n++) CHECK(help && *help && ntp_adamw_set_number(&o, name, 0, err, sizeof err) == 0);
  CHECK(n == 9);
}

/* the model ABI's train step checks its options against the table: lr = inf was let through
 * before (`o->lr >= 0`), and every weight became NaN */
static void abi_options(void) {
  void *image = NULL;
  size_t len = 0;
  ntp_program *p = compile_image(2, &image, &len);
  ntp_artifact a = {.abi_version = NTP_MODEL_ABI_VERSION, .image = image, .image_len = len};
  ntp_model *m = NULL;
  CHECK(p && image && ntprt_model_create(&a, NULL, &m) == NTP_OK && m);
  ntp_model_train_options bad = {.lr = INFINITY, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .clip = 1};
  double loss = 0;
  CHECK(m && ntprt_model_train_step(m, &bad, NULL, &loss) == NTP_EINVAL);
  CHECK(strstr(ntprt_model_last_error(), "train options: lr: expected a number of 0 or more") != NULL);
  bad.lr = 1e-3, bad.beta2 = 1;
  CHECK(m && ntprt_model_train_step(m, &bad, NULL, &loss) == NTP_EINVAL);
  CHECK(strstr(ntprt_model_last_error(), "beta2") != NULL);
  ntp_model_options tpu = {.backend = "tpu", .rank = -1};
  ntp_model *t = NULL;
  CHECK(ntprt_model_create(&a, &tpu, &t) == NTP_EINVAL && !t);
  CHECK(strcmp(ntprt_model_last_error(), "unknown backend 'tpu' (expected cpu or cuda)") == 0);
  ntp_model_options alone = {.backend = "cpu", .rank = 1};
  CHECK(ntprt_model_create(&a, &alone, &t) == NTP_EINVAL && !t);
  CHECK(strstr(ntprt_model_last_error(), "rank 1: the cpu backend runs every rank of the model") != NULL);
  ntprt_model_destroy(m);
  ntp_program_free(p);
  free(image);
}

int main(void) {
  table();
  placement();
  one_door();
  adamw_options();
  abi_options();
  return check_report("test_exec");
}
