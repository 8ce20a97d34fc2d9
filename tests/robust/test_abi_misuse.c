/* test_abi_misuse.c — the model ABI refuses misuse with NTP_EINVAL and a message, never a
 * crash or a silent success (issue 9, class 10): NULL arguments, a NULL output shape, a
 * byte_offset outside the address space, a second destroy, a destroyed handle, token ids
 * outside [0, V), a single rank on the cpu backend. */
#include <stdint.h>
#include <string.h>

#include "../check.h"
#include "../fuzz/abi_fixture.h"

static DLTensor tensor(void *data, DLDataTypeCode code, int bits, int32_t ndim, int64_t *shape) {
  return (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = ndim, .dtype = {(uint8_t)code, (uint8_t)bits, 1},
                    .shape = shape};
}

static bool says(const char *text) {
  const char *e = ntprt_model_last_error();
  if (strstr(e, text)) return true;
  fprintf(stderr, "  last error: '%s', expected '%s'\n", e, text);
  return false;
}

int main(void) {
  abi_fixture f;
  if (abi_fixture_init(&f, 2) != 0) return 1;
  const ntp_artifact *a = &f.a;

  CHECK(ntprt_model_get_info(a, NULL) == NTP_EINVAL && says("info is NULL"));
  const ntp_model_info *info = NULL;
  CHECK(ntprt_model_get_info(a, &info) == NTP_OK && info);
  CHECK(ntprt_model_create(a, NULL, NULL) == NTP_EINVAL && says("NULL"));

  ntp_model *m = NULL;
  ntp_model_options one = {.backend = "cpu", .rank = 0};
  CHECK(ntprt_model_create(a, &one, &m) == NTP_EINVAL && !m && says("set rank = -1"));
  ntp_model_options far = {.backend = "cpu", .rank = 7};
  CHECK(ntprt_model_create(a, &far, &m) == NTP_EINVAL && !m);
  ntp_model_options all = {.backend = "cpu", .rank = -1};
  CHECK(ntprt_model_create(a, &all, &m) == NTP_OK && m);

  int32_t tok[8] = {0, 1, 2, 3, 4, 5, 6, 15};
  float out[2 * 4 * 16];
  int64_t tshape[2] = {2, 4}, oshape[3] = {2, 4, 16};
  DLTensor in = tensor(tok, kDLInt, 32, 2, tshape), o = tensor(out, kDLFloat, 32, 3, oshape);
  const DLTensor *ins[1] = {&in};
  DLTensor *outs[1] = {&o};

  CHECK(ntprt_model_forward(NULL, ins, outs) == NTP_EINVAL && says("no model"));
  CHECK(ntprt_model_forward(m, ins, NULL) == NTP_EINVAL && says("outputs is NULL"));
  CHECK(ntprt_model_load(NULL, "x") == NTP_EINVAL);
  CHECK(ntprt_model_load(m, NULL) == NTP_EINVAL && says("path is NULL"));
  CHECK(ntprt_model_set_param(m, NULL, &in) == NTP_EINVAL && says("name is NULL"));
  CHECK(ntprt_model_set_param(NULL, "embed.wte", &in) == NTP_EINVAL);

  DLTensor noshape = o;
  noshape.shape = NULL;
  DLTensor *outs_noshape[1] = {&noshape};
  CHECK(ntprt_model_forward(m, ins, outs_noshape) == NTP_EINVAL && says("shape is NULL"));

  DLTensor far_off = o;
  far_off.byte_offset = UINT64_MAX - 8;
  DLTensor *outs_far[1] = {&far_off};
  CHECK(ntprt_model_forward(m, ins, outs_far) == NTP_EINVAL && says("outside the address space"));
  DLTensor in_far = in;
  in_far.byte_offset = (uint64_t)1 << 62;
  const DLTensor *ins_far[1] = {&in_far};
  CHECK(ntprt_model_forward(m, ins_far, outs) == NTP_EINVAL && says("outside the address space"));

  int rc = ntprt_model_forward(m, ins, outs);
  CHECK(rc == NTP_OK);
  if (rc) fprintf(stderr, "  forward: %s\n", ntprt_model_last_error());
  tok[3] = 16; /* V = 16: one past the vocabulary */
  CHECK(ntprt_model_forward(m, ins, outs) == NTP_EINVAL && says("outside [0, 16)"));
  tok[3] = -1;
  CHECK(ntprt_model_forward(m, ins, outs) == NTP_EINVAL && says("outside [0, 16)"));
  tok[3] = 3;
  CHECK(ntprt_model_forward(m, ins, outs) == NTP_OK);

  ntprt_model_destroy(m);
  ntprt_model_destroy(m); /* a second destroy: refused quietly, nothing freed twice */
  CHECK(ntprt_model_forward(m, ins, outs) == NTP_EINVAL && says("not a live model"));
  CHECK(ntprt_model_load(m, "x") == NTP_EINVAL && says("not a live model"));
  ntprt_model_destroy(NULL);

  abi_fixture_free(&f);
  return check_report("abi_misuse");
}
