/* train_init.c — training initialisations users know (docs/training.md, "Initialisation").
 *
 * Every draw is counter-based: element e of the parameter named N under seed s is a function of
 * (s, N, e) alone (ntp_init_normal_key / ntp_init_uniform_key), so a model sharded any way starts
 * from the same numbers as the unsharded one. The schemes:
 *   gpt2      every matrix and table N(0, std) (std 0.02 by default), the residual branches'
 *             output projections (attention's `wo`, the MLP's `w_down`) N(0, std / sqrt(2 L)) with
 *             L the attention layers, biases 0, gains 1 — GPT-2's, and nanoGPT's;
 *   megatron  the same numbers (Megatron-LM's init_method_normal and scaled_init_method_normal:
 *             sigma and sigma / sqrt(2 L));
 *   llama     every matrix and table N(0, std), norms' gains 1 (Hugging Face's LlamaPreTrainedModel:
 *             initializer_range 0.02, no residual scaling);
 *   uniform   every matrix and table uniform with standard deviation std (the former --init-std);
 *   module    the model's own initialisation (the comparison one: tests against references).
 * A model's family picks the default: llama where it has an RMS norm, else gpt2. */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "train_internal.h"

static const struct {
  const char *name;
  ntp_init_scheme scheme;
} names[] = {{"gpt2", NTP_INIT_GPT2},       {"megatron", NTP_INIT_MEGATRON}, {"llama", NTP_INIT_LLAMA},
             {"uniform", NTP_INIT_UNIFORM}, {"comparison", NTP_INIT_MODULE}, {"module", NTP_INIT_MODULE}};

bool ntp_init_scheme_named(const char *name, ntp_init_scheme *out) {
  for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
    if (strcasecmp(name, names[i].name) == 0) return *out = names[i].scheme, true;
  return false;
}

const char *ntp_init_scheme_name(ntp_init_scheme s) {
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].scheme == s) return names[i].name;
  return "?";
}

ntp_init_scheme ntp_trainer_family_init(const ntp_trainer *t) {
  const ntp_module *m = t->mod;
  for (size_t i = 0; i < m->n_ops; i++)
    if (m->ops[i].code == IR_RMSNORM) return NTP_INIT_LLAMA;
  return NTP_INIT_GPT2;
}

static bool ends_with(const char *s, const char *tail) {
  size_t n = s ? strlen(s) : 0, k = strlen(tail);
  return n >= k && strcmp(s + n - k, tail) == 0;
}

/* a residual branch's output projection: scaled down by sqrt(2 L) under gpt2 and megatron */
static bool residual_out(const char *name) { return ends_with(name, ".wo") || ends_with(name, ".w_down"); }

int ntp_trainer_init(ntp_trainer *t, ntp_init_scheme scheme, double std, uint64_t seed, char *err, size_t cap) {
  if (scheme == NTP_INIT_MODULE) return 0; /* the module's own: as the trainer was made */
  if (!(std > 0)) std = 0.02;
  const ntp_module *m = t->mod;
  if (ntp_train_gather(t, err, cap) != 0) return -1;
  int64_t layers = 0; /* L: the residual branches come in pairs, one attention each */
  for (size_t i = 0; i < t->np; i++) layers += ends_with(t->p[i].cur.name, ".wo");
  bool scaled = (scheme == NTP_INIT_GPT2 || scheme == NTP_INIT_MEGATRON) && layers > 0;
  for (size_t i = 0; i < t->np; i++) {
    tparam *p = &t->p[i];
    const ntp_op *op = &m->ops[m->values[p->value].def];
    uint64_t key = ntp_init_key(seed, ntp_name_hash(p->cur.name));
    double sd = scaled && residual_out(p->cur.name) ? std / sqrt(2.0 * (double)layers) : std;
    double a = std * 1.7320508075688772; /* U(-a, a) has standard deviation a / sqrt(3) */
    for (int64_t e = 0; e < p->n; e++)
      p->master[e] = !p->decay                      ? op->attr.init.center
                     : scheme == NTP_INIT_UNIFORM ? (float)(a * ntp_init_uniform_key(key, (uint64_t)e))
                                                  : (float)(sd * ntp_init_normal_key(key, (uint64_t)e));
    memcpy(p->cur.f, p->master, (size_t)p->n * sizeof *p->cur.f);
    ntp_round_buf(p->cur.f, (size_t)p->n, mode_of(p->cur.dtype));
  }
  return t->exec ? ntp_train_scatter(t, err, cap) : 0;
}

int ntp_trainer_init_std(ntp_trainer *t, double std, uint64_t seed, char *err, size_t cap) {
  return ntp_trainer_init(t, NTP_INIT_UNIFORM, std, seed, err, cap);
}
