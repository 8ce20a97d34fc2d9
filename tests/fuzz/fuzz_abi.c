/* fuzz_abi.c — sequences of model-ABI calls decoded from the input, on a fixed two-rank model
 * (abi_fixture.h): create with varied options, destroy (twice, too), forward, set_param,
 * load, get_info, with NULLs, wrong dtypes, shapes and strides, NULL shapes, byte offsets that
 * wrap the address space, token ids anywhere in int32, and handles that were destroyed. The
 * ABI must answer every call with a status; the fuzzer finds crashes and sanitizer reports.
 * Offsets that stay in the address space but leave the caller's buffer are the caller's
 * contract (no ABI can see them), so the harness only makes ones inside its buffers. */
#include "abi_fixture.h"
#include "fuzz_common.h"
#include "ntprt.h"

static abi_fixture fx;
static char params_path[256];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  if (abi_fixture_init(&fx, 2) != 0) abort();
  /* a valid parameter file for ntp_model_load */
  ntp_cpu_result res;
  char err[512];
  snprintf(params_path, sizeof params_path, "/tmp/ntp_fuzz_abi_%ld.safetensors", (long)getpid());
  if (ntp_cpu_run_params(&fx.prog->global, 3, 1, NULL, &res, err, sizeof err) != 0 ||
      ntp_safetensors_save(params_path, res.params, res.n_params, err, sizeof err) != 0)
    abort();
  ntp_cpu_result_free(&res);
  return 0;
}

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static uint8_t next(reader *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}

static int32_t next32(reader *r) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = v << 8 | next(r);
  return (int32_t)v;
}

/* A tensor for value v, right or wrong in one way chosen by the input. Its buffer has room
 * for a byte offset of up to 16. */
typedef struct made {
  DLTensor t;
  int64_t shape[8], strides[8];
  unsigned char *buf;
} made;

static void make(reader *r, int32_t v, made *m) {
  memset(m, 0, sizeof *m);
  const ntp_value *val = &fx.prog->global.values[v];
  int64_t n = shape_numel(&val->shape);
  size_t esize = dtype_bytes(val->dtype);
  m->buf = calloc(1, (size_t)n * esize + 16);
  m->t = (DLTensor){.data = m->buf, .device = {kDLCPU, 0}, .ndim = val->shape.ndim, .shape = m->shape};
  for (int d = 0; d < val->shape.ndim; d++) m->shape[d] = val->shape.dim[d];
  m->t.dtype = val->dtype == NTP_I32 ? (DLDataType){kDLInt, 32, 1}
               : val->dtype == NTP_BF16 ? (DLDataType){kDLBfloat, 16, 1}
               : val->dtype == NTP_FP16 ? (DLDataType){kDLFloat, 16, 1}
                                        : (DLDataType){kDLFloat, 32, 1};
  if (val->dtype == NTP_I32) /* token ids: in range mostly, anything sometimes */
    for (int64_t i = 0; i < n; i++) {
      int32_t id = next(r) & 0x80 ? next32(r) : next(r) % 16;
      memcpy(m->buf + 4 * i, &id, 4);
    }
  switch (next(r) % 12) {
  case 0: m->t.data = NULL; break;
  case 1: m->t.shape = NULL; break;
  case 2: m->t.ndim = next(r) % 8; break;
  case 3: if (m->t.ndim) m->shape[next(r) % m->t.ndim] = (int64_t)(int8_t)next(r); break;
  case 4: m->t.dtype.code = next(r) % 8; m->t.dtype.bits = next(r); m->t.dtype.lanes = next(r); break;
  case 5: m->t.byte_offset = UINT64_MAX - next(r); break;
  case 6: m->t.byte_offset = (uint64_t)1 << (56 + next(r) % 8); break; /* past any user address */
  case 7: m->t.byte_offset = next(r) % 17; break; /* inside the buffer's slack */
  case 8:
    m->t.strides = m->strides;
    for (int d = m->t.ndim - 1, s = 1; d >= 0; d--) m->strides[d] = s, s *= (int)m->shape[d];
    if (next(r) & 1 && m->t.ndim) m->strides[0] += 1;
    break;
  case 9: m->t.device.device_type = next(r); break;
  default: break;
  }
}

static int32_t input_value(void) {
  for (size_t i = 0; i < fx.prog->global.n_ops; i++)
    if (fx.prog->global.ops[i].code == IR_INPUT) return fx.prog->global.ops[i].result;
  return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  ntp_model *slot[2] = {NULL, NULL};
  ntp_model *stale[2] = {NULL, NULL}; /* destroyed handles, passed again on purpose */
  static const char *const backends[] = {NULL, "cpu", "tpu", ""};
  static const int32_t ranks[] = {-1, -1, -2, 0, 1, 2, -3, 1000};
  static const char *const pnames[] = {"embed.wte", "embed.wpe", "ln.g", "ln.b", "nope", NULL};
  const ntp_module *mod = &fx.prog->global;
  for (int steps = 0; r.n && steps < 16; steps++) {
    uint8_t op = next(&r);
    int k = (op >> 4) & 1;
    ntp_model *m = (op >> 5) & 1 ? stale[k] : slot[k];
    switch (op % 6) {
    case 0: {
      ntp_model_options o = {.backend = backends[next(&r) % 4], .rank = ranks[next(&r) % 8], .seed = next(&r)};
      ntp_model *made_model = NULL;
      if (ntprt_model_create(&fx.a, next(&r) & 1 ? &o : NULL, (op >> 6) & 1 ? NULL : &made_model) == NTP_OK) {
        if (slot[k]) ntprt_model_destroy(slot[k]);
        slot[k] = made_model;
      }
      break;
    }
    case 1:
      ntprt_model_destroy(m);
      if (m == slot[k]) {
        stale[k] = m;
        slot[k] = NULL;
      }
      break;
    case 2: {
      made in, out;
      make(&r, input_value(), &in);
      make(&r, mod->outputs[0].value, &out);
      const DLTensor *ins[1] = {next(&r) & 7 ? &in.t : NULL};
      DLTensor *outs[1] = {&out.t};
      uint8_t shape = next(&r);
      ntprt_model_forward(m, shape & 1 ? NULL : ins, shape & 2 ? NULL : outs);
      free(in.buf);
      free(out.buf);
      break;
    }
    case 3: {
      const char *name = pnames[next(&r) % 6];
      int32_t v = -1;
      for (size_t i = 0; name && i < mod->n_ops; i++)
        if (mod->ops[i].code == IR_PARAM && strcmp(mod->values[mod->ops[i].result].name, name) == 0)
          v = mod->ops[i].result;
      made t;
      make(&r, v >= 0 ? v : mod->ops[1].result, &t);
      ntprt_model_set_param(m, name, next(&r) & 7 ? &t.t : NULL);
      free(t.buf);
      break;
    }
    case 4: {
      uint8_t which = next(&r) % 4;
      const char *path = which == 0 ? NULL : which == 1 ? "/nonexistent/p.safetensors" : params_path;
      if (which == 3) path = fuzz_file(r.p, r.n, ".safetensors"); /* the rest of the input as a file */
      ntprt_model_load(m, path);
      break;
    }
    case 5: {
      const ntp_model_info *info;
      ntprt_model_get_info(&fx.a, next(&r) & 1 ? NULL : &info);
      break;
    }
    }
  }
  ntprt_model_destroy(slot[0]);
  ntprt_model_destroy(slot[1]);
  return 0;
}
