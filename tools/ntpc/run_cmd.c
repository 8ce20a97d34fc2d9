/* run_cmd.c — `ntpc run`: the forward on the CPU reference (the truth), then, where the backend
 * gives an executor (exec.h: the simulation of a sharded program, the GPUs of the cuda backend),
 * the same forward there with the same parameters and inputs, every output compared element by
 * element with the reference's within the dtype's tolerance. Which backend runs is a name passed
 * through: nothing here knows one from another. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "exec.h"
#include "ntprt.h"
#include "run_cmd.h"

void ntpc_print_model_summary(const ir_module *m, FILE *out) {
  size_t params = 0, inputs = 0;
  long long elems = 0;
  for (size_t i = 0; i < m->n_ops; i++) {
    if (m->ops[i].code == IR_PARAM) {
      params++;
      elems += shape_numel(&m->values[m->ops[i].result].shape);
    }
    inputs += m->ops[i].code == IR_INPUT;
  }
  fprintf(out, "model %s: %zu layers, %zu ops, %zu inputs, %zu params (%.3fM elements), %zu outputs, dtype %s\n",
          m->name, m->n_layers, m->n_ops, inputs, params, (double)elems / 1e6, m->n_outputs, dtype_name(m->dtype));
}

/* Gradients (--train) are measured against at least a share of the largest one (1e-3 in fp32,
 * 1e-2 in bf16 and fp16): a gradient that vanishes (a key bias's: softmax does not see it) is
 * round-off on both sides. */
static double grad_floor(const ntp_cpu_result *ref, ntp_dtype model) {
  double f = 0, share = model == NTP_FP32 ? 1e-3 : 1e-2;
  for (size_t i = 0; i < ref->n_outputs; i++)
    if (!strncmp(ref->outputs[i].name, "grad.", 5)) f = fmax(f, share * ntp_max_abs(&ref->outputs[i]));
  return f;
}

/* An output is as precise as what it is computed from: an fp32 loss of a bf16 model's logits is
 * held to bf16's tolerance. fp32_tol: the fp32 tolerance of the comparison (sums in another order). */
static double tolerance(const ntp_host_tensor *out, ntp_dtype model, double fp32_tol) {
  ntp_dtype d = out->dtype == NTP_FP32 && (model == NTP_BF16 || model == NTP_FP16) ? model : out->dtype;
  return d == NTP_FP32 ? fp32_tol : d == NTP_BF16 ? 5e-2 : 1e-2;
}

static double output_error(const ntp_host_tensor *got, const ntp_host_tensor *ref, double gfloor) {
  return ntp_max_rel_error_floor(got, ref, strncmp(ref->name, "grad.", 5) == 0 ? gfloor : 0);
}

/* --inputs and --text into given[] (over the module's values): 0, or 1 (an input error, said). */
static int load_inputs(const ntp_module *m, const ntpc_run_options *o, ntp_host_tensor ***given) {
  *given = NULL;
  if (!o->ninputs && !o->text) return 0;
  char err[512];
  if (!(*given = calloc(m->n_values ? m->n_values : 1, sizeof **given))) {
    fprintf(stderr, "ntpc: error: out of memory\n");
    return 1;
  }
  for (int i = 0; i < o->ninputs; i++)
    if (ntp_inputs_load(m, o->inputs[i], *given, err, sizeof err) != 0) goto fail;
  if (o->text && ntp_inputs_text(m, o->text, strlen(o->text), *given, err, sizeof err) != 0) goto fail;
  return 0;
fail:
  fprintf(stderr, "ntpc: error: %s\n", err);
  ntp_inputs_free(m, *given);
  free(*given);
  *given = NULL;
  return 1;
}

static void free_inputs(const ntp_module *m, ntp_host_tensor **given) {
  if (given) ntp_inputs_free(m, given);
  free(given);
}

/* The host memory a CPU run may use: $NTP_CPU_MEMORY_LIMIT (bytes), else the machine's. */
static double host_memory_limit(void) {
  const char *e = getenv("NTP_CPU_MEMORY_LIMIT");
  if (e && *e) {
    char *end;
    double v = strtod(e, &end);
    if (!*end && v > 0) return v;
  }
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? (double)pages * (double)size : 1e300;
}

static const char *bytes_str(double b, char *buf, size_t cap) {
  static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, u++;
  snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
  return buf;
}

/* Before anything is allocated: the CPU reference holds every value in fp32 (parameters and
 * inputs throughout, each activation while it is live), and the simulation adds every rank's
 * arena and slices. A model that cannot fit is refused with the tensor that dominates, instead
 * of allocating until the machine gives out. */
static int check_host_memory(const ir_module *m, const ntp_program *p) {
  double limit = host_memory_limit(), held = 0, biggest = 0;
  int32_t big = -1;
  for (size_t v = 0; v < m->n_values; v++) {
    double b = (double)shape_numel(&m->values[v].shape) * 4;
    ir_opcode code = m->ops[m->values[v].def].code;
    if (code == IR_PARAM || code == IR_INPUT) held += b;
    if (b > biggest) biggest = b, big = (int32_t)v;
  }
  double sim = 0;
  for (int32_t r = 0; p && r < p->world; r++)
    sim += (double)(p->mem[r].arena_bytes + p->mem[r].param_bytes + p->mem[r].input_bytes);
  char a[32], b[32], c[32], shp[160];
  if (big >= 0 && (biggest > limit || held + biggest > limit)) {
    const ir_value *val = &m->values[big];
    const ir_op *op = &m->ops[val->def];
    const char *name = val->name ? val->name : op->layer >= 0 ? m->layers[op->layer].name : ir_op_name(op->code);
    fprintf(stderr,
            "ntpc: error: the cpu reference needs %s for parameters and inputs, and %s for tensor '%s' %s%s alone "
            "(fp32 on the cpu); this machine allows %s (NTP_CPU_MEMORY_LIMIT)\n",
            bytes_str(held, a, sizeof a), bytes_str(biggest, b, sizeof b), name, dtype_name(val->dtype),
            shape_str(&val->shape, shp, sizeof shp), bytes_str(limit, c, sizeof c));
    return 2;
  }
  if (sim > limit) {
    int32_t worst = 0;
    for (int32_t r = 1; r < p->world; r++)
      if (p->mem[r].arena_bytes + p->mem[r].param_bytes > p->mem[worst].arena_bytes + p->mem[worst].param_bytes) worst = r;
    fprintf(stderr,
            "ntpc: error: simulating %d ranks needs %s (rank %d alone: %s); this machine allows %s (NTP_CPU_MEMORY_LIMIT)\n",
            p->world, bytes_str(sim, a, sizeof a), worst,
            bytes_str((double)(p->mem[worst].arena_bytes + p->mem[worst].param_bytes + p->mem[worst].input_bytes), b,
                      sizeof b),
            bytes_str(limit, c, sizeof c));
    return 2;
  }
  return 0;
}

/* The executor's forwards (its measurement: a warm-up and timed runs where it has them), each
 * output against the reference's. 0, 1 (a mismatch or an input the backend refused), 2 (the
 * backend could not start: no GPU, too few). */
static int run_exec(ntp_exec *e, const ntp_exec_backend *b, const ntp_program *p, const ntp_safetensors *params,
                    ntp_host_tensor *const *given, const ntp_cpu_result *ref, const ntpc_run_options *o) {
  char err[1024] = "";
  ntp_cpu_result res = {0};
  ntp_exec_measured *ms = calloc(1, sizeof *ms);
  int rc = 1;
  if (!ms) {
    snprintf(err, sizeof err, "out of memory");
    goto done;
  }
  if (params && e->ops->load(e->be, params, err, sizeof err) != 0) goto done;
  for (size_t v = 0; given && v < p->global.n_values; v++)
    if (given[v] && e->ops->set(e->be, (int32_t)v, given[v], err, sizeof err) != 0) goto done;
  if (e->ops->measure(e->be, o->seed, o->iters, &res, ms, err, sizeof err) != 0) {
    rc = 2; /* a run that cannot be made here (a device lost, too little memory) */
    goto done;
  }
  printf("backend %s: %d rank%s, seed %llu, forward %.3f ms (mean of %ld)\n%s", e->ops->label(e->be), p->world,
         p->world == 1 ? "" : "s", o->seed, ms->mean_s * 1e3, ms->runs, ms->notes);
  cli_verbose_exec(e);
  rc = 0;
  double gfloor = grad_floor(ref, p->global.dtype);
  for (size_t i = 0; i < res.n_outputs; i++) {
    fputs("output ", stdout);
    ntp_print_tensor_summary(&res.outputs[i], stdout);
    double err_i = output_error(&res.outputs[i], &ref->outputs[i], gfloor);
    double tol = tolerance(&res.outputs[i], p->global.dtype, b->fp32_tol);
    printf("  vs %s: max relative error %.3g (tolerance %.0e) %s\n", b->versus, err_i, tol,
           err_i <= tol ? "ok" : "MISMATCH");
    if (err_i > tol) rc = 1;
  }
done:
  if (rc && err[0]) fprintf(stderr, "ntpc: error: %s: %s\n", b->name, err);
  ntp_cpu_result_free(&res);
  free(ms);
  return rc;
}

/* The reference's run, with what --dump and --save-params write kept. 0, or the exit status. */
static int run_reference(const ir_module *m, const ntp_program *prog, const ntp_safetensors *params,
                         ntp_host_tensor *const *given, const ntpc_run_options *o, ntp_cpu_result *res) {
  char err[512];
  if (ntp_cpu_run_given(&prog->global, o->seed, o->dump != NULL || o->save_params != NULL, params,
                        (const ntp_host_tensor *const *)given, res, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    return 1;
  }
  if (o->save_params && ntp_safetensors_save_format(o->save_params, o->params_format, &prog->global, res->params,
                                                    res->n_params, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    return 2;
  }
  ntpc_print_model_summary(m, stdout);
  printf("backend cpu (reference), seed %llu, forward %.3f ms\n", o->seed, res->seconds * 1e3);
  for (size_t i = 0; i < res->n_outputs; i++) {
    fputs("output ", stdout);
    ntp_print_tensor_summary(&res->outputs[i], stdout);
  }
  return 0;
}

/* The backend's executor for p, made before the reference runs (a GPU that is not there is said
 * before minutes of CPU work); NULL and 0 where the reference alone runs p. */
static int make_exec(const ntp_program *p, const ntpc_run_options *o, const ntp_exec_backend *b, ntp_exec **e) {
  char err[1024];
  ntp_exec_options x = {.backend = b->name, .loopback = o->loopback};
  if (ntp_exec_new(p, &x, e, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s: %s\n", b->name, err);
    return 2;
  }
  return 0;
}

int ntpc_run(const ir_module *m, const ntp_program *prog, const ntpc_run_options *o) {
  char err[512];
  const ntp_exec_backend *b;
  ntp_exec *e = NULL;
  ntp_safetensors *params = NULL;
  ntp_host_tensor **given = NULL;
  ntp_cpu_result ref = {0};
  if (!(b = ntp_exec_backend_find(o->backend, err, sizeof err))) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    return 2;
  }
  /* the reference on the host; beside it the simulation's ranks where the backend has no devices */
  int rc = check_host_memory(m, prog->world && !b->devices ? prog : NULL);
  if (rc) return rc;
  if (o->save_params && ntp_safetensors_format_check(o->params_format, &prog->global, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: --save-params: %s\n", err); /* the model does not fit the layout: its input */
    return 1;
  }
  if (o->params && (ntp_safetensors_open(o->params, &params, err, sizeof err) != 0 ||
                    ntp_safetensors_set_format(params, o->params_format, &prog->global, err, sizeof err) != 0)) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    rc = 1; /* docs/cli.md: a --params file that cannot be read or does not fit is an input error */
    goto done;
  }
  if ((rc = load_inputs(&prog->global, o, &given)) != 0 || (rc = make_exec(prog, o, b, &e)) != 0 ||
      (rc = run_reference(m, prog, params, given, o, &ref)) != 0)
    goto done;
  if (e && (rc = run_exec(e, b, prog, params, given, &ref, o)) != 0) goto done;
  if (o->dump && ntp_dump_tensors(&ref, o->dump, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc: error: %s\n", err);
    rc = 2;
  }
done:
  ntp_exec_free(e);
  ntp_cpu_result_free(&ref);
  free_inputs(&prog->global, given);
  ntp_safetensors_close(params);
  return rc;
}
