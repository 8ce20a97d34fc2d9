/* train_abi.c — training through a model library's C ABI alone (ntp_model.h, dlopen): the
 * library (ntpc FILE --train -o model.so) trains for N steps on the batches of an llm.c token
 * file read in order, as `ntpc train --min-lr-frac 1` reads them, printing each step's loss in
 * ntpc train's format so that tests/train.sh can compare the two; then reads a parameter back
 * (ntp_model_get_param) and checks that a forward (loss and gradients, no update) leaves it as
 * it was.
 *
 *   train_abi MODEL.so TOKENS STEPS LR [cpu | cuda | cuda-loopback]   (the backend; default cpu) */
#include <dlfcn.h>
#include <dlpack/dlpack.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntp_model.h"

#define SYM(name) name##_fn name = (name##_fn)dlsym(lib, #name)
typedef int (*ntp_model_get_info_fn)(const ntp_model_info **);
typedef int (*ntp_model_create_fn)(const ntp_model_options *, ntp_model **);
typedef int (*ntp_model_train_step_fn)(ntp_model *, const ntp_model_train_options *, const DLTensor *const *, double *);
typedef int (*ntp_model_get_param_fn)(ntp_model *, const char *, DLTensor *);
typedef int (*ntp_model_init_fn)(ntp_model *, const char *, double);
typedef int (*ntp_model_forward_fn)(ntp_model *, const DLTensor *const *, DLTensor *const *);
typedef const char *(*ntp_model_last_error_fn)(void);
typedef void (*ntp_model_destroy_fn)(ntp_model *);

static DLTensor host(void *data, DLDataType dt, int32_t ndim, int64_t *shape) {
  return (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = ndim, .dtype = dt, .shape = shape};
}

int main(int argc, char **argv) {
  if (argc < 5 || argc > 7) {
    fprintf(stderr, "usage: train_abi MODEL.so TOKENS STEPS LR [cpu | cuda | cuda-loopback [INIT]]\n");
    return 2;
  }
  const char *backend = argc >= 6 ? argv[5] : "cpu", *init = argc == 7 ? argv[6] : NULL;
  ntp_model_options mo = {.backend = strncmp(backend, "cuda", 4) == 0 ? "cuda" : "cpu", .rank = -1,
                          .loopback = strcmp(backend, "cuda-loopback") == 0};
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  SYM(ntp_model_get_info);
  SYM(ntp_model_create);
  SYM(ntp_model_train_step);
  SYM(ntp_model_get_param);
  SYM(ntp_model_forward);
  SYM(ntp_model_last_error);
  SYM(ntp_model_destroy);
  SYM(ntp_model_init);
  if (!ntp_model_train_step || !ntp_model_get_param) {
    fprintf(stderr, "the library exports no training step\n");
    return 1;
  }
  const ntp_model_info *info;
  ntp_model_get_info(&info);
  /* the tokens and the targets: [rows, len] each */
  int64_t rows = info->inputs[0].shape[0], len = info->inputs[0].shape[1], n = rows * len;
  FILE *f = fopen(argv[2], "rb");
  if (!f) return 1;
  fseek(f, 0, SEEK_END);
  long bytes = ftell(f);
  int64_t ntok = (bytes - 1024) / 2;
  uint16_t *ids = malloc((size_t)ntok * 2);
  fseek(f, 1024, SEEK_SET);
  if (fread(ids, 2, (size_t)ntok, f) != (size_t)ntok) return 1;
  fclose(f);
  ntp_model *m;
  if (ntp_model_create(&mo, &m) != NTP_OK) {
    fprintf(stderr, "create: %s\n", ntp_model_last_error());
    return 1;
  }
  /* INIT: the start ntpc train --init INIT takes ("family": the model family's, as its default) */
  if (init && (!ntp_model_init || ntp_model_init(m, strcmp(init, "family") == 0 ? NULL : init, 0) != NTP_OK)) {
    fprintf(stderr, "init %s: %s\n", init, ntp_model_init ? ntp_model_last_error() : "no ntp_model_init");
    return 1;
  }
  int32_t *tok = malloc((size_t)n * 4), *tgt = malloc((size_t)n * 4);
  int64_t shape[2] = {rows, len};
  DLTensor t_tok = host(tok, (DLDataType){kDLInt, 32, 1}, 2, shape), t_tgt = host(tgt, (DLDataType){kDLInt, 32, 1}, 2, shape);
  /* the inputs in the info's order: which is the targets is found by name */
  const DLTensor *in[2];
  bool tgt_first = strcmp(info->inputs[0].name, "targets") == 0;
  in[tgt_first ? 1 : 0] = &t_tok;
  in[tgt_first ? 0 : 1] = &t_tgt;
  ntp_model_train_options o = {.lr = atof(argv[4]), .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .clip = 1};
  long steps = atol(argv[3]);
  int64_t pos = 0;
  for (long s = 1; s <= steps; s++) {
    if (pos + n + 1 > ntok) pos = 0;
    for (int64_t i = 0; i < n; i++) tok[i] = ids[pos + i], tgt[i] = ids[pos + i + 1];
    pos += n;
    double loss;
    if (ntp_model_train_step(m, &o, in, &loss) != NTP_OK) {
      fprintf(stderr, "train step: %s\n", ntp_model_last_error());
      return 1;
    }
    printf("step %4ld/%ld  loss %.6f\n", s, steps, loss);
  }
  /* a parameter back, then a forward (no update) must leave it unchanged */
  const ntp_model_tensor_info *p0 = &info->params[0];
  int64_t pn = 1;
  for (int d = 0; d < p0->ndim; d++) pn *= p0->shape[d];
  float *a = malloc((size_t)pn * 4), *b = malloc((size_t)pn * 4);
  DLTensor ta = host(a, p0->dtype, p0->ndim, (int64_t *)p0->shape), tb = host(b, p0->dtype, p0->ndim, (int64_t *)p0->shape);
  if (p0->dtype.bits != 32 || ntp_model_get_param(m, p0->name, &ta) != NTP_OK) {
    fprintf(stderr, "get_param: %s\n", ntp_model_last_error());
    return 1;
  }
  DLTensor *outs = calloc((size_t)info->n_outputs, sizeof *outs);
  DLTensor **op = calloc((size_t)info->n_outputs, sizeof *op);
  for (int k = 0; k < info->n_outputs; k++) {
    int64_t on = 1;
    for (int d = 0; d < info->outputs[k].ndim; d++) on *= info->outputs[k].shape[d];
    outs[k] = host(malloc((size_t)(on ? on : 1) * 4), info->outputs[k].dtype, info->outputs[k].ndim,
                   (int64_t *)info->outputs[k].shape);
    op[k] = &outs[k];
  }
  if (ntp_model_forward(m, in, op) != NTP_OK || ntp_model_get_param(m, p0->name, &tb) != NTP_OK) {
    fprintf(stderr, "forward: %s\n", ntp_model_last_error());
    return 1;
  }
  int same = memcmp(a, b, (size_t)pn * 4) == 0;
  printf("%s after %ld steps: %s; forward: loss %.6f, %d outputs (the loss and every gradient)\n", p0->name, steps,
         same ? "unchanged by a forward" : "CHANGED by a forward", *(float *)outs[0].data, info->n_outputs);
  ntp_model_destroy(m);
  for (int k = 0; k < info->n_outputs; k++) free(outs[k].data);
  free(outs);
  free(op);
  free(a);
  free(b);
  free(tok);
  free(tgt);
  free(ids);
  dlclose(lib);
  return same ? 0 : 1;
}
