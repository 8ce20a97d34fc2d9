/* model_abi.c — the ntp_model_* ABI over an artifact's program image (read at create): an executor
 * (exec.h) on the backend options->backend names runs its ranks (the cpu backend: every rank in
 * this process, simulated); a training library's trainer holds one. Nothing here knows which. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "ntp_artifact.h"
#include "ntp_train.h"
#include "ntprt.h"

static _Thread_local char last_error[512];

static int fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return code;
}

const char *ntprt_model_last_error(void) { return last_error; }

struct ntp_model {
  const ntp_artifact *a;
  ntp_program *prog; /* read from the artifact's image */
  ntp_exec *exec;       /* an inference library's ranks, on the backend the options chose (exec.h) */
  ntp_trainer *trainer; /* or a training library's trainer (on either backend): it holds the parameters */
  ntp_host_tensor *held; /* training library, per value: the inputs last set (owned) */
  const ntp_host_tensor **given;
  uint64_t seed;
  struct ntp_model *next_live;
};

/* The models created and not yet destroyed. A call with any other handle (NULL, freed, a
 * second destroy) is refused instead of touching freed memory: the ABI's callers are other
 * languages' bindings, where a stale handle is an easy mistake. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static ntp_model *live_models;

static void live_add(ntp_model *m) {
  pthread_mutex_lock(&live_lock);
  m->next_live = live_models;
  live_models = m;
  pthread_mutex_unlock(&live_lock);
}

static bool live_remove(ntp_model *m) {
  pthread_mutex_lock(&live_lock);
  bool found = false;
  for (ntp_model **p = &live_models; *p; p = &(*p)->next_live)
    if (*p == m) {
      *p = m->next_live;
      found = true;
      break;
    }
  pthread_mutex_unlock(&live_lock);
  return found;
}

static bool is_live(const ntp_model *m) {
  pthread_mutex_lock(&live_lock);
  bool found = false;
  for (const ntp_model *p = live_models; p && !found; p = p->next_live) found = p == m;
  pthread_mutex_unlock(&live_lock);
  return found;
}

#define CHECK_MODEL(m)                                                                                    \
  do {                                                                                                    \
    if (!(m)) return fail(NTP_EINVAL, "no model (NULL)");                                                 \
    if (!is_live(m)) return fail(NTP_EINVAL, "not a live model: it was destroyed, or never created");     \
  } while (0)

int ntprt_model_get_info(const ntp_artifact *a, const ntp_model_info **info) {
  if (!info) return fail(NTP_EINVAL, "info is NULL");
  *info = &a->info;
  return NTP_OK;
}

/* A training library's instance: the trainer runs the program on the executor x names and keeps
 * the fp32 masters and moments; inputs are host tensors, held here between the calls. A failure to
 * start is the backend's where it has devices to start, else memory. */
static int new_trainer(ntp_model *m, ntp_program *prog, const ntp_exec_options *x, int code, ntp_model **out) {
  char err[512] = "out of memory";
  ntp_adamw aw;
  ntp_adamw_defaults(&aw);
  m->held = calloc(prog->global.n_values + 1, sizeof *m->held);
  m->given = calloc(prog->global.n_values + 1, sizeof *m->given);
  if (!m->held || !m->given || ntp_trainer_new(prog, &aw, m->seed, NULL, x, &m->trainer, err, sizeof err) != 0) {
    free(m->held), free(m->given), ntp_program_free(prog), free(m);
    return fail(code, "%s", err);
  }
  live_add(m);
  *out = m;
  return NTP_OK;
}

/* Where the model's ranks run (exec.h), from the ABI's options: every rank here (rank -1), or this
 * process's one rank (given, or from the launcher's environment) on a backend with devices. */
static int placement(const ntp_model_options *o, const ntp_exec_backend *b, int32_t world, bool training,
                     ntp_exec_options *x) {
  *x = (ntp_exec_options){.backend = b->name};
  if (!o) return NTP_OK;
  if (!b->devices && o->rank != -1 && !(o->rank == 0 && world == 1))
    /* every rank in this process: one rank alone cannot run without the others */
    return fail(NTP_EINVAL, "rank %d: the %s backend runs every rank of the model in this process; set rank = -1",
                o->rank, b->name);
  if (o->rank < NTP_RANK_FROM_ENV || o->rank >= world)
    return fail(NTP_EINVAL, "rank %d is outside the model's world of %d", o->rank, world);
  if (!b->devices) return NTP_OK;
  x->loopback = o->loopback != 0, x->device = o->device, x->comm = o->nccl_comm;
  int rank = o->rank, device = o->device;
  if (rank == NTP_RANK_FROM_ENV && ntp_launcher_rank(&rank, &device) != 0)
    return fail(NTP_EINVAL, "no launcher rank in the environment (RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK)");
  if (rank >= world) return fail(NTP_EINVAL, "rank %d is outside the model's world of %d", rank, world);
  if (rank >= 0) x->rank_lo = rank, x->rank_hi = rank + 1, x->device = device; /* one rank, on its own device */
  if (training && x->rank_hi && x->rank_hi - x->rank_lo != world)
    return fail(NTP_EINVAL, "a training library runs every rank in one process (rank = -1): the update reads every "
                            "gradient on the host");
  return NTP_OK;
}

int ntprt_model_create(const ntp_artifact *a, const ntp_model_options *o, ntp_model **out) {
  if (!out) return fail(NTP_EINVAL, "the model pointer (out) is NULL");
  *out = NULL;
  if (a->abi_version != NTP_MODEL_ABI_VERSION)
    return fail(NTP_EINVAL, "model library ABI %d, runtime ABI %d: rebuild the model", a->abi_version,
                NTP_MODEL_ABI_VERSION);
  char err[1024];
  const ntp_exec_backend *b = ntp_exec_backend_find(o ? o->backend : NULL, err, sizeof err);
  if (!b) return fail(NTP_EINVAL, "%s", err);
  ntp_program *prog;
  if (!a->image || ntp_program_read(a->image, a->image_len, &prog, err, sizeof err) != 0)
    return fail(NTP_EINVAL, "%s", a->image ? err : "the model library carries no program image");
  if (prog->world < 1) {
    ntp_program_free(prog);
    return fail(NTP_EINVAL, "the model library's program image has no sharded program");
  }
  bool training = false; /* its outputs carry the parameters' gradients */
  for (size_t k = 0; k < prog->global.n_outputs; k++) training |= !strncmp(prog->global.outputs[k].name, "grad.", 5);
  ntp_exec_options x;
  int rc = placement(o, b, prog->world, training, &x);
  ntp_model *m = rc == NTP_OK ? calloc(1, sizeof *m) : NULL;
  if (!m) return ntp_program_free(prog), rc == NTP_OK ? fail(NTP_ENOMEM, "out of memory") : rc;
  m->a = a;
  m->prog = prog;
  m->seed = o ? o->seed : 0;
  int code = b->devices ? NTP_EBACKEND : NTP_ENOMEM; /* what a failure to start is */
  if (training) return new_trainer(m, prog, &x, code, out);
  if (ntp_exec_new(prog, &x, &m->exec, err, sizeof err) != 0) {
    ntp_program_free(prog), free(m);
    return fail(code, "%s", err);
  }
  live_add(m);
  *out = m;
  return NTP_OK;
}

void ntprt_model_destroy(ntp_model *m) {
  if (!m || !live_remove(m)) return; /* NULL, or destroyed already: nothing to do */
  ntp_exec_free(m->exec);
  ntp_trainer_free(m->trainer);
  for (size_t v = 0; m->held && v < m->prog->global.n_values; v++) free(m->held[v].f), free(m->held[v].i);
  free(m->held);
  free(m->given);
  ntp_program_free(m->prog);
  free(m);
}

int ntprt_model_load(ntp_model *m, const char *path) { return ntprt_model_load_format(m, path, "ntp"); }

int ntprt_model_load_format(ntp_model *m, const char *path, const char *format) {
  CHECK_MODEL(m);
  if (!path) return fail(NTP_EINVAL, "path is NULL");
  if (!format || !ntp_param_format_known(format))
    return fail(NTP_EINVAL, "unknown parameter layout '%s' (ntp, hf-gpt2, hf-llama)", format ? format : "(null)");
  char err[512];
  ntp_safetensors *f;
  if (ntp_safetensors_open(path, &f, err, sizeof err) != 0) return fail(NTP_EIO, "%s", err);
  if (ntp_safetensors_set_format(f, format, &m->prog->global, err, sizeof err) != 0) {
    ntp_safetensors_close(f);
    return fail(NTP_EIO, "%s", err);
  }
  int rc = m->exec ? m->exec->ops->load(m->exec->be, f, err, sizeof err) : 0;
  const ntp_module *mod = &m->prog->global;
  for (size_t i = 0; m->trainer && rc == 0 && i < mod->n_ops; i++) { /* a training library: every master */
    if (mod->ops[i].code != IR_PARAM) continue;
    const ntp_value *val = &mod->values[mod->ops[i].result];
    ntp_host_tensor h = {.name = val->name, .dtype = val->dtype, .shape = val->shape};
    ntp_box full = box_full(&val->shape);
    h.f = malloc((size_t)(shape_numel(&val->shape) ? shape_numel(&val->shape) : 1) * sizeof *h.f);
    rc = !h.f ? (snprintf(err, sizeof err, "out of memory"), -1)
              : ntp_safetensors_read_box(f, val->name, val->dtype, &val->shape, &full, h.f, err, sizeof err);
    if (rc == 0) rc = ntp_trainer_set_param(m->trainer, mod->ops[i].result, &h, err, sizeof err);
    free(h.f);
  }
  ntp_safetensors_close(f);
  return rc == 0 ? NTP_OK : fail(NTP_EIO, "%s", err);
}

static bool dl_matches(const DLTensor *t, ntp_dtype dt) {
  switch (dt) {
  case NTP_BF16: return t->dtype.code == kDLBfloat && t->dtype.bits == 16 && t->dtype.lanes == 1;
  case NTP_FP16: return t->dtype.code == kDLFloat && t->dtype.bits == 16 && t->dtype.lanes == 1;
  case NTP_FP32: return t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1;
  default: return t->dtype.code == kDLInt && t->dtype.bits == 32 && t->dtype.lanes == 1;
  }
}

/* A global DLTensor checked against value v: CPU, dense, the value's shape and dtype. */
static int check_dl(const ntp_model *m, const DLTensor *t, int32_t v, const char *what) {
  const ntp_value *val = &m->prog->global.values[v];
  if (!t || !t->data) return fail(NTP_EINVAL, "%s '%s': no tensor", what, val->name);
  if (t->ndim != val->shape.ndim) return fail(NTP_EINVAL, "%s '%s': %d dims, expected %d", what, val->name, t->ndim, val->shape.ndim);
  if (t->ndim > 0 && !t->shape) return fail(NTP_EINVAL, "%s '%s': shape is NULL", what, val->name);
  /* the data must not wrap around the address space; no 64-bit system maps user memory above 2^56 */
  uint64_t bytes = (uint64_t)shape_numel(&val->shape) * dtype_bytes(val->dtype), addr = (uint64_t)(uintptr_t)t->data,
           end;
  if (__builtin_add_overflow(addr, t->byte_offset, &end) || __builtin_add_overflow(end, bytes, &end) ||
      end > (UINT64_C(1) << 56))
    return fail(NTP_EINVAL, "%s '%s': byte_offset %llu puts the data outside the address space", what, val->name,
                (unsigned long long)t->byte_offset);
  if (t->device.device_type == kDLCUDA) { /* device memory: the cuda backend, on a GPU of this process */
    int dev = -1;
    char why[256];
    if (!m->exec) return fail(NTP_EINVAL, "%s '%s': a training library takes host tensors (kDLCPU)", what, val->name);
    if (m->exec->ops->device_of(m->exec->be, (const unsigned char *)t->data + t->byte_offset, &dev, why, sizeof why) != 0)
      return fail(NTP_EINVAL, "%s '%s': %s", what, val->name, why);
    if (dev != t->device.device_id)
      return fail(NTP_EINVAL, "%s '%s': kDLCUDA tensor whose data is not device memory of GPU %d", what, val->name,
                  t->device.device_id);
  } else if (t->device.device_type != kDLCPU) {
    return fail(NTP_EINVAL, "%s '%s': device type %d (expected kDLCPU or, on the cuda backend, kDLCUDA)", what,
                val->name, (int)t->device.device_type);
  }
  if (!dl_matches(t, val->dtype)) return fail(NTP_EINVAL, "%s '%s': dtype must be %s", what, val->name, dtype_name(val->dtype));
  int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != val->shape.dim[d])
      return fail(NTP_EINVAL, "%s '%s': dim %d is %lld, expected %lld", what, val->name, d, (long long)t->shape[d],
                  (long long)val->shape.dim[d]);
    if (t->strides && t->strides[d] != stride) return fail(NTP_EINVAL, "%s '%s': must be dense and row-major", what, val->name);
    stride *= t->shape[d];
  }
  return NTP_OK;
}

/* DLTensor (storage dtype) -> host tensor (fp32 values, or int32) */
static int to_host(const DLTensor *t, const ntp_value *val, ntp_host_tensor *h) {
  int64_t n = shape_numel(&val->shape);
  *h = (ntp_host_tensor){.name = val->name, .dtype = val->dtype, .shape = val->shape};
  const unsigned char *src = (const unsigned char *)t->data + t->byte_offset;
  if (val->dtype == NTP_I32) {
    h->i = malloc((size_t)(n ? n : 1) * 4);
    if (h->i) memcpy(h->i, src, (size_t)n * 4);
    return h->i ? 0 : -1;
  }
  h->f = malloc((size_t)(n ? n : 1) * 4);
  if (!h->f) return -1;
  for (int64_t i = 0; i < n; i++) {
    if (val->dtype == NTP_FP32) memcpy(&h->f[i], src + 4 * i, 4);
    else {
      uint16_t b;
      memcpy(&b, src + 2 * i, 2);
      h->f[i] = val->dtype == NTP_BF16 ? ntp_bf16_bits_to_float(b) : ntp_f16_bits_to_float(b);
    }
  }
  return 0;
}

static void from_host(const ntp_host_tensor *h, DLTensor *t) {
  int64_t n = shape_numel(&h->shape);
  unsigned char *dst = (unsigned char *)t->data + t->byte_offset;
  if (h->i) {
    memcpy(dst, h->i, (size_t)n * 4);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    if (h->dtype == NTP_FP32) memcpy(dst + 4 * i, &h->f[i], 4);
    else {
      uint16_t b = h->dtype == NTP_BF16 ? ntp_float_to_bf16_bits(h->f[i]) : ntp_float_to_f16_bits(h->f[i]);
      memcpy(dst + 2 * i, &b, 2);
    }
  }
}

/* Token ids that a gather reads must index its table, as the CPU reference requires: the
 * smallest table any gather reads this value with bounds them. INT64_MAX: no gather reads it. */
static int64_t index_bound(const ntp_module *mod, int32_t v) {
  int64_t bound = INT64_MAX;
  for (size_t i = 0; i < mod->n_ops; i++) {
    const ntp_op *op = &mod->ops[i];
    if (op->code == IR_GATHER && op->nargs == 2 && op->args[1] == v) {
      int64_t rows = mod->values[op->args[0]].shape.dim[0];
      if (rows < bound) bound = rows;
    }
  }
  return bound;
}

static int set_value(ntp_model *m, int32_t v, const DLTensor *t, const char *what) {
  int rc = check_dl(m, t, v, what);
  if (rc) return rc;
  if (t->device.device_type == kDLCUDA) { /* stays on the GPUs: each rank copies its slice */
    char err[512];
    const void *data = (const unsigned char *)t->data + t->byte_offset;
    if (m->prog->global.values[v].dtype == NTP_I32) { /* token ids are checked like host ones */
      int64_t n = shape_numel(&m->prog->global.values[v].shape), bound = index_bound(&m->prog->global, v);
      int32_t *ids = malloc((size_t)(n ? n : 1) * 4);
      if (!ids) return fail(NTP_ENOMEM, "out of memory");
      if (m->exec->ops->copy_to_host(m->exec->be, ids, data, (size_t)n * 4, err, sizeof err) != 0) {
        free(ids);
        return fail(NTP_ERUN, "%s", err);
      }
      for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= bound) {
          int32_t bad = ids[i];
          free(ids);
          return fail(NTP_EINVAL, "%s '%s': element %lld is %d, outside [0, %lld) (the rows of the table it indexes)",
                      what, m->prog->global.values[v].name, (long long)i, bad, (long long)bound);
        }
      free(ids);
    }
    rc = m->exec->ops->set_device(m->exec->be, v, data, t->device.device_id, err, sizeof err);
    return rc == 0 ? NTP_OK : fail(NTP_ERUN, "%s", err);
  }
  ntp_host_tensor h;
  if (to_host(t, &m->prog->global.values[v], &h) != 0) return fail(NTP_ENOMEM, "out of memory");
  if (h.i) {
    int64_t bound = index_bound(&m->prog->global, v), n = shape_numel(&h.shape);
    for (int64_t i = 0; i < n; i++)
      if (h.i[i] < 0 || h.i[i] >= bound) {
        int32_t bad = h.i[i];
        free(h.i);
        return fail(NTP_EINVAL, "%s '%s': element %lld is %d, outside [0, %lld) (the rows of the table it indexes)",
                    what, m->prog->global.values[v].name, (long long)i, bad, (long long)bound);
      }
  }
  char err[512];
  if (m->trainer) { /* parameters live in the trainer; inputs come with each call */
    rc = strcmp(what, "parameter") == 0 ? ntp_trainer_set_param(m->trainer, v, &h, err, sizeof err) : 0;
    if (rc == 0 && strcmp(what, "parameter") != 0) { /* an input: kept for the runs to come */
      free(m->held[v].f), free(m->held[v].i);
      m->held[v] = h;
      return NTP_OK;
    }
  } else {
    rc = m->exec->ops->set(m->exec->be, v, &h, err, sizeof err);
  }
  free(h.f);
  free(h.i);
  return rc == 0 ? NTP_OK : fail(NTP_EINVAL, "%s", err);
}

/* The module's value of parameter `name`, or -1. */
static int32_t param_value(const ntp_module *mod, const char *name) {
  for (size_t i = 0; i < mod->n_ops; i++)
    if (mod->ops[i].code == IR_PARAM && strcmp(mod->values[mod->ops[i].result].name, name) == 0)
      return mod->ops[i].result;
  return -1;
}

int ntprt_model_set_param(ntp_model *m, const char *name, const DLTensor *global) {
  CHECK_MODEL(m);
  if (!name) return fail(NTP_EINVAL, "the parameter name is NULL");
  int32_t v = param_value(&m->prog->global, name);
  if (v < 0) return fail(NTP_EINVAL, "the model has no parameter '%s'", name);
  return set_value(m, v, global, "parameter");
}

/* A training library's inputs as set: the `given` array its trainer runs with. */
static const ntp_host_tensor *const *held_inputs(ntp_model *m) {
  for (size_t v = 0; v < m->prog->global.n_values; v++)
    m->given[v] = m->held[v].f || m->held[v].i ? &m->held[v] : NULL;
  return m->given;
}

/* The inputs of a call, in the info's order (NULL ones keep their last value). */
static int set_inputs(ntp_model *m, const DLTensor *const *inputs) {
  const ntp_module *mod = &m->prog->global;
  int k = 0;
  for (size_t i = 0; i < mod->n_ops; i++) {
    if (mod->ops[i].code != IR_INPUT) continue;
    if (inputs && inputs[k]) {
      int rc = set_value(m, mod->ops[i].result, inputs[k], "input");
      if (rc) return rc;
    }
    k++;
  }
  return NTP_OK;
}

int ntprt_model_forward(ntp_model *m, const DLTensor *const *inputs, DLTensor *const *outputs) {
  CHECK_MODEL(m);
  if (!outputs) return fail(NTP_EINVAL, "outputs is NULL");
  const ntp_module *mod = &m->prog->global;
  int rc0 = set_inputs(m, inputs); /* an input not given keeps its last value, or the default initialisation */
  if (rc0) return rc0;
  for (size_t o = 0; o < mod->n_outputs; o++) {
    int rc = check_dl(m, outputs ? outputs[o] : NULL, mod->outputs[o].value, "output");
    if (rc) return rc;
  }
  char err[512] = "";
  if (m->trainer) {
    ntp_cpu_result res;
    if (ntp_trainer_eval(m->trainer, held_inputs(m), &res, err, sizeof err) != 0) return fail(NTP_ERUN, "%s", err);
    for (size_t o = 0; o < res.n_outputs; o++) from_host(&res.outputs[o], outputs[o]);
    ntp_cpu_result_free(&res);
    return NTP_OK;
  }
  bool on_device = false; /* device outputs are written where the ranks are; host ones come back through the host */
  for (size_t o = 0; o < mod->n_outputs; o++) on_device |= outputs[o]->device.device_type == kDLCUDA;
  const ntp_exec_ops *x = m->exec->ops;
  if (!on_device) {
    ntp_cpu_result res;
    if (x->forward(m->exec->be, m->seed, &res, err, sizeof err) != 0) return fail(NTP_ERUN, "%s", err);
    for (size_t o = 0; o < res.n_outputs; o++) from_host(&res.outputs[o], outputs[o]);
    ntp_cpu_result_free(&res);
    return NTP_OK;
  }
  if (x->run(m->exec->be, m->seed, err, sizeof err) != 0) return fail(NTP_ERUN, "%s", err);
  for (size_t o = 0; o < mod->n_outputs; o++) {
    DLTensor *t = outputs[o];
    if (t->device.device_type == kDLCUDA) {
      if (x->output_device(m->exec->be, o, (unsigned char *)t->data + t->byte_offset, t->device.device_id, err,
                           sizeof err) != 0)
        return fail(NTP_ERUN, "%s", err);
      continue;
    }
    ntp_host_tensor h;
    if (x->output(m->exec->be, o, &h, err, sizeof err) != 0) return fail(NTP_ERUN, "%s", err);
    from_host(&h, t);
    free(h.f);
    free(h.i);
  }
  return NTP_OK;
}

int ntprt_model_train_step(ntp_model *m, const ntp_model_train_options *o, const DLTensor *const *inputs,
                           double *loss) {
  CHECK_MODEL(m);
  if (!m->trainer) return fail(NTP_EINVAL, "this model library has no training step (build it with ntpc FILE --train -o)");
  if (!loss) return fail(NTP_EINVAL, "loss is NULL");
  ntp_adamw aw;
  ntp_adamw_defaults(&aw);
  if (o) {
    aw.lr = o->lr, aw.beta1 = o->beta1, aw.beta2 = o->beta2, aw.eps = o->eps, aw.weight_decay = o->weight_decay;
    aw.clip = o->clip;
  }
  aw.steps = 1; /* a constant rate: the caller's schedule */
  char why[256];
  if (ntp_adamw_check(&aw, why, sizeof why) != 0) return fail(NTP_EINVAL, "train options: %s", why);
  ntp_trainer_set_options(m->trainer, &aw);
  int rc = set_inputs(m, inputs);
  if (rc) return rc;
  char err[512];
  ntp_train_stats st;
  if (ntp_trainer_step(m->trainer, held_inputs(m), 0, &st, err, sizeof err) != 0) return fail(NTP_ERUN, "%s", err);
  *loss = st.loss;
  return NTP_OK;
}

int ntprt_model_init(ntp_model *m, const char *scheme, double std) {
  CHECK_MODEL(m);
  if (!m->trainer) return fail(NTP_EINVAL, "an initialisation scheme is a training library's (train=True)");
  ntp_init_scheme s = NTP_INIT_MODULE;
  if (!scheme) s = ntp_trainer_family_init(m->trainer);
  else if (!ntp_init_scheme_named(scheme, &s))
    return fail(NTP_EINVAL, "no initialisation '%s' (gpt2, megatron, llama, uniform or comparison)", scheme);
  char err[512];
  if (ntp_trainer_init(m->trainer, s, std, m->seed, err, sizeof err) != 0) return fail(NTP_ERUN, "%s", err);
  return NTP_OK;
}

int ntprt_model_get_param(ntp_model *m, const char *name, DLTensor *global) {
  CHECK_MODEL(m);
  if (!name) return fail(NTP_EINVAL, "the parameter name is NULL");
  int32_t v = param_value(&m->prog->global, name);
  if (v < 0) return fail(NTP_EINVAL, "the model has no parameter '%s'", name);
  int rc = check_dl(m, global, v, "parameter");
  if (rc) return rc;
  if (global->device.device_type != kDLCPU) return fail(NTP_EINVAL, "parameter '%s': a host tensor (kDLCPU) is needed", name);
  if (m->trainer) { /* its masters, rounded to the model's dtype */
    const ntp_host_tensor *ps;
    size_t n = ntp_trainer_params(m->trainer, &ps);
    for (size_t i = 0; i < n; i++)
      if (strcmp(ps[i].name, name) == 0) {
        from_host(&ps[i], global);
        return NTP_OK;
      }
    return fail(NTP_EINVAL, "the model has no parameter '%s'", name);
  }
  char err[256]; /* the ranks hold the slices */
  ntp_host_tensor h;
  if (m->exec->ops->value_get(m->exec->be, v, m->seed, &h, err, sizeof err) != 0)
    return fail(NTP_EINVAL, "ntp_model_get_param: %s", err);
  from_host(&h, global);
  free(h.f), free(h.i);
  return NTP_OK;
}

int ntprt_model_save_format(ntp_model *m, const char *path, const char *format) {
  CHECK_MODEL(m);
  if (!path) return fail(NTP_EINVAL, "path is NULL");
  if (!format || !ntp_param_format_known(format))
    return fail(NTP_EINVAL, "unknown parameter layout '%s' (ntp, hf-gpt2, hf-llama)", format ? format : "(null)");
  char err[512];
  if (m->trainer) {
    const ntp_host_tensor *ps;
    size_t n = ntp_trainer_params(m->trainer, &ps);
    if (ntp_safetensors_save_format(path, format, &m->prog->global, ps, n, err, sizeof err) != 0)
      return fail(NTP_EIO, "%s", err);
    return NTP_OK;
  }
  const ntp_module *mod = &m->prog->global; /* every parameter from the ranks' slices */
  ntp_host_tensor *ps = calloc(mod->n_ops + 1, sizeof *ps);
  size_t n = 0;
  int rc = ps ? NTP_OK : fail(NTP_ENOMEM, "out of memory");
  for (size_t k = 0; rc == NTP_OK && k < mod->n_ops; k++) {
    if (mod->ops[k].code != IR_PARAM) continue;
    if (m->exec->ops->value_get(m->exec->be, mod->ops[k].result, m->seed, &ps[n], err, sizeof err) != 0)
      rc = fail(NTP_EINVAL, "saving parameters: %s", err);
    else n++;
  }
  if (rc == NTP_OK && ntp_safetensors_save_format(path, format, mod, ps, n, err, sizeof err) != 0) rc = fail(NTP_EIO, "%s", err);
  for (size_t i = 0; ps && i < n; i++) free(ps[i].f), free(ps[i].i);
  free(ps);
  return rc;
}
