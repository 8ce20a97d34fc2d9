/* test_emu_model.c MODEL.so [--procs N] — a model library on the emulated GPU, through nothing
 * but its C ABI (ntp_model.h), against the same library on the CPU backend:
 *   - every rank in this process: loopback (one GPU) and NCCL (a GPU per rank);
 *   - device tensors: kDLCUDA inputs and outputs give exactly the host path's outputs;
 *   - --procs N: one rank per process, N processes started as a launcher would (RANK,
 *     LOCAL_RANK, NTP_NCCL_ID_FILE); each holds its pieces, together they hold everything.
 * Inputs are random (floats in [-1, 1), token ids in [0, 50)), the same for every run. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ntp_model.h"

static struct {
  int (*info)(const ntp_model_info **);
  int (*create)(const ntp_model_options *, ntp_model **);
  int (*forward)(ntp_model *, const DLTensor *const *, DLTensor *const *);
  const char *(*last_error)(void);
  void (*destroy)(ntp_model *);
} api;
static const ntp_model_info *info;

typedef struct tensor {
  DLTensor dl;
  size_t bytes;
} tensor;

static size_t numel(const ntp_model_tensor_info *t) {
  size_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
  return n;
}
static tensor host_tensor(const ntp_model_tensor_info *t) {
  tensor x = {.dl = {.device = {kDLCPU, 0}, .ndim = t->ndim, .dtype = t->dtype, .shape = (int64_t *)t->shape}};
  x.bytes = numel(t) * (t->dtype.bits / 8);
  x.dl.data = calloc(x.bytes + 1, 1);
  return x;
}
static tensor device_copy(const tensor *h, int dev) {
  tensor x = *h;
  x.dl.device = (DLDevice){kDLCUDA, dev};
  cudaSetDevice(dev);
  if (cudaMalloc(&x.dl.data, x.bytes) != cudaSuccess) exit(3);
  cudaMemcpy(x.dl.data, h->dl.data, x.bytes, cudaMemcpyHostToDevice);
  return x;
}

/* element i as a double (bf16, fp16, fp32, int32) */
static double value(const tensor *t, size_t i) {
  const unsigned char *p = t->dl.data;
  if (t->dl.dtype.code == kDLInt) return ((const int32_t *)p)[i];
  if (t->dl.dtype.bits == 32) return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  uint32_t u;
  float f;
  if (t->dl.dtype.code == kDLBfloat) u = (uint32_t)h << 16;
  else {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    u = e == 31 ? s | 0x7f800000u | (m << 13) : e ? s | ((e + 112) << 23) | (m << 13) : s;
    if (!e && m) {
      f = ldexpf((float)m, -24);
      memcpy(&u, &f, 4);
      u |= s;
    }
  }
  memcpy(&f, &u, 4);
  return f;
}

static void release(tensor *t, int n) {
  for (int i = 0; i < n; i++) free(t[i].dl.data);
}

static void random_inputs(tensor *in) {
  uint64_t s = 0x1234567;
  for (int i = 0; i < info->n_inputs; i++) {
    in[i] = host_tensor(&info->inputs[i]);
    size_t n = numel(&info->inputs[i]);
    for (size_t e = 0; e < n; e++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      uint32_t r = (uint32_t)(s >> 33);
      if (in[i].dl.dtype.code == kDLInt) ((int32_t *)in[i].dl.data)[e] = (int32_t)(r % 50);
      else if (in[i].dl.dtype.bits == 32) ((float *)in[i].dl.data)[e] = (float)r / 2147483648.0f - 1.0f;
      else { /* bf16 / fp16 bits of a value in [-1, 1): the top half of an fp32 is a bf16 */
        float f = (float)r / 2147483648.0f - 1.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)in[i].dl.data)[e] =
            in[i].dl.dtype.code == kDLBfloat ? (uint16_t)(u >> 16) : (uint16_t)(0x3800 | (r & 0x3ff)); /* [0.5, 1) */
      }
    }
  }
}

static int run(const ntp_model_options *o, tensor *in, tensor *out, bool device_io, int dev) {
  ntp_model *m;
  if (api.create(o, &m) != 0) {
    fprintf(stderr, "create (%s): %s\n", o->backend, api.last_error());
    return -1;
  }
  const DLTensor *ins[16];
  DLTensor *outs[16];
  tensor din[16], dout[16];
  for (int i = 0; i < info->n_inputs; i++) {
    din[i] = device_io ? device_copy(&in[i], dev) : in[i];
    ins[i] = &din[i].dl;
  }
  for (int i = 0; i < info->n_outputs; i++) {
    out[i] = host_tensor(&info->outputs[i]);
    dout[i] = device_io ? device_copy(&out[i], dev) : out[i];
    outs[i] = &dout[i].dl;
  }
  int rc = api.forward(m, ins, outs);
  if (rc != 0) fprintf(stderr, "forward (%s): %s\n", o->backend, api.last_error());
  for (int i = 0; device_io && i < info->n_outputs; i++) {
    cudaSetDevice(dev);
    cudaMemcpy(out[i].dl.data, dout[i].dl.data, out[i].bytes, cudaMemcpyDeviceToHost);
    cudaFree(dout[i].dl.data);
  }
  for (int i = 0; device_io && i < info->n_inputs; i++) cudaFree(din[i].dl.data);
  api.destroy(m);
  return rc;
}

static int failures;

/* max |a - b| / max |b|, as ntpc run reports it; NaN in a counts as a miss */
static void compare(const char *what, const tensor *a, const tensor *ref, double tol) {
  for (int o = 0; o < info->n_outputs; o++) {
    size_t n = numel(&info->outputs[o]), missing = 0;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
      double x = value(&a[o], i), y = value(&ref[o], i);
      if (isnan(x)) missing++;
      else if (fabs(x - y) > num) num = fabs(x - y);
      if (fabs(y) > den) den = fabs(y);
    }
    double e = den > 0 ? num / den : num;
    bool ok = e <= tol && !missing;
    printf("%-44s %-8s max relative error %.3g (tolerance %.0e)%s %s\n", what, info->outputs[o].name, e, tol,
           missing ? " with elements missing" : "", ok ? "ok" : "MISMATCH");
    failures += !ok;
  }
}
static void identical(const char *what, const tensor *a, const tensor *b) {
  for (int o = 0; o < info->n_outputs; o++) {
    bool same = !memcmp(a[o].dl.data, b[o].dl.data, a[o].bytes);
    printf("%-44s %-8s %s\n", what, info->outputs[o].name, same ? "bitwise equal" : "DIFFERENT");
    failures += !same;
  }
}

static double tolerance(void) {
  DLDataType t = info->outputs[0].dtype;
  return t.bits == 32 ? 1e-4 : t.code == kDLBfloat ? 5e-2 : 1e-2;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_emu_model MODEL.so [--procs N]\n");
    return 2;
  }
  int procs = argc > 3 && !strcmp(argv[2], "--procs") ? atoi(argv[3]) : 0;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  *(void **)&api.info = dlsym(lib, "ntp_model_get_info");
  *(void **)&api.create = dlsym(lib, "ntp_model_create");
  *(void **)&api.forward = dlsym(lib, "ntp_model_forward");
  *(void **)&api.last_error = dlsym(lib, "ntp_model_last_error");
  *(void **)&api.destroy = dlsym(lib, "ntp_model_destroy");
  if (!api.info || api.info(&info) != 0 || info->n_inputs > 16 || info->n_outputs > 16) return 2;
  printf("model %s: %d ranks\n", info->name, info->world);
  tensor in[16], ref[16], got[16], dev[16];
  random_inputs(in);
  const char *rank_out = getenv("NTP_TEST_RANK_OUT");
  if (rank_out) { /* one rank process of --procs: its outputs to RANK_OUT/RANK.OUTPUT */
    ntp_model_options o = {.backend = "cuda", .rank = NTP_RANK_FROM_ENV, .seed = 5};
    if (run(&o, in, got, false, 0) != 0) return 1;
    for (int i = 0; i < info->n_outputs; i++) {
      char path[4200];
      snprintf(path, sizeof path, "%s/%s.%d", rank_out, getenv("RANK"), i);
      FILE *f = fopen(path, "wb");
      if (!f || fwrite(got[i].dl.data, 1, got[i].bytes, f) != got[i].bytes) return 1;
      fclose(f);
    }
    release(in, info->n_inputs), release(got, info->n_outputs);
    return 0;
  }
  ntp_model_options cpu = {.backend = "cpu", .rank = -1, .seed = 5};
  if (run(&cpu, in, ref, false, 0) != 0) return 1;

  if (procs > 0) { /* one rank per process, as torchrun would start them */
    char idfile[] = "/tmp/ntp-emu-ncclid-XXXXXX", outdir[] = "/tmp/ntp-emu-procs-XXXXXX";
    int fd = mkstemp(idfile);
    if (fd < 0 || !mkdtemp(outdir)) return 2;
    close(fd);
    unlink(idfile); /* rank 0 writes it; the others wait for it */
    fflush(stdout);
    for (int r = 0; r < procs; r++) { /* fresh processes, as a launcher starts them */
      if (fork() == 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", r);
        setenv("RANK", v, 1);
        setenv("LOCAL_RANK", v, 1);
        snprintf(v, sizeof v, "%d", procs);
        setenv("WORLD_SIZE", v, 1);
        setenv("NTP_NCCL_ID_FILE", idfile, 1);
        setenv("NTP_TEST_RANK_OUT", outdir, 1);
        execl("/proc/self/exe", argv[0], argv[1], (char *)NULL);
        _exit(127);
      }
    }
    int bad = 0;
    for (int r = 0; r < procs; r++) {
      int st;
      wait(&st);
      bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    unlink(idfile);
    if (bad) {
      printf("%d of %d rank processes failed\n", bad, procs);
      return 1;
    }
    /* together: each element from the process that holds it (NaN elsewhere) */
    for (int i = 0; i < info->n_outputs; i++) {
      got[i] = host_tensor(&info->outputs[i]);
      size_t n = numel(&info->outputs[i]), es = got[i].bytes / n;
      tensor part = host_tensor(&info->outputs[i]);
      for (int r = 0; r < procs; r++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%d.%d", outdir, r, i);
        FILE *f = fopen(path, "rb");
        if (!f || fread(part.dl.data, 1, part.bytes, f) != part.bytes) return 1;
        fclose(f);
        unlink(path);
        size_t held = 0;
        for (size_t e = 0; e < n; e++)
          if (r == 0 || !isnan(value(&part, e))) {
            memcpy((char *)got[i].dl.data + e * es, (char *)part.dl.data + e * es, es);
            held += !isnan(value(&part, e));
          }
        printf("rank process %d holds %zu of the %zu elements of %s\n", r, held, n, info->outputs[i].name);
      }
      free(part.dl.data);
    }
    rmdir(outdir);
    char what[64];
    snprintf(what, sizeof what, "cuda, %d processes (NCCL) vs cpu", procs);
    compare(what, got, ref, tolerance());
    release(in, info->n_inputs), release(ref, info->n_outputs), release(got, info->n_outputs);
    printf("%d failed\n", failures);
    return failures ? 1 : 0;
  }

  ntp_model_options loop = {.backend = "cuda", .rank = -1, .loopback = 1, .seed = 5};
  if (run(&loop, in, got, false, 0) != 0) return 1;
  compare("cuda loopback vs cpu", got, ref, tolerance());
  if (run(&loop, in, dev, true, 0) != 0) return 1;
  identical("cuda loopback, kDLCUDA in and out, vs host", dev, got);
  if (info->world > 1) {
    ntp_model_options nccl = {.backend = "cuda", .rank = -1, .seed = 5};
    release(got, info->n_outputs), release(dev, info->n_outputs);
    if (run(&nccl, in, got, false, 0) != 0) return 1;
    compare("cuda, a GPU per rank (NCCL) vs cpu", got, ref, tolerance());
    if (run(&nccl, in, dev, true, 1) != 0) return 1; /* tensors on GPU 1: rank 1's; the others through the host */
    identical("cuda NCCL, kDLCUDA on GPU 1, vs host", dev, got);
  }
  release(in, info->n_inputs), release(ref, info->n_outputs), release(got, info->n_outputs), release(dev, info->n_outputs);
  printf("%d failed\n", failures);
  return failures ? 1 : 0;
}
