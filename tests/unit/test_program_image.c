/* test_program_image.c — the program format between compiler and runtime
 * (runtime/core/ntp_program.h): an image read back equals what the compiler wrote, field by
 * field (module, sharded program, every rank's CUDA); another version, a damaged byte, a
 * short or overlong image and bad magic are refused with their messages; and damage anywhere
 * with the checksum made to match is either read or refused, never a crash (this test runs
 * under ASan and UBSan in CI). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_gen.h"
#include "ntpc.h"
#include "session_program.h"
#include "shard.h"

static ntpc_session *compile(int32_t world, bool cuda) {
  ntpc_session *s = ntpc_session_new();
  ntpc_define(s, "L", 2);
  ntpc_set_world(s, world);
  ntpc_want_cuda(s, cuda);
  if (ntpc_add_plan_file(s, "examples/plans/gpt2_mixed8.ntp") != NTPC_OK ||
      ntpc_compile_file(s, "examples/gpt2.ntp") != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    exit(1);
  }
  return s;
}

static bool same_box(const ntp_box *a, const ntp_box *b) { return box_eq(a, b); }
static bool same_str(const char *a, const char *b) { return a == b || (a && b && strcmp(a, b) == 0); }

static bool same_op(const ir_op *c, const ntp_op *r) {
  if ((int)c->code != (int)r->code || c->result != r->result || c->nargs != r->nargs || c->layer != r->layer) return false;
  for (int a = 0; a < c->nargs; a++)
    if (c->args[a] != r->args[a]) return false;
  return memcmp(&c->attr, &r->attr, sizeof c->attr) == 0;
}

static void round_trip(ntpc_session *s) {
  char err[512];
  ntp_program *p = session_program(s, err, sizeof err);
  CHECK(p != NULL);
  if (!p) {
    fprintf(stderr, "%s\n", err);
    return;
  }
  const ir_module *m = ntpc_module(s);
  const sh_program *sp = ntpc_sharded(s);
  CHECK(same_str(p->global.name, m->name) && p->global.dtype == m->dtype);
  CHECK(p->global.n_values == m->n_values && p->global.n_ops == m->n_ops && p->global.n_layers == m->n_layers &&
        p->global.n_outputs == m->n_outputs);
  int bad = 0;
  for (size_t v = 0; v < m->n_values; v++) {
    const ir_value *a = &m->values[v];
    const ntp_value *b = &p->global.values[v];
    bad += !shape_eq(&a->shape, &b->shape) || a->dtype != b->dtype || a->def != b->def || !same_str(a->name, b->name);
  }
  for (size_t i = 0; i < m->n_ops; i++) bad += !same_op(&m->ops[i], &p->global.ops[i]);
  for (size_t l = 0; l < m->n_layers; l++) bad += !same_str(m->layers[l].name, p->global.layers[l]);
  for (size_t o = 0; o < m->n_outputs; o++)
    bad += !same_str(m->outputs[o].name, p->global.outputs[o].name) || m->outputs[o].value != p->global.outputs[o].value;
  CHECK(bad == 0);
  CHECK(p->world == sp->world && p->n_tensors == sp->n_tensors && p->n_steps == sp->n_steps);
  for (size_t t = 0; t < sp->n_tensors; t++) {
    const sh_tensor *a = &sp->tensors[t];
    const ntp_tensor *b = &p->tensors[t];
    bad += a->rank != b->rank || a->global != b->global || !same_box(&a->box, &b->box) || a->dtype != b->dtype ||
           a->persistent != b->persistent || !same_str(a->name, b->name) || a->init_value != b->init_value ||
           (a->persistent && !same_box(&a->init_box, &b->init_box)) || a->def != b->def || a->offset != b->offset;
  }
  for (size_t i = 0; i < sp->n_steps; i++) {
    const sh_step *a = &sp->steps[i];
    const ntp_step *b = &p->steps[i];
    bad += a->kind != b->kind || a->layer != b->layer;
    if (a->kind == SH_COMPUTE) {
      bad += a->rank != b->rank || !same_op(&a->op, &b->op);
      continue;
    }
    bad += a->comm != b->comm || a->nranks != b->nranks || a->nxfers != b->nxfers || a->elems != b->elems;
    for (int32_t k = 0; k < a->nranks && k < b->nranks; k++) bad += a->ranks[k] != b->ranks[k];
    for (size_t x = 0; x < a->nxfers && x < b->nxfers; x++)
      bad += a->xfers[x].src != b->xfers[x].src || a->xfers[x].dst != b->xfers[x].dst ||
             !same_box(&a->xfers[x].box, &b->xfers[x].box);
  }
  for (int32_t r = 0; r < sp->world; r++)
    bad += sp->mem[r].arena_bytes != p->mem[r].arena_bytes || sp->mem[r].param_bytes != p->mem[r].param_bytes ||
           sp->mem[r].input_bytes != p->mem[r].input_bytes;
  for (size_t v = 0; v < m->n_values; v++) {
    bad += sp->npieces[v] != p->npieces[v];
    for (size_t k = 0; k < sp->npieces[v] && k < p->npieces[v]; k++) bad += sp->pieces[v][k] != p->pieces[v][k];
  }
  CHECK(bad == 0);
  const cg_module *cm = ntpc_cuda_modules(s);
  CHECK(!cm == !p->cuda);
  for (int32_t r = 0; cm && p->cuda && r < sp->world; r++) {
    const ntp_rank_code *c = &p->cuda[r];
    CHECK(c->len == cm[r].len && memcmp(c->source, cm[r].source, c->len) == 0 && c->source[c->len] == '\0');
    CHECK(c->nkernels == cm[r].nkernels && c->nargs == cm[r].nargs);
    for (size_t k = 0; k < c->nkernels && k < cm[r].nkernels; k++) bad += memcmp(&c->kernels[k], &cm[r].kernels[k], sizeof c->kernels[k]) != 0;
    for (size_t i = 0; i < sp->n_steps; i++) bad += memcmp(&c->steps[i], &cm[r].steps[i], sizeof c->steps[i]) != 0;
    bad += c->nargs && memcmp(c->args, cm[r].args, c->nargs * sizeof *c->args) != 0;
    bad += c->scratch_bytes != cm[r].scratch_bytes;
  }
  CHECK(bad == 0);
  ntp_program_free(p);
}

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void reseal(unsigned char *img, size_t len) { put_u64(img + 24, ntp_fnv1a64(img + 32, len - 32, NTP_FNV_BASIS)); }

/* Reads img and expects a refusal whose message contains `want`. */
static void refused(const unsigned char *img, size_t len, const char *want) {
  ntp_program *p = NULL;
  char err[512] = "";
  int rc = ntp_program_read(img, len, &p, err, sizeof err);
  CHECK(rc == -1 && p == NULL);
  if (!strstr(err, want)) {
    fprintf(stderr, "expected '%s' in: %s\n", want, err);
    failures++;
  }
}

static void damage(ntpc_session *s) {
  const void *image;
  size_t len;
  CHECK(ntpc_program_image(s, &image, &len) == NTPC_OK && len > 64);
  unsigned char *img = malloc(len + 8);
  memcpy(img, image, len);

  put_u32(img + 8, NTP_PROGRAM_VERSION + 1);
  char want[128];
  snprintf(want, sizeof want, "format version %d; this runtime reads version %d", NTP_PROGRAM_VERSION + 1, NTP_PROGRAM_VERSION);
  refused(img, len, want);
  memcpy(img, image, len);
  img[0] = 'X';
  refused(img, len, "not an ntp program");
  memcpy(img, image, len);
  img[len / 2] ^= 0x40;
  refused(img, len, "checksum mismatch");
  memcpy(img, image, len);
  refused(img, len - 1, "payload bytes announced");
  refused(img, 10, "not an ntp program");
  img[len] = 0;
  refused(img, len + 1, "payload bytes announced");
  /* a payload one byte longer than its contents, announced and sealed: "after the end" */
  memcpy(img, image, len);
  img[len] = 0;
  put_u64(img + 16, (uint64_t)(len + 1 - 32));
  reseal(img, len + 1);
  refused(img, len + 1, "bytes after the end");

  /* every byte of the payload in turn (a stride of them for a long image), damaged and sealed
   * again: read or refused, and nothing read outside the image or the program's tables */
  size_t stride = len / 4000 + 1, tried = 0, rejected = 0;
  for (size_t at = 32; at < len; at += stride) {
    memcpy(img, image, len);
    img[at] ^= (unsigned char)(at % 2 ? 0xff : 0x80);
    reseal(img, len);
    ntp_program *p = NULL;
    char err[512];
    if (ntp_program_read(img, len, &p, err, sizeof err) != 0) rejected++;
    ntp_program_free(p);
    tried++;
  }
  printf("damaged images: %zu tried, %zu refused, %zu read\n", tried, rejected, tried - rejected);
  /* the CUDA sources are most of this image, and damaged text reads as text: of the rest, most
   * damage (counts, indices, kinds) is refused */
  CHECK(rejected > tried / 10);
  free(img);
}

int main(void) {
  ntpc_session *s = compile(0, true); /* the plan's world (8), with every rank's CUDA */
  round_trip(s);
  damage(s);
  ntpc_session_free(s);
  s = compile(-1, false); /* the module alone: no sharded program, no CUDA */
  {
    char err[256];
    ntp_program *p = session_program(s, err, sizeof err);
    CHECK(p && p->world == 0 && p->n_steps == 0 && !p->cuda && p->global.n_ops == ntpc_module(s)->n_ops);
    ntp_program_free(p);
  }
  ntpc_session_free(s);
  return check_report("program_image");
}
