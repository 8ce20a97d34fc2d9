/* fuzz_program.c — the program-image reader (runtime/io/program_read.c): the input is an image's
 * payload, given a valid header (version, length, checksum) so that every input reaches the
 * structure rather than stopping at the checksum. The reader must refuse or accept it without
 * reading outside the image or writing outside its own tables; an accepted image is walked (every
 * step's tensors and transfers, every piece, every kernel's arguments) as the runtime would index
 * it, so an index the reader let through out of range is a sanitizer report here. */
#include "fuzz_common.h"
#include "ntp_program.h"

static volatile uint64_t sink;
static void touch(uint64_t v) { sink ^= v; }

static void walk(const ntp_program *p) {
  const ntp_module *m = &p->global;
  for (size_t i = 0; i < m->n_ops; i++) {
    const ntp_op *o = &m->ops[i];
    touch((uint64_t)(m->values[o->result].shape.ndim));
    for (int a = 0; a < o->nargs; a++) touch((uint64_t)(m->values[o->args[a]].def));
  }
  for (size_t o = 0; o < m->n_outputs; o++) touch((uint64_t)(m->values[m->outputs[o].value].dtype));
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind == SH_COMPUTE) {
      touch((uint64_t)(p->tensors[st->op.result].offset) ^ (uint64_t)(p->mem[st->rank].arena_bytes));
      for (int a = 0; a < st->op.nargs; a++) touch((uint64_t)(p->tensors[st->op.args[a]].rank));
    } else {
      for (int32_t k = 0; k < st->nranks; k++) touch((uint64_t)(p->mem[st->ranks[k]].param_bytes));
      for (size_t x = 0; x < st->nxfers; x++) touch((uint64_t)(p->tensors[st->xfers[x].src].rank) ^ (uint64_t)(p->tensors[st->xfers[x].dst].rank));
    }
  }
  for (size_t v = 0; p->world && v < m->n_values; v++)
    for (size_t k = 0; k < p->npieces[v]; k++) touch((uint64_t)(p->tensors[p->pieces[v][k]].global));
  for (int32_t r = 0; p->cuda && r < p->world; r++) {
    const ntp_rank_code *c = &p->cuda[r];
    touch((uint64_t)(c->source[c->len]));
    for (size_t s = 0; s < p->n_steps; s++) {
      const cg_step *x = &c->steps[s];
      if (x->kind == CG_KERNEL) touch((uint64_t)c->kernels[x->kernel].block ^ (uint64_t)(x->nargs ? c->args[x->arg0 + x->nargs - 1] : 0));
      if (x->kind == CG_GEMM) touch((uint64_t)(p->tensors[x->out].offset));
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  enum { H = 32 };
  uint8_t *img = malloc(H + size + 1);
  if (!img) abort();
  memcpy(img, NTP_PROGRAM_MAGIC, 8);
  uint64_t fields[3] = {NTP_PROGRAM_VERSION, size, ntp_fnv1a64(data, size, NTP_FNV_BASIS)};
  for (int i = 0; i < 4; i++) img[8 + i] = (uint8_t)(fields[0] >> (8 * i)), img[12 + i] = 0;
  for (int i = 0; i < 8; i++) img[16 + i] = (uint8_t)(fields[1] >> (8 * i)), img[24 + i] = (uint8_t)(fields[2] >> (8 * i));
  if (size) memcpy(img + H, data, size);
  ntp_program *p = NULL;
  char err[512];
  if (ntp_program_read(img, H + size, &p, err, sizeof err) == 0) walk(p);
  ntp_program_free(p);
  free(img);
  return 0;
}
